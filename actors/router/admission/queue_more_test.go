package admission

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// release frees one slot on w and wakes the queue, as a finished request does.
func (h *fakeHost) release(q *Queue, w string) {
	h.loads[w]--
	q.WakeCapacity(h)
}

// TestDRROrderExact: with quanta 2:1 and both classes backlogged, one slot at a time goes
// A A B A A B …: a class keeps its credit while it has some, earns its quantum only when it
// has none, and an empty class's credit resets.
func TestDRROrderExact(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	q := newQueue(h, nil,
		ClassConfig{Name: "A", Quantum: 2, QueueLimit: 100, MaxWait: time.Hour},
		ClassConfig{Name: "B", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour})
	h.loads["w"] = 1
	for i := 0; i < 6; i++ {
		q.Admit(entry("a"+string(rune('0'+i)), "A", "", "w"), h, nil)
		q.Admit(entry("b"+string(rune('0'+i)), "B", "", "w"), h, nil)
	}
	var got []string
	for i := 0; i < 9; i++ {
		h.release(q, "w")
		got = append(got, h.dispatched[len(h.dispatched)-1].Req.Class)
	}
	if want := []string{"A", "A", "B", "A", "A", "B", "A", "A", "B"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestOldestHeadFirst: within a class the oldest head goes first, across session lanes, the
// shared lane and candidate sets.
func TestOldestHeadFirst(t *testing.T) {
	h := newHost("w1", "w2")
	h.threshold = 1
	h.loads["w1"], h.loads["w2"] = 1, 1
	q := newQueue(h, nil)
	mk := func(id, session string, pool string, route ...string) *Entry {
		e := entry(id, "", session, route...)
		e.Pool = pool
		return e
	}
	order := []*Entry{
		mk("x", "s2", "A", "w1"), mk("y", "", "B", "w2"), mk("z", "s1", "A", "w1"),
		mk("u", "", "A", "w1"), mk("v", "s3", "B", "w2"),
	}
	for _, e := range order {
		q.Admit(e, h, nil)
	}
	for range order {
		h.loads["w1"], h.loads["w2"] = 0, 0
		q.WakeCapacity(h)
	}
	// Each wake frees both pools: the oldest head of each set goes, oldest set first.
	if got := ids(h.dispatched); !slices.Equal(got, []string{"x", "y", "z", "v", "u"}) {
		t.Fatalf("dispatch order %v", got)
	}
	if len(q.classes[0].lanes) != 0 || len(q.classes[0].groups) != 0 {
		t.Fatalf("lanes %d, groups %d left after everything went", len(q.classes[0].lanes), len(q.classes[0].groups))
	}
}

// TestRestrictedEntriesSeeTheirOwnSet: entries of one pool narrowed to different workers wait
// in different lanes: one whose set is full does not block one whose set has room.
func TestRestrictedEntriesSeeTheirOwnSet(t *testing.T) {
	h := newHost("w1", "w2")
	h.threshold = 1
	h.loads["w1"], h.loads["w2"] = 1, 1
	q := newQueue(h, nil)
	r1, r2 := entry("r1", "", "", "w1", "w2"), entry("r2", "", "", "w1", "w2")
	r1.Req.Allowed, r2.Req.Allowed = []string{"w1"}, []string{"w2"}
	q.Admit(r1, h, nil)
	q.Admit(r2, h, nil)
	h.release(q, "w2")
	if got := ids(h.dispatched); !slices.Equal(got, []string{"r2"}) || h.dispatched[0].Worker() != "w2" {
		t.Fatalf("dispatched %v", got)
	}
}

// laneClassifier puts every request in the classifier-named lane "cold".
type laneClassifier struct{}

func (laneClassifier) Classify(r *Request, _ []string, _ func([]string) int) { r.Lane = "cold" }
func (laneClassifier) Gate() Gate                                            { return nil }

// TestNamedLaneLimitSpansCandidateSets: a classifier-named lane's own limit and max wait apply
// to its requests whatever their candidate set; the class's limit to the others.
func TestNamedLaneLimitSpansCandidateSets(t *testing.T) {
	h := newHost("w1", "w2")
	h.threshold = 1
	h.loads["w1"], h.loads["w2"] = 1, 1
	q := New(Config{
		Classes:      []ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 100, MaxWait: time.Minute}},
		DefaultClass: "default", Policy: laneClassifier{}, Now: func() time.Time { return h.now },
		Lanes: map[string]LaneLimit{"cold": {QueueLimit: 2, MaxWait: time.Second}},
	})
	mk := func(id, pool, w string) *Entry { e := entry(id, "", "", w); e.Pool = pool; return e }
	c1, c2, c3 := mk("c1", "A", "w1"), mk("c2", "B", "w2"), mk("c3", "A", "w1")
	for _, e := range []*Entry{c1, c2, c3} {
		q.Admit(e, h, nil)
	}
	if !errors.Is(h.rejected[c3], ErrQueueFull) || h.rejected[c1] != nil || h.rejected[c2] != nil {
		t.Fatalf("the lane's limit of 2 across sets: %v", h.rejected)
	}
	q.Cancel(c1, h)
	c4 := mk("c4", "B", "w2")
	q.Admit(c4, h, nil)
	if h.rejected[c4] != nil || q.Len() != 2 {
		t.Fatalf("after a cancel there is room: %v, queued %d", h.rejected[c4], q.Len())
	}
	h.advance(q, time.Second) // the lane's max wait, not the class's
	if !errors.Is(h.rejected[c2], ErrQueueTimeout) || !errors.Is(h.rejected[c4], ErrQueueTimeout) || q.Len() != 0 {
		t.Fatalf("at the lane's max wait: %v %v", h.rejected[c2], h.rejected[c4])
	}
	c5, c6, c7 := mk("c5", "A", "w1"), mk("c6", "A", "w1"), mk("c7", "B", "w2")
	for _, e := range []*Entry{c5, c6, c7} {
		q.Admit(e, h, nil)
	}
	if h.rejected[c5] != nil || h.rejected[c6] != nil || !errors.Is(h.rejected[c7], ErrQueueFull) {
		t.Fatalf("the count went back to zero: %v %v %v", h.rejected[c5], h.rejected[c6], h.rejected[c7])
	}
}

