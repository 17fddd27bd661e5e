package kv

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// toks returns n consecutive token ids starting at start.
func toks(start uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = start + uint32(i)
	}
	return out
}

func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func check(t *testing.T, p *Pool, seqs ...*Seq) {
	t.Helper()
	if err := p.checkInvariants(); err != nil {
		t.Fatalf("invariants: %v", err)
	}
	for i, s := range seqs {
		if err := p.checkSeq(s); err != nil {
			t.Fatalf("seq %d: %v", i, err)
		}
	}
}

func mustAlloc(t *testing.T, p *Pool, prompt []uint32) (*Seq, int) {
	t.Helper()
	s, cached, err := p.Allocate(prompt)
	if err != nil {
		t.Fatalf("Allocate(%d tokens): %v", len(prompt), err)
	}
	check(t, p, s)
	return s, cached
}

// state is a deep copy of everything a failed call must leave alone.
type state struct {
	Blocks     []block
	Slab       []uint32
	Free       []int32
	Cache      map[uint64]int32
	Head, Tail int32
	LRULen     int
	Stats      Stats
}

func snapshot(p *Pool) state {
	return state{
		Blocks: slices.Clone(p.blocks), Slab: slices.Clone(p.slab), Free: slices.Clone(p.free),
		Cache: maps.Clone(p.cache), Head: p.lruHead, Tail: p.lruTail, LRULen: p.lruLen,
		Stats: p.Stats(),
	}
}

func diffState(a, b state) string { return cmp.Diff(a, b, cmp.AllowUnexported(block{})) }

// TestNewPoolDefaults: a count or a size of 0 or less selects its default; 1 is kept.
func TestNewPoolDefaults(t *testing.T) {
	for _, c := range []struct{ blocks, size, wantBlocks, wantSize int }{
		{0, -1, DefaultTotalBlocks, DefaultBlockSize},
		{-1, 0, DefaultTotalBlocks, DefaultBlockSize},
		{1, 1, 1, 1},
	} {
		p := NewPool(c.blocks, c.size)
		st := p.Stats()
		if st.TotalBlocks != c.wantBlocks || p.BlockSize() != c.wantSize {
			t.Fatalf("NewPool(%d, %d): %d blocks of %d, want %d of %d", c.blocks, c.size, st.TotalBlocks, p.BlockSize(), c.wantBlocks, c.wantSize)
		}
		if st.FreeBlocks != st.TotalBlocks || st.CachedBlocks != 0 || st.ReferencedBlocks != 0 {
			t.Fatalf("fresh pool stats %+v", st)
		}
		check(t, p)
	}
}

func TestHitAccounting(t *testing.T) {
	p := NewPool(64, 16)
	a, cached := mustAlloc(t, p, toks(0, 40)) // blocks: full, full, partial of 8
	if cached != 0 || a.Blocks() != 3 || a.Len() != 40 {
		t.Fatalf("first prompt: cached %d, %d blocks, len %d", cached, a.Blocks(), a.Len())
	}

	// Shares the two full blocks, then diverges.
	second := concat(toks(0, 32), toks(1000, 8))
	if got := p.Lookup(second); got != 32 {
		t.Fatalf("Lookup = %d, want 32", got)
	}
	b, cached := mustAlloc(t, p, second)
	if cached != 32 {
		t.Fatalf("second prompt cached %d, want 32", cached)
	}
	if a.blocks[0] != b.blocks[0] || a.blocks[1] != b.blocks[1] || a.blocks[2] == b.blocks[2] {
		t.Fatalf("block tables a=%v b=%v: want the two full blocks shared, the partial not", a.blocks, b.blocks)
	}

	// The same 40 tokens again: the partial third block is never shared, so 32, not 39.
	c, cached := mustAlloc(t, p, toks(0, 40))
	if cached != 32 {
		t.Fatalf("identical prompt cached %d, want 32 (partial blocks are private)", cached)
	}
	if c.blocks[2] == a.blocks[2] {
		t.Fatal("partial block shared")
	}

	want := Stats{
		TotalBlocks: 64, FreeBlocks: 64 - 5, CachedBlocks: 2, ReferencedBlocks: 5,
		HitTokens: 64, LookupTokens: 120,
	}
	if diff := cmp.Diff(want, p.Stats()); diff != "" {
		t.Fatalf("stats (-want +got):\n%s", diff)
	}
	for _, s := range []*Seq{a, b, c} {
		if !p.Free(s) {
			t.Fatal("Free returned false")
		}
	}
	check(t, p, a, b, c)
	st := p.Stats()
	if st.FreeBlocks != st.TotalBlocks || st.CachedBlocks != 2 || st.ReferencedBlocks != 0 {
		t.Fatalf("after freeing: %+v", st)
	}
	if got := p.Lookup(toks(0, 50)); got != 32 {
		t.Fatalf("cache after free: Lookup = %d, want 32", got)
	}
}

