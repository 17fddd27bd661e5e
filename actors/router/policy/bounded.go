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

// PeerLoader is a bounded-load policy told the load its members' engines carry beyond the
// router's own picks (the gateway's other replicas', R23): peer is the pool's total of it.
// The cap is then the pool's whole load's, ⌈c·(m+peer+1)/n⌉, and each member is taken to
// carry an even share of peer, ⌊peer/n⌋, beside its own load: the members' order (who is
// least loaded) stays this router's exact counts, which a stale report would only blur, and
// the cap follows the engines' total, which moves slowly. peer 0 is the cap without replicas.
type PeerLoader interface {
	SetPeerLoad(peer int64)
}

// peerCap is the cap of PeerLoader for a pool of n members whose own loads sum to total and
// whose engines report peer more.
func peerCap(c float64, total, peer int64, n int) int64 {
	if n == 0 {
		return 0
	}
	return boundedCap(c, total+peer, n) - peer/int64(n)
}

// loadHeap is the half that prefix_aware and precise_prefix share: the members by (load, id)
// and their total load, for the bounded-load cap.
type loadHeap struct {
	c     float64
	h     mheap
	total int64 // sum of member loads, for the cap
	peer  int64 // PeerLoader
}

// SetPeerLoad implements PeerLoader.
func (b *loadHeap) SetPeerLoad(peer int64) { b.peer = max(peer, 0) }

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
func (b *loadHeap) Cap() int64 { return peerCap(b.c, b.total, b.peer, b.h.len()) }
