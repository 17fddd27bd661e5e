package policy

// Warmer is implemented by the policies that route by a prompt's cached prefix
// (prefix_aware, precise_prefix, predicted_latency): after a pick that went to a member for the
// prefix it holds has been counted in the member's load, Warm says whether the prefix should
// be copied to one more worker ahead of demand, and where.
//
// Why: a prompt prefix held by one worker stays there while that worker is under the
// bounded-load cap; once every holder is at the cap, the next request for it spills to a
// worker that holds nothing and pays the whole prefill, which for a long shared prompt is the
// tail of the time to first token. A warm-up is a one-token request of the held prefix sent
// by the gateway to the least loaded worker, off every client's path, so that the spill finds
// it cached.
//
// The picked member matched the prompt's first L chunks. An engine caches whole KV blocks
// only, so a copy of those L chunks leaves the last one or two (the block the copy ends in)
// uncached: the copy counts as holding the prefix to depth D = max(L − slack, 1), and that
// depth is what Warm checks. It reports a target only when all of these hold for the pick
// just made:
//   - L ≥ minChunks (the prefix is worth a prefill);
//   - the picked member is now at the cap, and no other holder of depth D is under it (more
//     than wideHolders holders: widely held, never warmed);
//   - the least loaded member not in exclude is under the cap with room for one more after
//     the warm-up (load + 1 < cap) and does not hold depth D.
//
// The answer — the target, L (the chunks to copy) and the chunk hash at depth D, which names
// the prefix — is for the last pick only: Pick forgets it, and so does Warm.
type Warmer interface {
	Warm(minChunks, slack int, exclude []string) (target *Member, chunks int, id uint64)
}

var (
	_ Warmer = (*PrefixAware)(nil)
	_ Warmer = (*PrecisePrefix)(nil)
	_ Warmer = (*PredictedLatency)(nil)
)

// lastPrefix is what a prefix pick leaves for Warm: the member picked, the depth it matched
// and the request's chunk hashes.
type lastPrefix struct {
	m      *Member
	depth  int
	hashes []uint64
}

// warmDepth is the depth a copy of last's prefix is counted to hold, and its chunk hash; ok
// false when the pick matched fewer than minChunks.
// (slack ≥ 0; the depth is never more than the hashes.)
func (last lastPrefix) warmDepth(minChunks, slack int) (id uint64, ok bool) {
	if last.m == nil || last.depth < max(minChunks, 1) {
		return 0, false
	}
	return last.hashes[max(last.depth-slack, 1)-1], true
}

// warmFrom is Warm's first step, shared by both prefix policies: the depth's chunk hash and
// the cap, when the last pick matched enough and left its member, still in the pool, at the
// cap (a member under it is a holder under the cap: the holders' walk would find it).
func (b *loadHeap) warmFrom(last lastPrefix, minChunks, slack int) (id uint64, limit int64, ok bool) {
	if id, ok = last.warmDepth(minChunks, slack); !ok || !b.h.contains(last.m) {
		return 0, 0, false
	}
	limit = b.Cap()
	return id, limit, last.m.load >= limit
}

// warmTarget is Warm's last step, shared by both prefix policies: the least loaded member not
// excluded, when it has room for the warm-up and a request and does not hold the prefix. (It
// is never the picked member, which is at the cap.)
func (b *loadHeap) warmTarget(limit int64, exclude []string, last lastPrefix, id uint64, holds func(*Member) bool) (*Member, int, uint64) {
	t := b.h.best(exclude)
	if t == nil || t.load+1 >= limit || holds(t) {
		return nil, 0, 0
	}
	return t, last.depth, id
}

// Warm implements Warmer.
func (p *PrefixAware) Warm(minChunks, slack int, exclude []string) (*Member, int, uint64) {
	last, x := p.last, p.lastIdx
	p.last, p.lastIdx = lastPrefix{}, nil
	id, limit, ok := p.warmFrom(last, minChunks, slack)
	if !ok {
		return nil, 0, 0
	}
	hs, n := x.Holders(id), 0
	for id, ok := hs.Next(); ok; id, ok = hs.Next() {
		if n++; n > wideHolders || p.candidate(id, limit, nil) != nil {
			return nil, 0, 0
		}
	}
	return p.warmTarget(limit, exclude, last, id, func(m *Member) bool { return x.Holds(m.ID, id) })
}

// Warm implements Warmer.
func (p *PrecisePrefix) Warm(minChunks, slack int, exclude []string) (*Member, int, uint64) {
	last, x := p.last, p.lastIdx
	p.last, p.lastIdx = lastPrefix{}, nil
	id, limit, ok := p.warmFrom(last, minChunks, slack)
	if !ok {
		return nil, 0, 0
	}
	hs := x.Holders(id)
	if len(hs) > wideHolders {
		return nil, 0, 0
	}
	for _, m := range hs {
		if p.candidate(m, limit, nil) {
			return nil, 0, 0
		}
	}
	return p.warmTarget(limit, exclude, last, id, func(m *Member) bool { return x.Holds(m, id) })
}
