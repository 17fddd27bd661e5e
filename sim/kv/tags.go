package kv

// Tags: ids a caller attaches to cached blocks, reported back when the last cached block holding
// an id is evicted. tlengine attaches the gateway's prompt chunk ids (SPEC R18.3, the chained
// hashes of internal/prefixindex over the rendered prompt) to the block that holds the token
// covering each chunk's last byte, and turns "first held" and "no longer held" into the KvEvents
// STORED and REMOVED it streams to gateways.
//
// An id is held while at least one cached block carries it; a block carries an id at most once.
// Worked example: two requests whose prompts share chunk c both tag it, on the same cached block
// (the second request matched the first's blocks) or on two different ones (the engine rendered
// them differently, say a chat and a completions prompt of the same text): the first Tag returns
// c, the second returns nothing; evicting one of two carrying blocks reports nothing, evicting the
// last reports c.
//
// Only cached blocks carry tags: a private block (a sequence's partial last block, or a duplicate
// of a registered block) is never found by a later lookup, so its KV is not "in the cache".

// Tag attaches ids to the i-th block of s and appends to dst the ids that no cached block held
// before (in the order given), returning the extended slice. It attaches nothing when that block
// is not in the prefix cache (partial or private) or i is out of range. The block carries the
// ids until it is evicted.
func (p *Pool) Tag(s *Seq, i int, ids []uint64, dst []uint64) []uint64 {
	if s == nil || s.freed || s.pool != p || i < 0 || i >= len(s.blocks) {
		return dst
	}
	id := s.blocks[i]
	if !p.blocks[id].cached {
		return dst
	}
	if p.tagRef == nil {
		p.tagRef = make(map[uint64]int32)
		p.tags = make([][]uint64, len(p.blocks))
	}
	for _, t := range ids {
		if carries(p.tags[id], t) {
			continue
		}
		p.tags[id] = append(p.tags[id], t)
		if p.tagRef[t]++; p.tagRef[t] == 1 {
			dst = append(dst, t)
		}
	}
	return dst
}

func carries(tags []uint64, t uint64) bool {
	for _, x := range tags {
		if x == t {
			return true
		}
	}
	return false
}

// Tagged appends to dst every id some cached block carries (in no particular order) and returns
// the extended slice.
func (p *Pool) Tagged(dst []uint64) []uint64 {
	for t := range p.tagRef {
		dst = append(dst, t)
	}
	return dst
}

// OnUntag sets f, which a pool call that evicted (Allocate, Import, Append) calls once, before
// it returns, with the ids that the evicted blocks carried and that no cached block carries any
// more (never empty). f runs inside the pool call (under the engine's scheduler lock): it must
// not call the pool and must not block. It may keep ids.
func (p *Pool) OnUntag(f func(ids []uint64)) { p.onUntag = f }

// untag drops the tags of block id, which is leaving the cache; flushUntag reports them.
func (p *Pool) untag(id int32) {
	if p.tags == nil || len(p.tags[id]) == 0 {
		return
	}
	for _, t := range p.tags[id] {
		if p.tagRef[t]--; p.tagRef[t] == 0 {
			delete(p.tagRef, t)
			p.untagged = append(p.untagged, t)
		}
	}
	p.tags[id] = p.tags[id][:0]
}

func (p *Pool) flushUntag() {
	if len(p.untagged) == 0 {
		return
	}
	gone := p.untagged
	p.untagged = nil
	if p.onUntag != nil {
		p.onUntag(gone)
	}
}
