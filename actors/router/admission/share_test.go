package admission

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// keyed is an entry of API key k.
func keyed(id string, k int, session string, route ...string) *Entry {
	e := entry(id, "c", session, route...)
	e.Req.APIKey = k
	return e
}

// queuedPerKey counts the queued entries of es by API key.
func queuedPerKey(es []*Entry) map[int]int {
	m := map[int]int{}
	for _, e := range es {
		if e.Queued() {
			m[e.Req.APIKey]++
		}
	}
	return m
}

// TestOneKeyCannotFillAClass (R20, issue 35 item 6): a key alone may fill its class's queue,
// but a second key's request still gets in — it takes the place of the first key's newest,
// which is answered queue_full — until the two hold equal shares; a third key gets its share
// from both, the most held first. A key at its share is refused as before. The worked example
// of pushOutFor. Run on fresh queues several times, since the keys are kept in a map whose
// order varies.
func TestOneKeyCannotFillAClass(t *testing.T) {
	for range 8 {
		oneKeyCannotFillAClass(t)
	}
}

func oneKeyCannotFillAClass(t *testing.T) {
	h := newHost("w")
	h.threshold = 1
	h.loads["w"] = 1 // every request waits
	q := newQueue(h, nil, ClassConfig{Name: "c", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour})
	var all []*Entry
	admit := func(id string, k int) *Entry {
		e := keyed(id, k, "", "w")
		q.Admit(e, h, nil)
		all = append(all, e)
		return e
	}
	for i := range 10 {
		admit(fmt.Sprint("a", i), 0)
	}
	if a10 := admit("a10", 0); a10.Queued() || h.rejected[a10] != ErrQueueFull {
		t.Fatal("a key alone past the class's limit was queued")
	}
	b0 := admit("b0", 1)
	if !b0.Queued() || h.rejected[all[9]] != ErrQueueFull || !all[8].Queued() {
		t.Fatalf("b0 queued %v; a9 rejected %v: want b0 in the place of a's newest", b0.Queued(), h.rejected[all[9]])
	}
	for i := 1; i < 6; i++ {
		admit(fmt.Sprint("b", i), 1)
	}
	if got := queuedPerKey(all); !maps.Equal(got, map[int]int{0: 5, 1: 5}) || q.Len() != 10 {
		t.Fatalf("queued per key %v (%d in all), want 5 and 5", got, q.Len())
	}
	if b5 := all[len(all)-1]; b5.Queued() {
		t.Fatal("a key at its share pushed another out")
	}
	// A tie of 5 and 5: the lower key's newest (a4) leaves first, then b4 (b holds the most).
	c0 := admit("c0", 2)
	if h.rejected[all[4]] != ErrQueueFull || !all[15].Queued() || !c0.Queued() {
		t.Fatalf("c0 queued %v, a4 rejected %v, b4 queued %v: want c0 in a4's place", c0.Queued(), h.rejected[all[4]], all[15].Queued())
	}
	for i := 1; i < 3; i++ {
		admit(fmt.Sprint("c", i), 2)
	}
	if got := queuedPerKey(all); !maps.Equal(got, map[int]int{0: 4, 1: 4, 2: 2}) || q.Len() != 10 {
		t.Fatalf("queued per key %v (%d in all), want 4, 4 and 2", got, q.Len())
	}
	var pushed []string
	for _, e := range all {
		if h.rejected[e] == ErrQueueFull {
			pushed = append(pushed, e.Req.ID)
		}
	}
	slices.Sort(pushed)
	// a10 refused; a9..a5 pushed out by b0..b4; a4 by c0, b4 by c1 (b held more then); c2 refused.
	if want := []string{"a10", "a4", "a5", "a6", "a7", "a8", "a9", "b4", "b5", "c2"}; !slices.Equal(pushed, want) {
		t.Fatalf("refused or pushed out %v, want %v", pushed, want)
	}
	// The queue serves what is left, oldest first, and keeps nothing after.
	var served []string
	for range 10 {
		h.release(q, "w")
	}
	for _, e := range h.dispatched {
		served = append(served, e.Req.ID)
	}
	if want := []string{"a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "c0", "c1"}; !slices.Equal(served, want) {
		t.Fatalf("served %v, want %v", served, want)
	}
	for _, e := range h.dispatched {
		h.finish(q, e)
	}
	if q.size() != 0 {
		t.Fatalf("%d table entries after every request ended", q.size())
	}
}

