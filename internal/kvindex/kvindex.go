// Package kvindex is tlgw's exact prefix index (SPEC R18.2 precise_prefix, R18.3): which
// 64-byte chunks of rendered prompts each worker's prefix cache holds, as the engines report
// them on their tl.kv.v1.KvEvents streams, so the router can send a prompt to the worker that
// holds its longest prefix.
//
// Chunk ids are internal/prefixindex's Hashes over the rendered prompt: chained, so a chunk id
// stands for the whole prefix up to and including its chunk, and a worker holds a prompt's
// prefix of k chunks exactly when it holds the prompt's k-th id (hashes[k-1]). An engine's
// prefix cache holds leading runs (a block is only found through its parents, and a prompt's
// use touches its prefix with it, so a prefix is never evicted before its extensions), which
// makes "holds hashes[d-1]" monotone in d: Match and the policy's pick binary-search the depth,
// as prefixindex does. Should an engine hold a deeper chunk without a shallower one, the search
// still returns a depth whose chunk is held (a held prefix), not necessarily the deepest.
//
// Unlike prefixindex it records what engines say they hold, not what the gateway sent: Store
// and Remove apply STORED and REMOVED events, Forget a CLEARED one (and a worker leaving).
//
// Workers are keyed by W, the caller's own identity for a worker (the router uses its
// *policy.Member: one per registered slot, so a new registration under an old id starts from
// nothing and nothing an engine reports can land on another worker's entries).
//
// Bounds: each worker holds at most BlocksPerWorker ids. Store drops the ids beyond the bound
// (they are not recorded; Dropped counts them) rather than forgetting older ones: the index then
// under-reports (a hit missed), never claims a chunk the engine does not hold. Memory is at most
// workers × BlocksPerWorker entries in the per-worker sets, and one holder-table entry per
// distinct id; the holder table is rebuilt smaller once it holds fewer than an eighth of its
// peak.
//
// Layout. The router applies every engine's STORED and REMOVED events, so at fleet scale (1,000
// workers at the default bound: 4 million entries) the index is large and an event's cost is its
// cache misses and what it makes the garbage collector do. Both tables are therefore free of
// pointers, which the collector does not scan: a worker's set maps each id to its position on the
// id's holder list, and the holder table maps an id to its one holder's slot number, or, for an
// id held by two or more workers (a shared system prompt), to a list of holders kept beside the
// table. An id held once, the common case, costs no allocation. Measured at 1,000 workers of
// 4,096 distinct ids (tests/bench: BenchmarkMemoryPrefixIndexes, BenchmarkExactIndexChurn):
// 73 bytes an entry (was 126 with a slice per id), a full collection with the index live 6 ms
// (was 487: the collector marked every slice), no allocation per STORED id (was one).
//
// An Index is not safe for concurrent use: the router actor that owns it is its only user.
package kvindex

// DefaultBlocksPerWorker is the per-worker bound New uses when given none: the default of
// [admission.prefix_index] blocks_per_worker, about 4,096 KV blocks of 16 tokens.
const DefaultBlocksPerWorker = 4096

// MaxBlocksPerWorker is the largest per-worker bound.
const MaxBlocksPerWorker = 1 << 20

// shared marks a holder-table value that is a list number (in lists), not a worker's slot.
const shared = 1 << 63

// Index is the exact prefix index over all workers. The zero value is not usable; call New.
//
// Bounds: workers holds the workers that hold at least one id (Remove or Forget of the last
// drops one; the router forgets a worker that leaves); slots and free never outgrow the most
// workers held at once (free slots are reused); holders one per distinct id held, rebuilt
// smaller after a fall (shrink); lists and unused at most the shared ids at their peak.
type Index[W comparable] struct {
	limit   int
	workers map[W]*worker[W]
	slots   []*worker[W]      // by slot number; nil when free
	free    []uint32          // free slot numbers
	holders map[uint64]uint64 // chunk id → its one holder's slot, or shared | its list's number
	lists   [][]W             // holder lists of ids held by two or more workers, in no order
	unused  []uint32          // list numbers free for reuse
	peak    int               // the most distinct ids held since the holder table was last built
	entries int
	dropped uint64
}

