// Package faults parses tlengine's --fault switch: the ways a simulated engine misbehaves so
// the gateway's failure handling can be exercised on demand.
package faults

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind is one fault switch.
type Kind int

// The fault switches (R12).
const (
	// None: a healthy engine.
	None Kind = iota
	// Refuse: heartbeats advertise an HTTP address nobody listens on.
	Refuse
	// Unavailable: every inference request is answered 503.
	Unavailable
	// CutAfter: the HTTP answer is cut after N tokens; the process stays up.
	CutAfter
	// CrashAfter: the process exits after N tokens have been sent.
	CrashAfter
	// Stall: requests are accepted and never answered (until the client leaves).
	Stall
	// NoHeartbeat: the engine serves but never heartbeats.
	NoHeartbeat
	// Draining: heartbeats report draining.
	Draining
	// BadHeaders: every answer carries headers no client may see (Set-Cookie,
	// X-TL-Route: spoofed, Location), for the gateway's header allow-list (R13.4, R14.5).
	BadHeaders
	// SlowHeaders: every inference request waits D (on the engine's clock) before anything
	// of its answer is written, then is served (R14.5).
	SlowHeaders
	// StallAfter: an answer stops after N tokens (a JSON answer after its headers and part
	// of its body) and the connection is kept open until the client leaves (R14.5).
	StallAfter
	// EndlessEvent: a streamed answer is one SSE line that never ends (a non-streamed one, a
	// JSON body that never ends): bytes without a newline until the client leaves (R14.5).
	EndlessEvent
)

// Fault is a parsed --fault value.
type Fault struct {
	Kind Kind
	N    int           // tokens, for CutAfter, CrashAfter and StallAfter
	D    time.Duration // the wait, for SlowHeaders
}

// String gives the flag form.
func (f Fault) String() string {
	switch f.Kind {
	case Refuse:
		return "refuse"
	case Unavailable:
		return "503"
	case CutAfter:
		return "cut-after=" + strconv.Itoa(f.N)
	case CrashAfter:
		return "crash-after=" + strconv.Itoa(f.N)
	case Stall:
		return "stall"
	case NoHeartbeat:
		return "no-heartbeat"
	case Draining:
		return "draining"
	case BadHeaders:
		return "bad-headers"
	case SlowHeaders:
		return "slow-headers=" + f.D.String()
	case StallAfter:
		return "stall-after=" + strconv.Itoa(f.N)
	case EndlessEvent:
		return "endless-event"
	}
	return "none"
}

// Usage lists the accepted values.
const Usage = "none|refuse|503|cut-after=N|crash-after=N|stall|stall-after=N|slow-headers=D|endless-event|no-heartbeat|draining|bad-headers"

// Parse reads a --fault value.
func Parse(s string) (Fault, error) {
	switch s {
	case "", "none":
		return Fault{}, nil
	case "refuse":
		return Fault{Kind: Refuse}, nil
	case "503":
		return Fault{Kind: Unavailable}, nil
	case "stall":
		return Fault{Kind: Stall}, nil
	case "no-heartbeat":
		return Fault{Kind: NoHeartbeat}, nil
	case "draining":
		return Fault{Kind: Draining}, nil
	case "bad-headers":
		return Fault{Kind: BadHeaders}, nil
	case "endless-event":
		return Fault{Kind: EndlessEvent}, nil
	}
	if v, ok := strings.CutPrefix(s, "slow-headers="); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return Fault{}, fmt.Errorf("fault %q: D must be a positive duration such as 5s", s)
		}
		return Fault{Kind: SlowHeaders, D: d}, nil
	}
	for prefix, kind := range map[string]Kind{"cut-after=": CutAfter, "crash-after=": CrashAfter, "stall-after=": StallAfter} {
		if v, ok := strings.CutPrefix(s, prefix); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return Fault{}, fmt.Errorf("fault %q: N must be a token count ≥ 0", s)
			}
			return Fault{Kind: kind, N: n}, nil
		}
	}
	return Fault{}, fmt.Errorf("fault %q: want one of %s", s, Usage)
}