// moveGate records Moved and holds the heads of sessions marked busy.
type moveGate struct {
	holdSessions
	moved []string
}

func (g *moveGate) Moved(r *Request, from, to string) {
	g.moved = append(g.moved, r.ID+":"+from+">"+to)
}

// TestMovedAndCompleted: Moved follows a dispatched request to its new worker (the gate is
// told; a queued or finished one is not moved), Completed uses the last worker and asks the
// request's session lane again.
func TestMovedAndCompleted(t *testing.T) {
	h := newHost("w1", "w2")
	g := &moveGate{holdSessions: *newGate()}
	q := newQueue(h, gatePolicy{g: g})
	e1, e2 := entry("e1", "", "s", "w1", "w2"), entry("e2", "", "s", "w1", "w2")
	q.Admit(e1, h, nil)
	g.held["s"] = true // the session's next turn waits (only its session can release it)
	g.sessionOnly = true
	q.Admit(e2, h, nil)
	if !e1.Dispatched() || !e2.Queued() {
		t.Fatalf("e1 dispatched %v, e2 queued %v", e1.Dispatched(), e2.Queued())
	}
	q.Moved(e2, "w2") // queued: nothing to move
	q.Moved(e1, "w2")
	if e1.Worker() != "w2" || !slices.Equal(g.moved, []string{"e1:w1>w2"}) {
		t.Fatalf("moved %v, worker %s", g.moved, e1.Worker())
	}
	delete(g.held, "s")
	q.WakeCapacity(h) // a capacity free does not ask a session-only hold
	if e2.Dispatched() {
		t.Fatal("a capacity free asked a head only its session can release")
	}
	q.Completed(e1, h)
	if !e2.Dispatched() || g.completed["e1"] != 1 {
		t.Fatalf("the end of the session's turn: e2 dispatched %v, gate told %d times", e2.Dispatched(), g.completed["e1"])
	}
	q.Moved(e1, "w1") // completed: nothing to move
	if len(g.moved) != 1 {
		t.Fatalf("moved %v", g.moved)
	}
	plain := newQueue(h, nil)
	e3 := entry("e3", "", "", "w1")
	plain.Admit(e3, h, nil)
	plain.Moved(e3, "w2") // no gate: nothing to tell
	plain.Completed(e3, h)
	if e3.Worker() != "w2" || e3.Dispatched() {
		t.Fatalf("worker %s, still dispatched %v", e3.Worker(), e3.Dispatched())
	}
}

