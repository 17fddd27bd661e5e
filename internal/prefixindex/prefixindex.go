// Package prefixindex is tlgw's approximate prefix index (R10): for every worker, which 64-byte
// chunks of rendered prompts it has recently been sent, so the router can estimate how much of a
// new prompt each worker already holds in its prefix cache without asking it.
//
// A prompt is cut into whole 64-byte chunks and each chunk is named by a chained hash, so one
// hash stands for the whole prefix up to and including its chunk (Hashes). When a request is
// dispatched to a worker, its hashes are recorded there (Record); a worker's matched prefix for a
// new prompt is the number of its leading chunk hashes the worker holds (Match), and Best finds
// the worker with the longest match. 64 bytes are about 16 tokens, one KV block of tlengine.
//
// Each worker keeps at most blocksPerWorker hashes, least recently used forgotten first, so
// memory is bounded by workers × blocksPerWorker entries. Record touches a prompt's hashes from
// the last chunk to the first, so a prefix is always more recent than any longer prefix built on
// it, and eviction drops the ends of prompts before their beginnings, as an engine's prefix
// cache does. As a result the chunks a worker holds of any prompt are always a leading run,
// which lets Match binary-search instead of scanning.
//
// Beside the per-worker lists the index keeps the inverse, from each chunk hash to the workers
// that hold it (Holders), so a pick need not ask every worker: by the leading-run property the
// workers that hold a prompt's k-th hash are exactly those whose match is at least k, and the
// holders of deeper hashes are a subset of the holders of shallower ones. Every (worker, hash)
// entry sits on exactly one holder list, so the inverse adds a fixed amount per entry and one
// table slot per distinct hash, and stays within the same workers × blocksPerWorker bound.
//
// The index is approximate: it models what the gateway sent, not what the engine kept (an
// engine under memory pressure may have evicted more, a restarted one holds nothing until
// Forget is called), and two different prefixes share a hash with probability 2⁻⁶⁴.
//
// An Index is not safe for concurrent use: the router actor that owns it is its only user.
package prefixindex

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// ChunkBytes is the size of one hashed chunk of a rendered prompt.
const ChunkBytes = 64

// DefaultBlocksPerWorker is the per-worker bound New uses when given none.
const DefaultBlocksPerWorker = 4096

// Hashes returns the chained hashes of rendered's whole 64-byte chunks, reusing dst's storage
// (its contents are overwritten, from dst[:0]); it allocates only when dst lacks the capacity.
// A trailing partial chunk is not hashed, so a prompt shorter than 64 bytes has no hashes.
//
//	h₁ = xxHash64(chunk₁)
//	hᵢ = xxHash64(hᵢ₋₁ as 8 little-endian bytes ‖ chunkᵢ)   for i > 1
//
// h₁ is the R3.4 Hash64 of the R4 prefix key of a prompt of at least 64 bytes. Two prompts
// whose first k·64 bytes agree share their first k hashes, and (up to hash collisions) no more
// after they diverge.
func Hashes(dst []uint64, rendered []byte) []uint64 {
	dst = dst[:0]
	if len(rendered) < ChunkBytes {
		return dst
	}
	h := xxhash.Sum64(rendered[:ChunkBytes])
	dst = append(dst, h)
	var buf [8 + ChunkBytes]byte
	for off := ChunkBytes; off+ChunkBytes <= len(rendered); off += ChunkBytes {
		binary.LittleEndian.PutUint64(buf[:8], h)
		copy(buf[8:], rendered[off:off+ChunkBytes])
		h = xxhash.Sum64(buf[:])
		dst = append(dst, h)
	}
	return dst
}

// Index is the approximate prefix index over all workers. The zero value is not usable; call
// New.
//
// Bounds: workers holds the workers that recorded something and were not forgotten (the router
// forgets a worker that leaves), each at most its limit of hashes; byNum and free never outgrow
// the most workers known at once; holders one slot per distinct hash held, halved as it empties.
type Index struct {
	limit   int
	seed    uint64
	workers map[string]*lru
	byNum   []*lru  // workers by number (lru.num); byNum[0] is never used, nil where free
	free    []int32 // numbers of forgotten workers, reused before byNum grows
	holders holderTable
}

