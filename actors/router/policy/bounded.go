package policy

import "math"

// DefaultLoadFactor is c of R3.3 when a policy is given none that is usable.
const DefaultLoadFactor = 1.25

// loadFactor is c when it is a usable load factor (≥ 1 and finite), else DefaultLoadFactor.
func loadFactor(c float64) float64 {
	if c < 1 || math.IsNaN(c) || math.IsInf(c, 0) {
		return DefaultLoadFactor
	}
	return c
}

// boundedCap is the bounded-load cap ⌈c·(m+1)/n⌉ of R3.3 for a pool of n members whose loads
// sum to m; 0 for an empty pool.
func boundedCap(c float64, total int64, n int) int64 {
	if n == 0 {
		return 0
	}
	return int64(math.Ceil(c * float64(total+1) / float64(n)))
}

// loadHeap is the half that prefix_aware and precise_prefix share: the members by (load, id)
// and their total load, for the bounded-load cap.
type loadHeap struct {
	c     float64
	h     mheap
	total int64 // sum of member loads, for the cap
}

func newLoadHeap(c float64) loadHeap { return loadHeap{c: loadFactor(c), h: mheap{less: less}} }

// add puts m in with its load and weight.
func (b *loadHeap) add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	b.h.push(m)
	b.total += load
}

// remove takes m out; it reports whether m was in.
func (b *loadHeap) remove(m *Member) bool {
	if !b.h.remove(m) {
		return false
	}
	b.total -= m.load
	return true
}

// SetLoad implements Policy.
func (b *loadHeap) SetLoad(m *Member, load int64) {
	if m.load == load {
		return
	}
	if !b.h.contains(m) {
		m.load = load
		return
	}
	b.total += load - m.load
	m.load = load
	b.h.fix(m.pos)
}

// SetWeight implements Policy; the prefix policies ignore weights.
func (b *loadHeap) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (b *loadHeap) Len() int { return b.h.len() }

// Cap is the bounded-load cap ⌈c·(m+1)/n⌉ for the pool as it stands.
func (b *loadHeap) Cap() int64 { return boundedCap(b.c, b.total, b.h.len()) }
