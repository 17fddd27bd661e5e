package enginetok

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Cache keeps the token ids engines rendered for recent prompts, per served model, so that a
// prompt sent again is not rendered again and a prompt that extends one seen before (a shared
// system prompt, the next turn of a conversation) gets the token ids of the part they share at
// once, without a call.
//
// Keys. A rendered prompt (oai.RenderPrompt's bytes) is cut into 64-byte chunks; chunk i's key
// chains the model, every byte before it and its own bytes through a hash seeded at random per
// process (a client cannot aim a prompt at another's key offline). An entry is found by its
// exact key (the chain over every byte and the length: a hit gives all its ids) and by its
// depth keys, the chain at chunks 1, 2, 4, 8, … and its last whole chunk: a prompt whose
// leading chunks agree with an entry's up to a depth key gets the entry's ids for those
// bytes (Lookup's partial hit).
//
// A partial hit's ids are a proportion of the entry's: the entry's ids × shared bytes /
// entry bytes, less a margin (1/16 of that, at least 16 ids) for the tokens that straddle the
// boundary and for uneven token densities. Used as a pick's token ids, wrong trailing ids only
// make its last blocks match nothing; they never move a pick away from the engine that holds
// the shared part.
//
// Bounds: at most MaxEntries entries and MaxIDs ids held in all, the least recently used
// entry evicted first; each entry has at most 2 + log2(chunks) keys. Safe for concurrent use.
type Cache struct {
	mu       sync.Mutex
	seed     uint64
	maxEnt   int
	maxIDs   int
	ids      int               // ids held by all entries
	byKey    map[uint64]*entry // exact and depth keys → entry; bounded by the entries' keys
	head     *entry            // most recently used
	tail     *entry            // least recently used: evicted first
	count    int
	hits     uint64
	partials uint64
	misses   uint64
}

type entry struct {
	keys       []uint64 // every key it is registered under (exact first)
	bytes      int      // the rendered prompt's length
	ids        []uint32
	prev, next *entry
}

// Cache bounds' defaults (NewCache with values ≤ 0).
const (
	DefaultCacheEntries = 4096
	DefaultCacheIDs     = 16 << 20 // 64 MiB of ids
)

// NewCache returns an empty cache of at most maxEntries entries and maxIDs ids.
func NewCache(maxEntries, maxIDs int) *Cache {
	if maxEntries <= 0 {
		maxEntries = DefaultCacheEntries
	}
	if maxIDs <= 0 {
		maxIDs = DefaultCacheIDs
	}
	return &Cache{seed: rand.Uint64(), maxEnt: maxEntries, maxIDs: maxIDs, byKey: make(map[uint64]*entry)}
}

const chunk = 64

// chain returns the keys of rendered's whole chunks for model (dst reused): chunk i's key
// hashes the key before it (the model's, for chunk 0) and the chunk's bytes.
func (c *Cache) chain(dst []uint64, model string, rendered []byte) []uint64 {
	dst = dst[:0]
	var d xxhash.Digest
	var b [8]byte
	d.ResetWithSeed(c.seed)
	_, _ = d.WriteString(model)
	binary.LittleEndian.PutUint64(b[:], uint64(len(model)))
	_, _ = d.Write(b[:])
	h := d.Sum64()
	for off := 0; off+chunk <= len(rendered); off += chunk {
		d.ResetWithSeed(c.seed)
		binary.LittleEndian.PutUint64(b[:], h)
		_, _ = d.Write(b[:])
		_, _ = d.Write(rendered[off : off+chunk])
		h = d.Sum64()
		dst = append(dst, h)
	}
	return dst
}

// exactKey is the key over every byte of rendered, given its chain.
func (c *Cache) exactKey(chain []uint64, model string, rendered []byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(c.seed ^ 0x9e3779b97f4a7c15)
	var b [8]byte
	if len(chain) > 0 {
		binary.LittleEndian.PutUint64(b[:], chain[len(chain)-1])
		_, _ = d.Write(b[:])
	} else {
		_, _ = d.WriteString(model)
		binary.LittleEndian.PutUint64(b[:], uint64(len(model)))
		_, _ = d.Write(b[:])
	}
	_, _ = d.Write(rendered[len(chain)*chunk:])
	binary.LittleEndian.PutUint64(b[:], uint64(len(rendered)))
	_, _ = d.Write(b[:])
	return d.Sum64()
}