// worker is one worker's held ids: each id's position on its holder list (0 for an id it alone
// holds).
type worker[W comparable] struct {
	at   map[uint64]int32
	self [1]W // the worker, as Holders returns it for an id held by it alone
	slot uint32
}

// New returns an empty index that keeps at most blocksPerWorker chunk ids per worker
// (DefaultBlocksPerWorker when blocksPerWorker < 1, at most MaxBlocksPerWorker).
func New[W comparable](blocksPerWorker int) *Index[W] {
	if blocksPerWorker < 1 {
		blocksPerWorker = DefaultBlocksPerWorker
	}
	blocksPerWorker = min(blocksPerWorker, MaxBlocksPerWorker)
	return &Index[W]{limit: blocksPerWorker, workers: make(map[W]*worker[W]), holders: make(map[uint64]uint64)}
}

// BlocksPerWorker is the per-worker bound.
func (x *Index[W]) BlocksPerWorker() int { return x.limit }

// Store records that w now holds ids (a STORED event). Ids already held change nothing; ids
// beyond the worker's bound are dropped (see the package comment), the first ones given kept.
func (x *Index[W]) Store(w W, ids []uint64) {
	if len(ids) == 0 {
		return
	}
	wk := x.workers[w]
	if wk == nil {
		wk = x.newWorker(w, min(len(ids), x.limit))
	}
	for _, id := range ids {
		if _, ok := wk.at[id]; ok {
			continue
		}
		if len(wk.at) >= x.limit {
			x.dropped++
			continue
		}
		wk.at[id] = x.hold(id, wk)
		x.entries++
	}
	x.peak = max(x.peak, len(x.holders))
}

// newWorker gives w a slot and an empty set sized for hint ids.
func (x *Index[W]) newWorker(w W, hint int) *worker[W] {
	wk := &worker[W]{at: make(map[uint64]int32, hint), self: [1]W{w}}
	if k := len(x.free); k > 0 {
		wk.slot = x.free[k-1]
		x.free = x.free[:k-1]
		x.slots[wk.slot] = wk
	} else {
		wk.slot = uint32(len(x.slots))
		x.slots = append(x.slots, wk)
	}
	x.workers[w] = wk
	return wk
}

// dropWorker frees the slot of wk, which holds nothing.
func (x *Index[W]) dropWorker(wk *worker[W]) {
	delete(x.workers, wk.self[0])
	x.slots[wk.slot] = nil
	x.free = append(x.free, wk.slot)
}

// hold puts wk on id's holders and returns its position there.
func (x *Index[W]) hold(id uint64, wk *worker[W]) int32 {
	v, ok := x.holders[id]
	switch {
	case !ok:
		x.holders[id] = uint64(wk.slot)
		return 0
	case v&shared == 0: // one holder so far, at position 0: the two start a list
		var n uint32
		if k := len(x.unused); k > 0 {
			n = x.unused[k-1]
			x.unused = x.unused[:k-1]
		} else {
			n = uint32(len(x.lists))
			x.lists = append(x.lists, nil)
		}
		x.lists[n] = append(x.lists[n], x.slots[v].self[0], wk.self[0])
		x.holders[id] = shared | uint64(n)
		return 1
	default:
		l := &x.lists[uint32(v)]
		*l = append(*l, wk.self[0])
		return int32(len(*l) - 1)
	}
}

// Remove records that w no longer holds ids (a REMOVED event). Ids not held change nothing.
func (x *Index[W]) Remove(w W, ids []uint64) {
	wk := x.workers[w]
	if wk == nil {
		return
	}
	for _, id := range ids {
		if pos, ok := wk.at[id]; ok {
			delete(wk.at, id)
			x.unhold(id, pos)
		}
	}
	if len(wk.at) == 0 {
		x.dropWorker(wk)
	}
	x.shrink()
}

// Forget drops everything w holds: a CLEARED event, a lost stream, or the worker leaving.
func (x *Index[W]) Forget(w W) {
	wk := x.workers[w]
	if wk == nil {
		return
	}
	for id, pos := range wk.at {
		x.unhold(id, pos)
	}
	x.dropWorker(wk)
	x.shrink()
}

