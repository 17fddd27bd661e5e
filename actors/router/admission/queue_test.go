package admission

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// fakeHost is a pool of workers with loads and a busy threshold (0: never full).
type fakeHost struct {
	now        time.Time
	loads      map[string]int64
	threshold  int64
	dispatched []*Entry
	rejected   map[*Entry]error
	armed      []time.Time
	late       map[*Entry]bool // entries no worker can serve in time (an objective's owner refuses them)
	dispatches int             // Dispatch calls
}

func newHost(workers ...string) *fakeHost {
	h := &fakeHost{now: time.Unix(1000, 0), loads: map[string]int64{}, rejected: map[*Entry]error{}}
	for _, w := range workers {
		h.loads[w] = 0
	}
	return h
}

type fakeView struct {
	ws  []Worker
	now time.Time
}

func (v fakeView) Workers() []Worker { return v.ws }
func (v fakeView) Now() time.Time    { return v.now }

func (h *fakeHost) candidates(e *Entry) []string {
	return Intersect(e.Route, e.Req.Allowed)
}

func (h *fakeHost) full(w string) bool { return h.threshold > 0 && h.loads[w] >= h.threshold }

func (h *fakeHost) View(e *Entry) View {
	var ws []Worker
	for _, w := range h.candidates(e) {
		ws = append(ws, Worker{ID: w, Load: h.loads[w], Full: h.full(w)})
	}
	return fakeView{ws: ws, now: h.now}
}

func (h *fakeHost) Dispatch(e *Entry, target string) (string, bool) {
	h.dispatches++
	if h.late[e] {
		return "", false
	}
	best := ""
	for _, w := range h.candidates(e) {
		if h.full(w) {
			continue
		}
		if w == target {
			best = w
			break
		}
		if best == "" || h.loads[w] < h.loads[best] {
			best = w
		}
	}
	if best == "" {
		return "", false
	}
	h.loads[best]++
	h.dispatched = append(h.dispatched, e)
	return best, true
}

func (h *fakeHost) Reject(e *Entry, err error) { h.rejected[e] = err }
func (h *fakeHost) ArmTimer(at time.Time)      { h.armed = append(h.armed, at) }

// advance moves the fake time and ticks the queue at every armed time passed.
func (h *fakeHost) advance(q *Queue, d time.Duration) {
	end := h.now.Add(d)
	for {
		var next time.Time
		for _, a := range h.armed {
			if a.After(h.now) && !a.After(end) && (next.IsZero() || a.Before(next)) {
				next = a
			}
		}
		if next.IsZero() {
			h.now = end
			return
		}
		h.now = next
		q.Tick(h)
	}
}

func (h *fakeHost) finish(q *Queue, e *Entry) {
	h.loads[e.Worker()]--
	q.Completed(e, h)
}

func newQueue(h *fakeHost, p Policy, classes ...ClassConfig) *Queue {
	if len(classes) == 0 {
		classes = []ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 100, MaxWait: time.Minute}}
	}
	return New(Config{Classes: classes, DefaultClass: classes[0].Name, Policy: p, Now: func() time.Time { return h.now }})
}

func entry(id, class, session string, route ...string) *Entry {
	return &Entry{Req: &Request{Key: key(id), ID: id, Class: class, SessionID: session}, Route: route, Pool: "p"}
}

// TestDRRShares: with quanta 3:1 and both classes backlogged, dispatch shares are 0.75/0.25
// within ±0.02 over 1,000 dispatches.
func TestDRRShares(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	q := newQueue(h, nil,
		ClassConfig{Name: "gold", Quantum: 3, QueueLimit: 5000, MaxWait: time.Hour},
		ClassConfig{Name: "bronze", Quantum: 1, QueueLimit: 5000, MaxWait: time.Hour})
	h.loads["w"] = 1 // full: everything queues
	for i := 0; i < 1500; i++ {
		q.Admit(entry(fmt.Sprint("g", i), "gold", "", "w"), h, nil)
		q.Admit(entry(fmt.Sprint("b", i), "bronze", "", "w"), h, nil)
	}
	gold := 0
	for i := 0; i < 1000; i++ {
		h.loads["w"] = 0
		before := len(h.dispatched)
		q.WakeCapacity(h)
		if len(h.dispatched) != before+1 {
			t.Fatalf("a capacity free dispatched %d", len(h.dispatched)-before)
		}
		if h.dispatched[len(h.dispatched)-1].Req.Class == "gold" {
			gold++
		}
	}
	if share := float64(gold) / 1000; math.Abs(share-0.75) > 0.02 {
		t.Fatalf("gold share %.3f, want 0.75 ± 0.02", share)
	}
}

