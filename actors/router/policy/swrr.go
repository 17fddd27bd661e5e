package policy

import (
	"cmp"
	"math"
	"slices"
)

// Weighted is smooth weighted round robin with weight = the member's KV capacity (R3.2): every
// pick adds each member's weight to its counter, takes the largest counter and subtracts the
// total weight from it. Weights 3 (big) and 1 (small) give big, big, small, big, repeating.
// Ties go to the larger weight, then the smaller id, so the sequence does not depend on names.
// A weight below 1 (an engine that reports no capacity) counts as 1, so it still gets a share.
//
// A pick is one pass over the members. The sequence is defined by every member's counter, so
// no sub-linear index reproduces it exactly; the pass runs over a contiguous array (counter,
// weight, member) kept in tie-break order, so it compares only integers.
type Weighted struct {
	ents []swrrEntry
}

type swrrEntry struct {
	cur int64
	w   int64
	m   *Member
}

var _ Policy = (*Weighted)(nil)

// NewWeighted returns an empty weighted policy.
func NewWeighted() *Weighted { return &Weighted{} }

func effWeight(w int64) int64 {
	if w < 1 {
		return 1
	}
	return w
}

// Add implements Policy. A joining member starts with a zero counter.
func (p *Weighted) Add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	p.insert(swrrEntry{w: effWeight(weight), m: m})
}

// insert keeps ents ordered by (weight desc, id asc), so a pick resolves counter ties by
// position and compares only integers.
func (p *Weighted) insert(e swrrEntry) {
	i, _ := slices.BinarySearchFunc(p.ents, e, func(a, b swrrEntry) int {
		if a.w != b.w {
			return cmp.Compare(b.w, a.w)
		}
		return cmp.Compare(a.m.ID, b.m.ID)
	})
	p.ents = slices.Insert(p.ents, i, e)
	p.renumber(i)
}

func (p *Weighted) renumber(from int) {
	for j := from; j < len(p.ents); j++ {
		p.ents[j].m.pos = j
	}
}

// Remove implements Policy.
func (p *Weighted) Remove(m *Member) {
	i := m.pos
	if i < 0 || i >= len(p.ents) || p.ents[i].m != m {
		return
	}
	p.ents = slices.Delete(p.ents, i, i+1)
	p.renumber(i)
	m.pos = -1
}

// SetLoad implements Policy; weighted ignores load.
func (p *Weighted) SetLoad(m *Member, load int64) { m.load = load }

// SetWeight implements Policy.
func (p *Weighted) SetWeight(m *Member, weight int64) {
	m.weight = weight
	if i := m.pos; i >= 0 && i < len(p.ents) && p.ents[i].m == m && p.ents[i].w != effWeight(weight) {
		e := p.ents[i]
		p.Remove(m)
		e.w = effWeight(weight)
		p.insert(e)
	}
}

// Len implements Policy.
func (p *Weighted) Len() int { return len(p.ents) }

// Pick implements Policy. Excluded members neither gain nor lose credit in this round.
func (p *Weighted) Pick(_ uint64, exclude []string) (*Member, Reason) {
	ents := p.ents
	best, bestCur, total := -1, int64(math.MinInt64), int64(0)
	if len(exclude) == 0 {
		for i := range ents { // the hot loop: integers only, ties to the earlier entry
			c := ents[i].cur + ents[i].w
			ents[i].cur = c
			total += ents[i].w
			if c > bestCur {
				best, bestCur = i, c
			}
		}
	} else {
		for i := range ents {
			if excluded(ents[i].m.ID, exclude) {
				continue
			}
			c := ents[i].cur + ents[i].w
			ents[i].cur = c
			total += ents[i].w
			if c > bestCur {
				best, bestCur = i, c
			}
		}
	}
	if best < 0 {
		return nil, ReasonWeighted
	}
	ents[best].cur -= total
	return ents[best].m, ReasonWeighted
}
