package admission

import (
	"container/heap"
	"time"
)

type laneKind uint8

const (
	sharedLane laneKind = iota
	sessionLane
	namedLane
)

// LaneKinds are the lane kinds, as the queue-length metric labels them.
var LaneKinds = [...]string{sharedLane: "shared", sessionLane: "session", namedLane: "classifier"}

func (k laneKind) String() string { return LaneKinds[k] }

// lane is a FIFO of requests of one class: the shared lane of a candidate set, a session's
// lane, or a classifier-named lane of a candidate set. Only its head is ever asked.
type lane struct {
	key     string
	name    string // a classifier-named lane's name
	kind    laneKind
	cls     *class
	entries []*Entry // FIFO; entries[0] is the head
	limit   LaneLimit
	hasLim  bool
	// Scheduling state: where the lane waits (idx is its place in that heap).
	where       laneWhere
	idx         int
	group       *capGroup // the capacity group it waits in (inCapWait)
	holdUntil   time.Time
	sessionOnly bool // the gate said only the session's own completion can release it
	gateWakes   bool // the gate said it names the head when it lets it go (Decision.GateWakes)
}

type laneWhere uint8

const (
	nowhere   laneWhere = iota
	inReady             // its head may be dispatchable: asked in the next pump
	inCapWait           // its head found no candidate with room: asked again when capacity frees
	inHeld              // the gate holds its head: asked again at a wake or its Hold time
)

func (l *lane) head() *Entry { return l.entries[0] }

// sorted reports whether l keeps its entries in its class's order rather than arrival order:
// a wspt class's shared and classifier lanes (a session's turns always keep theirs).
func sorted(l *lane) bool { return l.cls.cfg.Order == OrderWSPT && l.kind != sessionLane }

// class is one admission class: its lanes and where each waits.
type class struct {
	cfg     ClassConfig
	deficit int
	lanes   map[string]*lane
	ready   laneHeap // lanes whose head may be dispatchable, oldest head first
	// groups are the lanes blocked on capacity, by candidate set, oldest head first: a set
	// found full in a pump is skipped whole, so a capacity free asks one head per set.
	groups  []*capGroup
	groupBy map[string]*capGroup
	held    map[*lane]struct{} // lanes the gate holds
	queued  int
	byKind  [3]int         // queued per lane kind
	named   map[string]int // queued per classifier lane name (its limit spans candidate sets)
	// byKey is the queued requests per API key (Request.APIKey), for the per-key share of
	// queue_limit (Queue.makeRoom): bounded by the configured keys, an entry deleted at 0.
	byKey map[int]int
	tier  *tier
	index int // its place in its tier's ring
}

// tier is the classes of one priority, served by deficit round robin among themselves while
// no higher tier has a head that can go (R15.2).
type tier struct {
	priority int
	classes  []*class
	cursor   int
	carry    *class // the class served last, while it has credit left
}

// before reports whether a waits ahead of b in class c: the older first (fcfs), or the fewer
// estimated uncached tokens (uncached prompt and the most it may generate) first and then the
// older (wspt).
func (c *class) before(a, b *Entry) bool {
	if c.cfg.Order == OrderWSPT && a.uncached != b.uncached {
		return a.uncached < b.uncached
	}
	return a.seq < b.seq
}

// cost is what dispatching e takes from c's credit.
func (c *class) cost(e *Entry) int {
	if c.cfg.Cost == CostUncachedTokens {
		return max(1, e.uncached)
	}
	return 1
}

// capGroup is one candidate set's capacity-blocked lanes of a class.
type capGroup struct {
	key   string
	lanes laneHeap
	idx   int    // place in class.groups
	full  uint64 // the pump in which a head of the set found no room
	// objective: the set of one request with an objective (Request.Objective), whose asks a
	// pump bounds (MaxLateAsks).
	objective bool
}

// laneOf names the request's lane and finds it (nil: not open): its classifier-named lane, else its session's,
// else the class's shared lane. Shared and named lanes are per candidate set, so a head
// waiting for full workers never blocks requests that want others (a session keeps one lane:
// its turns stay in order).
func (q *Queue) laneOf(c *class, e *Entry) (l *lane, key string, kind laneKind) {
	r := e.Req
	kind = sharedLane
	switch {
	case r.Lane != "":
		key, kind = "l:"+r.Lane+"\x00"+e.capKey, namedLane
	case r.SessionID != "":
		key, kind = q.sessionLaneKey(r.SessionID), sessionLane
	default:
		key = "p:" + e.capKey
	}
	return c.lanes[key], key, kind
}