func TestCachedTokensCap(t *testing.T) {
	// A repeated block-aligned prompt shares every block but reports len-1 cached tokens: the
	// engine always computes the last prompt token.
	p := NewPool(8, 16)
	a, _ := mustAlloc(t, p, toks(0, 32))
	if got := p.Lookup(toks(0, 32)); got != 31 {
		t.Fatalf("Lookup = %d, want 31", got)
	}
	b, cached := mustAlloc(t, p, toks(0, 32))
	if cached != 31 {
		t.Fatalf("cached %d, want 31", cached)
	}
	if !slices.Equal(a.blocks, b.blocks) || p.Stats().ReferencedBlocks != 2 {
		t.Fatalf("blocks a=%v b=%v, referenced %d: want both shared", a.blocks, b.blocks, p.Stats().ReferencedBlocks)
	}
	if got := p.Lookup(toks(0, 16)); got != 15 {
		t.Fatalf("Lookup of one cached block = %d, want 15", got)
	}
	if got := p.Lookup(nil); got != 0 {
		t.Fatalf("Lookup(nil) = %d", got)
	}
	check(t, p, a, b)
}

func TestLookupHasNoSideEffects(t *testing.T) {
	p := NewPool(8, 4)
	a, _ := mustAlloc(t, p, toks(0, 8))
	b, _ := mustAlloc(t, p, toks(100, 8))
	p.Free(a)
	before := snapshot(p)
	if got := p.Lookup(toks(0, 9)); got != 8 {
		t.Fatalf("Lookup = %d, want 8", got)
	}
	if got := p.Lookup(toks(100, 9)); got != 8 {
		t.Fatalf("Lookup = %d, want 8", got)
	}
	if diff := diffState(before, snapshot(p)); diff != "" {
		t.Fatalf("Lookup changed the pool:\n%s", diff)
	}
	check(t, p, a, b)
}

func TestEvictionOrderIsLRU(t *testing.T) {
	p := NewPool(4, 2)
	// Four one-block prompts, freed in order: the LRU order is A, B, C, D; the free list is empty.
	prompts := [][]uint32{{1, 2}, {3, 4}, {5, 6}, {7, 8}}
	for _, pr := range prompts {
		s, _ := mustAlloc(t, p, pr)
		p.Free(s)
	}
	if st := p.Stats(); st.CachedBlocks != 4 || st.FreeBlocks != 4 || len(p.free) != 0 {
		t.Fatalf("setup: %+v, free list %d", st, len(p.free))
	}
	cachedSet := func() []bool {
		var out []bool
		for _, pr := range prompts {
			out = append(out, p.Lookup(append(slices.Clone(pr), 0)) == 2)
		}
		return out
	}

	// Reuse A (referenced, so off the LRU) and add a partial block: B, the oldest, goes.
	a, cached := mustAlloc(t, p, []uint32{1, 2, 9})
	if cached != 2 {
		t.Fatalf("cached %d, want 2", cached)
	}
	if got, want := cachedSet(), []bool{true, false, true, true}; !slices.Equal(got, want) {
		t.Fatalf("cached after first eviction %v, want %v", got, want)
	}
	// Freeing A makes it the most recently used; its partial block returns to the free list.
	p.Free(a)
	// Two blocks needed: the free list's one, then C (the oldest remaining); D and A survive.
	s, _ := mustAlloc(t, p, []uint32{11, 12, 13})
	if got, want := cachedSet(), []bool{true, false, false, true}; !slices.Equal(got, want) {
		t.Fatalf("cached after second eviction %v, want %v", got, want)
	}
	if ev := p.Stats().Evictions; ev != 2 {
		t.Fatalf("evictions %d, want 2", ev)
	}
	check(t, p, a, s)
}

func TestFreeReleasesDeepestBlockFirst(t *testing.T) {
	p := NewPool(3, 2)
	s, _ := mustAlloc(t, p, toks(0, 6)) // three full blocks
	p.Free(s)
	// One block is needed: the deepest of the freed prefix goes, its first two blocks stay.
	o, _ := mustAlloc(t, p, []uint32{50})
	if got := p.Lookup(toks(0, 7)); got != 4 {
		t.Fatalf("Lookup = %d, want 4 (deepest block evicted first)", got)
	}
	check(t, p, s, o)
}

