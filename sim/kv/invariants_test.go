package kv

import "fmt"

// checkInvariants verifies the pool's bookkeeping: every block is in exactly one state (free,
// evictable, referenced), the counters match, the LRU list is well linked, and the cache maps
// each hash to a cached block whose stored tokens hash to it.
func (p *Pool) checkInvariants() error {
	n := len(p.blocks)
	onFree := make([]bool, n)
	for _, id := range p.free {
		if id < 0 || int(id) >= n {
			return fmt.Errorf("free list holds bad id %d", id)
		}
		if onFree[id] {
			return fmt.Errorf("block %d twice on the free list", id)
		}
		onFree[id] = true
		if b := p.blocks[id]; b.ref != 0 || b.cached {
			return fmt.Errorf("free block %d has ref %d cached %v", id, b.ref, b.cached)
		}
	}

	inLRU := make([]bool, n)
	count := 0
	prev := none
	for id := p.lruHead; id != none; id = p.blocks[id].next {
		if inLRU[id] {
			return fmt.Errorf("LRU cycle at block %d", id)
		}
		inLRU[id] = true
		count++
		b := p.blocks[id]
		if b.prev != prev {
			return fmt.Errorf("LRU block %d: prev %d, want %d", id, b.prev, prev)
		}
		if b.ref != 0 || !b.cached {
			return fmt.Errorf("LRU block %d has ref %d cached %v", id, b.ref, b.cached)
		}
		prev = id
	}
	if prev != p.lruTail {
		return fmt.Errorf("LRU tail %d, walk ended at %d", p.lruTail, prev)
	}
	if count != p.lruLen {
		return fmt.Errorf("lruLen %d, walked %d", p.lruLen, count)
	}

	referenced, cached := 0, 0
	for id := range p.blocks {
		b := p.blocks[id]
		if b.ref < 0 {
			return fmt.Errorf("block %d has ref %d", id, b.ref)
		}
		if b.ref > 0 {
			referenced++
			if onFree[id] || inLRU[id] {
				return fmt.Errorf("referenced block %d is also free/evictable", id)
			}
		} else if !onFree[id] && !inLRU[id] {
			return fmt.Errorf("block %d leaked: unreferenced, not free, not evictable", id)
		}
		if b.cached {
			cached++
			if got, ok := p.cache[b.hash]; !ok || got != int32(id) {
				return fmt.Errorf("cached block %d not in the cache under its hash", id)
			}
			bs := p.blockSize
			if h := p.hash(b.parent, p.slab[id*bs:(id+1)*bs]); h != b.hash {
				return fmt.Errorf("cached block %d: contents hash to %x, registered as %x", id, h, b.hash)
			}
		}
	}
	if referenced != p.referenced {
		return fmt.Errorf("referenced counter %d, counted %d", p.referenced, referenced)
	}
	if cached != len(p.cache) {
		return fmt.Errorf("cache has %d entries, %d blocks marked cached", len(p.cache), cached)
	}
	if st := p.Stats(); st.TotalBlocks != len(p.free)+p.lruLen+st.ReferencedBlocks {
		return fmt.Errorf("total %d != free %d + evictable %d + referenced %d",
			st.TotalBlocks, len(p.free), p.lruLen, st.ReferencedBlocks)
	}
	return p.checkTags()
}

// checkTags verifies that only cached blocks carry tags, each at most once, and that tagRef
// counts the carrying blocks of every id (and holds no id that none carries).
func (p *Pool) checkTags() error {
	if len(p.untagged) != 0 {
		return fmt.Errorf("untagged ids %v not reported", p.untagged)
	}
	carriers := make(map[uint64]int32)
	for id, tags := range p.tags {
		if len(tags) > 0 && !p.blocks[id].cached {
			return fmt.Errorf("block %d carries tags %v but is not cached", id, tags)
		}
		for i, t := range tags {
			if carries(tags[:i], t) {
				return fmt.Errorf("block %d carries %d twice", id, t)
			}
			carriers[t]++
		}
	}
	if len(carriers) != len(p.tagRef) {
		return fmt.Errorf("tagRef has %d ids, blocks carry %d", len(p.tagRef), len(carriers))
	}
	for t, n := range carriers {
		if p.tagRef[t] != n {
			return fmt.Errorf("id %d: tagRef %d, carried by %d blocks", t, p.tagRef[t], n)
		}
	}
	return nil
}

// checkSeq verifies that a live sequence's blocks hold exactly its tokens, that its partial last
// block is private, and that its chained hash is right.
func (p *Pool) checkSeq(s *Seq) error {
	bs := p.blockSize
	if s.freed {
		if len(s.blocks) != 0 {
			return fmt.Errorf("freed sequence holds %d blocks", len(s.blocks))
		}
		return nil
	}
	if want := (len(s.tokens) + bs - 1) / bs; len(s.blocks) != want {
		return fmt.Errorf("sequence of %d tokens holds %d blocks, want %d", len(s.tokens), len(s.blocks), want)
	}
	parent := rootHash
	for i, id := range s.blocks {
		if p.blocks[id].ref <= 0 {
			return fmt.Errorf("sequence block %d (id %d) unreferenced", i, id)
		}
		lo, hi := i*bs, min((i+1)*bs, len(s.tokens))
		stored := p.slab[int(id)*bs : int(id)*bs+hi-lo]
		for j := range stored {
			if stored[j] != s.tokens[lo+j] {
				return fmt.Errorf("sequence block %d (id %d) holds wrong tokens", i, id)
			}
		}
		if hi-lo < bs {
			if p.blocks[id].cached || p.blocks[id].ref != 1 {
				return fmt.Errorf("partial block %d shared or cached", id)
			}
			continue
		}
		parent = p.hash(parent, s.tokens[lo:hi])
	}
	if parent != s.lastHash {
		return fmt.Errorf("sequence lastHash %x, want %x", s.lastHash, parent)
	}
	return nil
}
