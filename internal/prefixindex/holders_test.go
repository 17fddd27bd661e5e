package prefixindex

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// holderIDs lists the holders of h, sorted.
func holderIDs(x *Index, h uint64) []string {
	var ids []string
	hs := x.Holders(h)
	for id, ok := hs.Next(); ok; id, ok = hs.Next() {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// checkHolders verifies the inverse against the workers' own entries: every entry of every
// worker is on its hash's holder list exactly once, the lists are well linked and counted, the
// table holds exactly the hashes some worker holds within its load bounds, and worker numbers
// name their workers.
func checkHolders(t interface{ Fatalf(string, ...any) }, x *Index) {
	want := map[uint64][]string{} // hash → holders, by the workers' tables
	entries := 0
	for id, w := range x.workers {
		if w.id != id || w.num < 1 || int(w.num) >= len(x.byNum) || x.byNum[w.num] != w {
			t.Fatalf("worker %s: id %q, number %d not its own", id, w.id, w.num)
		}
		if len(w.links) != len(w.nodes) || cap(w.links) != cap(w.nodes) {
			t.Fatalf("worker %s: %d links (cap %d) for %d nodes (cap %d)", id, len(w.links), cap(w.links), len(w.nodes), cap(w.nodes))
		}
		if len(w.nodes) > w.limit || w.limit < 1 || w.limit > x.limit {
			t.Fatalf("worker %s: %d nodes under its bound %d (the index's %d)", id, len(w.nodes), w.limit, x.limit)
		}
		for _, nd := range w.nodes {
			want[nd.hash] = append(want[nd.hash], id)
			entries++
		}
		checkLRU(t, w)
	}
	if entries > len(x.workers)*x.limit {
		t.Fatalf("%d entries for %d workers of %d blocks", entries, len(x.workers), x.limit)
	}
	if x.Entries() != entries || x.Distinct() != len(want) {
		t.Fatalf("Entries %d, Distinct %d; want %d, %d", x.Entries(), x.Distinct(), entries, len(want))
	}
	used := 0
	for i, e := range x.holders.slots {
		if e.head.w == 0 {
			if e != (holderSlot{}) {
				t.Fatalf("empty slot %d not cleared: %+v", i, e)
			}
			continue
		}
		used++
		if x.holders.find(e.hash) != i {
			t.Fatalf("hash %x at slot %d is found at %d", e.hash, i, x.holders.find(e.hash))
		}
		var prev ref
		n := 0
		for r := e.head; r.w != 0; r = x.link(r).next {
			if h, l := x.byNum[r.w].nodes[r.n].hash, x.link(r); h != e.hash || l.prev != prev {
				t.Fatalf("hash %x: node %v holds %x, prev %v, want prev %v", e.hash, r, h, l.prev, prev)
			}
			if n++; n > entries {
				t.Fatalf("hash %x: the holder list loops", e.hash)
			}
			prev = r
		}
		ws := want[e.hash]
		slices.Sort(ws)
		if got := holderIDs(x, e.hash); !slices.Equal(got, ws) {
			t.Fatalf("hash %x: holders %v, want %v", e.hash, got, ws)
		}
	}
	if used != len(want) || used != x.holders.used {
		t.Fatalf("table: %d used (counted %d) for %d distinct hashes", used, x.holders.used, len(want))
	}
	size := len(x.holders.slots)
	if size&(size-1) != 0 || size < minHolderSlots || 2*used > size || (size > minHolderSlots && 8*used <= size) {
		t.Fatalf("table: %d slots for %d hashes", size, used)
	}
	free := map[int32]bool{}
	for _, n := range x.free {
		if n < 1 || int(n) >= len(x.byNum) || x.byNum[n] != nil || free[n] {
			t.Fatalf("free number %d: in use or repeated (byNum %d)", n, len(x.byNum))
		}
		free[n] = true
	}
	if len(x.byNum) != 1+len(x.workers)+len(free) || x.byNum[0] != nil {
		t.Fatalf("byNum %d for %d workers and %d free", len(x.byNum), len(x.workers), len(free))
	}
	if last := len(x.byNum) - 1; last > 0 && x.byNum[last] == nil {
		t.Fatalf("byNum ends in a free number %d", last)
	}
}

func TestHolders(t *testing.T) {
	x := New(100)
	sys := prompt(1, 64*8)
	q := Hashes(nil, append(bytes.Clone(sys), prompt(2, 64*8)...))
	x.Record("c", q[:12])
	x.Record("b", q)
	x.Record("a", q[:4])
	x.Record("d", Hashes(nil, prompt(5, 64*20)))
	checkHolders(t, x)
	for d, want := range map[int][]string{1: {"a", "b", "c"}, 4: {"a", "b", "c"}, 5: {"b", "c"}, 12: {"b", "c"}, 13: {"b"}, 16: {"b"}} {
		if got := holderIDs(x, q[d-1]); !slices.Equal(got, want) {
			t.Fatalf("depth %d: holders %v, want %v", d, got, want)
		}
	}
	var none Holders
	if id, ok := none.Next(); ok || id != "" {
		t.Fatalf("the zero cursor yields %q, %v", id, ok)
	}
	if got := holderIDs(x, 12345); got != nil {
		t.Fatalf("an unknown hash has holders %v", got)
	}
	if x.Entries() != 12+16+4+20 || x.Distinct() != 16+20 {
		t.Fatalf("Entries %d, Distinct %d", x.Entries(), x.Distinct())
	}
	x.Forget("b")
	x.Forget("b") // twice is a no-op
	x.Forget("nobody")
	checkHolders(t, x)
	if got := holderIDs(x, q[12]); got != nil {
		t.Fatalf("after Forget: %v", got)
	}
	if got := holderIDs(x, q[4]); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("after Forget: %v", got)
	}
	// A forgotten worker's number is reused.
	x.Record("e", q)
	checkHolders(t, x)
	if x.workers["e"].num != 2 || len(x.byNum) != 5 {
		t.Fatalf("e numbered %d, byNum %d; want b's 2 and 5", x.workers["e"].num, len(x.byNum))
	}
	if allocs := testing.AllocsPerRun(100, func() {
		hs := x.Holders(q[0])
		for _, ok := hs.Next(); ok; _, ok = hs.Next() {
		}
	}); allocs != 0 {
		t.Fatalf("walking holders allocates %v times", allocs)
	}
	for _, id := range []string{"a", "c", "d", "e"} {
		x.Forget(id)
		checkHolders(t, x)
	}
	if x.Entries() != 0 || x.Distinct() != 0 || len(x.holders.slots) != minHolderSlots || len(x.byNum) != 1 || len(x.free) != 0 {
		t.Fatalf("empty index keeps %d entries, %d hashes, %d slots, byNum %d, free %v",
			x.Entries(), x.Distinct(), len(x.holders.slots), len(x.byNum), x.free)
	}
}

func TestHoldersFollowEviction(t *testing.T) {
	x := New(6)
	a := Hashes(nil, prompt(1, 64*4))
	b := Hashes(nil, prompt(2, 64*4))
	x.Record("w", a)
	x.Record("v", a)
	x.Record("w", b) // w keeps a's first two chunks
	checkHolders(t, x)
	for d, want := range map[int][]string{1: {"v", "w"}, 2: {"v", "w"}, 3: {"v"}, 4: {"v"}} {
		if got := holderIDs(x, a[d-1]); !slices.Equal(got, want) {
			t.Fatalf("depth %d: holders %v, want %v", d, got, want)
		}
	}
	// One prompt longer than the bound: w's whole history is replaced, one entry at a time.
	long := Hashes(nil, prompt(3, 64*10))
	x.Record("w", long)
	checkHolders(t, x)
	if got := holderIDs(x, a[0]); !slices.Equal(got, []string{"v"}) {
		t.Fatalf("a's head after w forgot it: %v", got)
	}
	if got := holderIDs(x, long[5]); !slices.Equal(got, []string{"w"}) || holderIDs(x, long[6]) != nil {
		t.Fatal("the long prompt keeps other than its first 6 chunks")
	}
}

// TestHoldersBounded: however many workers come and go and however much they churn, the
// inverse holds at most workers × blocksPerWorker entries, its table shrinks as hashes go, and
// worker numbers are reused.
func TestHoldersBounded(t *testing.T) {
	const limit, workers = 32, 20
	x := New(limit)
	for round := range 30 {
		for i := range workers {
			id := fmt.Sprintf("w%02d", (i+round)%(workers+5))
			// Shared stems and private tails: many holders per hash and many distinct hashes.
			p := append(prompt(byte(i%3), 64*8), prompt(byte(round*workers+i), 64*(4+i%9))...)
			x.Record(id, Hashes(nil, p))
			if x.Entries() > x.Workers()*limit {
				t.Fatalf("%d entries for %d workers", x.Entries(), x.Workers())
			}
		}
		if round%5 == 4 {
			for i := range workers / 2 {
				x.Forget(fmt.Sprintf("w%02d", (i*3+round)%(workers+5)))
			}
		}
		checkHolders(t, x)
		if len(x.byNum) > workers+5+1 {
			t.Fatalf("byNum grew to %d for %d ids", len(x.byNum), workers+5)
		}
		if size := len(x.holders.slots); size > max(minHolderSlots, 8*x.Distinct()) {
			t.Fatalf("%d slots for %d hashes", size, x.Distinct())
		}
	}
	for id := range maps.Clone(x.workers) {
		x.Forget(id)
	}
	checkHolders(t, x)
	if len(x.holders.slots) != minHolderSlots || x.Entries() != 0 || len(x.byNum) != 1 {
		t.Fatalf("after forgetting all: %d slots, %d entries, byNum %d", len(x.holders.slots), x.Entries(), len(x.byNum))
	}
}

// TestHoldersMatchDefinition: under random records, evictions and Forget, the holders of a
// prompt's d-th hash are exactly the workers whose Match (by the model) is at least d, which
// is what a pick from holder lists relies on, and the inverse stays consistent.
func TestHoldersMatchDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.IntRange(1, 24).Draw(t, "limit")
		x := New(limit)
		ref := &model{limit: limit, lists: map[string][]uint64{}}
		workers := []string{"w0", "w1", "w2", "w3", "w4", "w5"}
		gen := func(t *rapid.T) []uint64 { return treePromptHashes(t, 14) }
		for step := rapid.IntRange(1, 80).Draw(t, "steps"); step > 0; step-- {
			w := workers[rapid.IntRange(0, len(workers)-1).Draw(t, "w")]
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0:
				x.Forget(w)
				delete(ref.lists, w)
			case 1, 2, 3, 4, 5:
				hs := gen(t)
				x.Record(w, hs)
				ref.record(w, hs)
			default:
				hs := gen(t)
				for d := 1; d <= len(hs); d++ {
					var want []string
					for _, id := range workers {
						if ref.match(id, hs) >= d {
							want = append(want, id)
						}
					}
					if got := holderIDs(x, hs[d-1]); !slices.Equal(got, want) {
						t.Fatalf("depth %d: holders %v, want %v", d, got, want)
					}
				}
			}
			checkHolders(t, x)
		}
	})
}