func TestReferencedBlocksAreNeverEvicted(t *testing.T) {
	p := NewPool(4, 2)
	held, _ := mustAlloc(t, p, toks(0, 4)) // two cached, referenced blocks
	x, _ := mustAlloc(t, p, []uint32{20, 21})
	p.Free(x) // one evictable block, one free block
	if _, _, err := p.Allocate(toks(30, 6)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err %v, want ErrNoSpace", err)
	}
	y, _ := mustAlloc(t, p, toks(30, 4)) // takes the free block and evicts x's block
	if got := p.Lookup(toks(0, 5)); got != 4 {
		t.Fatalf("held prefix Lookup = %d, want 4", got)
	}
	if err := y.Append(99); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append err %v, want ErrNoSpace", err)
	}
	if ev := p.Stats().Evictions; ev != 1 {
		t.Fatalf("evictions %d, want 1", ev)
	}
	check(t, p, held, y)
}

func TestNoSpaceLeavesPoolUnchanged(t *testing.T) {
	p := NewPool(3, 2)
	x, _ := mustAlloc(t, p, toks(0, 4))
	p.Free(x) // two evictable blocks holding [0 1][2 3], one free block

	before := snapshot(p)
	// The two cached blocks match, but referencing them leaves only the free block for two fresh
	// ones: the matched blocks must not be counted as room.
	if _, _, err := p.Allocate(toks(0, 8)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Allocate err %v, want ErrNoSpace", err)
	}
	if _, err := p.Import(toks(0, 8)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Import err %v, want ErrNoSpace", err)
	}
	if _, _, err := p.Allocate(toks(100, 7)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Allocate err %v, want ErrNoSpace", err)
	}
	if diff := diffState(before, snapshot(p)); diff != "" {
		t.Fatalf("failed calls changed the pool:\n%s", diff)
	}

	// Append: fill the pool, then cross a block boundary.
	s, _ := mustAlloc(t, p, toks(0, 6))
	before = snapshot(p)
	if err := s.Append(7); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append err %v, want ErrNoSpace", err)
	}
	if diff := diffState(before, snapshot(p)); diff != "" {
		t.Fatalf("failed Append changed the pool:\n%s", diff)
	}
	if s.Len() != 6 || s.Blocks() != 3 {
		t.Fatalf("seq after failed Append: len %d, %d blocks", s.Len(), s.Blocks())
	}
	check(t, p, s)
}

