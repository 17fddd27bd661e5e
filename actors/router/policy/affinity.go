package policy

import (
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Affinity is a consistent-hash ring with bounded loads on the prefix key (R3.3). Each member
// owns VirtualNodes points on a 64-bit ring; a key belongs to the first point clockwise of its
// hash. The owner takes the request unless its load has reached
//
//	cap = ⌈c·(m+1)/n⌉   (m = total load of the pool, n = members),
//
// in which case the walk goes on clockwise to the first member under the cap (reason load).
// Worked example (seed §2.3): 4 members, c = 1.25, 3 in flight on the owner and none
// elsewhere: cap = ⌈1.25·4/4⌉ = 2, the owner's 3 ≥ 2, so the next member clockwise takes it.
//
// Because cap > m/n, some member is always under it; a pick walks the ring only past members
// at the cap (and past exclusions). Membership changes are cheap and batched: a joining
// member's points wait in a pending list and a leaving member's points go stale (its ring
// generation moves on); the next pick merges the pending points in place and compacts the
// stale ones once they are a quarter of the ring. So a fleet of 10,000 registering at start-up
// costs one sort, not 10,000 ring rebuilds.
//
// Bounds: the ring holds the points of the members at the last pick plus stale ones, compacted
// once they are a quarter of it (under 4/3 of those members' points); pending holds the points
// added since the last pick, its stale ones dropped once they are more than half of it (at most
// twice the live members' points), so no membership churn grows either.
type Affinity struct {
	c       float64
	vnodes  int
	ring    []point // sorted by (hash, id); may hold stale points
	pending []point // points of members added since the last pick
	stale   int     // points in ring that belong to removed members
	n       int
	total   int64 // sum of member loads, for the cap
	peer    int64 // PeerLoader
}

type point struct {
	hash uint64
	m    *Member
	gen  uint32
}

// live reports whether the point belongs to its member's current time on the ring.
func (pt point) live() bool { return pt.m.pos == 1 && pt.m.gen == pt.gen }

var _ Policy = (*Affinity)(nil)

// NewAffinity returns an empty affinity policy with load factor c (≥ 1; default 1.25) and
// vnodes ring points per member (default 64).
func NewAffinity(c float64, vnodes int) *Affinity {
	c = loadFactor(c)
	if vnodes <= 0 {
		vnodes = 64
	}
	return &Affinity{c: c, vnodes: vnodes}
}

// pointHash places member id's i-th virtual node.
func pointHash(id string, i int) uint64 {
	var buf [96]byte
	b := append(buf[:0], id...)
	b = append(b, '#')
	b = strconv.AppendInt(b, int64(i), 10)
	return xxhash.Sum64(b)
}

func cmpPoint(a, b point) int {
	switch {
	case a.hash < b.hash:
		return -1
	case a.hash > b.hash:
		return 1
	case a.m.ID < b.m.ID:
		return -1
	case a.m.ID > b.m.ID:
		return 1
	}
	return 0
}

// Add implements Policy.
func (p *Affinity) Add(m *Member, load, weight int64) {
	if m.pos == 1 {
		return
	}
	m.load, m.weight, m.pos = load, weight, 1
	m.gen++
	for i := 0; i < p.vnodes; i++ {
		p.pending = append(p.pending, point{hash: pointHash(m.ID, i), m: m, gen: m.gen})
	}
	p.n++
	p.total += load
	if len(p.pending) > 2*p.vnodes*p.n {
		// More than half the pending points are stale (members that rejoined before any
		// pick): drop those now, so a pool that sees no picks does not keep every rejoin's.
		kept := slices.DeleteFunc(p.pending, func(pt point) bool { return !pt.live() })
		p.stale = max(0, p.stale-(len(p.pending)-len(kept)))
		p.pending = kept
	}
}

// Remove implements Policy.
func (p *Affinity) Remove(m *Member) {
	if m.pos != 1 {
		return
	}
	m.pos = -1
	m.gen++ // its points, in the ring or still pending, go stale
	p.stale += p.vnodes
	p.n--
	p.total -= m.load
}

// settle merges pending points into the ring and compacts stale ones when they have grown.
func (p *Affinity) settle() {
	if len(p.pending) == 0 && p.stale*4 < len(p.ring) {
		return
	}
	if p.stale*4 >= len(p.ring) {
		p.ring = slices.DeleteFunc(p.ring, func(pt point) bool { return !pt.live() })
		p.stale = 0
	}
	add := slices.DeleteFunc(p.pending, func(pt point) bool { return !pt.live() })
	p.pending = p.pending[len(p.pending):] // keep the capacity, drop the contents
	if len(add) == 0 {
		return
	}
	slices.SortFunc(add, cmpPoint)
	// Merge from the back, in place: the ring grows once, nothing else is allocated.
	i, j := len(p.ring)-1, len(add)-1
	p.ring = append(p.ring, add...)
	for k := len(p.ring) - 1; j >= 0; k-- {
		if i >= 0 && cmpPoint(p.ring[i], add[j]) > 0 {
			p.ring[k] = p.ring[i]
			i--
		} else {
			p.ring[k] = add[j]
			j--
		}
	}
	clear(add)
}

// SetLoad implements Policy.
func (p *Affinity) SetLoad(m *Member, load int64) {
	if m.pos == 1 {
		p.total += load - m.load
	}
	m.load = load
}

// SetWeight implements Policy; the ring gives every member the same number of points.
func (p *Affinity) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (p *Affinity) Len() int { return p.n }

// Cap is the bounded-load cap ⌈c·(m+1)/n⌉ for the pool as it stands.
func (p *Affinity) Cap() int64 { return peerCap(p.c, p.total, p.peer, p.n) }

// SetPeerLoad implements PeerLoader.
func (p *Affinity) SetPeerLoad(peer int64) { p.peer = max(peer, 0) }

// Pick implements Policy.
func (p *Affinity) Pick(key uint64, exclude []string) (*Member, Reason) {
	if p.n == 0 {
		return nil, ReasonAffinity
	}
	p.settle()
	limit := p.Cap()
	start, _ := slices.BinarySearchFunc(p.ring, key, func(pt point, k uint64) int {
		switch {
		case pt.hash < k:
			return -1
		case pt.hash > k:
			return 1
		}
		return 0
	})
	var owner *Member
	var fallback *Member // least loaded allowed member, if every one is at the cap
	for step := 0; step < len(p.ring); step++ {
		pt := p.ring[(start+step)%len(p.ring)]
		if !pt.live() {
			continue
		}
		m := pt.m
		if len(exclude) > 0 && excluded(m.ID, exclude) {
			continue
		}
		if owner == nil {
			owner = m
		}
		if m.load < limit {
			if m == owner {
				return m, ReasonAffinity
			}
			return m, ReasonLoad
		}
		if fallback == nil || less(m, fallback) {
			fallback = m
		}
	}
	if fallback == owner {
		return fallback, ReasonAffinity
	}
	return fallback, ReasonLoad
}