// TestAKeyAtItsShareTakesNoPlace: a key holding exactly its share is refused even while
// another key holds more than its own — it may not push that one further down. Run on fresh
// queues several times, since the keys are kept in a map whose order varies.
func TestAKeyAtItsShareTakesNoPlace(t *testing.T) {
	for range 16 {
		h := newHost("w")
		h.threshold = 1
		h.loads["w"] = 1
		q := newQueue(h, nil, ClassConfig{Name: "c", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour})
		var all []*Entry
		admit := func(id string, k int) *Entry {
			e := keyed(id, k, "", "w")
			q.Admit(e, h, nil)
			all = append(all, e)
			return e
		}
		for i := range 10 {
			admit(fmt.Sprint("a", i), 0)
		}
		admit("b0", 1) // share 5: a9 leaves
		for i := range 4 {
			admit(fmt.Sprint("c", i), 2) // share 4: a8, a7, a6, a5 leave
		}
		if got := queuedPerKey(all); !maps.Equal(got, map[int]int{0: 5, 1: 1, 2: 4}) {
			t.Fatalf("queued per key %v, want 5, 1 and 4", got)
		}
		if c4 := admit("c4", 2); c4.Queued() || h.rejected[c4] != ErrQueueFull {
			t.Fatal("a key at its share of 4 pushed out one of a key holding 5")
		}
		if got := queuedPerKey(all); !maps.Equal(got, map[int]int{0: 5, 1: 1, 2: 4}) {
			t.Fatalf("queued per key %v after the refusal", got)
		}
	}
}

// TestPushedOutHeadExposesTheNext: the request pushed out may head a lane with another key's
// request behind it; that one is asked at once (the gate lets it go), as after a
// cancellation, and the tables stay consistent.
func TestPushedOutHeadExposesTheNext(t *testing.T) {
	h := newHost("w")
	g := &holdFirst{held: map[uint64]bool{}}
	q := newQueue(h, gatePolicy{g: g}, ClassConfig{Name: "c", Quantum: 1, QueueLimit: 3, MaxWait: time.Hour})
	// Key 0: aOld in the shared lane, a0 heading session lane s (both held by the gate); key 1:
	// b0 behind a0 in s.
	aOld, a0, b0 := keyed("a-old", 0, "", "w"), keyed("a0", 0, "s", "w"), keyed("b0", 1, "s", "w")
	g.held[aOld.Req.Key], g.held[a0.Req.Key] = true, true
	for _, e := range []*Entry{aOld, a0, b0} {
		q.Admit(e, h, nil)
	}
	if q.Len() != 3 || len(h.dispatched) != 0 {
		t.Fatalf("%d queued, %d dispatched", q.Len(), len(h.dispatched))
	}
	// Key 2 comes to the full class: k = 3, share 1; key 0 holds 2: its newest, a0, leaves.
	c0 := keyed("c0", 2, "", "w")
	g.held[c0.Req.Key] = true
	q.Admit(c0, h, nil)
	if h.rejected[a0] != ErrQueueFull || !c0.Queued() {
		t.Fatalf("a0 %v, c0 queued %v", h.rejected[a0], c0.Queued())
	}
	if got := ids(h.dispatched); !slices.Equal(got, []string{"b0"}) {
		t.Fatalf("dispatched %v, want b0 (exposed at the head of s)", got)
	}
	// b0's dispatch made room: a fourth key's request queues without pushing anyone out.
	d0 := keyed("d0", 3, "", "w")
	g.held[d0.Req.Key] = true
	q.Admit(d0, h, nil)
	if !d0.Queued() || q.Len() != 3 || len(h.rejected) != 1 {
		t.Fatalf("d0 queued %v, %d queued, %d rejected", d0.Queued(), q.Len(), len(h.rejected))
	}
	h.finish(q, b0)
	for _, e := range []*Entry{aOld, c0, d0} {
		q.Cancel(e, h)
	}
	if q.size() != 0 {
		t.Fatalf("%d table entries after every request ended", q.size())
	}
}

// holdFirst holds every head it is told to (held), until it is not.
type holdFirst struct{ held map[uint64]bool }

func (g *holdFirst) Check(r *Request, _ View) Decision {
	if g.held[r.Key] {
		return Decision{Wait: waitTest}
	}
	return Decision{Go: true}
}
func (g *holdFirst) Dispatched(*Request, string)    {}
func (g *holdFirst) Completed(*Request, string)     {}
func (g *holdFirst) Moved(*Request, string, string) {}
func (g *holdFirst) Recheck() time.Duration         { return 0 }
