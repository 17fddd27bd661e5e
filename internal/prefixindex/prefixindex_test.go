package prefixindex

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"
)

// prompt builds a rendered prompt of n bytes whose content is decided by seed, so that two
// prompts with the same seed agree everywhere and with different seeds nowhere.
func prompt(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*7)
	}
	return b
}

func TestHashesChain(t *testing.T) {
	p := prompt(1, 200) // 3 whole chunks and 8 bytes left over
	got := Hashes(nil, p)
	if len(got) != 3 {
		t.Fatalf("len = %d, want 3 (whole chunks only)", len(got))
	}
	if got[0] != xxhash.Sum64(p[:64]) {
		t.Fatal("h1 is not xxHash64 of the first chunk (the R4 prefix key's hash)")
	}
	for i := 1; i < 3; i++ {
		var buf []byte
		buf = binary.LittleEndian.AppendUint64(buf, got[i-1])
		buf = append(buf, p[64*i:64*(i+1)]...)
		if want := xxhash.Sum64(buf); got[i] != want {
			t.Fatalf("h%d = %x, want %x", i+1, got[i], want)
		}
	}
	for _, n := range []int{0, 1, 63} {
		if h := Hashes(nil, prompt(1, n)); len(h) != 0 {
			t.Fatalf("%d bytes: %d hashes, want 0", n, len(h))
		}
	}
	if h := Hashes(nil, prompt(1, 64)); len(h) != 1 {
		t.Fatalf("64 bytes: %d hashes, want 1", len(h))
	}
}

func TestHashesPrefixProperty(t *testing.T) {
	a := prompt(1, 64*8)
	b := bytes.Clone(a)
	b[64*5+3] ^= 0xff // diverge inside chunk 6
	ha, hb := Hashes(nil, a), Hashes(nil, b)
	if !slices.Equal(ha[:5], hb[:5]) {
		t.Fatal("shared prefix chunks hash differently")
	}
	for i := 5; i < 8; i++ {
		if ha[i] == hb[i] {
			t.Fatalf("chunk %d hashes alike after the prompts diverged", i+1)
		}
	}
	// The same chunk at another depth is another prefix: its hash differs.
	c := append(bytes.Clone(a[64:128]), a[64:128]...)
	if hc := Hashes(nil, c); hc[0] == hc[1] {
		t.Fatal("a repeated chunk hashed alike at two depths")
	}
}

func TestHashesReusesDst(t *testing.T) {
	p := prompt(2, 64*32+10)
	dst := make([]uint64, 5, 64)
	dst[0] = 42
	got := Hashes(dst, p)
	if len(got) != 32 || &got[0] != &dst[0] {
		t.Fatalf("len %d, same storage %v", len(got), &got[0] == &dst[0])
	}
	if !slices.Equal(got, Hashes(nil, p)) {
		t.Fatal("reused storage gave other hashes")
	}
	if allocs := testing.AllocsPerRun(100, func() { dst = Hashes(dst, p) }); allocs != 0 {
		t.Fatalf("Hashes allocates %v times with enough capacity", allocs)
	}
}

func TestRecordAndMatch(t *testing.T) {
	x := New(100)
	sys := prompt(1, 64*10)
	req1 := append(bytes.Clone(sys), prompt(2, 64*4)...)
	req2 := append(bytes.Clone(sys), prompt(3, 64*6)...)
	h1, h2 := Hashes(nil, req1), Hashes(nil, req2)

	if got := x.Match("w1", h1); got != 0 {
		t.Fatalf("empty index: %d", got)
	}
	x.Record("w1", h1)
	if got := x.Match("w1", h1); got != 14 {
		t.Fatalf("same prompt: %d, want 14", got)
	}
	if got := x.Match("w1", h2); got != 10 {
		t.Fatalf("shared system prompt: %d, want 10", got)
	}
	if got := x.Match("w2", h1); got != 0 {
		t.Fatalf("other worker: %d, want 0", got)
	}
	if got := x.Match("w1", h1[:3]); got != 3 {
		t.Fatalf("shorter prompt: %d, want 3", got)
	}
	if got := x.Match("w1", nil); got != 0 {
		t.Fatalf("no hashes: %d", got)
	}
	if got := x.Match("w1", Hashes(nil, prompt(9, 64*3))); got != 0 {
		t.Fatalf("unrelated prompt: %d", got)
	}
	x.Record("w1", nil) // a prompt under 64 bytes records nothing
	if x.Len("w1") != 14 {
		t.Fatalf("Len = %d, want 14", x.Len("w1"))
	}
	x.Record("w1", h2)
	if x.Len("w1") != 20 || x.Match("w1", h2) != 16 {
		t.Fatalf("after a second prompt: Len %d, Match %d", x.Len("w1"), x.Match("w1", h2))
	}
	x.Forget("w1")
	if x.Match("w1", h1) != 0 || x.Len("w1") != 0 || x.Workers() != 0 {
		t.Fatal("Forget left entries")
	}
}

