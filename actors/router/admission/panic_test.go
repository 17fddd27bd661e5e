package admission

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// panicky panics classifying a request whose id starts with "boom" (after scribbling on it)
// and checking a head whose id starts with "trap"; it lets everything else go.
type panicky struct{ checks int }

func (p *panicky) Classify(r *Request, _ []string, _ func([]string) int) {
	if strings.HasPrefix(r.ID, "boom") {
		r.Class, r.Lane, r.Allowed = "nonsense-from-the-classifier", "x", []string{"nowhere"}
		panic("classifier bug")
	}
}
func (p *panicky) Gate() Gate { return p }
func (p *panicky) Check(head *Request, _ View) Decision {
	p.checks++
	if strings.HasPrefix(head.ID, "trap") {
		panic("gate bug")
	}
	return Decision{Go: true}
}
func (p *panicky) Dispatched(*Request, string)    {}
func (p *panicky) Completed(*Request, string)     {}
func (p *panicky) Moved(*Request, string, string) {}
func (p *panicky) Recheck() time.Duration         { return 0 }

// TestClassifierPanicFailsOneRequest (R15.3; upstream
// synchronous_panic_fails_one_request_and_retains_the_classifier): a classifier that panics on
// one request fails that request with ErrClassifierFailed, under a configured class (nothing
// it wrote is kept), and the same classifier goes on serving the others.
func TestClassifierPanicFailsOneRequest(t *testing.T) {
	h := newHost("w")
	p := &panicky{}
	q := newQueue(h, p)
	boom, ok1, ok2 := entry("boom", "", "", "w"), entry("ok1", "", "", "w"), entry("ok2", "", "", "w")
	q.Admit(ok1, h, nil)
	q.Admit(boom, h, nil)
	q.Admit(ok2, h, nil)
	if !errors.Is(h.rejected[boom], ErrClassifierFailed) || len(h.rejected) != 1 {
		t.Fatalf("rejected %v", h.rejected)
	}
	if boom.Req.Class != "default" || boom.Req.Lane != "" || boom.Req.Allowed != nil {
		t.Fatalf("the failed classifier's writes were kept: %+v", boom.Req)
	}
	if got := ids(h.dispatched); !slices.Equal(got, []string{"ok1", "ok2"}) {
		t.Fatalf("dispatched %v", got)
	}
	if q.Panics() != 1 || q.Len() != 0 || boom.Dispatched() {
		t.Fatalf("panics %d, queued %d", q.Panics(), q.Len())
	}
}

// TestGatePanicFailsThatHeadOnly (R15.3): a gate that panics on a queued head fails that
// request once, and the head behind it in the same lane goes in the same pump; a gate that
// panics on a new request's first check fails it at admission.
func TestGatePanicFailsThatHeadOnly(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1 // full: everything queues
	p := &panicky{}
	q := newQueue(h, p)
	first, trap, after := entry("first", "", "", "w"), entry("trap", "", "", "w"), entry("after", "", "", "w")
	for _, e := range []*Entry{first, trap, after} {
		q.Admit(e, h, nil)
	}
	if len(h.rejected) != 0 || q.Len() != 3 {
		t.Fatalf("rejected %v, queued %d: only the head is asked while w is full", h.rejected, q.Len())
	}
	h.release(q, "w") // first goes; trap becomes the head, is asked, panics; after is asked
	if !errors.Is(h.rejected[trap], ErrClassifierFailed) || len(h.rejected) != 1 {
		t.Fatalf("rejected %v", h.rejected)
	}
	if got := ids(h.dispatched); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("dispatched %v", got)
	}
	if q.Len() != 1 || after.Waiting() != WaitCapacity {
		t.Fatalf("queued %d, the next head waits for %v", q.Len(), after.Waiting())
	}
	h.release(q, "w")
	if got := ids(h.dispatched); !slices.Equal(got, []string{"first", "after"}) || q.Len() != 0 {
		t.Fatalf("dispatched %v, queued %d", got, q.Len())
	}
	// At admission, with room: the first check panics, the request fails there.
	h.loads["w"] = 0
	trap2 := entry("trap2", "", "", "w")
	q.Admit(trap2, h, nil)
	if !errors.Is(h.rejected[trap2], ErrClassifierFailed) || trap2.Queued() || trap2.Dispatched() {
		t.Fatalf("trap2: %v", h.rejected[trap2])
	}
	if q.Panics() != 2 || len(q.failed) != 0 {
		t.Fatalf("panics %d, failed left %d", q.Panics(), len(q.failed))
	}
}