// openLane opens the lane laneOf named for e (a request about to wait in it). A request that
// goes at once needs none: a lane is made only to hold waiting requests.
func (q *Queue) openLane(c *class, e *Entry, key string, kind laneKind) *lane {
	l := &lane{key: key, kind: kind, cls: c}
	if kind == namedLane {
		l.name = e.Req.Lane
		l.limit, l.hasLim = q.lanes[e.Req.Lane]
	}
	c.lanes[key] = l
	return l
}

// dropIfEmpty forgets an empty lane (session lanes come and go; memory stays bounded).
func (q *Queue) dropIfEmpty(l *lane) {
	if len(l.entries) > 0 {
		return
	}
	q.detach(l)
	delete(l.cls.lanes, l.key)
}

// detach takes a lane out of whichever wait structure holds it.
func (q *Queue) detach(l *lane) {
	c := l.cls
	switch l.where {
	case inReady:
		heap.Remove(&c.ready, l.idx)
	case inCapWait:
		g := l.group
		heap.Remove(&g.lanes, l.idx)
		if g.lanes.Len() == 0 {
			last := c.groups[len(c.groups)-1]
			c.groups[g.idx], last.idx = last, g.idx
			c.groups[len(c.groups)-1] = nil
			c.groups = c.groups[:len(c.groups)-1]
			delete(c.groupBy, g.key)
		}
		l.group = nil
	case inHeld:
		delete(c.held, l)
	}
	l.where = nowhere
}

// block parks a lane whose head cannot go now: in its candidate set's capacity group, or held
// by the gate — with its Hold time armed when that is in the future (a time not in the future
// arms nothing: the head waits for the next wake and is never asked in a loop,
// GATE-PITFALLS 3).
func (q *Queue) block(l *lane, head *Entry, h Host) {
	q.detach(l)
	if head.wait.blocksOnCapacity() {
		c := l.cls
		g := c.groupBy[head.capKey]
		if g == nil {
			g = &capGroup{key: head.capKey, idx: len(c.groups), objective: head.Req.Objective > 0}
			c.groups = append(c.groups, g)
			c.groupBy[head.capKey] = g
		}
		l.where, l.group = inCapWait, g
		heap.Push(&g.lanes, l)
		return
	}
	l.where = inHeld
	l.cls.held[l] = struct{}{}
	l.holdUntil, l.sessionOnly, l.gateWakes = head.holdUntil, head.sessionOnly, head.gateWakes
	if !head.holdUntil.IsZero() && head.holdUntil.After(q.cfg.Now()) {
		q.arm(h, head.holdUntil)
	}
}

// ready makes a lane's head eligible to be asked in the next pump.
func (q *Queue) ready(l *lane) {
	if len(l.entries) == 0 || l.where == inReady {
		return
	}
	q.detach(l)
	l.holdUntil = time.Time{}
	l.where = inReady
	heap.Push(&l.cls.ready, l)
}

// pop removes a dispatched head from its lane.
func (q *Queue) pop(e *Entry) {
	l := e.lane
	l.entries[0] = nil
	l.entries = l.entries[1:]
	q.count(l, e, -1)
	q.unexpire(e)
	if q.byKey != nil {
		delete(q.byKey, e.Req.Key)
	}
	if len(l.entries) == 0 {
		q.dropIfEmpty(l)
		return
	}
	// A new head: it goes back to being asked with the others.
	q.ready(l)
	heap.Fix(&l.cls.ready, l.idx)
}

// laneHeap orders one class's lanes by their heads, as the class orders requests.
type laneHeap []*lane

func (h laneHeap) Len() int           { return len(h) }
func (h laneHeap) Less(i, j int) bool { return h[i].cls.before(h[i].head(), h[j].head()) }
func (h laneHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *laneHeap) Push(x any) {
	l := x.(*lane)
	l.idx = len(*h)
	*h = append(*h, l)
}
func (h *laneHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return l
}
