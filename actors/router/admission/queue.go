package admission

import (
	"container/heap"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
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
	// ErrClassifierFailed: the policy panicked classifying the request or checking it as a
	// lane head (R15.3): that request fails (500 internal_error) and the queue goes on.
	ErrClassifierFailed = errors.New("the admission classifier failed")
)

// ClassConfig is one class.
type ClassConfig struct {
	Name string
	// Quantum is the DRR weight, ≥ 1: requests per round (Cost requests) or uncached prompt
	// tokens per round (Cost uncached_tokens).
	Quantum    int
	QueueLimit int           // 0: never queues
	MaxWait    time.Duration // > 0
	// Priority orders classes strictly (R15.2): a class is served only while no class of a
	// higher priority has a head that can go; classes of equal priority share by DRR.
	Priority int
	Order    Order // how a class's waiting requests are ordered
	Cost     Cost  // what a dispatch costs a class's DRR credit
}

// Order is how a class orders its waiting requests (R15.2).
type Order uint8

const (
	// OrderFCFS serves a class's requests oldest first.
	OrderFCFS Order = iota
	// OrderWSPT serves the fewest estimated uncached tokens first (the uncached prompt and the
	// most the request may generate, Request.OutputTokens), ties oldest first. A
	// session's turns keep their own order: only which lane goes next, and the order within
	// shared and classifier lanes, follow the estimate.
	OrderWSPT
)

// Orders are the orders by configuration name.
var Orders = map[string]Order{"fcfs": OrderFCFS, "wspt": OrderWSPT}

// Cost is what one dispatch costs a class's DRR credit (R15.2).
type Cost uint8

const (
	// CostRequests: one per request; the quantum is requests per round.
	CostRequests Cost = iota
	// CostUncachedTokens: the request's estimated uncached tokens (its uncached prompt and the
	// most it may generate; at least 1), taken
	// when it is admitted; the quantum is tokens per round.
	CostUncachedTokens
)

// Costs are the costs by configuration name.
var Costs = map[string]Cost{"requests": CostRequests, "uncached_tokens": CostUncachedTokens}

// LaneLimit overrides the class limits for a classifier-named lane (cold_pool's "cold").
type LaneLimit struct {
	QueueLimit int
	MaxWait    time.Duration
}

// Config configures a queue.
type Config struct {
	Classes      []ClassConfig
	DefaultClass string
	// Lanes are limits of classifier-named lanes; a policy that is a LaneLimiter adds its own.
	Lanes  map[string]LaneLimit
	Policy Policy // nil: the default classifier and no gate
	Now    func() time.Time
	// Recheck wakes held heads periodically while anything is queued, whatever the policy
	// (GATE-PITFALLS 2, 11); the gate's own Recheck applies when shorter. 0 = only the gate's.
	Recheck time.Duration
	// Unbounded: no busy threshold is configured, so no worker is ever full and the capacity
	// check only asks that a candidate exists (the gate is still asked first, GATE-PITFALLS 1).
	Unbounded bool
	// OnDecision observes every gate answer (metrics); may be nil.
	OnDecision func(d Decision)
}

type entryState uint8

const (
	queued entryState = iota
	dispatched
	left // cancelled, expired, rejected or completed
)

// Entry is one request in (or through) the queue.
type Entry struct {
	Req     *Request
	Payload any // the owner's own data (the pick and who to answer)
	// Route is the candidate pool before Allowed narrowing (the owner fills it).
	Route []string
	// Pool names the pool the owner dispatches the entry to (its model and role). Entries with
	// the same Pool and Allowed see the same workers: they share a shared lane, and one found
	// with every worker full stands for all of them until capacity changes.
	Pool string

	state    entryState
	seq      uint64
	enqueued time.Time
	deadline time.Time
	lane     *lane
	worker   string
	dlIdx    int
	capKey   string // Pool and Allowed: entries with equal keys see the same candidates
	// uncached is the estimated uncached tokens when admitted (the prompt less the best
	// cached prefix among its candidates, and the most it may generate), for classes that
	// order or charge by it.
	uncached int

	// Why the entry waits, for the admin view.
	wait        Wait
	holdUntil   time.Time
	sessionOnly bool
	gateWakes   bool
}

// Enqueued is when the entry joined the queue (zero when it never waited).
func (e *Entry) Enqueued() time.Time { return e.enqueued }