// holdSessions is a gate that holds every head of the listed sessions.
type holdSessions struct {
	held        map[string]bool
	dispatched  map[string]int
	completed   map[string]int
	until       time.Time
	sessionOnly bool
	recheck     time.Duration
}

var waitTest = NewWait("test_hold")

func (g *holdSessions) Check(r *Request, v View) Decision {
	if g.held[r.SessionID] || g.held[r.ID] {
		return Decision{Until: g.until, Wait: waitTest, SessionOnly: g.sessionOnly}
	}
	return Decision{Go: true}
}
func (g *holdSessions) Dispatched(r *Request, _ string) { g.dispatched[r.ID]++ }
func (g *holdSessions) Completed(r *Request, _ string)  { g.completed[r.ID]++ }
func (g *holdSessions) Moved(*Request, string, string)  {}
func (g *holdSessions) Recheck() time.Duration          { return g.recheck }

type gatePolicy struct {
	g    Gate
	lane func(*Request)
}

func (p gatePolicy) Classify(r *Request, _ []string, _ func([]string) int) {
	if p.lane != nil {
		p.lane(r)
	}
}
func (p gatePolicy) Gate() Gate { return p.g }

func newGate() *holdSessions {
	return &holdSessions{held: map[string]bool{}, dispatched: map[string]int{}, completed: map[string]int{}}
}

// TestHeldSessionBlocksOnlyItself: a held session head blocks only its session; requests of
// other sessions and of no session go.
func TestHeldSessionBlocksOnlyItself(t *testing.T) {
	h := newHost("w1", "w2")
	g := newGate()
	g.held["alice"] = true
	q := newQueue(h, gatePolicy{g: g})
	a1, a2 := entry("a1", "", "alice", "w1", "w2"), entry("a2", "", "alice", "w1", "w2")
	b1, n1 := entry("b1", "", "bob", "w1", "w2"), entry("n1", "", "", "w1", "w2")
	for _, e := range []*Entry{a1, a2, b1, n1} {
		q.Admit(e, h, nil)
	}
	if got := ids(h.dispatched); !slices.Equal(got, []string{"b1", "n1"}) {
		t.Fatalf("dispatched %v, want [b1 n1]", got)
	}
	if q.Len() != 2 || a1.Waiting() != waitTest {
		t.Fatalf("queued %d, hold %v", q.Len(), a1.Waiting())
	}
	delete(g.held, "alice")
	q.Wake(h)
	if got := ids(h.dispatched); !slices.Equal(got, []string{"b1", "n1", "a1", "a2"}) {
		t.Fatalf("after release: %v", got)
	}
}

func ids(es []*Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Req.ID)
	}
	return out
}

// TestClassifierLaneKeepsHeldHeadOutOfSharedLane: a classifier-named lane keeps a held head
// out of the shared lane; the negative control (no lane) shows the shared lane blocked.
func TestClassifierLaneKeepsHeldHeadOutOfSharedLane(t *testing.T) {
	for _, withLane := range []bool{true, false} {
		h := newHost("w1")
		g := newGate()
		g.held["big"] = true
		lane := func(r *Request) {
			if withLane && r.ID == "big" {
				r.Lane = "cold"
			}
		}
		q := newQueue(h, gatePolicy{g: g, lane: lane})
		q.Admit(entry("big", "", "", "w1"), h, nil)
		q.Admit(entry("small", "", "", "w1"), h, nil)
		got := ids(h.dispatched)
		if withLane && !slices.Equal(got, []string{"small"}) {
			t.Fatalf("with a lane: dispatched %v, want [small]", got)
		}
		if !withLane && len(got) != 0 {
			t.Fatalf("negative control: the shared lane should be blocked by the held head, dispatched %v", got)
		}
	}
}

