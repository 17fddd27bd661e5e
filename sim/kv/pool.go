// Package kv is tlengine's paged KV block pool with a prefix cache, modelled on vLLM's
// automatic prefix caching (SPEC R12).
//
// The pool owns a fixed number of blocks of blockSize token slots. A sequence (Seq) holds an
// ordered list of blocks covering its tokens. Each full block is named by a chained hash,
//
//	hash_0 = H(0, tokens[0:bs]),  hash_i = H(hash_{i-1}, tokens[i*bs:(i+1)*bs]),
//
// with H = xxHash64 over the parent hash (8 bytes, little-endian) followed by the block's token
// ids (4 bytes each, little-endian). Because the hash covers the whole prefix, two sequences
// share block i only when their first (i+1)*bs tokens are equal. A full block is registered in
// the prefix cache under its hash as soon as it is full (when Allocate or Import writes it, or
// when Append fills it), and later sequences with the same prefix take references on it instead
// of allocating. A partial block (the last, not yet full block of a sequence) is never cached
// and never shared.
//
// Every block is in exactly one of three states:
//
//	free        on the free list: unreferenced and not cached;
//	evictable   cached but unreferenced (no live sequence holds it), kept in LRU order;
//	referenced  held by at least one live sequence (cached or private).
//
// New blocks come from the free list first; only when it is empty is the least recently
// released evictable block evicted (dropped from the cache) and reused. Referenced blocks are
// never evicted.
//
// A Pool is not safe for concurrent use: the engine serialises every call (its scheduler holds
// one mutex around the pool and all of the pool's sequences).
package kv

import (
	"encoding/binary"
	"errors"

	"github.com/cespare/xxhash/v2"
)

// Defaults used by tlengine (SPEC R12: 16-token blocks).
const (
	DefaultTotalBlocks = 1024
	DefaultBlockSize   = 16
)

var (
	// ErrNoSpace means the request needs more blocks than are free or evictable. The pool and
	// the sequence involved are left exactly as they were.
	ErrNoSpace = errors.New("kv: not enough free KV blocks")
	// ErrFreed means the sequence was already freed.
	ErrFreed = errors.New("kv: sequence already freed")
)

// rootHash is hash_{-1}, the parent of every sequence's first block.
const rootHash uint64 = 0

const none int32 = -1

type block struct {
	hash   uint64 // chained hash; meaningful while cached
	parent uint64 // the parent's chained hash; checked on lookup
	ref    int32  // live sequences holding the block
	cached bool   // registered in Pool.cache under hash
	// prev and next link evictable blocks in LRU order (least recently released first).
	prev, next int32
}

// Pool is a paged KV block pool with a prefix cache. See the package comment.
type Pool struct {
	blockSize int
	blocks    []block
	slab      []uint32 // token ids held by block i: slab[i*blockSize : (i+1)*blockSize]
	free      []int32  // stack of free blocks
	cache     map[uint64]int32

	lruHead, lruTail int32 // head: next to be evicted
	lruLen           int
	referenced       int

	hitTokens, lookupTokens, evictions, imported uint64

	scratch []byte // hash input buffer

	// Tags (tags.go): ids carried by each cached block and how many cached blocks carry each id;
	// both nil until the first Tag.
	tags     [][]uint64
	tagRef   map[uint64]int32
	untagged []uint64 // ids evicted by the current call, for onUntag
	onUntag  func(ids []uint64)

	// Block events (events.go): seed covered by every hash; pending holds the current call's
	// events (bounded by its blocks) for onBlocks.
	seed     uint64
	pending  BlockEvents
	onBlocks func(BlockEvents)
}

// Stats is a snapshot of the pool.
//
// Block counts obey TotalBlocks == free list + evictable + ReferencedBlocks, and FreeBlocks is
// free list + evictable (what a new sequence could use). CachedBlocks counts registered blocks,
// referenced or not.
//
// Counters: LookupTokens grows by len(prompt) for each successful Allocate (not rounded to
// blocks) and HitTokens by the cached tokens it returned, so HitTokens/LookupTokens is the token
// hit rate as vLLM reports it. Imported counts the tokens of successful Imports (which count
// neither as lookups nor as hits). Evictions counts cached blocks dropped to make room. A call
// that fails with ErrNoSpace counts nothing.
type Stats struct {
	TotalBlocks      int
	FreeBlocks       int
	CachedBlocks     int
	ReferencedBlocks int
	HitTokens        uint64
	LookupTokens     uint64
	Evictions        uint64
	Imported         uint64
}