// TestRecheckIntervals: with no recheck anywhere, a tick for another reason (an expiry) does
// not ask a held head again; otherwise held heads are asked at every min(queue's, gate's)
// recheck, the next one armed from each tick.
func TestRecheckIntervals(t *testing.T) {
	for _, c := range []struct {
		name        string
		queue, gate time.Duration
		asks        uint64 // in the first second
	}{
		{"none", 0, 0, 0}, // the expiry at 500 ms asks nobody
		{"queue only", 250 * time.Millisecond, 0, 5},              // 250 (both), 500, 750, 1000
		{"gate shorter", time.Second, 200 * time.Millisecond, 7},  // 200, 400 (both), 500, 700, 900
		{"queue shorter", 500 * time.Millisecond, time.Second, 2}, // 500, 1000
		{"gate only", 0, 300 * time.Millisecond, 4},               // 300 (both), 500, 800
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost("w")
			g := newGate()
			g.held["held"], g.held["short"], g.recheck = true, true, c.gate
			q := New(Config{
				Classes: []ClassConfig{{Name: "long", Quantum: 1, QueueLimit: 10, MaxWait: 10 * time.Second},
					{Name: "short", Quantum: 1, QueueLimit: 10, MaxWait: 500 * time.Millisecond}},
				DefaultClass: "long", Policy: gatePolicy{g: g}, Now: func() time.Time { return h.now }, Recheck: c.queue,
			})
			q.Admit(entry("held", "long", "", "w"), h, nil)
			q.Admit(entry("short", "short", "", "w"), h, nil)
			asks0 := q.GateAsks()
			h.advance(q, time.Second)
			if got := q.GateAsks() - asks0; got != c.asks {
				t.Fatalf("asks in the first second: %d, want %d", got, c.asks)
			}
			if q.Len() != 1 {
				t.Fatalf("queued %d, want the long one", q.Len())
			}
		})
	}
}

// TestSessionLaneNextHeadGoes: when a session lane's head is dispatched, the next one is asked
// on the next capacity free.
func TestSessionLaneNextHeadGoes(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil)
	e1, e2 := entry("e1", "", "s", "w"), entry("e2", "", "s", "w")
	q.Admit(e1, h, nil)
	q.Admit(e2, h, nil)
	h.release(q, "w")
	h.release(q, "w")
	if got := ids(h.dispatched); !slices.Equal(got, []string{"e1", "e2"}) {
		t.Fatalf("dispatched %v", got)
	}
}

// TestWaitKinds: the queue's own kinds have their names, a policy's kind is registered once,
// and an unregistered value is "unknown".
func TestWaitKinds(t *testing.T) {
	for w, name := range map[Wait]string{WaitNone: "ready", WaitCapacity: "capacity", WaitNoWorker: "no_worker",
		WaitHeld: "held", waitTest: "test_hold"} {
		if w.String() != name {
			t.Fatalf("%d is %q, want %q", w, w.String(), name)
		}
	}
	if Wait(250).String() != "unknown" {
		t.Fatal("an unregistered wait kind")
	}
	if !WaitCapacity.blocksOnCapacity() || !WaitNoWorker.blocksOnCapacity() || WaitHeld.blocksOnCapacity() {
		t.Fatal("blocksOnCapacity")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a wait kind registered twice did not panic")
		}
	}()
	NewWait("capacity")
}

// TestIntersect: nil allowed is the route; an intersection keeps the route's order; an empty
// one keeps the route (R10.1).
func TestIntersect(t *testing.T) {
	route := []string{"a", "b", "c"}
	for _, c := range []struct {
		allowed, want []string
	}{
		{nil, route},
		{[]string{"c", "a"}, []string{"a", "c"}},
		{[]string{"x"}, route},
		{[]string{}, route},
	} {
		if got := Intersect(route, c.allowed); !slices.Equal(got, c.want) {
			t.Fatalf("Intersect(%v) = %v, want %v", c.allowed, got, c.want)
		}
	}
}

