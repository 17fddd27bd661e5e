package router

import (
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// holdGate holds every head whose session starts with "hold" (asked again on every capacity
// free: not SessionOnly) and counts the asks per request key.
type holdGate struct{ asks map[uint64]int }

func (g *holdGate) Classify(*admission.Request, []string, func([]string) int) {}
func (g *holdGate) Gate() admission.Gate                                      { return g }
func (g *holdGate) Check(head *admission.Request, _ admission.View) admission.Decision {
	g.asks[head.Key]++
	if strings.HasPrefix(head.SessionID, "hold") {
		return admission.Decision{}
	}
	return admission.Decision{Go: true}
}
func (g *holdGate) Dispatched(*admission.Request, string)    {}
func (g *holdGate) Moved(*admission.Request, string, string) {}
func (g *holdGate) Completed(*admission.Request, string)     {}
func (g *holdGate) Recheck() time.Duration                   { return 0 }

// TestFreedWorkerWakesOnlyTheHeadsItCanServe (issue 34, review finding 7): a worker whose load
// falls (its LoadReport after a release, or a heartbeat) wakes only the held heads that could
// be sent to it — of its pool, within their allowed set — not every held head of every model:
// the others would get the answer they got.
func TestFreedWorkerWakesOnlyTheHeadsItCanServe(t *testing.T) {
	g := &holdGate{asks: map[uint64]int{}}
	r := newRig(t, Config{Admission: admissionCfg(g, 0)})
	r.join("a1", "a", 0)
	r.join("b1", "b", 0)
	var held []*requester
	for _, s := range []string{"hold1", "hold2", "hold3"} {
		q := r.newRequester()
		q.pick(s, "a", s)
		q.queued()
		held = append(held, q)
	}
	asks := func() (n int) {
		for _, q := range held {
			n += g.asks[q.key]
		}
		return n
	}
	before := asks()
	if before != 3 {
		t.Fatalf("%d asks to queue three heads", before)
	}
	// Model b's worker frees a slot, and heartbeats: nothing of model a can go there.
	other := r.newRequester()
	other.pick("other", "b", "")
	other.release(other.picked())
	r.join("b1", "b", 0)
	if n := asks(); n != before {
		t.Fatalf("model a's held heads were asked %d times for model b's worker", n-before)
	}
	// Model a's worker frees a slot: each of its held heads is asked again.
	mine := r.newRequester()
	mine.pick("mine", "a", "")
	mine.release(mine.picked())
	if n := asks(); n != before+3 {
		t.Fatalf("%d asks of model a's held heads when a1 freed, want 3", n-before)
	}
	for _, q := range held {
		q.silent()
	}
}
