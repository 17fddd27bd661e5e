package policy

// LeastOutstanding picks the member with the minimum load, ties to the smallest id (R3.1).
// Members sit in a binary min-heap ordered by (load, id): a pick without exclusions reads the
// root in O(1); a load change is an O(log n) sift; with e exclusions a pick visits at most
// 2e+1 heap nodes.
type LeastOutstanding struct {
	h mheap
}

var _ Policy = (*LeastOutstanding)(nil)

// NewLeastOutstanding returns an empty least_outstanding policy.
func NewLeastOutstanding() *LeastOutstanding {
	return &LeastOutstanding{h: mheap{less: less}}
}

func less(a, b *Member) bool {
	if a.load != b.load {
		return a.load < b.load
	}
	if a.Tie != b.Tie {
		return a.Tie < b.Tie
	}
	return a.ID < b.ID
}

// Add implements Policy.
func (p *LeastOutstanding) Add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	p.h.push(m)
}

// Remove implements Policy.
func (p *LeastOutstanding) Remove(m *Member) { p.h.remove(m) }

// SetLoad implements Policy.
func (p *LeastOutstanding) SetLoad(m *Member, load int64) {
	if m.load == load {
		return
	}
	m.load = load
	if p.h.contains(m) {
		p.h.fix(m.pos)
	}
}

// SetWeight implements Policy; least_outstanding ignores weights.
func (p *LeastOutstanding) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (p *LeastOutstanding) Len() int { return p.h.len() }

// Pick implements Policy.
func (p *LeastOutstanding) Pick(_ uint64, exclude []string) (*Member, Reason) {
	return p.h.best(exclude), ReasonLeastLoad
}
