package admission

import (
	"slices"
	"testing"
	"time"
)

// wakerGate holds every head until it lets it go (GateWakes), counting asks; asking the head
// named probe lets go the heads named in free (Woken), as a settling would.
type wakerGate struct {
	asks  map[string]int
	free  map[string]bool // heads it lets go
	probe string          // the ask that lets the free ones go
	byKey map[uint64]string
	woken []uint64
}

func (g *wakerGate) Classify(r *Request, _ []string, _ func([]string) int) { g.byKey[r.Key] = r.ID }
func (g *wakerGate) Gate() Gate                                            { return g }
func (g *wakerGate) Check(head *Request, _ View) Decision {
	g.asks[head.ID]++
	if head.ID == g.probe {
		for k, id := range g.byKey {
			if g.free[id] {
				g.woken = append(g.woken, k)
			}
		}
		slices.Sort(g.woken)
	}
	if g.free[head.ID] {
		return Decision{Go: true}
	}
	return Decision{Wait: WaitHeld, GateWakes: true}
}
func (g *wakerGate) Woken(wake func(uint64)) {
	for _, k := range g.woken {
		wake(k)
	}
	g.woken = g.woken[:0]
}
func (g *wakerGate) Dispatched(*Request, string)    {}
func (g *wakerGate) Moved(*Request, string, string) {}
func (g *wakerGate) Completed(*Request, string)     {}
func (g *wakerGate) Recheck() time.Duration         { return 0 }

// TestGateWokenHeads (issue 34, review finding 7): heads held until the gate names them are
// asked on a capacity free one per candidate set (the oldest), not all; the heads the gate
// names during that ask are asked in the same pump and go; a free the heads cannot use asks
// none; workers changing (Wake) asks them all.
func TestGateWokenHeads(t *testing.T) {
	h := newHost("w1", "w2")
	g := &wakerGate{asks: map[string]int{}, free: map[string]bool{}, byKey: map[uint64]string{}}
	q := newQueue(h, g)
	var es []*Entry
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		e := entry(id, "", id, "w1", "w2") // a session each: a lane each
		q.Admit(e, h, nil)
		es = append(es, e)
	}
	if q.Len() != 5 {
		t.Fatalf("%d queued", q.Len())
	}
	total := func() (n int) {
		for _, c := range g.asks {
			n += c
		}
		return n
	}
	before := total()
	q.WakeCapacityFor(h, func(*Entry) bool { return false })
	if n := total() - before; n != 0 {
		t.Fatalf("a free no head can use asked %d", n)
	}
	q.WakeCapacity(h)
	if n := total() - before; n != 1 || g.asks["a"] != 2 {
		t.Fatalf("a free asked %d heads (a: %d), want the oldest once", n, g.asks["a"])
	}
	g.probe, g.free["c"], g.free["d"] = "a", true, true
	before = total()
	q.WakeCapacity(h)
	if got := ids(h.dispatched); !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("dispatched %v, want the two the gate let go, in the same wake", got)
	}
	if n := total() - before; n != 3 {
		t.Fatalf("%d asks, want the probe and the two woken heads", n)
	}
	before = total()
	q.Wake(h)
	if n := total() - before; n != 3 {
		t.Fatalf("workers changing asked %d of the 3 held heads", n)
	}
}

// viewCounter is a host that counts the views taken of each request (one per ask).
type viewCounter struct {
	*fakeHost
	views map[string]int
}

func (h *viewCounter) View(e *Entry) View {
	h.views[e.Req.ID]++
	return h.fakeHost.View(e)
}

// TestCapacityFreeSkipsGroupsItDoesNotServe (WakeCapacityFor): a capacity free that only some
// heads can use asks the capacity groups whose head it serves, and not one head of the others
// — they would find their workers as full as before — in the pump it runs.
func TestCapacityFreeSkipsGroupsItDoesNotServe(t *testing.T) {
	h := &viewCounter{fakeHost: newHost("w1", "w2"), views: map[string]int{}}
	h.threshold = 1
	h.loads["w1"], h.loads["w2"] = 1, 1
	q := newQueue(h.fakeHost, nil)
	a := entry("a", "", "", "w1", "w2")
	a.Req.Allowed = []string{"w1"}
	b := entry("b", "", "", "w1", "w2")
	b.Req.Allowed = []string{"w2"}
	q.Admit(a, h, nil)
	q.Admit(b, h, nil)
	if q.Len() != 2 {
		t.Fatalf("%d queued, want both waiting for capacity", q.Len())
	}
	clear(h.views)
	h.loads["w2"] = 0
	q.WakeCapacityFor(h, func(e *Entry) bool { return slices.Contains(e.Req.Allowed, "w2") })
	if got := ids(h.dispatched); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("dispatched %v, want b", got)
	}
	if h.views["a"] != 0 {
		t.Fatalf("a, waiting for w1, was asked %d times on a free of w2", h.views["a"])
	}
}
