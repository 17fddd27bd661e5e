package policy

import (
	"github.com/tlgw/tlgw/internal/kvindex"
)

// HeldIndex is the exact prefix index as precise_prefix reads it: workers keyed by the
// router's own *Member (one per registered worker), chunk ids as the engines report them.
type HeldIndex = kvindex.Index[*Member]

// HeldScorer is implemented by policies that pick by what the engines report they hold (the
// exact index of R18.3). As with PrefixScorer, the router hands the index and the request's
// chunk hashes (prefixindex.Hashes of the rendered prompt) over right before the Pick they are
// meant for; Pick clears them, so a pick made without sees no earlier request's prefix.
type HeldScorer interface {
	SetHeld(x *HeldIndex, hashes []uint64)
}

// PrecisePrefix is precise_prefix (R18.2): prefix_aware's rule fed by the exact index instead
// of the approximate one. It picks the member holding the request's longest prompt prefix
// among those under the bounded-load cap
//
//	cap = ⌈c·(m+1)/n⌉   (m = total load of the pool, n = members), as affinity (R3.3),
//
// ties to the less loaded member, then the smaller id, and the least loaded member (reason
// least_load) when no candidate holds the prompt's first chunk or no prefix was installed.
// Worked example: 3 members, c = 1.25, loads 2, 0, 0; the first holds 10 chunks of the prompt,
// the second 4, the third none: cap = ⌈1.25·3/3⌉ = 2, so the first is at the cap and the second
// takes the request for its 4 chunks (reason prefix).
//
// The holders of a prompt's d-th chunk id are the workers holding its d-chunk prefix, and (an
// engine's cache holding leading runs) they shrink as d grows, so a binary search over the
// depths finds the deepest with a candidate (a member of this pool, under the cap, not
// excluded) in O(log L) holder lookups for a prompt of L chunks, each walking that chunk's
// holders until the first candidate; the pick is then the least (load, id) candidate among the
// deepest chunk's holders. It allocates nothing.
//
// A pick given no exact prefix (SetHeld not called: a pool keyed by its engines' own events
// whose request came without token ids, R22) is prefix_aware's over the approximate index when
// the router installed it (SetPrefix), else by load: the embedded PrefixAware holds the
// members' heap and answers that pick.
type PrecisePrefix struct {
	PrefixAware
	idx    *HeldIndex
	hashes []uint64
	// The last pick's prefix, for Warm.
	last    lastPrefix
	lastIdx *HeldIndex
}

var (
	_ Policy       = (*PrecisePrefix)(nil)
	_ HeldScorer   = (*PrecisePrefix)(nil)
	_ PrefixScorer = (*PrecisePrefix)(nil)
)

// NewPrecisePrefix returns an empty precise_prefix policy with load factor c (≥ 1; default
// 1.25).
func NewPrecisePrefix(c float64) *PrecisePrefix {
	return &PrecisePrefix{PrefixAware: *NewPrefixAware(c)}
}

// SetHeld implements HeldScorer.
func (p *PrecisePrefix) SetHeld(x *HeldIndex, hashes []uint64) { p.idx, p.hashes = x, hashes }

// Add implements Policy.
func (p *PrecisePrefix) Add(m *Member, load, weight int64) { p.PrefixAware.Add(m, load, weight) }

// Remove implements Policy.
func (p *PrecisePrefix) Remove(m *Member) { p.PrefixAware.Remove(m) }

// Pick implements Policy. key is not read: the prefix arrives by SetHeld.
func (p *PrecisePrefix) Pick(key uint64, exclude []string) (*Member, Reason) {
	idx, hashes := p.idx, p.hashes
	p.idx, p.hashes = nil, nil
	p.last, p.lastIdx = lastPrefix{}, nil
	if idx == nil {
		return p.PrefixAware.Pick(key, exclude)
	}
	p.PrefixAware.SetPrefix(nil, nil) // the exact index answers: an approximate one installed too is not read
	if idx != nil && p.h.len() > 0 {
		if best := p.pickHeld(idx, hashes, exclude); best != nil {
			return best, ReasonPrefix
		}
	}
	return p.h.best(exclude), ReasonLeastLoad
}

func (p *PrecisePrefix) pickHeld(x *HeldIndex, hashes []uint64, exclude []string) *Member {
	limit := p.Cap()
	lo, hi := 0, len(hashes) // depth lo has a candidate (0 by convention); deeper than hi none
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if p.anyCandidate(x.Holders(hashes[mid-1]), limit, exclude) {
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

// bestHolding is the least (load, id) candidate among id's holders.
func (p *PrecisePrefix) bestHolding(x *HeldIndex, id uint64, limit int64, exclude []string) *Member {
	hs := x.Holders(id)
	if len(hs) > wideHolders {
		// Most workers hold it (a system prompt every worker has served): one of the least
		// loaded does too, found in (load, id) order from the heap's root.
		if m, ok := p.firstHeld(x, id, limit, exclude); ok {
			return m
		}
	}
	var best *Member
	for _, m := range hs {
		if p.candidate(m, limit, exclude) && (best == nil || less(m, best)) {
			best = m
		}
	}
	return best
}

// firstHeld returns the first member in (load, id) order that is a candidate and holds id,
// as PrefixAware's firstHolding: it gives up (ok false) after wideHolders visits.
func (p *PrecisePrefix) firstHeld(x *HeldIndex, id uint64, limit int64, exclude []string) (m *Member, ok bool) {
	items := p.h.items
	var buf [wideHolders + 2]int32
	frontier := append(buf[:0], 0) // heap positions whose parents have been visited
	for visits := 0; len(frontier) > 0; visits++ {
		if visits == wideHolders {
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
			return nil, true // the least of the frontier is at the cap: so is everything left
		}
		if !(len(exclude) > 0 && excluded(m.ID, exclude)) && x.Holds(m, id) {
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

func (p *PrecisePrefix) anyCandidate(holders []*Member, limit int64, exclude []string) bool {
	for _, m := range holders {
		if p.candidate(m, limit, exclude) {
			return true
		}
	}
	return false
}

// candidate reports whether m may take the request for its prefix: in this pool, under the
// cap and not excluded.
func (p *PrecisePrefix) candidate(m *Member, limit int64, exclude []string) bool {
	return p.h.contains(m) && m.load < limit && !(len(exclude) > 0 && excluded(m.ID, exclude))
}
