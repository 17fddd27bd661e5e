package policy

import "math"

// PrefixScorer is implemented by policies that use a per-request score of each member, the
// length of the request's prompt prefix that the member is believed to hold in its cache (see
// internal/prefixindex). Pick only receives a 64-bit key, so the router hands the score over
// out of band, on its own goroutine, right before the Pick it is meant for:
//
//	if ps, ok := p.(policy.PrefixScorer); ok && len(hashes) > 0 {
//		ps.SetScores(st.scoreFn) // made once; reads the current request's hashes from st
//	}
//	m, reason := p.Pick(prefixHash, exclude)
//
// SetScores installs f for the next Pick only: Pick clears it, so a pick made without one (a
// prompt shorter than one chunk, another router path) never sees an earlier request's scores.
// f(id) returns the matched prefix length of member id in any unit (prefixindex chunks), 0 for
// none; Pick calls it at most once per candidate and never retains it. To keep picks free of
// allocations, pass the same long-lived func each time instead of a fresh closure.
type PrefixScorer interface {
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
// Members sit in the same (load, id) min-heap as least_outstanding; a scored pick scans them
// all, so it costs O(n) score calls, and allocates nothing.
type PrefixAware struct {
	c     float64
	h     mheap
	total int64 // sum of member loads, for the cap
	score func(memberID string) int
}

var (
	_ Policy       = (*PrefixAware)(nil)
	_ PrefixScorer = (*PrefixAware)(nil)
)

// NewPrefixAware returns an empty prefix_aware policy with load factor c (≥ 1; default 1.25).
func NewPrefixAware(c float64) *PrefixAware {
	if c < 1 || math.IsNaN(c) || math.IsInf(c, 0) {
		c = 1.25
	}
	return &PrefixAware{c: c, h: mheap{less: less}}
}

// SetScores implements PrefixScorer.
func (p *PrefixAware) SetScores(f func(memberID string) int) { p.score = f }

// Add implements Policy.
func (p *PrefixAware) Add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	p.h.push(m)
	p.total += load
}

// Remove implements Policy.
func (p *PrefixAware) Remove(m *Member) {
	if p.h.remove(m) {
		p.total -= m.load
	}
}

// SetLoad implements Policy.
func (p *PrefixAware) SetLoad(m *Member, load int64) {
	if m.load == load {
		return
	}
	if !p.h.contains(m) {
		m.load = load
		return
	}
	p.total += load - m.load
	m.load = load
	p.h.fix(m.pos)
}

// SetWeight implements Policy; prefix_aware ignores weights.
func (p *PrefixAware) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (p *PrefixAware) Len() int { return p.h.len() }

// Cap is the bounded-load cap ⌈c·(m+1)/n⌉ for the pool as it stands.
func (p *PrefixAware) Cap() int64 {
	n := p.h.len()
	if n == 0 {
		return 0
	}
	return int64(math.Ceil(p.c * float64(p.total+1) / float64(n)))
}

// Pick implements Policy. key is not read: the prefix arrives by SetScores.
func (p *PrefixAware) Pick(_ uint64, exclude []string) (*Member, Reason) {
	score := p.score
	p.score = nil
	if score != nil && p.h.len() > 0 {
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
		if best != nil {
			return best, ReasonPrefix
		}
	}
	return p.h.best(exclude), ReasonLeastLoad
}