// unhold takes the holder at pos off id's holders: on a list, the last holder moves into its
// place, and a list left with one holder goes back into the table.
func (x *Index[W]) unhold(id uint64, pos int32) {
	x.entries--
	v := x.holders[id]
	if v&shared == 0 {
		delete(x.holders, id)
		return
	}
	n := uint32(v)
	hs := x.lists[n]
	last := int32(len(hs) - 1)
	if pos != last {
		moved := hs[last]
		hs[pos] = moved
		x.workers[moved].at[id] = pos
	}
	var zero W
	hs[last] = zero
	hs = hs[:last]
	if len(hs) > 1 {
		x.lists[n] = hs
		return
	}
	// One holder left, at position 0 (the one removed was there, and the last moved into it,
	// or it was the last): its position in the table's own entry is 0 too.
	x.holders[id] = uint64(x.workers[hs[0]].slot)
	hs[0] = zero
	x.releaseList(n, hs[:0])
}

// releaseList makes list n free for reuse, keeping a small list's storage for the next.
func (x *Index[W]) releaseList(n uint32, emptied []W) {
	if cap(emptied) > 64 {
		emptied = nil
	}
	x.lists[n] = emptied
	x.unused = append(x.unused, n)
}

// shrink rebuilds the holder table once it holds under an eighth of its peak, since a Go map
// keeps its storage after deletes; the lists are numbered afresh with it, the free ones let go.
func (x *Index[W]) shrink() {
	if x.peak < 1024 || 8*len(x.holders) >= x.peak {
		return
	}
	fresh := make(map[uint64]uint64, len(x.holders))
	var lists [][]W
	for id, v := range x.holders {
		if v&shared != 0 {
			lists = append(lists, x.lists[uint32(v)])
			v = shared | uint64(len(lists)-1)
		}
		fresh[id] = v
	}
	x.holders, x.lists, x.unused, x.peak = fresh, lists, nil, len(fresh)
}

// Holds reports whether w holds id.
func (x *Index[W]) Holds(w W, id uint64) bool {
	wk := x.workers[w]
	if wk == nil {
		return false
	}
	_, ok := wk.at[id]
	return ok
}

// Holders returns the workers holding id, in no particular order. With id the k-th of a
// prompt's hashes they are the workers holding its prefix of k chunks. The slice is the index's
// own: read it before the next Store, Remove or Forget, and do not modify it.
func (x *Index[W]) Holders(id uint64) []W {
	v, ok := x.holders[id]
	switch {
	case !ok:
		return nil
	case v&shared == 0:
		return x.slots[v].self[:]
	default:
		return x.lists[uint32(v)]
	}
}

// Match returns w's held prefix of hashes in chunks: the deepest d with hashes[d-1] held,
// found by binary search (see the package comment); 0 for an unknown worker. It allocates
// nothing.
func (x *Index[W]) Match(w W, hashes []uint64) int {
	wk := x.workers[w]
	if wk == nil {
		return 0
	}
	lo, hi := 0, len(hashes) // hashes[:lo] taken as held; hashes[hi:] not
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if _, ok := wk.at[hashes[mid]]; ok {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// MatchAll writes into out[i] the Match of candidates[i] and returns out[:len(candidates)]
// (out grows only when it lacks the capacity).
func (x *Index[W]) MatchAll(hashes []uint64, candidates []W, out []int) []int {
	out = out[:0]
	for _, w := range candidates {
		out = append(out, x.Match(w, hashes))
	}
	return out
}

// Len is how many ids w holds (at most BlocksPerWorker).
func (x *Index[W]) Len(w W) int {
	if wk := x.workers[w]; wk != nil {
		return len(wk.at)
	}
	return 0
}

// Workers is how many workers hold at least one id.
func (x *Index[W]) Workers() int { return len(x.workers) }

// Entries is the number of (worker, id) entries: at most Workers() × BlocksPerWorker().
func (x *Index[W]) Entries() int { return x.entries }

// Distinct is the number of distinct ids held by any worker.
func (x *Index[W]) Distinct() int { return len(x.holders) }

// Dropped counts the ids Store dropped at a worker's bound.
func (x *Index[W]) Dropped() uint64 { return x.dropped }