// Worker is where the entry was dispatched ("" before), the last worker after a Moved.
func (e *Entry) Worker() string { return e.worker }

// Queued reports whether the entry waits in the queue.
func (e *Entry) Queued() bool { return e.state == queued && e.lane != nil }

// Dispatched reports whether the entry left the queue for a worker and has not completed.
func (e *Entry) Dispatched() bool { return e.state == dispatched }

// Waiting is why the entry waits (WaitNone when it does not).
func (e *Entry) Waiting() Wait { return e.wait }

// Queue is the admission queue. It is not safe for concurrent use: its owner (the router
// actor) calls it from one goroutine.
//
// Bounds (R19): every table follows the queued requests, each limited by its class's
// queue_limit (or its named lane's): a lane exists only while it holds one (dropIfEmpty), a
// capacity group while one of its lanes waits in it, held and named while a lane is held or a
// named lane counts one; expiry holds each queued request once and failed only during a pump.
// classes, tiers and lanes-by-name are the configuration's. Empty once nothing is queued
// (TestQueueTablesEmptyAfterRequests).
type Queue struct {
	cfg      Config
	gate     Gate
	observer QueueObserver
	// waker is the gate as a Waker (nil: it is not one), and byKey the queued entries by
	// request key, kept only for it (bounded by the queued requests).
	waker Waker
	byKey map[uint64]*Entry
	wakeF func(uint64) // q.wake, made once: reading the gate's wakes allocates nothing
	// probes is WakeCapacity's scratch: the head asked per class and candidate set among the
	// gate-woken holds (bounded by the candidate sets; cleared after each wake).
	probes  map[string]*lane
	lanes   map[string]LaneLimit
	classes []*class // in configuration order
	tiers   []*tier  // the classes by priority, highest first
	byName  map[string]*class
	seq     uint64
	sessKey [16]byte
	expiry  deadlineHeap
	armed   time.Time
	asks    uint64   // gate Check calls, for tests of the no-spin rule
	panics  uint64   // the policy's panics recovered (R15.3)
	failed  []*Entry // heads the gate failed on, to be rejected after the pump
	pump    uint64   // numbers the pumps: a capacity group found full is skipped for the pump
	// late counts the heads with an objective that could not go in pump late.pump (see
	// MaxLateAsks).
	late struct {
		pump uint64
		n    int
	}
}

// MaxLateAsks bounds the heads with an objective (Request.Objective) that one pump asks in
// vain: each waits in a candidate set of its own, so without a bound every wake would ask
// every one of them (each ask a scan of its pool). Past the bound the rest are not asked in
// that pump; the oldest are asked first, as everywhere.
const MaxLateAsks = 8

// lateFailed counts a head that could not go, when it has an objective.
func (q *Queue) lateFailed(e *Entry) {
	if e.Req.Objective <= 0 {
		return
	}
	if q.late.pump != q.pump {
		q.late.pump, q.late.n = q.pump, 0
	}
	q.late.n++
}

// lateDone reports whether this pump has asked MaxLateAsks heads with an objective in vain.
func (q *Queue) lateDone() bool { return q.late.pump == q.pump && q.late.n >= MaxLateAsks }