func TestLRUEvictsPromptEndsFirst(t *testing.T) {
	x := New(6)
	a := Hashes(nil, prompt(1, 64*4))
	b := Hashes(nil, prompt(2, 64*4))
	x.Record("w", a)
	x.Record("w", b) // 8 entries wanted, 6 kept: a's last two chunks go
	if got := x.Match("w", a); got != 2 {
		t.Fatalf("a after b: %d, want 2 (its tail evicted, its head kept)", got)
	}
	if got := x.Match("w", b); got != 4 {
		t.Fatalf("b: %d, want 4", got)
	}
	// Touching a's head makes it newer than b: b's tail goes next.
	x.Record("w", a[:2])
	x.Record("w", Hashes(nil, prompt(3, 64)))
	if got := x.Match("w", b); got != 3 {
		t.Fatalf("b after a was touched: %d, want 3", got)
	}
	if got := x.Match("w", a); got != 2 {
		t.Fatalf("a after being touched: %d, want 2", got)
	}
	// A prompt longer than the bound keeps its head.
	long := Hashes(nil, prompt(4, 64*20))
	x.Record("w", long)
	if got := x.Match("w", long); got != 6 || x.Len("w") != 6 {
		t.Fatalf("long prompt: Match %d Len %d, want 6 and 6", got, x.Len("w"))
	}
}

func TestMemoryBounded(t *testing.T) {
	const limit = 64
	x := New(limit)
	for i := 0; i < 10*limit; i++ {
		var p [64]byte
		binary.LittleEndian.PutUint64(p[:], uint64(i))
		x.Record("w", Hashes(nil, p[:]))
		if x.Len("w") > limit {
			t.Fatalf("after %d records: Len %d > %d", i+1, x.Len("w"), limit)
		}
	}
	w := x.workers["w"]
	if len(w.nodes) != limit || cap(w.nodes) != limit || len(w.table) != 2*limit {
		t.Fatalf("nodes %d (cap %d), table %d; want %d, %d, %d", len(w.nodes), cap(w.nodes), len(w.table), limit, limit, 2*limit)
	}
	checkLRU(t, w)
	// Long prompts too: 10× the bound in one prompt, then in many.
	x.Record("w", Hashes(nil, prompt(7, 64*10*limit)))
	for i := 0; i < 10; i++ {
		x.Record("v", Hashes(nil, prompt(byte(i), 64*limit)))
	}
	if x.Len("w") != limit || x.Len("v") != limit {
		t.Fatalf("Len w %d v %d, want %d", x.Len("w"), x.Len("v"), limit)
	}
	if New(0).BlocksPerWorker() != DefaultBlocksPerWorker || New(-3).BlocksPerWorker() != DefaultBlocksPerWorker {
		t.Fatal("a bound below 1 does not mean the default")
	}
}