// depth reports whether chunk index i (0-based) of a prompt of n whole chunks carries a
// depth key: i+1 a power of two, or the last chunk.
func depth(i, n int) bool { return i == n-1 || (i+1)&i == 0 }

// Lookup returns the token ids for model's rendered prompt: all of an entry's when the
// prompt was rendered before (exact), a proportional prefix of the deepest entry that shares
// a depth key with it (partial), or nil.
func (c *Cache) Lookup(model string, rendered []byte) (ids []uint32, exact bool) {
	ch := c.chain(make([]uint64, 0, len(rendered)/chunk), model, rendered)
	ek := c.exactKey(ch, model, rendered)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.byKey[ek]; e != nil && e.keys[0] == ek && e.bytes == len(rendered) {
		c.touch(e)
		c.hits++
		return e.ids, true
	}
	// Every chunk is probed, deepest first: an entry's last chunk may sit at any depth. At
	// most one map read per chunk of the prompt.
	for i := len(ch) - 1; i >= 0; i-- {
		e := c.byKey[ch[i]]
		if e == nil {
			continue
		}
		if e.keys[0] == ch[i] {
			continue // an exact key equal to a chunk key: a collision, not this prompt
		}
		n := PrefixIDs(len(e.ids), (i+1)*chunk, e.bytes)
		if n <= 0 {
			break
		}
		c.touch(e)
		c.partials++
		return e.ids[:n:n], false
	}
	c.misses++
	return nil, false
}

// PrefixIDs is how many of an entry's n ids a partial hit on shared of its total bytes
// takes: the proportion, less a margin of 1/16 of it and at least 16 ids.
func PrefixIDs(n, shared, total int) int {
	if total <= 0 || shared <= 0 || n <= 0 {
		return 0
	}
	p := int(int64(n) * int64(min(shared, total)) / int64(total))
	return p - max(16, p/16)
}

// Store keeps ids as model's rendering of rendered (the caller no longer changes ids).
// Entries over the bounds are evicted, least recently used first; ids longer than the whole
// bound are not kept.
func (c *Cache) Store(model string, rendered []byte, ids []uint32) {
	if len(ids) == 0 || len(ids) > c.maxIDs {
		return
	}
	ch := c.chain(make([]uint64, 0, len(rendered)/chunk), model, rendered)
	ek := c.exactKey(ch, model, rendered)
	e := &entry{bytes: len(rendered), ids: ids, keys: make([]uint64, 0, 2+bitsLen(len(ch)))}
	e.keys = append(e.keys, ek)
	for i := range ch {
		if depth(i, len(ch)) {
			e.keys = append(e.keys, ch[i])
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.byKey[ek]; old != nil && old.keys[0] == ek {
		c.remove(old)
	}
	for _, k := range e.keys {
		c.byKey[k] = e // the newest entry answers a shared depth key
	}
	c.pushFront(e)
	c.count++
	c.ids += len(ids)
	for c.count > c.maxEnt || c.ids > c.maxIDs {
		c.remove(c.tail)
	}
}

func bitsLen(n int) int {
	b := 0
	for ; n > 0; n >>= 1 {
		b++
	}
	return b
}

// remove drops e and those of its keys that still name it.
func (c *Cache) remove(e *entry) {
	for _, k := range e.keys {
		if c.byKey[k] == e {
			delete(c.byKey, k)
		}
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
	c.count--
	c.ids -= len(e.ids)
}

func (c *Cache) pushFront(e *entry) {
	e.prev, e.next = nil, c.head
	if c.head != nil {
		c.head.prev = e
	} else {
		c.tail = e
	}
	c.head = e
}

func (c *Cache) touch(e *entry) {
	if c.head == e {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	c.pushFront(e)
}

// CacheStats is a snapshot of the cache.
type CacheStats struct {
	Entries, IDs, Keys     int
	Hits, Partials, Misses uint64
}

// Stats returns the cache's counts.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Entries: c.count, IDs: c.ids, Keys: len(c.byKey), Hits: c.hits, Partials: c.partials, Misses: c.misses}
}