// New builds a queue. Unknown or duplicate class names are the caller's to validate.
func New(cfg Config) *Queue {
	q := &Queue{cfg: cfg, byName: make(map[string]*class), lanes: maps.Clone(cfg.Lanes)}
	if q.lanes == nil {
		q.lanes = make(map[string]LaneLimit)
	}
	if cfg.Policy != nil {
		q.gate = cfg.Policy.Gate()
		if w, ok := q.gate.(Waker); ok {
			q.waker, q.byKey, q.probes = w, make(map[uint64]*Entry), make(map[string]*lane)
			q.wakeF = q.wake
		}
		if o, ok := cfg.Policy.(QueueObserver); ok {
			q.observer = o
		}
		if l, ok := cfg.Policy.(LaneLimiter); ok {
			maps.Copy(q.lanes, l.LaneLimits())
		}
	}
	for _, cc := range cfg.Classes {
		cc.Quantum = max(cc.Quantum, 1)
		c := &class{cfg: cc, lanes: make(map[string]*lane), groupBy: make(map[string]*capGroup),
			held: make(map[*lane]struct{}), named: make(map[string]int), byKey: make(map[int]int)}
		q.classes = append(q.classes, c)
		q.byName[cc.Name] = c
		// The tier of its priority (tiers stay sorted, highest first).
		i := slices.IndexFunc(q.tiers, func(t *tier) bool { return t.priority <= cc.Priority })
		if i < 0 {
			i = len(q.tiers)
		}
		if i == len(q.tiers) || q.tiers[i].priority != cc.Priority {
			q.tiers = slices.Insert(q.tiers, i, &tier{priority: cc.Priority})
		}
		t := q.tiers[i]
		c.tier, c.index = t, len(t.classes)
		t.classes = append(t.classes, c)
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
// A class that never queues (queue limit 0) is asked to the gate like any other
// (GATE-PITFALLS 1, 9): what the gate would hold, or what finds no room, is rejected 429.
func (q *Queue) Admit(e *Entry, h Host, cached func([]string) int) {
	r := e.Req
	r.Pool = e.Pool
	if q.cfg.Policy != nil && !q.classify(r, e.Route, cached) {
		e.state = left
		h.Reject(e, ErrClassifierFailed)
		return
	}
	c := q.byName[r.Class]
	if c == nil {
		c = q.byName[q.cfg.DefaultClass]
		r.Class = c.cfg.Name
	}
	if r.Refuse != nil {
		e.state = left // refused before anything was made for it (under a configured class)
		h.Reject(e, r.Refuse)
		return
	}
	e.capKey = e.Pool
	if r.Allowed != nil {
		e.capKey += "\x00" + strings.Join(r.Allowed, "\x00")
	}
	if r.Objective > 0 {
		// A candidate set of its own (see Request.Objective); the key is the queue's
		// internal id, no client's string.
		e.capKey += "\x00o" + strconv.FormatUint(r.Key, 16)
	}
	if c.cfg.Order == OrderWSPT || c.cfg.Cost == CostUncachedTokens {
		// A snapshot at admission: the estimate the request is ordered and charged by.
		if cached != nil {
			r.CachedTokens = min(max(cached(Intersect(e.Route, r.Allowed)), 0), r.PromptTokens)
		}
		e.uncached = max(r.PromptTokens-r.CachedTokens, 0) + max(r.OutputTokens, 0)
	}
	l, key, kind := q.laneOf(c, e)
	// A request asks to go at once when nothing of its lane waits ahead of it: the lane is
	// empty, or (wspt) it would be the lane's new head.
	if l == nil || len(l.entries) == 0 || (sorted(l) && c.before(e, l.head())) {
		if d, ok := q.ask(e, h); ok {
			if w, ok := h.Dispatch(e, d.Target); ok {
				q.dispatched(e, w)
				if l != nil {
					q.dropIfEmpty(l)
				}
				return
			}
			e.wait = WaitCapacity // the host found no room after all
		} else if e.wait == WaitFailed {
			q.failed = q.failed[:len(q.failed)-1] // answered here, not after a pump
			e.state = left
			if q.observer != nil {
				q.observer.Left(r) // classified: the policy may hold state for it
			}
			h.Reject(e, ErrClassifierFailed)
			return
		}
	}
	if l == nil {
		l = q.openLane(c, e, key, kind)
	}
	limit, maxWait, count := c.cfg.QueueLimit, c.cfg.MaxWait, c.queued
	if l.hasLim {
		limit, maxWait, count = l.limit.QueueLimit, l.limit.MaxWait, c.named[l.name]
	}
	if r.Objective > 0 {
		maxWait = min(maxWait, r.Objective)
	}
	var pushOut *Entry // the request this one takes the place of (pushOutFor)
	if count >= limit {
		if !l.hasLim {
			pushOut = q.pushOutFor(c, r.APIKey)
		}
		if pushOut == nil {
			e.state = left
			q.dropIfEmpty(l)
			if q.observer != nil {
				q.observer.Left(r)
			}
			h.Reject(e, ErrQueueFull)
			return
		}
	}
	now := q.cfg.Now()
	q.seq++
	e.seq, e.enqueued, e.deadline, e.lane = q.seq, now, now.Add(maxWait), l
	at := len(l.entries)
	if sorted(l) {
		at, _ = slices.BinarySearchFunc(l.entries, e, func(x, e *Entry) int {
			if c.before(x, e) {
				return -1
			}
			return 1
		})
	}
	l.entries = slices.Insert(l.entries, at, e)
	q.count(l, e, +1)
	if q.byKey != nil {
		q.byKey[r.Key] = e
	}
	heap.Push(&q.expiry, e)
	if q.observer != nil {
		q.observer.Enqueued(r)
	}
	if at == 0 {
		// A new head: the check above held it, so the lane waits for a wake or its time.
		q.block(l, e, h)
	}
	q.arm(h, e.deadline)
	if r := q.recheck(); r > 0 {
		q.arm(h, now.Add(r))
	}
	if pushOut != nil {
		// It leaves as a cancelled request does: a head it exposes is asked at once.
		q.remove(pushOut)
		h.Reject(pushOut, ErrQueueFull)
		q.Pump(h)
	}
}

// pushOutFor is the request a request of API key takes the place of in class c, which is at
// its queue_limit (nil: none; R20, one key cannot fill a class's queue). Each key with
// requests queued in the class is due an equal share of queue_limit, ⌈limit / k⌉ with k those
// keys counting the new request's: a key under its share takes the place of the newest
// request of the key holding the most, when that key holds more than its share; the request
// pushed out is answered ErrQueueFull, as it would have been had it come after this one. A
// key at its share, or a class whose keys all hold at most their share, takes no place.
//
// Worked example: queue_limit 10, key A holds all 10; B comes — k = 2, share 5: A's newest
// leaves (A 9, B 1); B's next requests push out A's until each holds 5. A third key C then
// has share 4 and takes A's and B's newest in turn (the most held first, the lower key index
// on a tie) down to A 4, B 4, C 2. A class with queue_limit 0 (it never queues) has shares of
// 0: nothing is pushed out.
func (q *Queue) pushOutFor(c *class, key int) *Entry {
	k := len(c.byKey)
	mine, queued := c.byKey[key]
	if !queued {
		k++
	}
	share := (c.cfg.QueueLimit + k - 1) / k
	if mine >= share {
		return nil
	}
	victimKey, most := 0, 0
	for vk, n := range c.byKey {
		if n > most || (n == most && vk < victimKey) {
			victimKey, most = vk, n
		}
	}
	if most <= share {
		return nil
	}
	var victim *Entry
	for _, l := range c.lanes {
		for _, x := range l.entries {
			if x.Req.APIKey == victimKey && (victim == nil || x.seq > victim.seq) {
				victim = x
			}
		}
	}
	return victim
}

// classify runs the policy's Classify; a panic in it is recovered and reported false
// (R15.3): the request fails, the classifier stays.
func (q *Queue) classify(r *Request, route []string, cached func([]string) int) (ok bool) {
	class, lane, allowed, tag := r.Class, r.Lane, r.Allowed, r.Tag
	defer func() {
		if p := recover(); p != nil {
			q.panics++
			// Nothing a failed classifier wrote is kept: the class names a configured one
			// (it labels the rejection's metric).
			r.Class, r.Lane, r.Allowed, r.Tag = class, lane, allowed, tag
			if q.byName[r.Class] == nil {
				r.Class = q.cfg.DefaultClass
			}
			ok = false
		}
	}()
	q.cfg.Policy.Classify(r, route, cached)
	return true
}

// check asks the gate about head; a panic in it is recovered and reported false (R15.3).
func (q *Queue) check(head *Request, v View) (d Decision, ok bool) {
	defer func() {
		if p := recover(); p != nil {
			q.panics++
			d, ok = Decision{}, false
		}
	}()
	return q.gate.Check(head, v), true
}

// Panics counts the policy's panics recovered so far (each failed its request).
func (q *Queue) Panics() uint64 { return q.panics }

// count adds d to the queued counts of l's class, for e (in l).
func (q *Queue) count(l *lane, e *Entry, d int) {
	l.cls.queued += d
	l.cls.byKind[l.kind] += d
	if l.cls.byKey[e.Req.APIKey] += d; l.cls.byKey[e.Req.APIKey] == 0 {
		delete(l.cls.byKey, e.Req.APIKey)
	}
	if l.kind == namedLane {
		if l.cls.named[l.name] += d; l.cls.named[l.name] == 0 {
			delete(l.cls.named, l.name)
		}
	}
}

// ask puts one head to the gate and the capacity check; it records why the head waits. A
// head with no candidate worker is never dispatchable, whatever the gate says.
func (q *Queue) ask(e *Entry, h Host) (Decision, bool) {
	v := h.View(e)
	d := Decision{Go: true}
	if q.gate != nil {
		q.asks++
		var ok bool
		if d, ok = q.check(e.Req, v); !ok {
			// The gate failed on this head: it leaves with an error once the pump is over
			// (failHeads); until then its lane is held, so nothing asks it again.
			e.wait, e.holdUntil, e.sessionOnly, e.gateWakes = WaitFailed, time.Time{}, false, false
			q.failed = append(q.failed, e)
			return d, false
		}
		if q.cfg.OnDecision != nil {
			q.cfg.OnDecision(d)
		}
		q.drainWoken()
	}
	e.holdUntil, e.sessionOnly, e.gateWakes = time.Time{}, false, false
	if !d.Go {
		e.wait, e.holdUntil, e.sessionOnly = d.Wait, d.Until, d.SessionOnly
		e.gateWakes = d.GateWakes && q.waker != nil
		if e.wait == WaitNone || e.wait.blocksOnCapacity() {
			e.wait = WaitHeld // a gate hold is never mistaken for a capacity wait
		}
		return d, false
	}
	ws := v.Workers()
	if len(ws) == 0 {
		e.wait = WaitNoWorker
		return d, false
	}
	for _, w := range ws {
		if q.cfg.Unbounded || !w.Full {
			e.wait = WaitNone
			return d, true
		}
	}
	e.wait = WaitCapacity
	return d, false
}

// dispatched records a request leaving for worker: the gate's Dispatched, exactly once.
func (q *Queue) dispatched(e *Entry, worker string) {
	if e.state == dispatched {
		panic("admission: a request dispatched twice")
	}
	e.state, e.worker, e.wait = dispatched, worker, WaitNone
	if q.gate != nil {
		q.gate.Dispatched(e.Req, worker)
		q.drainWoken()
	}
}

// Moved records that a dispatched request goes on on another worker (a failover, a later
// cascade step or a repeated pick): the gate's bookkeeping follows the worker used.
func (q *Queue) Moved(e *Entry, worker string) {
	if e.state != dispatched {
		return
	}
	from := e.worker
	e.worker = worker
	if q.gate != nil {
		q.gate.Moved(e.Req, from, worker)
		q.drainWoken()
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
		q.drainWoken()
	}
	// A completion frees capacity, may end a session's turn and may change what a policy
	// allows on that worker: the session's lanes (in every class: a session's next turn may
	// be of another class) and the classifier lanes are asked again.
	q.readySession(e.Req.SessionID)
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
// once (with its Hold time armed), and so are its session's lanes in the other classes (a gate
// may hold a session's turn behind this one). It reports whether the entry was still queued.
func (q *Queue) Cancel(e *Entry, h Host) bool {
	if !e.Queued() {
		return false
	}
	q.remove(e)
	q.readySession(e.Req.SessionID)
	q.Pump(h)
	return true
}

// readySession makes the heads of session sid's lanes, in every class, eligible to be asked.
func (q *Queue) readySession(sid string) {
	if sid == "" {
		return
	}
	key := q.sessionLaneKey(sid)
	for _, c := range q.classes {
		if l := c.lanes[key]; l != nil {
			q.ready(l)
		}
	}
}

// remove takes a queued entry out of its lane (cancelled or expired).
func (q *Queue) remove(e *Entry) {
	l := e.lane
	wasHead := l.entries[0] == e
	for i, x := range l.entries {
		if x == e {
			l.entries = append(l.entries[:i], l.entries[i+1:]...)
			break
		}
	}
	q.count(l, e, -1)
	e.state = left
	q.unexpire(e)
	if q.byKey != nil {
		delete(q.byKey, e.Req.Key)
	}
	if q.observer != nil {
		q.observer.Left(e.Req)
		q.drainWoken()
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

// drainWoken readies the lanes of the held heads the gate let go of (Waker): each is asked in
// the pump at hand, or the next one.
func (q *Queue) drainWoken() {
	if q.waker != nil {
		q.waker.Woken(q.wakeF)
	}
}

// wake readies the lane of the queued request key if it heads a held lane.
func (q *Queue) wake(key uint64) {
	if e := q.byKey[key]; e != nil && e.lane != nil && e.lane.where == inHeld && e.lane.entries[0] == e {
		q.ready(e.lane)
	}
}

// Len is the number of queued requests.
func (q *Queue) Len() int {
	n := 0
	for _, c := range q.classes {
		n += c.queued
	}
	return n
}