// TestHoldInThePastDoesNotSpin: a Hold whose time is not in the future arms no timer and the
// gate is asked a bounded number of times.
func TestHoldInThePastDoesNotSpin(t *testing.T) {
	h := newHost("w1")
	g := newGate()
	g.held["x"] = true
	g.until = h.now.Add(-time.Second)
	q := newQueue(h, gatePolicy{g: g})
	q.Admit(entry("x", "", "", "w1"), h, nil)
	armedBefore := len(h.armed)
	for i := 0; i < 10; i++ {
		q.Pump(h)
	}
	if q.GateAsks() != 1 {
		t.Fatalf("gate asked %d times without a wake, want 1", q.GateAsks())
	}
	for _, a := range h.armed[armedBefore:] {
		if !a.After(h.now) {
			t.Fatalf("a timer was armed in the past: %v", a)
		}
	}
	for _, a := range h.armed {
		if a.Equal(g.until) {
			t.Fatal("the past Hold time was armed")
		}
	}
	q.Wake(h) // a real wake asks once more
	if q.GateAsks() != 2 {
		t.Fatalf("gate asked %d times after one wake, want 2", q.GateAsks())
	}
}

// TestHoldUntilRechecksExactly: Hold until T asks again at T exactly, not before.
func TestHoldUntilRechecksExactly(t *testing.T) {
	h := newHost("w1")
	g := newGate()
	g.held["x"] = true
	g.until = h.now.Add(3 * time.Second)
	q := newQueue(h, gatePolicy{g: g})
	x := entry("x", "", "", "w1")
	q.Admit(x, h, nil)
	h.advance(q, 3*time.Second-time.Nanosecond)
	if q.GateAsks() != 1 {
		t.Fatalf("asked %d times before T", q.GateAsks())
	}
	delete(g.held, "x")
	h.advance(q, time.Nanosecond)
	if q.GateAsks() != 2 || len(h.dispatched) != 1 {
		t.Fatalf("at T: asked %d, dispatched %d", q.GateAsks(), len(h.dispatched))
	}
}

// TestCapacityFreeWakesHeldHeadWithoutThreshold: with no busy threshold configured, a head the
// gate holds for room is asked again on a capacity free.
func TestCapacityFreeWakesHeldHeadWithoutThreshold(t *testing.T) {
	h := newHost("w1") // threshold 0: never full
	g := newGate()
	g.held["x"] = true
	q := newQueue(h, gatePolicy{g: g})
	q.Admit(entry("x", "", "", "w1"), h, nil)
	delete(g.held, "x")
	q.WakeCapacity(h)
	if len(h.dispatched) != 1 {
		t.Fatal("a capacity free did not wake the held head")
	}
	// A SessionOnly hold is not asked again on a capacity free.
	g2 := newGate()
	g2.held["s"], g2.sessionOnly = true, true
	q2 := newQueue(h, gatePolicy{g: g2})
	q2.Admit(entry("y", "", "s", "w1"), h, nil)
	q2.WakeCapacity(h)
	if q2.GateAsks() != 1 {
		t.Fatalf("a session-only hold was asked again on a capacity free (%d asks)", q2.GateAsks())
	}
}

// TestDispatchedExactlyOnce: every request meets Dispatched exactly once — or never, if it was
// cancelled or expired first — including races between cancellation, expiry and dispatch.
func TestDispatchedExactlyOnce(t *testing.T) {
	h := newHost("w1")
	h.threshold = 1
	g := newGate()
	q := newQueue(h, gatePolicy{g: g}, ClassConfig{Name: "default", Quantum: 1, QueueLimit: 100, MaxWait: 2 * time.Second})
	h.loads["w1"] = 1
	var es []*Entry
	for i := 0; i < 6; i++ {
		e := entry(fmt.Sprint("r", i), "", "", "w1")
		es = append(es, e)
		q.Admit(e, h, nil)
	}
	if !q.Cancel(es[0], h) || q.Cancel(es[0], h) {
		t.Fatal("Cancel must succeed once")
	}
	h.loads["w1"] = 0
	q.WakeCapacity(h) // r1 goes
	if q.Cancel(es[1], h) {
		t.Fatal("cancelling a dispatched request must report false")
	}
	h.finish(q, es[1])
	h.finish(q, es[1]) // a second completion is ignored
	h.advance(q, 2*time.Second)
	for _, e := range es {
		if n := g.dispatched[e.Req.ID]; n > 1 {
			t.Fatalf("%s dispatched %d times", e.Req.ID, n)
		}
		_, rejected := h.rejected[e]
		if g.dispatched[e.Req.ID] == 1 == (rejected || e == es[0]) {
			t.Fatalf("%s: dispatched %d, rejected %v", e.Req.ID, g.dispatched[e.Req.ID], rejected)
		}
		if g.completed[e.Req.ID] > 1 {
			t.Fatalf("%s completed %d times", e.Req.ID, g.completed[e.Req.ID])
		}
	}
	if q.Len() != 0 {
		t.Fatalf("%d left queued", q.Len())
	}
}

