package policy

import (
	"math"
	"slices"
)

// Weighted is smooth weighted round robin with weight = the member's KV capacity (R3.2): every
// pick adds each member's weight to its counter, takes the largest counter and subtracts the
// total weight from it. Weights 3 (big) and 1 (small) give big, big, small, big, repeating.
// Ties go to the larger weight, then the smaller id, so the sequence does not depend on names.
// Excluded members neither gain nor lose credit in a round. A weight below 1 (an engine that
// reports no capacity) counts as 1, so it still gets a share.
//
// The counters are kept lazily so a pick need not touch every member. After R rounds a
// member's counter is key + w·R, where key changes only when the member is picked (−total)
// or excluded (−w). Members of equal weight therefore keep their relative order as rounds
// pass, so each weight class is a max-heap on key, and a pick compares only the class heads:
// O(d + log n) for d distinct capacities (a fleet has a handful), the exact sequence of the
// definition.
type Weighted struct {
	classes []*wclass // by weight, descending: the tie-break order across classes
	heads   []head    // classes[i]'s weight and head key, contiguous for the pick's scan
	byID    map[string]*Member
	rounds  int64
	sumW    int64
	maxW    int64
}

type wclass struct {
	w   int64
	h   mheap
	idx int // position in classes and heads
}

type head struct {
	w, key int64
}

// syncHead refreshes the cached head key of c after its heap changed.
func (p *Weighted) syncHead(c *wclass) {
	if c.h.len() > 0 {
		p.heads[c.idx] = head{w: c.w, key: c.h.items[0].key}
	}
}

// reindex renumbers the classes and rebuilds the head cache (a class came or went).
func (p *Weighted) reindex() {
	p.heads = p.heads[:0]
	for i, c := range p.classes {
		c.idx = i
		p.heads = append(p.heads, head{w: c.w})
		p.syncHead(c)
	}
}

var _ Policy = (*Weighted)(nil)

// NewWeighted returns an empty weighted policy.
func NewWeighted() *Weighted { return &Weighted{byID: make(map[string]*Member)} }

func effWeight(w int64) int64 {
	if w < 1 {
		return 1
	}
	return w
}

// byKey orders a class heap: larger counter first, ties to the smaller id.
func byKey(a, b *Member) bool {
	if a.key != b.key {
		return a.key > b.key
	}
	return a.ID < b.ID
}

// Add implements Policy. A joining member starts with a zero counter.
func (p *Weighted) Add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	p.insert(m, 0)
}

// insert files m under its effective weight with counter cur.
func (p *Weighted) insert(m *Member, cur int64) {
	w := effWeight(m.weight)
	i, found := slices.BinarySearchFunc(p.classes, w, func(c *wclass, w int64) int {
		switch {
		case c.w > w:
			return -1
		case c.w < w:
			return 1
		}
		return 0
	})
	if !found {
		p.classes = slices.Insert(p.classes, i, &wclass{w: w, h: mheap{less: byKey}})
		p.reindex()
	}
	c := p.classes[i]
	if w > p.maxW {
		p.maxW = w
		p.renormalizeIfNeeded()
	}
	m.class = c
	m.key = cur - w*p.rounds
	c.h.push(m)
	p.syncHead(c)
	p.sumW += w
	p.byID[m.ID] = m
}

// Remove implements Policy.
func (p *Weighted) Remove(m *Member) {
	c := m.class
	if c == nil || !c.h.remove(m) {
		return
	}
	m.class = nil
	p.sumW -= c.w
	delete(p.byID, m.ID)
	if c.h.len() == 0 {
		p.classes = slices.Delete(p.classes, c.idx, c.idx+1)
		p.reindex()
	} else {
		p.syncHead(c)
	}
}

// SetLoad implements Policy; weighted ignores load.
func (p *Weighted) SetLoad(m *Member, load int64) { m.load = load }

// SetWeight implements Policy. The member keeps its counter.
func (p *Weighted) SetWeight(m *Member, weight int64) {
	c := m.class
	if c == nil || effWeight(weight) == c.w {
		m.weight = weight
		return
	}
	cur := m.key + c.w*p.rounds
	p.Remove(m)
	m.weight = weight
	p.insert(m, cur)
}

// Len implements Policy.
func (p *Weighted) Len() int { return len(p.byID) }

// Pick implements Policy.
func (p *Weighted) Pick(_ uint64, exclude []string) (*Member, Reason) {
	if len(p.byID) == 0 {
		return nil, ReasonWeighted
	}
	p.rounds++
	total := p.sumW
	for i, id := range exclude {
		m := p.byID[id]
		if m == nil || slices.Contains(exclude[:i], id) {
			continue
		}
		m.key -= m.class.w // no gain this round
		m.class.h.fix(m.pos)
		p.syncHead(m.class)
		total -= m.class.w
	}
	var best *Member
	if len(exclude) == 0 {
		// The hot path: one contiguous pass over the class heads, integers only.
		bi, bestCur := -1, int64(0)
		for i := range p.heads {
			if cur := p.heads[i].key + p.heads[i].w*p.rounds; bi < 0 || cur > bestCur { // ties: the heavier class
				bi, bestCur = i, cur
			}
		}
		best = p.classes[bi].h.items[0]
	} else {
		var bestCur int64
		for _, c := range p.classes {
			m := c.h.best(exclude)
			if m == nil {
				continue
			}
			if cur := m.key + c.w*p.rounds; best == nil || cur > bestCur {
				best, bestCur = m, cur
			}
		}
	}
	if best != nil {
		best.key -= total
		best.class.h.fix(best.pos)
		p.syncHead(best.class)
	}
	p.renormalizeIfNeeded()
	return best, ReasonWeighted
}

// renormalizeIfNeeded folds the rounds into the keys before w·rounds could overflow: every
// member's key becomes its counter and rounds restarts at 0 (O(n), once per ~2^60/maxW picks).
func (p *Weighted) renormalizeIfNeeded() {
	if p.maxW == 0 || p.rounds < math.MaxInt64/4/p.maxW {
		return
	}
	for _, c := range p.classes {
		for _, m := range c.h.items {
			m.key += c.w * p.rounds
		}
		p.syncHead(c)
	}
	p.rounds = 0
}