func TestBest(t *testing.T) {
	x := New(1000)
	sys := prompt(1, 64*8)
	q := Hashes(nil, append(bytes.Clone(sys), prompt(2, 64*8)...))
	x.Record("c", q[:12])
	x.Record("b", q[:12])
	x.Record("a", q[:4])
	x.Record("d", Hashes(nil, prompt(5, 64*20)))
	workers := []string{"d", "c", "a", "b", "unknown"}
	if w, n := x.Best(workers, q); w != "b" || n != 12 {
		t.Fatalf("Best = %q, %d; want b (tie with c, smaller id), 12", w, n)
	}
	if w, n := x.Best([]string{"a", "d"}, q); w != "a" || n != 4 {
		t.Fatalf("Best among a, d = %q, %d; want a, 4", w, n)
	}
	if w, n := x.Best([]string{"d", "unknown"}, q); w != "" || n != 0 {
		t.Fatalf("no match: %q, %d", w, n)
	}
	if w, n := x.Best(nil, q); w != "" || n != 0 {
		t.Fatalf("no workers: %q, %d", w, n)
	}
	if w, n := x.Best(workers, nil); w != "" || n != 0 {
		t.Fatalf("no hashes: %q, %d", w, n)
	}
	x.Record("e", q)
	if w, n := x.Best(workers, q); w != "b" || n != 12 {
		t.Fatalf("e is not among the candidates: %q, %d", w, n)
	}
	if w, n := x.Best(append(workers, "e"), q); w != "e" || n != 16 {
		t.Fatalf("Best = %q, %d; want e, 16", w, n)
	}
	if allocs := testing.AllocsPerRun(100, func() { x.Best(workers, q) }); allocs != 0 {
		t.Fatalf("Best allocates %v times", allocs)
	}
	if allocs := testing.AllocsPerRun(100, func() { x.Match("b", q) }); allocs != 0 {
		t.Fatalf("Match allocates %v times", allocs)
	}
}

// checkLRU verifies a worker's structure: the list holds every node once, each node's hash is
// found at a slot that maps back to it, and the table holds nothing else.
func checkLRU(t interface{ Fatalf(string, ...any) }, w *lru) {
	seen := 0
	prev := int32(nilNode)
	for n := w.head; n != nilNode; n = w.nodes[n].next {
		if w.nodes[n].prev != prev {
			t.Fatalf("node %d: prev %d, want %d", n, w.nodes[n].prev, prev)
		}
		if i := w.find(w.nodes[n].hash); i < 0 || w.at(i) != n {
			t.Fatalf("node %d (hash %x) not found in the table", n, w.nodes[n].hash)
		}
		prev = n
		seen++
	}
	if prev != w.tail || seen != len(w.nodes) {
		t.Fatalf("list: %d nodes ending at %d; want %d ending at tail %d", seen, prev, len(w.nodes), w.tail)
	}
	used := 0
	for i, e := range w.table {
		if e == 0 {
			continue
		}
		used++
		if n := nodeOf(e); n < 0 || int(n) >= len(w.nodes) || e != entry(mix(w.nodes[n].hash, w.seed), n) {
			t.Fatalf("slot %d: entry %x, not its node's", i, e)
		}
	}
	if used != len(w.nodes) || 2*used > len(w.table) {
		t.Fatalf("table: %d used of %d slots for %d nodes", used, len(w.table), len(w.nodes))
	}
}

// TestRecordWithinShrinks: a worker whose bound falls below what it holds keeps its most
// recently used entries in their order, so the next eviction takes the least recent of them.
func TestRecordWithinShrinks(t *testing.T) {
	x := New(8)
	for _, h := range []uint64{1, 2, 3, 4} {
		x.Record("w", []uint64{h}) // 4 most recent, then 3, 2, 1
	}
	x.RecordWithin("w", 2, []uint64{5}) // keeps 4 and 3, then 5 evicts 3
	for h, want := range map[uint64]bool{1: false, 2: false, 3: false, 4: true, 5: true} {
		if x.Holds("w", h) != want {
			t.Errorf("holds %d: %v, want %v", h, !want, want)
		}
	}
	if x.Len("w") != 2 {
		t.Fatalf("Len = %d, want 2", x.Len("w"))
	}
	checkHolders(t, x)
	// The bound is the worker's own: another worker keeps the index's.
	for h := range uint64(10) {
		x.Record("v", []uint64{100 + h})
	}
	if x.Len("v") != 8 || x.Len("w") != 2 {
		t.Fatalf("Len(v) = %d, Len(w) = %d; want 8, 2", x.Len("v"), x.Len("w"))
	}
}

// model is the index by definition: per worker a recency list (most recent first), Match a
// linear count of leading hashes held, Best a scan with ties to the smallest id.
type model struct {
	limit int
	lists map[string][]uint64
}