// New returns an empty index that keeps at most blocksPerWorker chunk hashes per worker
// (DefaultBlocksPerWorker when blocksPerWorker < 1).
func New(blocksPerWorker int) *Index {
	if blocksPerWorker < 1 {
		blocksPerWorker = DefaultBlocksPerWorker
	}
	blocksPerWorker = min(blocksPerWorker, math.MaxInt32) // nodes link by int32
	seed := rand.Uint64()
	return &Index{limit: blocksPerWorker, seed: seed, workers: make(map[string]*lru),
		byNum: make([]*lru, 1), holders: newHolderTable(seed)}
}

// BlocksPerWorker is the per-worker bound the index was built with.
func (x *Index) BlocksPerWorker() int { return x.limit }

// Record notes that a prompt with these chunk hashes was dispatched to worker: each becomes
// worker's most recently used entry, the first chunk most recent of all, and the least
// recently used entries beyond the bound are forgotten. A prompt longer than the bound keeps
// only its first blocksPerWorker chunks.
func (x *Index) Record(worker string, hashes []uint64) { x.RecordWithin(worker, 0, hashes) }

// RecordWithin is Record with worker's bound lowered to limit chunks (limit < 1 or above
// BlocksPerWorker: BlocksPerWorker), for a worker known to hold less: the gateway passes what
// the worker's KV cache can hold, so the index does not believe it holds prompts its engine
// must have evicted. A worker that holds more than a new, lower bound keeps its most recently
// used entries.
func (x *Index) RecordWithin(worker string, limit int, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	if limit < 1 || limit > x.limit {
		limit = x.limit
	}
	w := x.workers[worker]
	switch {
	case w == nil:
		w = x.add(worker)
	case w.len() > limit:
		w = x.shrink(w, limit)
	}
	w.limit = limit
	hashes = hashes[:min(len(hashes), limit)]
	for i := len(hashes) - 1; i >= 0; i-- {
		x.touch(w, hashes[i])
	}
}

// add starts worker's entry.
func (x *Index) add(worker string) *lru {
	w := newLRU(x.seed)
	w.id = worker
	if k := len(x.free); k > 0 {
		w.num = x.free[k-1]
		x.free = x.free[:k-1]
	} else {
		w.num = int32(len(x.byNum))
		x.byNum = append(x.byNum, nil)
	}
	x.byNum[w.num] = w
	x.workers[worker] = w
	w.limit = x.limit
	return w
}

// shrink keeps only w's limit most recently used entries, in their order: it forgets w and
// records them again (rare: only when a worker's bound falls below what it holds).
func (x *Index) shrink(w *lru, limit int) *lru {
	keep := make([]uint64, 0, limit)
	for n := w.head; n != nilNode && len(keep) < limit; n = w.nodes[n].next {
		keep = append(keep, w.nodes[n].hash)
	}
	x.Forget(w.id)
	nw := x.add(w.id)
	for i := len(keep) - 1; i >= 0; i-- {
		x.touch(nw, keep[i])
	}
	return nw
}

// Match returns how many leading chunks of hashes worker holds: its matched prefix length in
// chunks (multiply by ChunkBytes for bytes, about 16 tokens a chunk). An unknown worker
// matches 0. Match does not count as a use: it refreshes nothing.
func (x *Index) Match(worker string, hashes []uint64) int {
	w := x.workers[worker]
	if w == nil {
		return 0
	}
	return w.match(hashes, 0)
}

// Holds reports whether worker holds h, one chunk hash: for the k-th hash of a prompt,
// whether its Match for that prompt is at least k+1. It refreshes nothing.
func (x *Index) Holds(worker string, h uint64) bool {
	w := x.workers[worker]
	return w != nil && w.has(h)
}

// Best returns the worker among workers with the longest match for hashes and that match in
// chunks; ties go to the smallest id. When no worker matches even one chunk it returns ("", 0).
// It costs about one or two lookups per worker beyond the first match plus a binary search
// for each improvement, and allocates nothing.
func (x *Index) Best(workers []string, hashes []uint64) (worker string, chunks int) {
	for _, id := range workers {
		w := x.workers[id]
		if w == nil {
			continue
		}
		m := 0
		if chunks > 0 {
			// Only a worker that holds the current best prefix can tie or beat it.
			if !w.has(hashes[chunks-1]) {
				continue
			}
			m = w.match(hashes, chunks)
		} else {
			m = w.match(hashes, 0)
		}
		if m > chunks || (m == chunks && m > 0 && id < worker) {
			worker, chunks = id, m
		}
	}
	return worker, chunks
}