// NewPool returns a pool of totalBlocks blocks of blockSize tokens each, all free. A value ≤ 0
// selects the default (DefaultTotalBlocks, DefaultBlockSize).
func NewPool(totalBlocks, blockSize int) *Pool {
	if totalBlocks <= 0 {
		totalBlocks = DefaultTotalBlocks
	}
	if blockSize <= 0 {
		blockSize = DefaultBlockSize
	}
	p := &Pool{
		blockSize: blockSize,
		blocks:    make([]block, totalBlocks),
		slab:      make([]uint32, totalBlocks*blockSize),
		free:      make([]int32, totalBlocks),
		cache:     make(map[uint64]int32, totalBlocks),
		lruHead:   none,
		lruTail:   none,
		scratch:   make([]byte, 0, 16+4*blockSize),
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = none, none
		// Stack order: block 0 is handed out first.
		p.free[i] = int32(totalBlocks - 1 - i)
	}
	return p
}

// BlockSize is the number of tokens per block.
func (p *Pool) BlockSize() int { return p.blockSize }

// Stats returns the pool's counts and counters. It is O(1).
func (p *Pool) Stats() Stats {
	return Stats{
		TotalBlocks:      len(p.blocks),
		FreeBlocks:       len(p.free) + p.lruLen,
		CachedBlocks:     len(p.cache),
		ReferencedBlocks: p.referenced,
		HitTokens:        p.hitTokens,
		LookupTokens:     p.lookupTokens,
		Evictions:        p.evictions,
		Imported:         p.imported,
	}
}

// Lookup returns how many tokens of prompt Allocate would report as cached right now, with no
// side effects (no references, no LRU change, no counters). See Allocate for the rule.
func (p *Pool) Lookup(prompt []uint32) int {
	n, _ := p.match(prompt, nil)
	return cachedTokens(n*p.blockSize, len(prompt))
}

// Allocate creates a sequence holding prompt. It takes references on the longest run of cached
// whole blocks that prefixes the prompt and allocates fresh blocks for the rest, evicting least
// recently released cached blocks when the free list is empty. Fresh full blocks are registered
// in the cache; if an identical block is already registered, the registered one stays and the
// fresh one remains private to this sequence (it returns to the free list when freed).
//
// cachedTokens is the number of prompt tokens whose KV the sequence found in the cache, capped at
// len(prompt)-1: like vLLM, the last prompt token is always computed so that the engine has
// logits for the first output token. (All matched blocks are shared even when the cap applies,
// so a repeated block-aligned prompt of 32 tokens shares both blocks and reports 31.)
//
// If the blocks cannot be found, Allocate returns ErrNoSpace and changes nothing. Allocate copies
// prompt; an empty prompt yields an empty sequence.
func (p *Pool) Allocate(prompt []uint32) (*Seq, int, error) {
	s, matched, err := p.alloc(prompt)
	if err != nil {
		return nil, 0, err
	}
	cached := cachedTokens(matched*p.blockSize, len(prompt))
	p.lookupTokens += uint64(len(prompt))
	p.hitTokens += uint64(cached)
	return s, cached, nil
}

// Import creates a sequence holding tokens whose KV was computed elsewhere (a prefill worker
// pushing to this decode worker). Blocks are shared, allocated and registered exactly as by
// Allocate, so the pushed KV also warms this pool's prefix cache, but the tokens count in
// Stats.Imported instead of as lookups and hits. It returns ErrNoSpace and changes nothing when
// the blocks cannot be found.
func (p *Pool) Import(tokens []uint32) (*Seq, error) {
	s, _, err := p.alloc(tokens)
	if err != nil {
		return nil, err
	}
	p.imported += uint64(len(tokens))
	return s, nil
}

// Free drops s's references. Its cached blocks that no other sequence holds become evictable;
// its private blocks (a partial last block, or a duplicate of a registered block) return to the
// free list. Blocks are released from the last to the first, so a prefix's deeper blocks are
// evicted before its shallower ones (a shallower block is worth more: every longer match needs
// it). Free reports false and does nothing when s is nil or already freed. It panics if s belongs
// to another pool.
func (p *Pool) Free(s *Seq) bool {
	if s == nil || s.freed {
		return false
	}
	if s.pool != p {
		panic("kv: Free of a sequence from another pool")
	}
	for i := len(s.blocks) - 1; i >= 0; i-- {
		p.release(s.blocks[i])
	}
	s.blocks = nil
	s.freed = true
	return true
}

func cachedTokens(matchedTokens, n int) int {
	if matchedTokens >= n {
		return max(n-1, 0)
	}
	return matchedTokens
}

