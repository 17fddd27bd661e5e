package kvindex

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tlgw/tlgw/internal/prefixindex"
)

// model is the index from scratch: per worker, the set of ids it holds.
type model map[int]map[uint64]bool

func (m model) check(t *testing.T, x *Index[int], ids []uint64) {
	t.Helper()
	entries := 0
	for w, set := range m {
		entries += len(set)
		if got := x.Len(w); got != len(set) {
			t.Fatalf("Len(%d) = %d, want %d", w, got, len(set))
		}
	}
	if x.Entries() != entries {
		t.Fatalf("Entries = %d, want %d", x.Entries(), entries)
	}
	workers := 0
	for _, set := range m {
		if len(set) > 0 {
			workers++
		}
	}
	if x.Workers() != workers {
		t.Fatalf("Workers = %d, want %d", x.Workers(), workers)
	}
	// Freed slots and lists are used again: neither grows past what is held at once.
	if len(x.slots) > modelWorkers || len(x.lists) > len(ids) {
		t.Fatalf("%d slots for %d workers, %d lists for %d ids", len(x.slots), modelWorkers, len(x.lists), len(ids))
	}
	x.checkLayout(t)
	for _, id := range ids {
		var want []int
		for w, set := range m {
			if set[id] {
				want = append(want, w)
			}
		}
		got := slices.Clone(x.Holders(id))
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("Holders(%x) = %v, want %v", id, got, want)
		}
		for w := range m {
			if x.Holds(w, id) != m[w][id] {
				t.Fatalf("Holds(%d, %x) = %v, want %v", w, id, x.Holds(w, id), m[w][id])
			}
		}
	}
}

// checkLayout fails t unless the index's own tables agree: each worker's set gives every id's
// position on that id's holders, the holder table points at live slots and lists of two or
// more, and every list is either in use or free (empty) for reuse.
func (x *Index[W]) checkLayout(t *testing.T) {
	t.Helper()
	entries, inUse := 0, 0
	for w, wk := range x.workers {
		if x.slots[wk.slot] != wk || wk.self[0] != w || len(wk.at) == 0 {
			t.Fatalf("worker %v: slot %d holds %v, %d ids", w, wk.slot, x.slots[wk.slot], len(wk.at))
		}
		for id, pos := range wk.at {
			if hs := x.Holders(id); int(pos) >= len(hs) || hs[pos] != w {
				t.Fatalf("worker %v holds %x at %d, holders %v", w, id, pos, hs)
			}
		}
		entries += len(wk.at)
	}
	for id, v := range x.holders {
		if v&shared == 0 {
			if int(v) >= len(x.slots) || x.slots[v] == nil {
				t.Fatalf("id %x held by free slot %d", id, v)
			}
			continue
		}
		inUse++
		if hs := x.lists[uint32(v)]; len(hs) < 2 {
			t.Fatalf("id %x on list %d of %d holders", id, uint32(v), len(hs))
		}
	}
	var zero W
	for n, hs := range x.lists {
		if slices.ContainsFunc(hs[len(hs):cap(hs)], func(w W) bool { return w != zero }) {
			t.Fatalf("list %d keeps a worker past its end: %v", n, hs[:cap(hs)])
		}
	}
	for _, n := range x.unused {
		if len(x.lists[n]) != 0 {
			t.Fatalf("free list %d holds %v", n, x.lists[n])
		}
	}
	free := 0
	for _, wk := range x.slots {
		if wk == nil {
			free++
		}
	}
	if entries != x.entries || inUse+len(x.unused) != len(x.lists) || free != len(x.free) || len(x.workers)+free != len(x.slots) {
		t.Fatalf("entries %d (counted %d), lists %d in use + %d free of %d, slots %d free (%d listed) + %d workers of %d",
			entries, x.entries, inUse, len(x.unused), len(x.lists), free, len(x.free), len(x.workers), len(x.slots))
	}
}

// modelWorkers is how many workers TestAgainstModel's events go to.
const modelWorkers = 6