// Forget drops everything recorded for worker, e.g. when it leaves the fleet or restarts.
func (x *Index) Forget(worker string) {
	w := x.workers[worker]
	if w == nil {
		return
	}
	for n := range w.nodes {
		x.unlinkHolder(w, int32(n))
	}
	x.holders.shrink()
	x.byNum[w.num] = nil
	// Trailing free numbers are dropped, the others kept for reuse, so byNum never outgrows
	// the most workers known at once.
	x.free = append(x.free, w.num)
	for last := int32(len(x.byNum) - 1); last > 0 && x.byNum[last] == nil; last-- {
		k := slices.Index(x.free, last)
		x.free[k] = x.free[len(x.free)-1]
		x.free = x.free[:len(x.free)-1]
		x.byNum = x.byNum[:last]
	}
	delete(x.workers, worker)
}

// Holders returns a cursor over the workers that hold h, in no particular order. With h the
// k-th of a prompt's hashes (Hashes), they are the workers whose Match for that prompt is at
// least k+1. The cursor is valid until the next Record or Forget.
func (x *Index) Holders(h uint64) Holders {
	if i := x.holders.find(h); i >= 0 {
		return Holders{x: x, at: x.holders.slots[i].head}
	}
	return Holders{}
}

// Holders is a cursor over the workers holding one chunk hash (Index.Holders). The zero value
// holds nobody.
type Holders struct {
	x  *Index
	at ref
}

// Next returns the next holder's id, or ("", false) after the last.
func (c *Holders) Next() (worker string, ok bool) {
	if c.at.w == 0 {
		return "", false
	}
	w := c.x.byNum[c.at.w]
	c.at = w.links[c.at.n].next
	return w.id, true
}

// NextNum is Next with the holder's number in the index: a small integer, unique among the
// workers the index knows at once and reused after Forget, so a caller can cache what it
// knows of a worker in a slice by number and check the entry against the id.
func (c *Holders) NextNum() (num int32, worker string, ok bool) {
	if c.at.w == 0 {
		return 0, "", false
	}
	num = c.at.w
	w := c.x.byNum[num]
	c.at = w.links[c.at.n].next
	return num, w.id, true
}

// Entries is the number of (worker, hash) entries the index holds, summed over workers: at
// most Workers() × BlocksPerWorker().
func (x *Index) Entries() int { return x.holders.entries }

// Distinct is the number of distinct hashes held by any worker (at most Entries()).
func (x *Index) Distinct() int { return x.holders.used }

// Len returns how many chunk hashes the index holds for worker (at most BlocksPerWorker).
func (x *Index) Len(worker string) int {
	if w := x.workers[worker]; w != nil {
		return w.len()
	}
	return 0
}

// Workers returns how many workers have entries.
func (x *Index) Workers() int { return len(x.workers) }

// lru is one worker's hashes: nodes in a doubly linked list by recency (head most recent), and
// an open-addressing table from hash to node. Nodes live in one slice and link by index, and an
// evicted node is reused in place. The table uses linear probing with backward-shift deletion,
// so it holds no tombstones and grows only with the number of live entries: a worker's memory
// is at most limit nodes (with their holder links) plus a table of the next power of two
// ≥ 2·limit slots, however much churn it sees. (Go maps are avoided here because deleting
// under churn may grow them.) A slot holds its node's index and 32 bits of the node's mixed
// hash (see entry), from which a probe tells most other hashes apart and the table finds every
// entry's home without reading the node: a node is read only to confirm a match, since the
// nodes of 1,000 workers at their bound are far outside the processor's caches.
type lru struct {
	seed  uint64   // the index's; spreads hashes over the table unpredictably to clients
	table []uint64 // entry per slot, 0 when empty; len is a power of two
	nodes []node
	links []link // per node, its place on its hash's holders (apart, so lookups read less)
	head  int32
	tail  int32
	id    string // the worker's
	num   int32  // the worker's number in the index (≥ 1), which holder lists link by
	limit int    // its bound (RecordWithin), at most the index's
}

type node struct {
	hash       uint64
	prev, next int32
}

// link is a node's place on the list of workers holding its hash; the zero ref ends it.
type link struct{ prev, next ref }

// ref names one node of one worker; worker numbers start at 1, so the zero ref names none.
type ref struct{ w, n int32 }

const nilNode = -1

func newLRU(seed uint64) *lru {
	return &lru{seed: seed, table: make([]uint64, 16), head: nilNode, tail: nilNode}
}

