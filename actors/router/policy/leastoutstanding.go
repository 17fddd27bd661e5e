package policy

// LeastOutstanding picks the member with the minimum load, ties to the smallest id (R3.1).
// Members sit in a binary min-heap ordered by (load, id): a pick without exclusions reads the
// root in O(1); a load change is an O(log n) sift. With e exclusions a pick visits at most
// 2e+1 heap nodes, because the best non-excluded member is the root or a child of an excluded
// node on the way down.
type LeastOutstanding struct {
	heap []*Member
}

var _ Policy = (*LeastOutstanding)(nil)

// NewLeastOutstanding returns an empty least_outstanding policy.
func NewLeastOutstanding() *LeastOutstanding { return &LeastOutstanding{} }

func less(a, b *Member) bool {
	if a.load != b.load {
		return a.load < b.load
	}
	return a.ID < b.ID
}

// Add implements Policy.
func (p *LeastOutstanding) Add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	m.pos = len(p.heap)
	p.heap = append(p.heap, m)
	p.up(m.pos)
}

// Remove implements Policy.
func (p *LeastOutstanding) Remove(m *Member) {
	i := m.pos
	if i < 0 || i >= len(p.heap) || p.heap[i] != m {
		return
	}
	last := len(p.heap) - 1
	p.swap(i, last)
	p.heap[last] = nil
	p.heap = p.heap[:last]
	m.pos = -1
	if i < last {
		p.fix(i)
	}
}

// SetLoad implements Policy.
func (p *LeastOutstanding) SetLoad(m *Member, load int64) {
	if m.load == load {
		return
	}
	m.load = load
	if i := m.pos; i >= 0 && i < len(p.heap) && p.heap[i] == m {
		p.fix(i)
	}
}

// SetWeight implements Policy; least_outstanding ignores weights.
func (p *LeastOutstanding) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (p *LeastOutstanding) Len() int { return len(p.heap) }

// Pick implements Policy.
func (p *LeastOutstanding) Pick(_ uint64, exclude []string) (*Member, Reason) {
	if len(p.heap) == 0 {
		return nil, ReasonLeastLoad
	}
	if len(exclude) == 0 || !excluded(p.heap[0].ID, exclude) {
		return p.heap[0], ReasonLeastLoad
	}
	// Best-first search below the excluded nodes. The frontier holds at most e+1 nodes at a
	// time; a fixed array keeps the common case (a few failovers) allocation-free.
	var buf [16]int
	frontier := buf[:0]
	frontier = append(frontier, 0)
	for len(frontier) > 0 {
		bi := 0
		for k := 1; k < len(frontier); k++ {
			if less(p.heap[frontier[k]], p.heap[frontier[bi]]) {
				bi = k
			}
		}
		i := frontier[bi]
		frontier[bi] = frontier[len(frontier)-1]
		frontier = frontier[:len(frontier)-1]
		if !excluded(p.heap[i].ID, exclude) {
			return p.heap[i], ReasonLeastLoad
		}
		for _, c := range [2]int{2*i + 1, 2*i + 2} {
			if c < len(p.heap) {
				frontier = append(frontier, c)
			}
		}
	}
	return nil, ReasonLeastLoad
}

func (p *LeastOutstanding) swap(i, j int) {
	p.heap[i], p.heap[j] = p.heap[j], p.heap[i]
	p.heap[i].pos = i
	p.heap[j].pos = j
}

func (p *LeastOutstanding) fix(i int) {
	if !p.down(i) {
		p.up(i)
	}
}

func (p *LeastOutstanding) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !less(p.heap[i], p.heap[parent]) {
			return
		}
		p.swap(i, parent)
		i = parent
	}
}

func (p *LeastOutstanding) down(i int) bool {
	start, n := i, len(p.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && less(p.heap[r], p.heap[l]) {
			c = r
		}
		if !less(p.heap[c], p.heap[i]) {
			break
		}
		p.swap(i, c)
		i = c
	}
	return i > start
}
