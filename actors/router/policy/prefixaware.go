package policy

import (
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// PrefixScorer is implemented by policies that use a per-request score of each member, the
// length of the request's prompt prefix that the member is believed to hold in its cache (see
// internal/prefixindex). Pick only receives a 64-bit key, so the router hands the prefix over
// out of band, on its own goroutine, right before the Pick it is meant for:
//
//	if ps, ok := p.(policy.PrefixScorer); ok && len(hashes) > 0 {
//		ps.SetPrefix(st.pidx, hashes) // the index and the request's chunk hashes
//	}
//	m, reason := p.Pick(prefixHash, exclude)
//
// SetPrefix installs the prefix index and the request's chunk hashes (prefixindex.Hashes): a
// member's score is then its prefixindex Match, and the pick looks only at the workers that
// hold the request's hashes (see PrefixAware), not at every member. Neither is retained past
// the Pick. SetScores installs any score function instead: f(id) returns the matched prefix
// length of member id in any unit, 0 for none, and Pick calls it at most once per member, so it
// costs O(n). To keep such picks free of allocations, pass the same long-lived func each time.
//
// Either installs the scores for the next Pick only, replacing the other: Pick clears them, so
// a pick made without (a prompt shorter than one chunk, another router path) never sees an
// earlier request's scores.
type PrefixScorer interface {
	SetPrefix(x *prefixindex.Index, hashes []uint64)
	SetScores(f func(memberID string) int)
}

// PrefixAware picks the member with the longest matched prompt prefix among those under the
// bounded-load cap, and the least loaded member when none matches (R10):
//
//	cap = ⌈c·(m+1)/n⌉   (m = total load of the pool, n = members), as affinity (R3.3).
//
// A member whose load has reached the cap is not considered for its prefix. Among equal
// matches the less loaded member wins, then the smaller id. With no score installed, or no
// candidate under the cap with a positive score, the pick is least_outstanding's (minimum
// load, ties to the smallest id; reason least_load). Worked example: 4 members, c = 1.25,
// loads 3, 0, 0, 0: cap = ⌈1.25·4/4⌉ = 2, so the member at 3 is passed over even if it holds
// the whole prompt, and the longest match among the other three takes the request.
//
// Members sit in the same (load, id) min-heap as least_outstanding. A pick given the prefix
// index (SetPrefix) does not score them all. A worker holding a prompt's d-th chunk hash holds
// all the chunks before it (the index's leading-run property), so the holders of the d-th hash
// are the workers whose match is at least d, and they shrink as d grows; whether one of them
// is a candidate (a member, under the cap, not excluded) is therefore monotone in d, and a
// binary search over the depths finds the deepest d with a candidate. Every candidate holding
// that hash matches exactly d chunks, as a deeper match would have been found, so the pick is
// the least (load, id) among them: the best of that hash's holders, or, when more than
// wideHolders workers hold it, the first holder met in (load, id) order (firstHolding). That
// costs O(log L) hash lookups for a prompt of L chunks plus walks of holder lists, each
// stopping at its first candidate but the last, whatever the pool's size; only when a
// prefix's holders are many and mostly not candidates (other pools' workers, at the cap,
// excluded) does a walk grow towards the number of holders. A pick given a score function
// (SetScores) scans every member. Neither allocates.
type PrefixAware struct {
	loadHeap
	byID map[string]*Member // the members, for the workers the prefix index names
	wide int                // ≤ wideHolders; see firstHolding (a variable for tests)
	// The next pick's scores: a function, or the index and the request's hashes.
	score  func(memberID string) int
	idx    *prefixindex.Index
	hashes []uint64
	// The last pick's prefix, for Warm.
	last    lastPrefix
	lastIdx *prefixindex.Index
}

var (
	_ Policy       = (*PrefixAware)(nil)
	_ PrefixScorer = (*PrefixAware)(nil)
)

// NewPrefixAware returns an empty prefix_aware policy with load factor c (≥ 1; default 1.25).
func NewPrefixAware(c float64) *PrefixAware {
	return &PrefixAware{loadHeap: newLoadHeap(c), byID: make(map[string]*Member), wide: wideHolders}
}

// SetScores implements PrefixScorer.
func (p *PrefixAware) SetScores(f func(memberID string) int) {
	p.score, p.idx, p.hashes = f, nil, nil
}

// SetPrefix implements PrefixScorer.
func (p *PrefixAware) SetPrefix(x *prefixindex.Index, hashes []uint64) {
	p.score, p.idx, p.hashes = nil, x, hashes
}

// Add implements Policy.
func (p *PrefixAware) Add(m *Member, load, weight int64) {
	p.add(m, load, weight)
	p.byID[m.ID] = m
}

// Remove implements Policy.
func (p *PrefixAware) Remove(m *Member) {
	if p.remove(m) {
		delete(p.byID, m.ID)
	}
}

// Pick implements Policy. key is not read: the prefix arrives by SetPrefix or SetScores.
func (p *PrefixAware) Pick(_ uint64, exclude []string) (*Member, Reason) {
	score, idx, hashes := p.score, p.idx, p.hashes
	p.score, p.idx, p.hashes = nil, nil, nil
	p.last, p.lastIdx = lastPrefix{}, nil
	if p.h.len() > 0 {
		var best *Member
		switch {
		case idx != nil:
			best = p.pickHeld(idx, hashes, exclude)
		case score != nil:
			best = p.pickScored(score, exclude)
		}
		if best != nil {
			return best, ReasonPrefix
		}
	}
	return p.h.best(exclude), ReasonLeastLoad
}

// pickScored is the pick by score function: every member under the cap and not excluded is
// scored, the highest positive score wins, ties to the less loaded, then the smaller id.
func (p *PrefixAware) pickScored(score func(memberID string) int, exclude []string) *Member {
	limit := p.Cap()
	var best *Member
	bestScore := 0
	for _, m := range p.h.items {
		if m.load >= limit || (len(exclude) > 0 && excluded(m.ID, exclude)) {
			continue
		}
		s := score(m.ID)
		if s <= 0 {
			continue
		}
		if s > bestScore || (s == bestScore && less(m, best)) {
			best, bestScore = m, s
		}
	}
	return best
}

// pickHeld is the same pick with each member's score its Match in x, made from the holders of
// hashes instead of the members (see PrefixAware): nil when no candidate matches a chunk.
func (p *PrefixAware) pickHeld(x *prefixindex.Index, hashes []uint64, exclude []string) *Member {
	limit := p.Cap()
	// The deepest depth with a candidate holder: depth 0 has one by convention (no match).
	lo, hi := 0, len(hashes)
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if p.anyHeld(x, hashes[mid-1], limit, exclude) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo == 0 {
		return nil
	}
	best := p.bestHolding(x, hashes[lo-1], limit, exclude)
	if best != nil {
		p.last, p.lastIdx = lastPrefix{m: best, depth: lo, hashes: hashes}, x
	}
	return best
}

// bestHolding is the least (load, id) candidate among h's holders.
func (p *PrefixAware) bestHolding(x *prefixindex.Index, h uint64, limit int64, exclude []string) *Member {
	hs := x.Holders(h)
	if p.wider(hs) {
		if m, ok := p.firstHolding(x, h, limit, exclude); ok {
			return m
		}
	}
	var best *Member
	for id, ok := hs.Next(); ok; id, ok = hs.Next() {
		if m := p.candidate(id, limit, exclude); m != nil && (best == nil || less(m, best)) {
			best = m
		}
	}
	return best
}

// wideHolders is how many holders of the best depth make the pick look for them in (load, id)
// order among the members instead of walking them all: when most workers hold a prompt's
// prefix (a system prompt every worker has served), one of the least loaded does too.
const wideHolders = 32

// wider reports whether more than p.wide workers are left on hs (a copy: the caller's cursor
// does not move).
func (p *PrefixAware) wider(hs prefixindex.Holders) bool {
	for range p.wide + 1 {
		if _, ok := hs.Next(); !ok {
			return false
		}
	}
	return true
}

// firstHolding returns the first member in (load, id) order that is a candidate (under the
// cap, not excluded) and holds h, visiting members best first from the heap's root. It gives
// up after p.wide visits (ok false), so a pick whose holders are mostly loaded or
// excluded costs a bounded detour before the walk of the holders.
func (p *PrefixAware) firstHolding(x *prefixindex.Index, h uint64, limit int64, exclude []string) (m *Member, ok bool) {
	items := p.h.items
	var buf [wideHolders + 2]int32
	frontier := append(buf[:0], 0) // heap positions whose parents have been visited
	for visits := 0; len(frontier) > 0; visits++ {
		if visits == p.wide {
			return nil, false
		}
		bi := 0
		for k := 1; k < len(frontier); k++ {
			if less(items[frontier[k]], items[frontier[bi]]) {
				bi = k
			}
		}
		i := frontier[bi]
		frontier[bi] = frontier[len(frontier)-1]
		frontier = frontier[:len(frontier)-1]
		m := items[i]
		if m.load >= limit {
			// The least of the frontier is at the cap, so all the rest and below are too.
			return nil, true
		}
		if !(len(exclude) > 0 && excluded(m.ID, exclude)) && x.Holds(m.ID, h) {
			return m, true
		}
		for _, c := range [2]int32{2*i + 1, 2*i + 2} {
			if int(c) < len(items) {
				frontier = append(frontier, c)
			}
		}
	}
	return nil, true
}

// anyHeld reports whether a candidate holds h.
func (p *PrefixAware) anyHeld(x *prefixindex.Index, h uint64, limit int64, exclude []string) bool {
	hs := x.Holders(h)
	for id, ok := hs.Next(); ok; id, ok = hs.Next() {
		if p.candidate(id, limit, exclude) != nil {
			return true
		}
	}
	return false
}

// candidate returns the member with this id if it may take the request for its prefix: in
// the pool, under the cap and not excluded.
func (p *PrefixAware) candidate(id string, limit int64, exclude []string) *Member {
	m := p.byID[id]
	if m == nil || m.load >= limit || (len(exclude) > 0 && excluded(id, exclude)) {
		return nil
	}
	return m
}