func (m *model) record(w string, hs []uint64) { m.recordWithin(w, 0, hs) }

// recordWithin is record with w's bound lowered to limit (RecordWithin): its list first keeps
// its limit most recent hashes.
func (m *model) recordWithin(w string, limit int, hs []uint64) {
	if len(hs) == 0 {
		return
	}
	if limit < 1 || limit > m.limit {
		limit = m.limit
	}
	l := m.lists[w]
	l = l[:min(len(l), limit)]
	for i := len(hs) - 1; i >= 0; i-- {
		l = slices.DeleteFunc(l, func(h uint64) bool { return h == hs[i] })
		l = slices.Insert(l, 0, hs[i])
		if len(l) > limit {
			l = l[:limit]
		}
	}
	m.lists[w] = l
}

func (m *model) match(w string, hs []uint64) int {
	n := 0
	for n < len(hs) && slices.Contains(m.lists[w], hs[n]) {
		n++
	}
	return n
}

func TestMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.IntRange(1, 24).Draw(t, "limit")
		x := New(limit)
		ref := &model{limit: limit, lists: map[string][]uint64{}}
		workers := []string{"w0", "w1", "w2", "w3"}
		gen := func(t *rapid.T) []uint64 { return treePromptHashes(t, 12) }
		for step := rapid.IntRange(1, 60).Draw(t, "steps"); step > 0; step-- {
			w := workers[rapid.IntRange(0, len(workers)-1).Draw(t, "w")]
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0:
				x.Forget(w)
				delete(ref.lists, w)
			case 1, 2, 3:
				hs := gen(t)
				x.Record(w, hs)
				ref.record(w, hs)
			case 4:
				// A worker's own bound, as the gateway passes what its KV holds: it may fall
				// below what the worker holds, or be out of range (the index's bound).
				hs, lim := gen(t), rapid.IntRange(-1, limit+2).Draw(t, "within")
				x.RecordWithin(w, lim, hs)
				ref.recordWithin(w, lim, hs)
			default:
				hs := gen(t)
				if got, want := x.Match(w, hs), ref.match(w, hs); got != want {
					t.Fatalf("Match(%s) = %d, want %d", w, got, want)
				}
				bw, bn := "", 0
				for _, id := range workers {
					if m := ref.match(id, hs); m > bn {
						bw, bn = id, m
					}
				}
				if gw, gn := x.Best(workers, hs); gw != bw || gn != bn {
					t.Fatalf("Best = %q, %d; want %q, %d", gw, gn, bw, bn)
				}
			}
			for _, id := range workers {
				if w := x.workers[id]; w != nil {
					checkLRU(t, w)
				}
				if x.Len(id) != len(ref.lists[id]) {
					t.Fatalf("Len(%s) = %d, want %d", id, x.Len(id), len(ref.lists[id]))
				}
				if hs := ref.lists[id]; len(hs) > 0 && x.Match(id, hs[:1]) != 1 {
					t.Fatalf("%s lost its most recent hash", id)
				}
			}
			checkHolders(t, x)
		}
	})
}

// benchIndex has n workers that all served a prompt sharing a 16-chunk system prompt with q,
// each a different amount of q's own tail (0 to 16 chunks), so Best does real work.
func benchIndex(n int) (*Index, []string, []uint64) {
	x := New(DefaultBlocksPerWorker)
	sys := prompt(1, 64*16)
	q := Hashes(nil, append(bytes.Clone(sys), prompt(2, 64*16)...))
	workers := make([]string, n)
	for i := range workers {
		workers[i] = fmt.Sprintf("worker-%04d", i)
		x.Record(workers[i], q[:16+i%17])
		// Plus unrelated history to fill the maps.
		for j := 0; j < 8; j++ {
			x.Record(workers[i], Hashes(nil, prompt(byte(3+i+j), 64*32)))
		}
	}
	return x, workers, q
}

// BenchmarkBest is one prefix-aware decision: 1000 workers × a 32-chunk prompt.
func BenchmarkBest(b *testing.B) {
	x, workers, q := benchIndex(1000)
	b.ReportAllocs()
	for b.Loop() {
		x.Best(workers, q)
	}
}