// TestAgainstModel: random STORED, REMOVED and CLEARED events over a few workers and ids leave
// the index equal to the sets they describe (within the bound).
func TestAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const limit = 40
	x := New[int](limit)
	m := model{}
	ids := make([]uint64, 120)
	for i := range ids {
		ids[i] = r.Uint64()
	}
	for range 5000 {
		w := r.IntN(modelWorkers)
		batch := make([]uint64, r.IntN(10))
		for i := range batch {
			batch[i] = ids[r.IntN(len(ids))]
		}
		switch op := r.IntN(10); {
		case op < 6:
			x.Store(w, batch)
			if m[w] == nil {
				m[w] = map[uint64]bool{}
			}
			for _, id := range batch {
				if len(m[w]) < limit {
					m[w][id] = true
				}
			}
		case op < 9:
			if r.IntN(4) == 0 { // at times, everything the worker holds
				batch = slices.Collect(maps.Keys(m[w]))
			}
			x.Remove(w, batch)
			for _, id := range batch {
				delete(m[w], id)
			}
		default:
			x.Forget(w)
			delete(m, w)
		}
		m.check(t, x, ids)
	}
}

// TestBound: a worker keeps its first BlocksPerWorker ids; the rest are dropped and counted,
// and room freed by REMOVED is used again.
func TestBound(t *testing.T) {
	x := New[string](3)
	x.Store("a", []uint64{1, 2, 3, 4, 5})
	if x.Len("a") != 3 || !x.Holds("a", 3) || x.Holds("a", 4) || x.Dropped() != 2 {
		t.Fatalf("len %d holds3 %v holds4 %v dropped %d", x.Len("a"), x.Holds("a", 3), x.Holds("a", 4), x.Dropped())
	}
	x.Remove("a", []uint64{1})
	x.Store("a", []uint64{4})
	if !x.Holds("a", 4) || x.Len("a") != 3 {
		t.Fatal("freed room not reused")
	}
	if New[int](0).BlocksPerWorker() != DefaultBlocksPerWorker || New[int](1<<30).BlocksPerWorker() != MaxBlocksPerWorker ||
		New[int](1).BlocksPerWorker() != 1 || New[int](-1).BlocksPerWorker() != DefaultBlocksPerWorker {
		t.Fatal("bounds not defaulted")
	}
}

// TestMatch: a worker's match is its deepest held chunk of the prompt; the ids are prefixindex
// Hashes of rendered prompts, so two prompts share exactly their common leading chunks.
func TestMatch(t *testing.T) {
	base := make([]byte, 64*8)
	for i := range base {
		base[i] = byte('a' + i%26)
	}
	other := slices.Clone(base)
	other[64*5+3] = '!' // differs in chunk 5
	hb, ho := prefixindex.Hashes(nil, base), prefixindex.Hashes(nil, other)
	x := New[string](100)
	x.Store("w1", hb[:6])
	x.Store("w2", ho)
	x.Store("w3", hb[:2])
	got := x.MatchAll(hb, []string{"w1", "w2", "w3", "nobody"}, nil)
	if want := []int{6, 5, 2, 0}; !slices.Equal(got, want) {
		t.Fatalf("MatchAll = %v, want %v", got, want)
	}
	x.Remove("w1", hb[4:6]) // the engine evicted the prompt's end
	if got := x.Match("w1", hb); got != 4 {
		t.Fatalf("after REMOVED Match = %d, want 4", got)
	}
	x.Forget("w2")
	if got := x.Match("w2", hb); got != 0 || x.Workers() != 2 {
		t.Fatalf("after Forget Match = %d, workers %d", got, x.Workers())
	}
	if allocs := testing.AllocsPerRun(100, func() { x.Match("w1", hb) }); allocs != 0 {
		t.Fatalf("Match allocates %v", allocs)
	}
}

// spreadIDs is n distinct ids spread over the 64 bits.
func spreadIDs(n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	return ids
}