// TestTimersArmed: a queued request arms its deadline and nothing else when no recheck is
// configured; once the queue is empty no timer is armed again.
func TestTimersArmed(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil)
	e := entry("e", "", "", "w")
	q.Admit(e, h, nil)
	if want := []time.Time{h.now.Add(time.Minute)}; !slices.Equal(h.armed, want) {
		t.Fatalf("armed %v, want %v", h.armed, want)
	}
	h.advance(q, time.Minute)
	if !errors.Is(h.rejected[e], ErrQueueTimeout) || len(h.armed) != 1 {
		t.Fatalf("after the expiry: %v, armed %v", h.rejected[e], h.armed)
	}
	if Wait(len(waits.names)).String() != "unknown" {
		t.Fatal("the first unregistered wait kind")
	}
}

// TestDRRCreditOnlyWhenSpent: a class blocked with credit left keeps it and earns no more when
// it is served again; the class after it goes first on the next round.
func TestDRRCreditOnlyWhenSpent(t *testing.T) {
	h := newHost("wa", "wb")
	h.threshold = 1
	h.loads["wa"], h.loads["wb"] = 1, 1
	q := newQueue(h, nil,
		ClassConfig{Name: "A", Quantum: 2, QueueLimit: 100, MaxWait: time.Hour},
		ClassConfig{Name: "B", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour})
	for i := range 4 {
		a, b := entry(fmt.Sprint("a", i), "A", "", "wa"), entry(fmt.Sprint("b", i), "B", "", "wb")
		a.Pool, b.Pool = "pa", "pb"
		q.Admit(a, h, nil)
		q.Admit(b, h, nil)
	}
	h.release(q, "wa") // a0 (A: credit 2, 1 left; a1 blocked)
	h.release(q, "wb") // b0
	h.release(q, "wa") // a1 spends A's last credit
	h.loads["wa"], h.loads["wb"] = 0, 0
	q.WakeCapacity(h) // B's turn first, then A earns anew
	if got := ids(h.dispatched); !slices.Equal(got, []string{"a0", "b0", "a1", "b1", "a2"}) {
		t.Fatalf("order %v", got)
	}
}

// TestImmediateDispatchOpensNoLane: a request that goes at once (shared, session or named
// lane) leaves no lane open; one that waits opens its lane, which closes when it goes.
func TestImmediateDispatchOpensNoLane(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	q := newQueue(h, nil)
	shared, session := entry("a", "", "", "w"), entry("b", "", "s1", "w")
	named := entry("c", "", "", "w")
	named.Req.Lane = "tools"
	for _, e := range []*Entry{shared, session, named} {
		q.Admit(e, h, nil)
		if e.state != dispatched || len(q.classes[0].lanes) != 0 {
			t.Fatalf("%s: state %v, %d lanes open", e.Req.ID, e.state, len(q.classes[0].lanes))
		}
		h.loads["w"] = 0
	}
	h.loads["w"] = 1
	waiting := entry("d", "", "", "w")
	q.Admit(waiting, h, nil)
	if waiting.state == dispatched || len(q.classes[0].lanes) != 1 {
		t.Fatalf("a waiting request: state %v, %d lanes open", waiting.state, len(q.classes[0].lanes))
	}
	h.release(q, "w")
	if waiting.state != dispatched || len(q.classes[0].lanes) != 0 {
		t.Fatalf("after it went: state %v, %d lanes open", waiting.state, len(q.classes[0].lanes))
	}
}

