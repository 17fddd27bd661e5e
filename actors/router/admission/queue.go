package admission

import (
	"container/heap"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Host is what the queue needs of its owner (the router actor). Every call happens on the
// owner's goroutine.
type Host interface {
	// View is the entry's candidate workers (its route's pool ∩ Allowed) with their loads.
	View(e *Entry) View
	// Dispatch picks a worker for e (target first when it is a candidate and not full),
	// reserves it and answers the requester. ok is false when no candidate can take it now.
	Dispatch(e *Entry, target string) (worker string, ok bool)
	// Reject answers the requester with err (ErrQueueFull or ErrQueueTimeout).
	Reject(e *Entry, err error)
	// ArmTimer asks for Tick to be called at `at` (the owner keeps one timer for the
	// earliest time asked).
	ArmTimer(at time.Time)
}

// Rejections.
var (
	// ErrQueueFull: the class (or lane) is at its queue limit, or never queues and no worker
	// has room (429 queue_full).
	ErrQueueFull = errors.New("queue full")
	// ErrQueueTimeout: the request waited its class's max_wait (503 queue_timeout).
	ErrQueueTimeout = errors.New("queue timeout")
)

// ClassConfig is one class.
type ClassConfig struct {
	Name       string
	Quantum    int           // DRR weight, ≥ 1 (requests per round)
	QueueLimit int           // 0: never queues
	MaxWait    time.Duration // > 0
}

// LaneLimit overrides the class limits for a classifier-named lane (cold_pool's "cold").
type LaneLimit struct {
	QueueLimit int
	MaxWait    time.Duration
}

// Config configures a queue.
type Config struct {
	Classes      []ClassConfig
	DefaultClass string
	Lanes        map[string]LaneLimit
	Policy       Policy // nil: the default classifier and no gate
	Now          func() time.Time
	// Recheck wakes held heads periodically while anything is queued, whatever the policy
	// (GATE-PITFALLS 2, 11); the gate's own Recheck applies when shorter. 0 = only the gate's.
	Recheck time.Duration
	// Unbounded: no busy threshold is configured, so no worker is ever full and the capacity
	// check is skipped (the gate is still asked first, GATE-PITFALLS 1).
	Unbounded bool
	// OnDecision observes every gate answer (metrics); may be nil.
	OnDecision func(d Decision)
}

type entryState uint8

const (
	queued entryState = iota
	dispatched
	left // cancelled or expired
)

// Entry is one request in (or through) the queue.
type Entry struct {
	Req     *Request
	Payload any // the owner's own data (the pick and who to answer)
	// Route is the candidate pool before Allowed narrowing (the owner fills it).
	Route []string

	state    entryState
	seq      uint64
	enqueued time.Time
	deadline time.Time
	lane     *lane
	worker   string
	dlIdx    int

	// Why the entry waits, for the admin view.
	HoldReason  string
	HoldUntil   time.Time
	sessionOnly bool
}

// Enqueued is when the entry joined the queue (zero when it never waited).
func (e *Entry) Enqueued() time.Time { return e.enqueued }

// Worker is where the entry was dispatched ("" before).
func (e *Entry) Worker() string { return e.worker }

type laneKind uint8

const (
	sharedLane laneKind = iota
	sessionLane
	namedLane
)

func (k laneKind) String() string {
	switch k {
	case sessionLane:
		return "session"
	case namedLane:
		return "classifier"
	}
	return "shared"
}

type lane struct {
	key     string
	kind    laneKind
	cls     *class
	entries []*Entry // FIFO; entries[0] is the head
	limit   LaneLimit
	hasLim  bool
	// Scheduling state: where the lane waits (idx is its place in that heap).
	where       laneWhere
	idx         int
	holdUntil   time.Time
	sessionOnly bool // the gate said only the session's own completion can release it
}

type laneWhere uint8

const (
	nowhere   laneWhere = iota
	inReady             // its head may be dispatchable: asked in the next pump
	inCapWait           // its head found every candidate full: asked again when capacity frees
	inHeld              // the gate holds its head: asked again at a wake or its Hold time
)

func (l *lane) head() *Entry { return l.entries[0] }

type class struct {
	cfg     ClassConfig
	deficit int
	lanes   map[string]*lane
	ready   laneHeap           // lanes whose head may be dispatchable, oldest head first
	capWait laneHeap           // lanes blocked on capacity, oldest head first
	held    map[*lane]struct{} // lanes the gate holds
	queued  int
	byKind  [3]int // queued per lane kind
	index   int
	// capFull: in this pump, an unrestricted head found every worker full, so other
	// unrestricted capacity-blocked heads would too; they are not asked again until capacity
	// changes (a capacity free asks one head, not every lane).
	capFull bool
}

// Queue is the admission queue. It is not safe for concurrent use: its owner (the router
// actor) calls it from one goroutine.
type Queue struct {
	cfg      Config
	gate     Gate
	observer QueueObserver
	classes  []*class
	byName   map[string]*class
	cursor   int
	carry    *class
	seq      uint64
	sessKey  [16]byte
	expiry   deadlineHeap
	armed    time.Time
	asks     uint64 // gate Check calls, for tests of the no-spin rule
}

// QueueObserver is an optional policy interface: told when a request joins the queue and
// when it leaves without being dispatched (cancelled or expired).
type QueueObserver interface {
	Enqueued(*Request)
	Left(*Request)
}

// New builds a queue. Unknown or duplicate class names are the caller's to validate.
func New(cfg Config) *Queue {
	q := &Queue{cfg: cfg, byName: make(map[string]*class)}
	if cfg.Policy != nil {
		q.gate = cfg.Policy.Gate()
		if o, ok := cfg.Policy.(QueueObserver); ok {
			q.observer = o
		}
	}
	for i, cc := range cfg.Classes {
		if cc.Quantum < 1 {
			cc.Quantum = 1
		}
		c := &class{cfg: cc, lanes: make(map[string]*lane), held: make(map[*lane]struct{}), index: i}
		q.classes = append(q.classes, c)
		q.byName[cc.Name] = c
	}
	_, _ = rand.Read(q.sessKey[:])
	return q
}

// GateAsks counts the gate's Check calls so far.
func (q *Queue) GateAsks() uint64 { return q.asks }

// sessionLaneKey hashes a client-chosen session id with a per-process random key, so no
// client can pick an id that lands in another session's lane (GATE-PITFALLS 12).
func (q *Queue) sessionLaneKey(id string) string {
	var b [8]byte
	d := xxhash.New()
	_, _ = d.Write(q.sessKey[:])
	_, _ = d.WriteString(id)
	binary.LittleEndian.PutUint64(b[:], d.Sum64())
	return "s:" + string(b[:])
}

// Admit classifies a new request and dispatches it at once when its lane is empty, the gate
// says Go and a candidate has room; otherwise it queues it (or rejects it when over a limit).
func (q *Queue) Admit(e *Entry, h Host, cached func([]string) int) {
	r := e.Req
	if q.cfg.Policy != nil {
		q.cfg.Policy.Classify(r, e.Route, cached)
	}
	c := q.byName[r.Class]
	if c == nil {
		c = q.byName[q.cfg.DefaultClass]
		r.Class = c.cfg.Name
	}
	if c.cfg.QueueLimit == 0 {
		// A class that never queues is not asked to the gate (R10.2); it still goes through
		// the gate's Dispatched bookkeeping (GATE-PITFALLS 9).
		if w, ok := h.Dispatch(e, ""); ok {
			q.dispatched(e, w)
			return
		}
		e.state = left
		h.Reject(e, ErrQueueFull)
		return
	}
	l := q.laneFor(c, r)
	if len(l.entries) == 0 {
		if d, ok := q.ask(e, h); ok {
			if w, ok := h.Dispatch(e, d.Target); ok {
				q.dispatched(e, w)
				q.dropIfEmpty(l)
				return
			}
		}
	}
	limit, maxWait := c.cfg.QueueLimit, c.cfg.MaxWait
	if l.hasLim {
		limit, maxWait = l.limit.QueueLimit, l.limit.MaxWait
	}
	count := c.queued
	if l.hasLim {
		count = len(l.entries)
	}
	if count >= limit {
		e.state = left
		q.dropIfEmpty(l)
		h.Reject(e, ErrQueueFull)
		return
	}
	now := q.cfg.Now()
	q.seq++
	e.seq, e.enqueued, e.deadline, e.lane = q.seq, now, now.Add(maxWait), l
	l.entries = append(l.entries, e)
	c.queued++
	c.byKind[l.kind]++
	heap.Push(&q.expiry, e)
	if q.observer != nil {
		q.observer.Enqueued(r)
	}
	if len(l.entries) == 1 {
		// A new head: the check above held it, so the lane waits for a wake or its time.
		q.block(l, e, h)
	}
	q.arm(h, e.deadline)
	if r := q.recheck(); r > 0 {
		q.arm(h, now.Add(r))
	}
}

// laneFor finds (or opens) the request's lane: its classifier-named lane, else its session's,
// else the class's shared lane.
func (q *Queue) laneFor(c *class, r *Request) *lane {
	key, kind := "shared", sharedLane
	switch {
	case r.Lane != "":
		key, kind = "l:"+r.Lane, namedLane
	case r.SessionID != "":
		key, kind = q.sessionLaneKey(r.SessionID), sessionLane
	}
	l := c.lanes[key]
	if l == nil {
		l = &lane{key: key, kind: kind, cls: c, idx: -1}
		if kind == namedLane {
			l.limit, l.hasLim = q.cfg.Lanes[r.Lane]
		}
		c.lanes[key] = l
	}
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
		heap.Remove(&c.capWait, l.idx)
	case inHeld:
		delete(c.held, l)
	}
	l.where, l.idx = nowhere, -1
}

