package admission

import (
	"container/heap"
	"time"
)

// Tick runs at an armed time: expired requests are rejected (503 queue_timeout), heads whose
// Hold time came are asked again, and the gate's periodic recheck wakes everybody.
func (q *Queue) Tick(h Host) {
	now := q.cfg.Now()
	q.armed = time.Time{}
	for q.expiry.Len() > 0 && !q.expiry[0].deadline.After(now) {
		e := q.expiry[0]
		q.remove(e)
		h.Reject(e, ErrQueueTimeout)
	}
	for _, c := range q.classes {
		for l := range c.held {
			if !l.holdUntil.IsZero() && !l.holdUntil.After(now) {
				q.ready(l)
			}
		}
	}
	if q.recheck() > 0 {
		q.Wake(h)
	} else {
		q.Pump(h)
	}
	q.rearm(h)
}

// unexpire takes a request that leaves the queue off the deadline heap (every queued request
// is on it).
func (q *Queue) unexpire(e *Entry) { heap.Remove(&q.expiry, e.dlIdx) }

// recheck is the periodic wake interval: the shorter of the queue's and the gate's.
func (q *Queue) recheck() time.Duration {
	r := q.cfg.Recheck
	if q.gate != nil {
		if g := q.gate.Recheck(); g > 0 && (r == 0 || g < r) {
			r = g
		}
	}
	return r
}

// rearm asks for the earliest future time the queue must act at.
func (q *Queue) rearm(h Host) {
	now := q.cfg.Now()
	var next time.Time
	consider := func(t time.Time) {
		if !t.IsZero() && t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if q.expiry.Len() > 0 {
		consider(q.expiry[0].deadline)
	}
	for _, c := range q.classes {
		for l := range c.held {
			consider(l.holdUntil)
		}
	}
	if r := q.recheck(); r > 0 && q.Len() > 0 {
		consider(now.Add(r))
	}
	if !next.IsZero() {
		q.arm(h, next)
	}
}

// arm asks the owner for a Tick at `at` unless an earlier one is already armed.
func (q *Queue) arm(h Host, at time.Time) {
	if !q.armed.IsZero() && !at.Before(q.armed) && q.armed.After(q.cfg.Now()) {
		return
	}
	q.armed = at
	h.ArmTimer(at)
}

// deadlineHeap orders queued entries by deadline.
type deadlineHeap []*Entry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].dlIdx, h[j].dlIdx = i, j
}
func (h *deadlineHeap) Push(x any) {
	e := x.(*Entry)
	e.dlIdx = len(*h)
	*h = append(*h, e)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
