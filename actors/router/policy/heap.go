package policy

// mheap is an indexed binary heap of members (Member.pos is the index), ordered by less.
type mheap struct {
	items []*Member
	less  func(a, b *Member) bool
}

func (h *mheap) len() int { return len(h.items) }

func (h *mheap) contains(m *Member) bool {
	return m.pos >= 0 && m.pos < len(h.items) && h.items[m.pos] == m
}

func (h *mheap) push(m *Member) {
	m.pos = len(h.items)
	h.items = append(h.items, m)
	h.up(m.pos)
}

func (h *mheap) remove(m *Member) bool {
	if !h.contains(m) {
		return false
	}
	i, last := m.pos, len(h.items)-1
	h.swap(i, last)
	h.items[last] = nil
	h.items = h.items[:last]
	m.pos = -1
	if i < last {
		h.fix(i)
	}
	return true
}

// fix restores the order after the key of the member at index i changed.
func (h *mheap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

// best returns the first member in heap order whose id is not in exclude, or nil. With e
// exclusions it visits at most 2e+1 nodes: the best allowed member is the root or a child of
// an excluded node on the way down. A fixed frontier keeps the common case allocation-free.
func (h *mheap) best(exclude []string) *Member {
	if len(h.items) == 0 {
		return nil
	}
	if len(exclude) == 0 || !excluded(h.items[0].ID, exclude) {
		return h.items[0]
	}
	var buf [16]int
	frontier := append(buf[:0], 0)
	for len(frontier) > 0 {
		bi := 0
		for k := 1; k < len(frontier); k++ {
			if h.less(h.items[frontier[k]], h.items[frontier[bi]]) {
				bi = k
			}
		}
		i := frontier[bi]
		frontier[bi] = frontier[len(frontier)-1]
		frontier = frontier[:len(frontier)-1]
		if !excluded(h.items[i].ID, exclude) {
			return h.items[i]
		}
		for _, c := range [2]int{2*i + 1, 2*i + 2} {
			if c < len(h.items) {
				frontier = append(frontier, c)
			}
		}
	}
	return nil
}

func (h *mheap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].pos = i
	h.items[j].pos = j
}

func (h *mheap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(h.items[i], h.items[parent]) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

func (h *mheap) down(i int) bool {
	start, n := i, len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			c = r
		}
		if !h.less(h.items[c], h.items[i]) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}