// TestLimitsAndExpiry: over queue_limit 429; past max_wait 503; queue_limit 0 never queues: it
// is asked to the gate like every class (a hold or no room is 429) and goes through Dispatched.
func TestLimitsAndExpiry(t *testing.T) {
	h := newHost("w1")
	h.threshold = 1
	g := newGate()
	q := newQueue(h, gatePolicy{g: g},
		ClassConfig{Name: "std", Quantum: 1, QueueLimit: 2, MaxWait: 5 * time.Second},
		ClassConfig{Name: "rt", Quantum: 1, QueueLimit: 0, MaxWait: time.Second})
	h.loads["w1"] = 1
	a, b, c := entry("a", "std", "", "w1"), entry("b", "std", "", "w1"), entry("c", "std", "", "w1")
	q.Admit(a, h, nil)
	q.Admit(b, h, nil)
	q.Admit(c, h, nil)
	if !errors.Is(h.rejected[c], ErrQueueFull) {
		t.Fatalf("over the limit: %v", h.rejected[c])
	}
	rt := entry("rt1", "rt", "", "w1")
	q.Admit(rt, h, nil)
	if !errors.Is(h.rejected[rt], ErrQueueFull) || q.GateAsks() != 2 {
		t.Fatalf("queue_limit 0 with no room: %v, asks %d", h.rejected[rt], q.GateAsks())
	}
	h.loads["w1"] = 0
	rt2 := entry("rt2", "rt", "", "w1")
	q.Admit(rt2, h, nil)
	if g.dispatched["rt2"] != 1 || q.GateAsks() != 3 {
		t.Fatalf("queue_limit 0 with room: dispatched %d, asks %d", g.dispatched["rt2"], q.GateAsks())
	}
	g.held["rt3"] = true
	rt3 := entry("rt3", "rt", "", "w1")
	q.Admit(rt3, h, nil)
	if !errors.Is(h.rejected[rt3], ErrQueueFull) || g.dispatched["rt3"] != 0 || q.GateAsks() != 4 {
		t.Fatalf("queue_limit 0 held by the gate: %v, dispatched %d", h.rejected[rt3], g.dispatched["rt3"])
	}
	h.advance(q, 5*time.Second-time.Nanosecond)
	if len(h.rejected) != 3 {
		t.Fatalf("expired early: %v", h.rejected)
	}
	h.advance(q, time.Nanosecond)
	if !errors.Is(h.rejected[a], ErrQueueTimeout) || !errors.Is(h.rejected[b], ErrQueueTimeout) {
		t.Fatalf("at max_wait: %v %v", h.rejected[a], h.rejected[b])
	}
}

// TestCancelExposesHeadWithTimer: cancelling a head makes the next head be asked at once and
// its own Hold time armed (GATE-PITFALLS 5).
func TestCancelExposesHeadWithTimer(t *testing.T) {
	h := newHost("w1")
	g := newGate()
	g.held["first"] = true
	g.held["second"] = true
	q := newQueue(h, gatePolicy{g: g})
	first, second := entry("first", "", "", "w1"), entry("second", "", "", "w1")
	q.Admit(first, h, nil)
	q.Admit(second, h, nil)
	g.until = h.now.Add(4 * time.Second)
	q.Cancel(first, h)
	if second.holdUntil != g.until {
		t.Fatalf("exposed head not asked (until %v)", second.holdUntil)
	}
	delete(g.held, "second")
	h.advance(q, 4*time.Second)
	if len(h.dispatched) != 1 || h.dispatched[0] != second {
		t.Fatal("the exposed head's Hold time did not fire")
	}
}

// key is a test request's internal key, derived from its readable id.
func key(id string) uint64 { return xxhash.Sum64String(id) }
