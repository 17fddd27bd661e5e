package policy

// Weighted is smooth weighted round robin with weight = the member's KV capacity (R3.2): every
// pick adds each member's weight to its counter, takes the largest counter and subtracts the
// total weight from it. Weights 3 (big) and 1 (small) give big, big, small, big, repeating.
// Ties go to the larger weight, then the smaller id, so the sequence does not depend on names.
// A weight below 1 (an engine that reports no capacity) counts as 1, so it still gets a share.
//
// A pick is one pass over the members: O(n), allocation-free, ~1 ns per member. The algorithm
// is defined by the counters of every member, so no sub-linear structure reproduces it exactly;
// the pass is the cost of the exact sequence the contract specifies.
type Weighted struct {
	members []*Member
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
	m.load, m.weight, m.current = load, weight, 0
	m.pos = len(p.members)
	p.members = append(p.members, m)
}

// Remove implements Policy.
func (p *Weighted) Remove(m *Member) {
	i := m.pos
	if i < 0 || i >= len(p.members) || p.members[i] != m {
		return
	}
	last := len(p.members) - 1
	p.members[i] = p.members[last]
	p.members[i].pos = i
	p.members[last] = nil
	p.members = p.members[:last]
	m.pos = -1
}

// SetLoad implements Policy; weighted ignores load.
func (p *Weighted) SetLoad(m *Member, load int64) { m.load = load }

// SetWeight implements Policy.
func (p *Weighted) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (p *Weighted) Len() int { return len(p.members) }

// Pick implements Policy. Excluded members neither gain nor lose credit in this round.
func (p *Weighted) Pick(_ uint64, exclude []string) (*Member, Reason) {
	var best *Member
	var total int64
	for _, m := range p.members {
		if len(exclude) > 0 && excluded(m.ID, exclude) {
			continue
		}
		w := effWeight(m.weight)
		m.current += w
		total += w
		if best == nil || m.current > best.current ||
			(m.current == best.current && (w > effWeight(best.weight) ||
				(w == effWeight(best.weight) && m.ID < best.ID))) {
			best = m
		}
	}
	if best != nil {
		best.current -= total
	}
	return best, ReasonWeighted
}
