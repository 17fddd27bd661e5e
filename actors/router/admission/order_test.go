package admission

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// sized is an entry whose prompt is tokens long (nothing cached).
func sized(id, class, session string, tokens int, route ...string) *Entry {
	e := entry(id, class, session, route...)
	e.Req.PromptTokens = tokens
	return e
}

// drain frees one slot of w at a time and returns the ids dispatched, in order.
func drain(h *fakeHost, q *Queue, w string, n int) []string {
	var got []string
	for range n {
		before := len(h.dispatched)
		h.release(q, w)
		for _, e := range h.dispatched[before:] {
			got = append(got, e.Req.ID)
		}
	}
	return got
}

// TestStrictPriorityDrainsFirst (R15.2; upstream test_strict_priority_drains_before_policy_score):
// a higher class drains completely before a lower one gets a slot, whatever the quanta; a
// lower class goes while the higher one's heads cannot (their workers are full), so priority
// never idles a worker.
func TestStrictPriorityDrainsFirst(t *testing.T) {
	h := newHost("w", "v")
	h.threshold = 1
	h.loads["w"], h.loads["v"] = 1, 1
	q := newQueue(h, nil,
		ClassConfig{Name: "lo", Quantum: 100, QueueLimit: 100, MaxWait: time.Hour},
		ClassConfig{Name: "hi", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour, Priority: 5})
	for i := range 3 {
		q.Admit(entry(fmt.Sprint("lo", i), "lo", "", "w"), h, nil)
		q.Admit(entry(fmt.Sprint("hi", i), "hi", "", "w"), h, nil)
	}
	if got, want := drain(h, q, "w", 6), []string{"hi0", "hi1", "hi2", "lo0", "lo1", "lo2"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	// hi waits for v (full); lo, for w, goes when w frees.
	q.Admit(entry("hi-v", "hi", "", "v"), h, nil)
	q.Admit(entry("lo-w", "lo", "", "w"), h, nil)
	if got := drain(h, q, "w", 1); !slices.Equal(got, []string{"lo-w"}) {
		t.Fatalf("with the high class's worker full, a free slot elsewhere went to %v", got)
	}
	if got := drain(h, q, "v", 1); !slices.Equal(got, []string{"hi-v"}) {
		t.Fatalf("got %v", got)
	}
}

// TestEqualPriorityIsDRR: classes of one priority still share by their quanta, below a
// higher class.
func TestEqualPriorityIsDRR(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil,
		ClassConfig{Name: "a", Quantum: 2, QueueLimit: 100, MaxWait: time.Hour, Priority: 1},
		ClassConfig{Name: "b", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour, Priority: 1},
		ClassConfig{Name: "top", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour, Priority: 2})
	for i := range 4 {
		q.Admit(entry(fmt.Sprint("a", i), "a", "", "w"), h, nil)
		q.Admit(entry(fmt.Sprint("b", i), "b", "", "w"), h, nil)
	}
	q.Admit(entry("top", "top", "", "w"), h, nil)
	if got, want := drain(h, q, "w", 7), []string{"top", "a0", "a1", "b0", "a2", "a3", "b1"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestFCFSAndWSPTOrderOnlyWithinEachClass (R15.2; upstream fcfs_and_wspt_order_only_within_each_class):
// a wspt class serves its fewest uncached tokens first (ties oldest first), an fcfs class
// its oldest first, and DRR between them is untouched by either order.
func TestFCFSAndWSPTOrderOnlyWithinEachClass(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil,
		ClassConfig{Name: "wspt", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour, Order: OrderWSPT},
		ClassConfig{Name: "fcfs", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour})
	for i, n := range []int{300, 100, 200, 100} {
		q.Admit(sized(fmt.Sprint("w", i, "-", n), "wspt", "", n, "w"), h, nil)
		q.Admit(sized(fmt.Sprint("f", i, "-", n), "fcfs", "", n, "w"), h, nil)
	}
	want := []string{"w1-100", "f0-300", "w3-100", "f1-100", "w2-200", "f2-200", "w0-300", "f3-100"}
	if got := drain(h, q, "w", 8); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestWSPTKeepsSessionTurnsInOrder: in a wspt class a session's turns keep their order (a
// smaller later turn never overtakes an earlier one), while lanes are chosen by their heads.
func TestWSPTKeepsSessionTurnsInOrder(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil, ClassConfig{Name: "c", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour, Order: OrderWSPT})
	q.Admit(sized("s-big", "c", "s", 500, "w"), h, nil)
	q.Admit(sized("s-small", "c", "s", 10, "w"), h, nil)
	q.Admit(sized("shared-mid", "c", "", 100, "w"), h, nil)
	if got, want := drain(h, q, "w", 3), []string{"shared-mid", "s-big", "s-small"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestWSPTUsesUncachedTokens: the estimate is the prompt less its best cached prefix among
// the request's candidates, taken at admission: a long prompt mostly cached goes before a
// shorter one with nothing cached.
func TestWSPTUsesUncachedTokens(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil, ClassConfig{Name: "c", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour, Order: OrderWSPT})
	cachedFor := func(n int) func([]string) int {
		return func(ws []string) int {
			if !slices.Equal(ws, []string{"w"}) {
				t.Errorf("cached asked over %v, want the candidates [w]", ws)
			}
			return n
		}
	}
	short, long := sized("short", "c", "", 200, "w"), sized("long-cached", "c", "", 1000, "w")
	q.Admit(short, h, cachedFor(0))
	q.Admit(long, h, cachedFor(950))
	if long.Req.CachedTokens != 950 || long.uncached != 50 || short.uncached != 200 {
		t.Fatalf("cached %d, uncached %d and %d", long.Req.CachedTokens, long.uncached, short.uncached)
	}
	over := sized("over", "c", "", 10, "w")
	q.Admit(over, h, cachedFor(99)) // a prefix longer than the prompt counts as the prompt
	if over.uncached != 0 || over.Req.CachedTokens != 10 {
		t.Fatalf("over-cached: cached %d, uncached %d", over.Req.CachedTokens, over.uncached)
	}
	if got, want := drain(h, q, "w", 3), []string{"over", "long-cached", "short"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestWSPTCountsWhatARequestMayGenerate (R20, issue 35 item 7): the estimate adds the most a
// request may generate (its prompts × n × max_tokens) to its uncached prompt, so a short prompt
// asking for a long answer is not served as a short request — and a class charging by
// uncached tokens is charged for it.
func TestWSPTCountsWhatARequestMayGenerate(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil, ClassConfig{Name: "c", Quantum: 1, QueueLimit: 100, MaxWait: time.Hour, Order: OrderWSPT, Cost: CostUncachedTokens})
	long := sized("short-prompt-long-answer", "c", "", 10, "w")
	long.Req.OutputTokens = 4000
	mid := sized("mid", "c", "", 500, "w")
	mid.Req.OutputTokens = 16
	q.Admit(long, h, nil)
	q.Admit(mid, h, nil)
	if long.uncached != 4010 || mid.uncached != 516 || q.byName["c"].cost(long) != 4010 {
		t.Fatalf("estimates %d and %d", long.uncached, mid.uncached)
	}
	if got, want := drain(h, q, "w", 2), []string{"mid", "short-prompt-long-answer"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestDRRChargesUncachedTokens (R15.2 cost = uncached_tokens): with equal quanta, two
// backlogged classes get equal uncached tokens, not equal requests — a class of 30-token
// requests gets one slot for every three of a class of 10-token requests.
func TestDRRChargesUncachedTokens(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil,
		ClassConfig{Name: "big", Quantum: 10, QueueLimit: 1000, MaxWait: time.Hour, Cost: CostUncachedTokens},
		ClassConfig{Name: "small", Quantum: 10, QueueLimit: 1000, MaxWait: time.Hour, Cost: CostUncachedTokens})
	for i := range 200 {
		q.Admit(sized(fmt.Sprint("big", i), "big", "", 30, "w"), h, nil)
		q.Admit(sized(fmt.Sprint("small", i), "small", "", 10, "w"), h, nil)
	}
	tokens := map[string]int{}
	for _, id := range drain(h, q, "w", 200) {
		if id[0] == 'b' {
			tokens["big"] += 30
		} else {
			tokens["small"] += 10
		}
	}
	if d := tokens["big"] - tokens["small"]; d < -30 || d > 30 {
		t.Fatalf("tokens served %v: want equal within one request", tokens)
	}
}

// TestOversizedHeadsBulkAddCredit (upstream oversized_heads_bulk_add_deficit_and_make_progress):
// a head far above its class's quantum goes in the one choice that finds it — every class
// with a head that can go earns the whole rounds at once — and the class is left with no
// negative credit; a class whose heads cannot go earns nothing meanwhile.
func TestOversizedHeadsBulkAddCredit(t *testing.T) {
	h := newHost("w", "v")
	h.threshold = 1
	h.loads["w"], h.loads["v"] = 1, 1
	q := newQueue(h, nil,
		ClassConfig{Name: "huge", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour, Cost: CostUncachedTokens},
		ClassConfig{Name: "mid", Quantum: 3, QueueLimit: 10, MaxWait: time.Hour, Cost: CostUncachedTokens},
		ClassConfig{Name: "stuck", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour, Cost: CostUncachedTokens})
	q.Admit(sized("huge", "huge", "", 100000, "w"), h, nil)
	q.Admit(sized("mid", "mid", "", 30, "w"), h, nil)
	q.Admit(sized("stuck", "stuck", "", 5, "v"), h, nil) // v stays full
	asks := q.GateAsks()
	if got := drain(h, q, "w", 1); !slices.Equal(got, []string{"mid"}) {
		t.Fatalf("first: %v, want mid (10 rounds cover it; huge needs 99,999)", got)
	}
	huge, mid, stuck := q.byName["huge"], q.byName["mid"], q.byName["stuck"]
	if huge.deficit != 10 || mid.deficit != 0 || stuck.deficit != 0 {
		t.Fatalf("credit after the bulk round: huge %d, mid %d, stuck %d; want 10, 0, 0", huge.deficit, mid.deficit, stuck.deficit)
	}
	if got := drain(h, q, "w", 1); !slices.Equal(got, []string{"huge"}) {
		t.Fatalf("second: %v, want huge", got)
	}
	if huge.deficit != 0 || stuck.deficit != 0 {
		t.Fatalf("credit: huge %d, stuck %d; want 0 and 0", huge.deficit, stuck.deficit)
	}
	if asks != q.GateAsks() {
		t.Fatal("no gate: nothing should be asked")
	}
}

// TestFullyBlockedRingAccruesNothing (upstream fully_blocked_ring_returns_without_accruing_deficit):
// when no class's head can go, a wake dispatches nothing and no class earns credit.
func TestFullyBlockedRingAccruesNothing(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1
	q := newQueue(h, nil,
		ClassConfig{Name: "a", Quantum: 4, QueueLimit: 10, MaxWait: time.Hour, Cost: CostUncachedTokens},
		ClassConfig{Name: "b", Quantum: 2, QueueLimit: 10, MaxWait: time.Hour})
	q.Admit(sized("a", "a", "", 50, "w"), h, nil)
	q.Admit(sized("b", "b", "", 50, "w"), h, nil)
	for range 5 {
		q.Wake(h)
		q.WakeCapacity(h)
	}
	if len(h.dispatched) != 0 || q.byName["a"].deficit != 0 || q.byName["b"].deficit != 0 {
		t.Fatalf("%d dispatched, credit a %d b %d", len(h.dispatched), q.byName["a"].deficit, q.byName["b"].deficit)
	}
}

// oneTurn is a gate that lets one request of a session be dispatched at a time (session-only
// holds), whatever its class.
type oneTurn struct{ running map[string]bool }

func (g *oneTurn) Check(r *Request, _ View) Decision {
	if g.running[r.SessionID] {
		return Decision{Wait: waitTest, SessionOnly: true}
	}
	return Decision{Go: true}
}
func (g *oneTurn) Dispatched(r *Request, _ string) { g.running[r.SessionID] = true }
func (g *oneTurn) Completed(r *Request, _ string)  { delete(g.running, r.SessionID) }
func (g *oneTurn) Moved(*Request, string, string)  {}
func (g *oneTurn) Recheck() time.Duration          { return 0 }

// TestSessionTurnInAnotherClassWakes: a session's turn held in another class's lane is asked
// again when the session's running turn completes — at once, with no recheck configured —
// and when the turn ahead of it is cancelled.
func TestSessionTurnInAnotherClassWakes(t *testing.T) {
	h := newHost("w")
	g := &oneTurn{running: map[string]bool{}}
	q := newQueue(h, gatePolicy{g: g},
		ClassConfig{Name: "a", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour},
		ClassConfig{Name: "b", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour})
	first, next := entry("first", "a", "s", "w"), entry("next", "b", "s", "w")
	q.Admit(first, h, nil)
	q.Admit(next, h, nil)
	if got := ids(h.dispatched); !slices.Equal(got, []string{"first"}) || !next.Queued() {
		t.Fatalf("dispatched %v", got)
	}
	h.finish(q, first)
	if got := ids(h.dispatched); !slices.Equal(got, []string{"first", "next"}) {
		t.Fatalf("after the first turn completed: dispatched %v", got)
	}
	// Cancel: a gate holding b's turn behind a's queued one lets it go when a's leaves.
	g.running["t"] = true
	ta, tb := entry("ta", "a", "t", "w"), entry("tb", "b", "t", "w")
	q.Admit(ta, h, nil)
	q.Admit(tb, h, nil)
	delete(g.running, "t") // the turn that held both ended without a completion here
	if !q.Cancel(ta, h) {
		t.Fatal("ta was not queued")
	}
	if got := ids(h.dispatched); !slices.Contains(got, "tb") {
		t.Fatalf("after the cancel: dispatched %v", got)
	}
}
