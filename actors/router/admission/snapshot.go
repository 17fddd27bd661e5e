package admission

import (
	"cmp"
	"slices"
	"time"
)

// Lengths calls f with the number of queued requests per class and lane kind.
func (q *Queue) Lengths(f func(class, laneKind string, n int)) {
	for _, c := range q.classes {
		for k, n := range c.byKind {
			f(c.cfg.Name, LaneKinds[k], n)
		}
	}
}

// Snapshot is the admin view of the queue (GET /admin/v1/queue).
type Snapshot struct {
	Classes []ClassView `json:"classes"`
}

// ClassView is one class in the snapshot.
type ClassView struct {
	Name       string     `json:"name"`
	Quantum    int        `json:"quantum"`
	QueueLimit int        `json:"queue_limit"`
	MaxWait    string     `json:"max_wait"`
	Queued     int        `json:"queued"`
	Deficit    int        `json:"deficit"`
	Lanes      []LaneView `json:"lanes"`
}

// LaneView is one lane: its kind, its length and its head (session lanes are named by an
// opaque key, never the client's session id).
type LaneView struct {
	Kind   string    `json:"kind"`
	Name   string    `json:"name,omitempty"` // classifier lanes only
	Length int       `json:"length"`
	Head   *HeadView `json:"head,omitempty"`
}

// HeadView is a lane head: who, since when, and why it waits.
type HeadView struct {
	RequestID string `json:"request_id"`
	Tag       string `json:"tag,omitempty"`
	Waiting   string `json:"waiting"`
	State     string `json:"state"` // ready, capacity, held
	// Reason is the wait kind: capacity, no_worker, or the gate's (session_busy, …).
	Reason string     `json:"reason,omitempty"`
	Until  *time.Time `json:"until,omitempty"`
}

// Snapshot describes the queue now.
func (q *Queue) Snapshot() Snapshot {
	now := q.cfg.Now()
	out := Snapshot{Classes: []ClassView{}}
	for _, c := range q.classes {
		cv := ClassView{Name: c.cfg.Name, Quantum: c.cfg.Quantum, QueueLimit: c.cfg.QueueLimit,
			MaxWait: c.cfg.MaxWait.String(), Queued: c.queued, Deficit: c.deficit, Lanes: []LaneView{}}
		for _, l := range c.lanes {
			if len(l.entries) == 0 {
				continue
			}
			lv := LaneView{Kind: LaneKinds[l.kind], Length: len(l.entries)}
			lv.Name = l.name
			e := l.head()
			hv := &HeadView{RequestID: e.Req.ID, Tag: e.Req.Tag, Waiting: now.Sub(e.enqueued).String(), State: "ready"}
			switch l.where {
			case inCapWait:
				hv.State, hv.Reason = "capacity", e.wait.String()
			case inHeld:
				hv.State, hv.Reason = "held", e.wait.String()
				if !l.holdUntil.IsZero() {
					u := l.holdUntil.UTC()
					hv.Until = &u
				}
			}
			lv.Head = hv
			cv.Lanes = append(cv.Lanes, lv)
		}
		slices.SortFunc(cv.Lanes, func(a, b LaneView) int {
			return cmp.Compare(a.Head.RequestID, b.Head.RequestID)
		})
		out.Classes = append(out.Classes, cv)
	}
	return out
}