// TestObjectiveWaitsAlone: a request with an objective that its owner cannot dispatch in time
// waits alone: requests after it, with the same objective, another or none, go at once. It
// expires when its objective has passed, before the class's max_wait; once it can be served
// in time, a wake dispatches it. However many wait, a wake asks at most MaxLateAsks of them in
// vain, oldest first.
func TestObjectiveWaitsAlone(t *testing.T) {
	h := newHost("w")
	h.late = map[*Entry]bool{}
	q := newQueue(h, nil)
	admit := func(id string, objective time.Duration, late bool) *Entry {
		e := entry(id, "", "", "w")
		e.Req.Objective = objective
		if late {
			h.late[e] = true
		}
		q.Admit(e, h, nil)
		return e
	}
	late := admit("late", 200*time.Millisecond, true)
	same := admit("same", 200*time.Millisecond, false)
	other := admit("other", 300*time.Millisecond, false)
	plain := admit("plain", 0, false)
	if !late.Queued() {
		t.Fatal("the late request did not wait")
	}
	if same.Queued() || other.Queued() || plain.Queued() || len(h.dispatched) != 3 {
		t.Fatalf("%d dispatched, want the three after the late one", len(h.dispatched))
	}
	var many []*Entry
	for i := range 3 * MaxLateAsks {
		objective := 3 * time.Second
		if i == 3*MaxLateAsks-1 {
			objective = 4 * time.Second // the youngest outlives the others
		}
		many = append(many, admit(fmt.Sprint("many", i), objective, true))
	}
	h.dispatches = 0
	q.WakeCapacity(h)
	if h.dispatches != MaxLateAsks {
		t.Fatalf("a wake made %d dispatch attempts, want %d", h.dispatches, MaxLateAsks)
	}
	// The oldest are asked: the first late one can go now, and does.
	h.advance(q, 100*time.Millisecond)
	delete(h.late, late)
	delete(h.late, many[len(many)-1]) // the youngest could go too, but is not asked this pump
	q.WakeCapacity(h)
	if late.Queued() {
		t.Fatal("the first late request was not dispatched once it could be served in time")
	}
	if !many[len(many)-1].Queued() {
		t.Fatal("the youngest was asked past the bound")
	}
	h.advance(q, 2899*time.Millisecond)
	if _, ok := h.rejected[many[0]]; ok {
		t.Fatal("rejected before its objective passed")
	}
	h.advance(q, time.Millisecond)
	// The others gone, the youngest is asked (the expiry's pump), and goes.
	if youngest := many[len(many)-1]; youngest.Queued() || h.dispatched[len(h.dispatched)-1] != youngest {
		t.Fatal("the youngest was not dispatched once the older ones had left")
	}
	for _, e := range many[:len(many)-1] {
		if err := h.rejected[e]; !errors.Is(err, ErrQueueTimeout) {
			t.Fatalf("%s: %v, want a queue timeout at its objective (max_wait is a minute)", e.Req.ID, err)
		}
	}
	if q.Len() != 0 {
		t.Fatalf("%d still queued", q.Len())
	}
}

// TestLateAsksBoundOnlyObjectives: the bound on vain asks per pump counts and skips only
// requests with an objective: requests without one waiting for full workers are asked after
// the bound is reached (and do not count towards it), so one that can go goes, and a late one
// is still asked after many of them failed.
func TestLateAsksBoundOnlyObjectives(t *testing.T) {
	workers := []string{"v", "late"}
	for i := range MaxLateAsks + 2 {
		workers = append(workers, fmt.Sprint("full", i))
	}
	h := newHost(workers...)
	h.threshold = 1
	h.late = map[*Entry]bool{}
	q := newQueue(h, nil)
	var lates []*Entry
	for i := range MaxLateAsks + 2 { // the oldest: late ones that cannot go
		e := entry(fmt.Sprint("late", i), "", "", "late")
		e.Req.Objective = time.Minute
		h.late[e] = true
		q.Admit(e, h, nil)
		lates = append(lates, e)
	}
	var fulls []*Entry
	for i := range MaxLateAsks + 2 { // then requests without one, each for a full worker of its own
		w := fmt.Sprint("full", i)
		h.loads[w] = 1
		e := entry(fmt.Sprint("f", i), "", "", w)
		e.Req.Allowed = []string{w}
		q.Admit(e, h, nil)
		fulls = append(fulls, e)
	}
	h.loads["v"] = 1
	plain := entry("plain", "", "", "v")
	q.Admit(plain, h, nil)
	canGo := entry("can-go", "", "", "late") // an objective, and room in time once asked
	canGo.Req.Objective = time.Minute
	h.late[canGo] = true
	q.Admit(canGo, h, nil)
	for _, e := range append(append(lates, fulls...), plain, canGo) {
		if !e.Queued() {
			t.Fatalf("%s did not wait", e.Req.ID)
		}
	}
	h.loads["v"] = 0
	delete(h.late, canGo)
	q.WakeCapacity(h)
	if plain.Queued() {
		t.Fatal("a request without an objective was skipped once the late ones reached the bound")
	}
	for _, e := range fulls {
		if !e.Queued() {
			t.Fatalf("%s went to a full worker", e.Req.ID)
		}
	}
	if !canGo.Queued() {
		t.Fatal("a late request past the bound was asked")
	}
	// Without the late ones ahead, the requests without an objective that fail do not use up
	// the bound: the late one that can go is asked, and goes.
	for _, e := range lates {
		q.Cancel(e, h)
	}
	if canGo.Queued() {
		t.Fatal("the late request that could go was not asked after ten failed requests without an objective")
	}
}