// BenchmarkMatchAll scores every worker by Match, as a per-member scorer does.
func BenchmarkMatchAll(b *testing.B) {
	x, workers, q := benchIndex(1000)
	b.ReportAllocs()
	for b.Loop() {
		for _, w := range workers {
			x.Match(w, q)
		}
	}
}

// BenchmarkRecord is the dispatch-time cost: 32 chunks into a full worker.
func BenchmarkRecord(b *testing.B) {
	x, workers, _ := benchIndex(1)
	hs := make([][]uint64, 256)
	for i := range hs {
		hs[i] = Hashes(nil, prompt(byte(i), 64*32))
	}
	for _, h := range hs { // 8192 distinct chunks: the worker is full and evicting
		x.Record(workers[0], h)
	}
	if x.Len(workers[0]) != DefaultBlocksPerWorker {
		b.Fatalf("Len = %d", x.Len(workers[0]))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		x.Record(workers[0], hs[i%len(hs)])
		i++
	}
}

// BenchmarkHashes hashes a 2 KiB rendered prompt into reused storage.
func BenchmarkHashes(b *testing.B) {
	p := prompt(1, 2048)
	dst := make([]uint64, 0, 32)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		dst = Hashes(dst, p)
	}
}

// treePromptHashes draws the hashes of a prompt of up to maxChunks chunks from a small tree: a
// few stems and branches, so prefixes are shared often.
func treePromptHashes(t *rapid.T, maxChunks int) []uint64 {
	stem := rapid.IntRange(0, 2).Draw(t, "stem")
	n := rapid.IntRange(0, maxChunks).Draw(t, "chunks")
	branch := rapid.IntRange(0, 3).Draw(t, "branch")
	at := rapid.IntRange(0, maxChunks).Draw(t, "at")
	p := prompt(byte(stem), 64*n)
	for i := at * 64; i < len(p); i++ {
		p[i] ^= byte(branch) * 0x55
	}
	return Hashes(nil, p)
}

// unmix inverts mix: the hash whose mixed value under seed is z.
func unmix(z, seed uint64) uint64 {
	inv := func(a uint64) uint64 { // a's inverse mod 2^64 (a odd), by Newton's iteration
		x := a
		for range 6 {
			x *= 2 - a*x
		}
		return x
	}
	unshift := func(y uint64, k uint) uint64 { // inverts y = x ^ x>>k
		x := y
		for s := k; s < 64; s += k {
			x ^= y >> s
		}
		return x
	}
	z = unshift(z, 31)
	z *= inv(0x94d049bb133111eb)
	z = unshift(z, 27)
	z *= inv(0xbf58476d1ce4e5b9)
	z = unshift(z, 30)
	return z ^ seed
}

// TestTableTagsCollide: a worker's table tells hashes apart by their node, not by the 32 bits of
// their mixed value a slot keeps: two hashes that agree on those bits are both held, each found
// as itself, and an entry whose bits are all 0 (node 0, tag 0: the slot value 1) survives the
// table's growth.
func TestTableTagsCollide(t *testing.T) {
	x := New(64)
	for _, z := range []uint64{7, 7 + 1<<32} {
		if got := mix(unmix(z, x.seed), x.seed); got != z {
			t.Fatalf("unmix(%x) mixes back to %x", z, got)
		}
	}
	zero, h1, h2 := unmix(0, x.seed), unmix(7, x.seed), unmix(7+1<<32, x.seed)
	x.Record("w", []uint64{zero}) // node 0, entry 1
	x.Record("w", []uint64{h1})
	if x.Match("w", []uint64{h2}) != 0 || x.Holds("w", h2) {
		t.Fatal("a hash whose mixed value shares its low 32 bits with a held one counts as held")
	}
	x.Record("w", []uint64{h2})
	more := make([]uint64, 40) // grows the table from 16 slots, twice
	for i := range more {
		more[i] = uint64(i)*0x9e3779b97f4a7c15 + 3
	}
	x.Record("w", more)
	for _, h := range []uint64{zero, h1, h2} {
		if !x.Holds("w", h) {
			t.Fatalf("%x lost", h)
		}
	}
	checkLRU(t, x.workers["w"])
}
