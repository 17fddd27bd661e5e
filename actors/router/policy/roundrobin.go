package policy

import (
	"slices"
	"strings"
)

// RoundRobin hands requests to the members in turn, in id order, ignoring load and capacity
// (R18.2): the baseline a load- or cache-aware policy is measured against. The turn is kept as
// the id of the last member picked, not as a position, so members joining or leaving never
// make it skip or repeat anyone: a pick takes the first member whose id sorts after the last
// one picked (wrapping around), skipping exclusions. Worked example: members a, b, c pick a, b,
// c, a, … (a first pick starts at the member of least Tie, the first by id when no member has
// one); after b, a member bb joins and is next (bb sorts after b), then c; excluding c
// from the pick after bb gives a. Members sit in a slice sorted by id: a pick is a binary
// search, O(log n) without exclusions, and never allocates; a join or leave is O(n).
type RoundRobin struct {
	ms   []*Member // sorted by id
	last string    // the id of the last member picked ("" = none yet: start at the first)
	any  bool      // a pick has been made (an empty id is a valid member id)
}

var _ Policy = (*RoundRobin)(nil)

// NewRoundRobin returns an empty round_robin policy.
func NewRoundRobin() *RoundRobin { return &RoundRobin{} }

func (p *RoundRobin) find(id string) (int, bool) {
	return slices.BinarySearchFunc(p.ms, id, func(m *Member, id string) int { return strings.Compare(m.ID, id) })
}

// Add implements Policy.
func (p *RoundRobin) Add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	i, _ := p.find(m.ID)
	p.ms = slices.Insert(p.ms, i, m)
}

// Remove implements Policy.
func (p *RoundRobin) Remove(m *Member) {
	if i, ok := p.find(m.ID); ok && p.ms[i] == m {
		p.ms = slices.Delete(p.ms, i, i+1)
	}
}

// SetLoad implements Policy; round_robin ignores load.
func (p *RoundRobin) SetLoad(m *Member, load int64) { m.load = load }

// SetWeight implements Policy; round_robin ignores weights.
func (p *RoundRobin) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (p *RoundRobin) Len() int { return len(p.ms) }

// Pick implements Policy. key is not read.
func (p *RoundRobin) Pick(_ uint64, exclude []string) (*Member, Reason) {
	n := len(p.ms)
	if n == 0 {
		return nil, ReasonRoundRobin
	}
	start := 0
	if !p.any {
		// The first pick starts at the member of least Tie (the first id without one): the
		// replicas of a gateway (R23) each start elsewhere instead of all moving in step.
		for i, m := range p.ms {
			if m.Tie < p.ms[start].Tie {
				start = i
			}
		}
	} else {
		i, ok := p.find(p.last)
		if ok {
			i++
		}
		start = i
	}
	for k := range n {
		m := p.ms[(start+k)%n]
		if len(exclude) > 0 && excluded(m.ID, exclude) {
			continue
		}
		p.last, p.any = m.ID, true
		return m, ReasonRoundRobin
	}
	return nil, ReasonRoundRobin
}
