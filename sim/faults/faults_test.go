package faults

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	good := map[string]Fault{
		"": {}, "none": {}, "refuse": {Kind: Refuse}, "503": {Kind: Unavailable},
		"cut-after=3": {Kind: CutAfter, N: 3}, "crash-after=0": {Kind: CrashAfter, N: 0},
		"stall": {Kind: Stall}, "no-heartbeat": {Kind: NoHeartbeat}, "draining": {Kind: Draining}, "bad-headers": {Kind: BadHeaders},
		"stall-after=3": {Kind: StallAfter, N: 3}, "stall-after=0": {Kind: StallAfter, N: 0},
		"slow-headers=2s": {Kind: SlowHeaders, D: 2 * time.Second}, "slow-headers=1m30s": {Kind: SlowHeaders, D: 90 * time.Second},
		"slow-headers=250ms": {Kind: SlowHeaders, D: 250 * time.Millisecond},
		"endless-event":      {Kind: EndlessEvent},
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" {
			if again, _ := Parse(got.String()); again != got {
				t.Errorf("%q does not round-trip: %q", in, got.String())
			}
		}
	}
	// Each bad value is rejected with an error that quotes it and says what is wanted.
	bad := []struct{ in, says string }{
		{"crash", "want one of"}, {"504", "want one of"}, {"STALL", "want one of"},
		{"cut-after=", "token count"}, {"cut-after=-1", "token count"}, {"cut-after=x", "token count"},
		{"stall-after=", "token count"}, {"stall-after=-2", "token count"}, {"stall-after=1.5", "token count"},
		{"stall-after", "want one of"}, {"slow-headers", "want one of"}, {"endless-event=1", "want one of"},
		{"endless", "want one of"}, {"Endless-Event", "want one of"},
		{"slow-headers=", "positive duration"}, {"slow-headers=5", "positive duration"},
		{"slow-headers=0s", "positive duration"}, {"slow-headers=-1s", "positive duration"},
		{"slow-headers=soon", "positive duration"},
	}
	for _, c := range bad {
		_, err := Parse(c.in)
		if err == nil {
			t.Errorf("Parse(%q) accepted", c.in)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, `"`+c.in+`"`) || !strings.Contains(msg, c.says) {
			t.Errorf("Parse(%q): %q, want it to quote the value and say %q", c.in, msg, c.says)
		}
	}
	// Usage names every switch.
	for _, name := range []string{"slow-headers=D", "stall-after=N", "endless-event", "bad-headers"} {
		if !strings.Contains(Usage, name) {
			t.Errorf("Usage %q does not name %s", Usage, name)
		}
	}
}