// entry is the slot value of node n whose hash mixes (mix) to z: z's low 32 bits, whose low
// bits are its home in any table of up to 2³² slots, above n+1 (so 0 is no entry).
func entry(z uint64, n int32) uint64 { return uint64(uint32(z))<<32 | uint64(uint32(n)+1) }

// nodeOf is the node a slot's entry names.
func nodeOf(e uint64) int32 { return int32(uint32(e)) - 1 }

// at is the node in slot i (which holds one).
func (w *lru) at(i int) int32 { return nodeOf(w.table[i]) }

// mix spreads h over 64 bits, seeded. The seed keeps a client that can compute chunk hashes
// from chosen prompts from aiming them all at one slot; the finalizer (SplitMix64's) spreads
// every bit.
func mix(h, seed uint64) uint64 {
	z := h ^ seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// slotOf is h's first slot in a table of size slots (a power of two) seeded with seed.
func slotOf(h, seed uint64, size int) int { return int(mix(h, seed) & uint64(size-1)) }

// find returns h's slot, or -1.
func (w *lru) find(h uint64) int {
	mask := len(w.table) - 1
	z := mix(h, w.seed)
	tag := uint32(z)
	for i := int(z) & mask; ; i = (i + 1) & mask {
		e := w.table[i]
		if e == 0 {
			return -1
		}
		if uint32(e>>32) == tag && w.nodes[nodeOf(e)].hash == h {
			return i
		}
	}
}

func (w *lru) has(h uint64) bool { return w.find(h) >= 0 }

// insert puts node n (whose hash is not in the table) into the table.
func (w *lru) insert(n int32) { w.put(entry(mix(w.nodes[n].hash, w.seed), n)) }

// put stores entry e in the first free slot from its home.
func (w *lru) put(e uint64) {
	mask := len(w.table) - 1
	i := int(uint32(e>>32)) & mask
	for w.table[i] != 0 {
		i = (i + 1) & mask
	}
	w.table[i] = e
}

// remove empties slot i and shifts back the entries after it that probed past it.
func (w *lru) remove(i int) {
	mask := len(w.table) - 1
	for j := (i + 1) & mask; w.table[j] != 0; j = (j + 1) & mask {
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		k := int(uint32(w.table[j]>>32)) & mask
		if (j-k)&mask >= (j-i)&mask {
			w.table[i] = w.table[j]
			i = j
		}
	}
	w.table[i] = 0
}

// match returns the number of leading hashes w holds, given that it holds at least the first
// from of them. The chunks held of one prompt are a leading run (see the package comment), so
// presence is monotone along hashes and a binary search finds its end.
func (w *lru) match(hashes []uint64, from int) int {
	lo, hi := from, len(hashes) // invariant: hashes[:lo] held; hashes[hi:] not
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if w.has(hashes[mid]) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// touch makes h worker w's most recently used entry, evicting its least recently used one
// when a new entry would exceed the bound; holder lists follow.
func (x *Index) touch(w *lru, h uint64) {
	if i := w.find(h); i >= 0 {
		if n := w.at(i); n != w.head {
			w.unlink(n)
			w.pushFront(n)
		}
		return
	}
	limit := w.limit
	var n int32
	if len(w.nodes) < limit {
		if len(w.nodes) == cap(w.nodes) {
			// Grow by doubling but never past limit, so a full worker holds exactly limit nodes.
			size := min(max(2*cap(w.nodes), 16), limit)
			grown := make([]node, len(w.nodes), size)
			copy(grown, w.nodes)
			w.nodes = grown
			links := make([]link, len(w.links), size)
			copy(links, w.links)
			w.links = links
		}
		n = int32(len(w.nodes))
		w.nodes = append(w.nodes, node{})
		w.links = append(w.links, link{})
		if 2*len(w.nodes) > len(w.table) {
			w.grow()
		}
	} else {
		n = w.tail
		w.unlink(n)
		w.remove(w.find(w.nodes[n].hash))
		x.unlinkHolder(w, n)
		x.holders.shrink()
	}
	w.nodes[n].hash = h
	w.insert(n)
	w.pushFront(n)
	x.linkHolder(w, n)
}

// link returns the holder link of the node r names.
func (x *Index) link(r ref) *link { return &x.byNum[r.w].links[r.n] }

// linkHolder puts node n of w, which holds its hash now, at the head of the hash's holders.
func (x *Index) linkHolder(w *lru, n int32) {
	h, l := w.nodes[n].hash, &w.links[n]
	me := ref{w.num, n}
	l.prev = ref{}
	x.holders.entries++
	if i := x.holders.find(h); i >= 0 {
		e := &x.holders.slots[i]
		l.next = e.head
		x.link(e.head).prev = me
		e.head = me
		return
	}
	l.next = ref{}
	x.holders.add(h, me)
}

// unlinkHolder takes node n of w off its hash's holders, dropping the hash when it was the
// last. It does not shrink the table: callers do once they are done.
func (x *Index) unlinkHolder(w *lru, n int32) {
	l := &w.links[n]
	i := x.holders.find(w.nodes[n].hash)
	e := &x.holders.slots[i]
	if l.next.w != 0 {
		x.link(l.next).prev = l.prev
	}
	if l.prev.w != 0 {
		x.link(l.prev).next = l.next
	} else if e.head = l.next; e.head.w == 0 {
		x.holders.remove(i) // it was the last holder
	}
	*l = link{}
	x.holders.entries--
}

// holderTable maps each hash some worker holds to the head of its list of holders. It is an
// open-addressing table like a worker's (linear probing, backward-shift deletion, seeded
// slots), with the hash in the slot so that a lookup reads no node; its load stays between one
// eighth and one half of its slots (above the minimum size), so it holds a power of two of at
// most 8·Distinct() slots however the index churns.
type holderTable struct {
	seed    uint64
	slots   []holderSlot // head.w == 0: empty; len is a power of two ≥ minHolderSlots
	used    int          // non-empty slots: distinct hashes held
	entries int          // holder list entries, over all hashes
}

type holderSlot struct {
	hash uint64
	head ref
}

const minHolderSlots = 16

func newHolderTable(seed uint64) holderTable {
	return holderTable{seed: seed, slots: make([]holderSlot, minHolderSlots)}
}

// find returns h's slot, or -1.
func (t *holderTable) find(h uint64) int {
	mask := len(t.slots) - 1
	for i := slotOf(h, t.seed, len(t.slots)); ; i = (i + 1) & mask {
		e := &t.slots[i]
		if e.head.w == 0 {
			return -1
		}
		if e.hash == h {
			return i
		}
	}
}

// add enters h (not in the table) with one holder, head.
func (t *holderTable) add(h uint64, head ref) {
	if 2*(t.used+1) > len(t.slots) {
		t.resize(2 * len(t.slots))
	}
	t.put(holderSlot{hash: h, head: head})
	t.used++
}

// put stores e in the first free slot of its probe sequence.
func (t *holderTable) put(e holderSlot) {
	mask := len(t.slots) - 1
	i := slotOf(e.hash, t.seed, len(t.slots))
	for t.slots[i].head.w != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = e
}

// remove empties slot i and shifts back the entries after it that probed past it.
func (t *holderTable) remove(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].head.w != 0; j = (j + 1) & mask {
		k := slotOf(t.slots[j].hash, t.seed, len(t.slots))
		if (j-k)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = holderSlot{}
	t.used--
}

// shrink halves the table while it is at most one-eighth full, so it follows the distinct
// hashes held down as well as up.
func (t *holderTable) shrink() {
	size := len(t.slots)
	for size > minHolderSlots && 8*t.used <= size {
		size /= 2
	}
	if size != len(t.slots) {
		t.resize(size)
	}
}

// resize rebuilds the table with size slots.
func (t *holderTable) resize(size int) {
	old := t.slots
	t.slots = make([]holderSlot, size)
	for _, e := range old {
		if e.head.w != 0 {
			t.put(e)
		}
	}
}

// grow doubles the table, keeping its load at most one half. The node being added (the last)
// has no hash yet and is inserted by the caller.
func (w *lru) grow() {
	old := w.table
	w.table = make([]uint64, 2*len(old))
	for _, e := range old {
		if e != 0 {
			w.put(e)
		}
	}
}

// Len is the number of hashes held.
func (w *lru) len() int { return len(w.nodes) }

func (w *lru) unlink(i int32) {
	n := &w.nodes[i]
	if n.prev != nilNode {
		w.nodes[n.prev].next = n.next
	} else {
		w.head = n.next
	}
	if n.next != nilNode {
		w.nodes[n.next].prev = n.prev
	} else {
		w.tail = n.prev
	}
	n.prev, n.next = nilNode, nilNode
}

func (w *lru) pushFront(i int32) {
	n := &w.nodes[i]
	n.prev, n.next = nilNode, w.head
	if w.head != nilNode {
		w.nodes[w.head].prev = i
	} else {
		w.tail = i
	}
	w.head = i
}