// alloc builds a sequence for toks; it returns how many leading blocks came from the cache.
func (p *Pool) alloc(toks []uint32) (*Seq, int, error) {
	bs := p.blockSize
	nblocks := (len(toks) + bs - 1) / bs
	s := &Seq{
		pool:   p,
		tokens: append(make([]uint32, 0, len(toks)+bs), toks...),
		blocks: make([]int32, 0, nblocks+1),
	}
	matched, parent := p.match(toks, &s.blocks)

	// Check capacity before touching anything: matched blocks that are now evictable stop being
	// available once we reference them.
	avail := len(p.free) + p.lruLen
	for _, id := range s.blocks {
		if p.blocks[id].ref == 0 {
			avail--
		}
	}
	if nblocks-matched > avail {
		return nil, 0, ErrNoSpace
	}

	for _, id := range s.blocks {
		p.acquire(id)
	}
	defer p.flushBlocks()
	defer p.flushUntag()
	for i := matched; i < nblocks; i++ {
		id := p.take()
		lo, hi := i*bs, min((i+1)*bs, len(toks))
		copy(p.slab[int(id)*bs:], toks[lo:hi])
		s.blocks = append(s.blocks, id)
		if hi-lo == bs {
			h := p.hash(parent, toks[lo:hi])
			p.register(id, h, parent)
			parent = h
		}
	}
	s.lastHash = parent
	return s, matched, nil
}

// match walks the cache along toks' full blocks and returns how many leading blocks are cached
// and the chained hash of the last matched one. If ids is not nil the matched block ids are
// appended to it.
func (p *Pool) match(toks []uint32, ids *[]int32) (int, uint64) {
	bs := p.blockSize
	parent := rootHash
	n := 0
	for ; (n+1)*bs <= len(toks); n++ {
		chunk := toks[n*bs : (n+1)*bs]
		h := p.hash(parent, chunk)
		id, ok := p.cache[h]
		if !ok || !p.holds(id, parent, chunk) {
			break
		}
		if ids != nil {
			*ids = append(*ids, id)
		}
		parent = h
	}
	return n, parent
}

// holds reports whether cached block id really is chunk after parent, so that a 64-bit hash
// collision can cost a cache miss but never hand a sequence the wrong tokens.
func (p *Pool) holds(id int32, parent uint64, chunk []uint32) bool {
	if p.blocks[id].parent != parent {
		return false
	}
	bs := p.blockSize
	stored := p.slab[int(id)*bs : int(id+1)*bs]
	for i, t := range chunk {
		if stored[i] != t {
			return false
		}
	}
	return true
}

func (p *Pool) hash(parent uint64, chunk []uint32) uint64 {
	b := p.scratch[:0]
	if p.seed != 0 {
		b = binary.LittleEndian.AppendUint64(b, p.seed)
	}
	b = binary.LittleEndian.AppendUint64(b, parent)
	for _, t := range chunk {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	p.scratch = b
	return xxhash.Sum64(b)
}

// register caches full block id under h unless a block is already registered there.
func (p *Pool) register(id int32, h, parent uint64) {
	if _, dup := p.cache[h]; dup {
		return
	}
	b := &p.blocks[id]
	b.hash, b.parent, b.cached = h, parent, true
	p.cache[h] = id
	p.noteStored(id, h, parent)
}

// acquire takes a reference on a cached block found by match.
func (p *Pool) acquire(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.lruRemove(id)
		p.referenced++
	}
	b.ref++
}

// take returns a block with one reference, from the free list or by evicting the least recently
// released cached block. The caller has checked that one exists.
func (p *Pool) take() int32 {
	var id int32
	if n := len(p.free); n > 0 {
		id = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		id = p.lruHead
		p.lruRemove(id)
		b := &p.blocks[id]
		delete(p.cache, b.hash)
		b.cached = false
		p.noteRemoved(b.hash)
		p.evictions++
		p.untag(id)
	}
	p.blocks[id].ref = 1
	p.referenced++
	return id
}

func (p *Pool) release(id int32) {
	b := &p.blocks[id]
	b.ref--
	if b.ref > 0 {
		return
	}
	p.referenced--
	if b.cached {
		p.lruPushBack(id)
	} else {
		p.free = append(p.free, id)
	}
}

func (p *Pool) lruPushBack(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = p.lruTail, none
	if p.lruTail == none {
		p.lruHead = id
	} else {
		p.blocks[p.lruTail].next = id
	}
	p.lruTail = id
	p.lruLen++
}

func (p *Pool) lruRemove(id int32) {
	b := &p.blocks[id]
	if b.prev == none {
		p.lruHead = b.next
	} else {
		p.blocks[b.prev].next = b.next
	}
	if b.next == none {
		p.lruTail = b.prev
	} else {
		p.blocks[b.next].prev = b.prev
	}
	b.prev, b.next = none, none
	p.lruLen--
}