func TestAppend(t *testing.T) {
	p := NewPool(4, 4)
	s, _ := mustAlloc(t, p, toks(0, 3))
	for i, tok := range toks(3, 6) { // fills block 0, then half of block 1
		if err := s.Append(tok); err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
		check(t, p, s)
	}
	if s.Len() != 9 || s.Blocks() != 3 || !slices.Equal(s.Tokens(), toks(0, 9)) {
		t.Fatalf("len %d blocks %d tokens %v", s.Len(), s.Blocks(), s.Tokens())
	}
	// The blocks Append filled are in the cache for everyone.
	if got := p.Lookup(toks(0, 10)); got != 8 {
		t.Fatalf("Lookup = %d, want 8", got)
	}
	o, cached := mustAlloc(t, p, concat(toks(0, 8), []uint32{77}))
	if cached != 8 {
		t.Fatalf("cached %d, want 8", cached)
	}
	// Pool: s holds 3, o shares 2 and holds 1 partial: full. Append needs a block.
	if err := s.Append(9); err != nil { // still room in s's partial block
		t.Fatal(err)
	}
	for s.Len()%4 != 0 {
		if err := s.Append(uint32(s.Len())); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Append(1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append err %v, want ErrNoSpace", err)
	}
	p.Free(o)
	if err := s.Append(1); err != nil {
		t.Fatalf("Append after Free: %v", err)
	}
	check(t, p, s, o)
	p.Free(s)
	if err := s.Append(1); !errors.Is(err, ErrFreed) {
		t.Fatalf("Append on freed seq: %v, want ErrFreed", err)
	}
	if !s.Freed() || s.Blocks() != 0 || s.Len() != 13 {
		t.Fatalf("freed seq: freed %v blocks %d len %d", s.Freed(), s.Blocks(), s.Len())
	}
	check(t, p)
}

func TestDuplicateFullBlockKeepsFirst(t *testing.T) {
	p := NewPool(4, 2)
	a, _ := mustAlloc(t, p, []uint32{1})
	b, _ := mustAlloc(t, p, []uint32{1})
	for _, s := range []*Seq{a, b} {
		if err := s.Append(2); err != nil {
			t.Fatal(err)
		}
	}
	// Both blocks now hold [1 2]; a's was registered first and stays, b's stays private.
	if got := p.cache[p.hash(rootHash, []uint32{1, 2})]; got != a.blocks[0] {
		t.Fatalf("cache holds block %d, want a's %d", got, a.blocks[0])
	}
	if st := p.Stats(); st.CachedBlocks != 1 || st.ReferencedBlocks != 2 {
		t.Fatalf("stats %+v", st)
	}
	check(t, p, a, b)
	p.Free(b) // the private duplicate goes to the free list
	if len(p.free) != 3 || p.lruLen != 0 {
		t.Fatalf("free list %d, evictable %d", len(p.free), p.lruLen)
	}
	c, cached := mustAlloc(t, p, []uint32{1, 2, 3})
	if cached != 2 || c.blocks[0] != a.blocks[0] {
		t.Fatalf("cached %d block %d, want 2 and a's block", cached, c.blocks[0])
	}
	check(t, p, a, c)
}

func TestFreeTwiceAndForeign(t *testing.T) {
	p := NewPool(4, 2)
	s, _ := mustAlloc(t, p, toks(0, 3))
	if !p.Free(s) {
		t.Fatal("first Free returned false")
	}
	before := snapshot(p)
	if p.Free(s) || p.Free(nil) {
		t.Fatal("second Free or Free(nil) returned true")
	}
	if diff := diffState(before, snapshot(p)); diff != "" {
		t.Fatalf("double Free changed the pool:\n%s", diff)
	}
	q := NewPool(4, 2)
	o, _ := mustAlloc(t, q, toks(0, 3))
	defer func() {
		if recover() == nil {
			t.Fatal("Free of a foreign sequence did not panic")
		}
	}()
	p.Free(o)
}

func TestEmptyPrompt(t *testing.T) {
	p := NewPool(2, 2)
	s, cached := mustAlloc(t, p, nil)
	if cached != 0 || s.Len() != 0 || s.Blocks() != 0 {
		t.Fatalf("cached %d len %d blocks %d", cached, s.Len(), s.Blocks())
	}
	if err := s.Append(5); err != nil {
		t.Fatal(err)
	}
	check(t, p, s)
	p.Free(s)
	check(t, p)
}

func TestImport(t *testing.T) {
	p := NewPool(8, 4)
	pushed := toks(0, 10) // two full blocks and a partial one
	s, err := p.Import(pushed)
	if err != nil {
		t.Fatal(err)
	}
	check(t, p, s)
	if s.Len() != 10 || s.Blocks() != 3 {
		t.Fatalf("imported seq: len %d blocks %d", s.Len(), s.Blocks())
	}
	st := p.Stats()
	if st.Imported != 10 || st.LookupTokens != 0 || st.HitTokens != 0 || st.CachedBlocks != 2 {
		t.Fatalf("stats after Import %+v", st)
	}
	// Decode continues on the imported sequence.
	for _, tok := range []uint32{10, 11, 12} {
		if err := s.Append(tok); err != nil {
			t.Fatal(err)
		}
	}
	check(t, p, s)
	if st := p.Stats(); st.CachedBlocks != 3 {
		t.Fatalf("cached blocks %d, want 3 after decode filled one", st.CachedBlocks)
	}

	// A second import of the same prefix shares the cached blocks.
	s2, err := p.Import(toks(0, 9))
	if err != nil {
		t.Fatal(err)
	}
	if s2.blocks[0] != s.blocks[0] || s2.blocks[1] != s.blocks[1] {
		t.Fatalf("second import blocks %v, first %v", s2.blocks, s.blocks)
	}
	// A local request with the same prefix hits the imported KV.
	o, cached := mustAlloc(t, p, toks(0, 14))
	if cached != 12 {
		t.Fatalf("cached %d, want 12", cached)
	}
	st = p.Stats()
	if st.Imported != 19 || st.LookupTokens != 14 || st.HitTokens != 12 {
		t.Fatalf("stats %+v", st)
	}
	for _, x := range []*Seq{s, s2, o} {
		p.Free(x)
	}
	check(t, p, s, s2, o)
	if st := p.Stats(); st.FreeBlocks != st.TotalBlocks {
		t.Fatalf("leak after import: %+v", st)
	}
	if _, err := p.Import(toks(500, 33)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("oversized Import err %v, want ErrNoSpace", err)
	}
}

func BenchmarkAllocateFree512Warm(b *testing.B) {
	p := NewPool(DefaultTotalBlocks, DefaultBlockSize)
	prompt := make([]uint32, 512)
	for i := range prompt {
		prompt[i] = uint32(i*7919) % 32000
	}
	s, _, err := p.Allocate(prompt)
	if err != nil {
		b.Fatal(err)
	}
	p.Free(s)
	b.ReportAllocs()
	for b.Loop() {
		s, cached, err := p.Allocate(prompt)
		if err != nil || cached != 511 {
			b.Fatalf("cached %d err %v", cached, err)
		}
		p.Free(s)
	}
}