func TestHolds(t *testing.T) {
	x := New(100)
	q := Hashes(nil, prompt(1, 64*6))
	x.Record("a", q[:4])
	for k, want := range []bool{true, true, true, true, false, false} {
		if x.Holds("a", q[k]) != want {
			t.Fatalf("Holds(a, h%d) = %v", k+1, !want)
		}
		if x.Holds("b", q[k]) {
			t.Fatalf("an unknown worker holds h%d", k+1)
		}
	}
}

// TestHolderTableSizes: the table doubles when an entry would fill more than half of it and
// halves once at most an eighth is used.
func TestHolderTableSizes(t *testing.T) {
	x := New(100)
	x.Record("a", Hashes(nil, prompt(1, 64*8)))
	if x.Distinct() != 8 || len(x.holders.slots) != 16 {
		t.Fatalf("8 hashes in %d slots, want 16", len(x.holders.slots))
	}
	x.Record("a", Hashes(nil, prompt(1, 64*9)))
	if x.Distinct() != 9 || len(x.holders.slots) != 32 {
		t.Fatalf("9 hashes in %d slots, want 32", len(x.holders.slots))
	}
	x.Record("b", Hashes(nil, prompt(2, 64*4)))
	x.Record("c", Hashes(nil, prompt(3, 64)))
	x.Forget("a")
	if x.Distinct() != 5 || len(x.holders.slots) != 32 {
		t.Fatalf("5 hashes in %d slots, want 32", len(x.holders.slots))
	}
	x.Forget("c")
	if x.Distinct() != 4 || len(x.holders.slots) != 16 {
		t.Fatalf("4 hashes in %d slots, want 16", len(x.holders.slots))
	}
	checkHolders(t, x)
}

// TestNodesGrowToTheBound: a worker's nodes and links grow by doubling but stop at the bound,
// not at the next size append would pick.
func TestNodesGrowToTheBound(t *testing.T) {
	const limit = 100
	x := New(limit)
	for i := range 3 {
		x.Record("w", Hashes(nil, prompt(byte(i), 64*limit)))
		w := x.workers["w"]
		if len(w.nodes) != limit || cap(w.nodes) != limit || cap(w.links) != limit {
			t.Fatalf("nodes %d (cap %d), links cap %d; want %d", len(w.nodes), cap(w.nodes), cap(w.links), limit)
		}
	}
	checkHolders(t, x)
}
