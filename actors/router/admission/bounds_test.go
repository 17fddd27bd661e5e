package admission

import (
	"fmt"
	"testing"
	"time"
)

// size counts every entry of the queue's tables: its lanes (and their entries), capacity
// groups, held lanes, named-lane counts, ready heaps, the deadline heap, the failed heads and,
// with a gate that wakes heads, the queued requests by key and the wake probes.
func (q *Queue) size() int {
	n := len(q.expiry) + len(q.failed) + len(q.byKey) + len(q.probes)
	for _, c := range q.classes {
		n += len(c.lanes) + len(c.groups) + len(c.groupBy) + len(c.held) + len(c.named) + len(c.ready) + c.queued + len(c.byKey)
		for _, l := range c.lanes {
			n += len(l.entries)
		}
	}
	return n
}

// churnPolicy names a lane for every fourth request and holds every fifth head until a second
// from now, once: the queue's named lanes, held lanes and hold timers all come and go. It is a
// Waker that names no head, so the queue keeps its requests by key too.
type churnPolicy struct{ held map[uint64]bool }

func (p *churnPolicy) Classify(r *Request, _ []string, _ func([]string) int) {
	if r.Key%4 == 0 {
		r.Lane = "named"
	}
}
func (p *churnPolicy) Gate() Gate { return p }
func (p *churnPolicy) Check(head *Request, v View) Decision {
	if head.Key%5 == 0 && !p.held[head.Key] {
		p.held[head.Key] = true
		return Decision{Until: v.Now().Add(time.Second)}
	}
	return Decision{Go: true}
}
func (p *churnPolicy) Dispatched(*Request, string)    {}
func (p *churnPolicy) Moved(*Request, string, string) {}
func (p *churnPolicy) Completed(r *Request, _ string) { delete(p.held, r.Key) }
func (p *churnPolicy) Recheck() time.Duration         { return 0 }
func (p *churnPolicy) Woken(func(uint64))             {}
func (p *churnPolicy) forget(r *Request)              { delete(p.held, r.Key) }

// TestQueueTablesEmptyAfterRequests (R19): after n requests of two classes — sessions, named
// lanes, held heads, objectives, capacity waits — have been dispatched and completed, cancelled
// or expired, the queue keeps no lane, group, count, deadline, failed head or request by key.
func TestQueueTablesEmptyAfterRequests(t *testing.T) {
	h := newHost("a", "b", "c")
	h.threshold = 2
	pol := &churnPolicy{held: map[uint64]bool{}}
	q := newQueue(h, pol,
		ClassConfig{Name: "default", Quantum: 2, QueueLimit: 40, MaxWait: 3 * time.Second},
		ClassConfig{Name: "batch", Quantum: 1, QueueLimit: 10, MaxWait: 2 * time.Second, Priority: -1})
	const n = 2000
	var live []*Entry
	queuedSeen, expired := 0, 0
	for i := range n {
		class := "default"
		if i%3 == 0 {
			class = "batch"
		}
		session := ""
		if i%2 == 0 {
			session = fmt.Sprint("s", i%13)
		}
		e := entry(fmt.Sprint("r", i), class, session, "a", "b", "c")
		e.Req.APIKey = i % 3 // three keys share the classes' limits (and push each other out)
		if i%17 == 0 {
			e.Req.Objective = 500 * time.Millisecond
		}
		q.Admit(e, h, nil)
		if e.Queued() {
			queuedSeen++
		}
		live = append(live, e)
		switch {
		case i%9 == 0:
			h.advance(q, 700*time.Millisecond)
		case len(live) > 20:
			// The oldest ends: completed if it went, else its client leaves.
			old := live[0]
			live = live[1:]
			if old.Dispatched() {
				h.finish(q, old)
			} else if !q.Cancel(old, h) {
				pol.forget(old.Req) // rejected or expired: nothing to end
			}
		}
	}
	for _, e := range live {
		if e.Dispatched() {
			h.finish(q, e)
		} else {
			q.Cancel(e, h)
		}
	}
	h.advance(q, time.Minute)
	for _, err := range h.rejected {
		if err == ErrQueueTimeout {
			expired++
		}
	}
	if queuedSeen == 0 || expired == 0 {
		t.Fatalf("of %d requests %d queued and %d expired: the run must queue and expire some", n, queuedSeen, expired)
	}
	if q.Len() != 0 || q.size() != 0 {
		t.Fatalf("after %d requests ended: %d queued, %d table entries", n, q.Len(), q.size())
	}
}