// ask puts one head to the gate and the capacity check; it records why the head waits.
func (q *Queue) ask(e *Entry, h Host) (Decision, bool) {
	v := h.View(e)
	d := Decision{Go: true}
	if q.gate != nil {
		q.asks++
		d = q.gate.Check(e.Req, v)
		if q.cfg.OnDecision != nil {
			q.cfg.OnDecision(d)
		}
	}
	if !d.Go {
		e.HoldReason, e.HoldUntil, e.sessionOnly = d.Reason, d.Until, d.SessionOnly
		if e.HoldReason == "" {
			e.HoldReason = "held"
		}
		return d, false
	}
	if q.cfg.Unbounded {
		e.HoldReason, e.HoldUntil = "", time.Time{}
		return d, true
	}
	for _, w := range v.Workers() {
		if !w.Full {
			e.HoldReason, e.HoldUntil = "", time.Time{}
			return d, true
		}
	}
	e.HoldReason, e.HoldUntil = "capacity", time.Time{}
	return d, false
}

// block parks a lane whose head cannot go now: on capacity, or held by the gate — with its
// Hold time armed when that is in the future (a time not in the future arms nothing: the head
// waits for the next wake and is never asked in a loop, GATE-PITFALLS 3).
func (q *Queue) block(l *lane, head *Entry, h Host) {
	q.detach(l)
	if head.HoldReason == "capacity" {
		l.where = inCapWait
		heap.Push(&l.cls.capWait, l)
		return
	}
	l.where = inHeld
	l.cls.held[l] = struct{}{}
	l.holdUntil, l.sessionOnly = head.HoldUntil, head.sessionOnly
	if !head.HoldUntil.IsZero() && head.HoldUntil.After(q.cfg.Now()) {
		q.arm(h, head.HoldUntil)
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

// Wake asks every held head again and dispatches what it can: called when a worker arrives,
// leaves or drains, and on the gate's periodic recheck.
func (q *Queue) Wake(h Host) {
	for _, c := range q.classes {
		for l := range c.held {
			q.ready(l)
		}
	}
	q.Pump(h)
}

// WakeCapacity is a capacity free (a request finished, a worker's load fell): capacity-blocked
// heads are asked again, oldest first, until the room is used up, and so are held heads —
// a gate may hold for room (GATE-PITFALLS 8) — except those only their session can release.
func (q *Queue) WakeCapacity(h Host) {
	for _, c := range q.classes {
		for l := range c.held {
			if !l.sessionOnly {
				q.ready(l)
			}
		}
	}
	q.Pump(h)
}

// Pump dispatches heads by deficit round robin across classes (cost 1 per request, quantum
// requests per round) until no head can go. The class that still has credit after a dispatch
// is tried first next time without new credit; a class whose head cannot go keeps its credit
// and earns none; an empty class's credit resets. A head that cannot go blocks only its lane.
func (q *Queue) Pump(h Host) {
	n := len(q.classes)
	if n == 0 {
		return
	}
	var retry []*lane // restricted capacity-blocked lanes tried in this pump
	for _, c := range q.classes {
		c.capFull = false
	}
	for {
		c, e, target := q.popNext(h, &retry)
		if e == nil {
			break
		}
		w, ok := h.Dispatch(e, target)
		if !ok {
			e.HoldReason = "capacity"
			q.block(e.lane, e, h)
			continue
		}
		c.deficit--
		q.pop(e)
		q.dispatched(e, w)
		q.cursor = (c.index + 1) % n
		q.carry = nil
		if c.deficit > 0 && c.queued > 0 {
			q.carry = c
		}
		if c.queued == 0 {
			c.deficit = 0
		}
	}
	for _, l := range retry {
		if len(l.entries) > 0 && l.where == nowhere {
			l.where = inCapWait
			heap.Push(&l.cls.capWait, l)
		}
	}
}

// popNext chooses the class and head to dispatch next, crediting the class as DRR says.
func (q *Queue) popNext(h Host, retry *[]*lane) (*class, *Entry, string) {
	if c := q.carry; c != nil {
		if e, t := q.nextHead(c, h, retry); e != nil {
			return c, e, t
		}
	}
	n := len(q.classes)
	for k := 0; k < n; k++ {
		c := q.classes[(q.cursor+k)%n]
		if c.queued == 0 {
			c.deficit = 0
			continue
		}
		e, t := q.nextHead(c, h, retry)
		if e == nil {
			continue // blocked: keeps its credit, earns none
		}
		if c.deficit < 1 {
			c.deficit += c.cfg.Quantum
		}
		return c, e, t
	}
	return nil, nil, ""
}

// nextHead returns the oldest dispatchable head of c — from its ready lanes, or, while capacity
// may have freed, its capacity-blocked ones — blocking the lanes whose heads cannot go.
func (q *Queue) nextHead(c *class, h Host, retry *[]*lane) (*Entry, string) {
	for {
		var l *lane
		fromCap := false
		switch {
		case c.ready.Len() > 0 && (c.capFull || c.capWait.Len() == 0 || c.ready[0].head().seq < c.capWait[0].head().seq):
			l = c.ready[0]
		case !c.capFull && c.capWait.Len() > 0:
			l, fromCap = c.capWait[0], true
		default:
			return nil, ""
		}
		e := l.head()
		d, ok := q.ask(e, h)
		if ok {
			return e, d.Target
		}
		if fromCap && e.HoldReason == "capacity" {
			if e.Req.Allowed == nil {
				c.capFull = true // every unrestricted head would find the same full pool
				continue
			}
			q.detach(l)
			*retry = append(*retry, l)
			continue
		}
		q.block(l, e, h)
	}
}

// pop removes a dispatched head from its lane.
func (q *Queue) pop(e *Entry) {
	l := e.lane
	l.entries[0] = nil
	l.entries = l.entries[1:]
	l.cls.queued--
	l.cls.byKind[l.kind]--
	if e.dlIdx >= 0 && e.dlIdx < q.expiry.Len() && q.expiry[e.dlIdx] == e {
		heap.Remove(&q.expiry, e.dlIdx)
	}
	if len(l.entries) == 0 {
		q.dropIfEmpty(l)
		return
	}
	// A new head: it goes back to being asked with the others.
	q.ready(l)
	heap.Fix(&l.cls.ready, l.idx)
}

// dispatched records a request leaving for worker: the gate's Dispatched, exactly once.
func (q *Queue) dispatched(e *Entry, worker string) {
	if e.state == dispatched {
		panic("admission: a request dispatched twice")
	}
	e.state, e.worker = dispatched, worker
	if q.gate != nil {
		q.gate.Dispatched(e.Req, worker)
	}
}

// Completed is the end of a dispatched request (whatever its outcome): the gate learns it and
// held heads are asked again.
func (q *Queue) Completed(e *Entry, h Host) {
	if e.state != dispatched {
		return
	}
	e.state = left
	if q.gate != nil {
		q.gate.Completed(e.Req, e.worker)
	}
	// A completion frees capacity, may end a session's turn and may change what a policy
	// allows on that worker: its session lane and the classifier lanes are asked again.
	if e.Req.SessionID != "" {
		if c := q.byName[e.Req.Class]; c != nil {
			if l := c.lanes[q.sessionLaneKey(e.Req.SessionID)]; l != nil {
				q.ready(l)
			}
		}
	}
	for _, c := range q.classes {
		for l := range c.held {
			if l.kind == namedLane {
				q.ready(l)
			}
		}
	}
	q.Pump(h)
}

// Cancel removes a queued request whose client left; the lane head exposed by it is asked at
// once (with its Hold time armed). It reports whether the entry was still queued.
func (q *Queue) Cancel(e *Entry, h Host) bool {
	if e.state != queued || e.lane == nil {
		return false
	}
	q.remove(e)
	q.Pump(h)
	return true
}

func (q *Queue) remove(e *Entry) {
	l := e.lane
	wasHead := l.entries[0] == e
	for i, x := range l.entries {
		if x == e {
			l.entries = append(l.entries[:i], l.entries[i+1:]...)
			break
		}
	}
	l.cls.queued--
	l.cls.byKind[l.kind]--
	e.state = left
	if e.dlIdx >= 0 && e.dlIdx < q.expiry.Len() && q.expiry[e.dlIdx] == e {
		heap.Remove(&q.expiry, e.dlIdx)
	}
	if q.observer != nil {
		q.observer.Left(e.Req)
	}
	if len(l.entries) == 0 {
		q.dropIfEmpty(l)
		return
	}
	if wasHead {
		// The exposed head is asked at once, with its own Hold time armed (GATE-PITFALLS 5).
		q.ready(l)
		heap.Fix(&l.cls.ready, l.idx)
	}
}

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
	if q.recheck() > 0 && q.Len() > 0 {
		q.Wake(h)
	} else {
		q.Pump(h)
	}
	q.rearm(h)
}

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

// Len is the number of queued requests.
func (q *Queue) Len() int {
	n := 0
	for _, c := range q.classes {
		n += c.queued
	}
	return n
}

// laneHeap orders lanes by their head's arrival.
type laneHeap []*lane

func (h laneHeap) Len() int           { return len(h) }
func (h laneHeap) Less(i, j int) bool { return h[i].head().seq < h[j].head().seq }
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
	l.idx = -1
	return l
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
	e.dlIdx = -1
	return e
}