// TestShrink: the holder table is rebuilt once most of its peak is gone, and stays correct.
func TestShrink(t *testing.T) {
	x := New[int](1 << 16)
	ids := spreadIDs(5000)
	x.Store(1, ids)
	x.Store(2, ids[:10])
	x.Forget(1)
	if x.Distinct() != 10 || x.peak != 10 || x.Entries() != 10 {
		t.Fatalf("distinct %d peak %d entries %d", x.Distinct(), x.peak, x.Entries())
	}
	if x.Match(2, ids) != 10 {
		t.Fatal("lost entries on rebuild")
	}
}

// TestShrinkKeepsSharedLists: ids held by several workers survive the rebuild on lists numbered
// afresh, and the lists that had been freed are let go.
func TestShrinkKeepsSharedLists(t *testing.T) {
	x := New[int](1 << 16)
	ids := spreadIDs(5000)
	x.Store(1, ids)
	x.Store(2, ids[:300])
	x.Store(3, ids[:10])
	x.Remove(2, ids[200:300]) // 100 lists go back to one holder: free for reuse
	if len(x.unused) != 100 {
		t.Fatalf("%d free lists, want 100", len(x.unused))
	}
	x.Forget(1) // 300 ids left of a peak of 5,000: rebuilt
	if x.Distinct() != 200 || x.peak != 200 || x.Entries() != 210 || len(x.lists) != 10 || len(x.unused) != 0 {
		t.Fatalf("distinct %d peak %d entries %d lists %d free %d", x.Distinct(), x.peak, x.Entries(), len(x.lists), len(x.unused))
	}
	x.checkLayout(t)
	for _, id := range ids[:10] {
		got := slices.Sorted(slices.Values(x.Holders(id)))
		if !slices.Equal(got, []int{2, 3}) {
			t.Fatalf("Holders(%x) = %v, want [2 3]", id, got)
		}
	}
	if x.Match(2, ids) != 200 || x.Match(3, ids) != 10 {
		t.Fatalf("Match = %d, %d after the rebuild", x.Match(2, ids), x.Match(3, ids))
	}
}

// TestSharedListStorageReused: a worker joining and leaving an id another worker holds reuses
// the list's storage: no allocation in the steady state.
func TestSharedListStorageReused(t *testing.T) {
	x := New[int](16)
	x.Store(1, []uint64{7})
	x.Store(2, []uint64{8}) // keeps worker 2 in the index while it joins and leaves id 7
	allocs := testing.AllocsPerRun(100, func() {
		x.Store(2, []uint64{7})
		x.Remove(2, []uint64{7})
	})
	if allocs != 0 || !slices.Equal(x.Holders(7), []int{1}) {
		t.Fatalf("%v allocations a round; holders of 7: %v", allocs, x.Holders(7))
	}
}

// TestHolderTableShrinks: the holder table is rebuilt (its peak reset to what it holds) once
// it holds under an eighth of a peak of at least 1,024 ids — not at exactly an eighth, and never
// for a smaller peak.
func TestHolderTableShrinks(t *testing.T) {
	ids := func(from, to int) []uint64 {
		var out []uint64
		for i := from; i < to; i++ {
			out = append(out, uint64(i))
		}
		return out
	}
	x := New[string](4096)
	x.Store("w", ids(0, 1024))
	x.Remove("w", ids(0, 1024-128)) // 128 left: exactly an eighth
	if x.peak != 1024 {
		t.Fatalf("rebuilt at an eighth: peak %d", x.peak)
	}
	x.Remove("w", ids(1024-128, 1024-127)) // 127 left
	if x.peak != 127 || len(x.holders) != 127 || !x.Holds("w", 1023) || x.Holds("w", 0) {
		t.Fatalf("after dropping under an eighth: peak %d, %d held", x.peak, len(x.holders))
	}

	small := New[string](4096)
	small.Store("w", ids(0, 1023))
	small.Remove("w", ids(0, 1022))
	if small.peak != 1023 {
		t.Fatalf("a peak under 1,024 was rebuilt: peak %d", small.peak)
	}
}
