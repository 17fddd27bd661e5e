package policy

import (
	"math"
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
// at the cap. Exclusions (failover) are skipped the same way. Membership changes insert or
// remove one member's points (O(n·v) copy, no full rebuild).
type Affinity struct {
	c      float64
	vnodes int
	ring   []point
	n      int
	total  int64 // sum of member loads, for the cap
}

type point struct {
	hash uint64
	m    *Member
}

var _ Policy = (*Affinity)(nil)

// NewAffinity returns an empty affinity policy with load factor c (≥ 1; default 1.25) and
// vnodes ring points per member (default 64).
func NewAffinity(c float64, vnodes int) *Affinity {
	if c < 1 || math.IsNaN(c) || math.IsInf(c, 0) {
		c = 1.25
	}
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
	m.load, m.weight, m.pos = load, weight, 1
	pts := make([]point, p.vnodes)
	for i := range pts {
		pts[i] = point{hash: pointHash(m.ID, i), m: m}
	}
	slices.SortFunc(pts, cmpPoint)
	merged := make([]point, 0, len(p.ring)+len(pts))
	i, j := 0, 0
	for i < len(p.ring) && j < len(pts) {
		if cmpPoint(p.ring[i], pts[j]) <= 0 {
			merged = append(merged, p.ring[i])
			i++
		} else {
			merged = append(merged, pts[j])
			j++
		}
	}
	merged = append(merged, p.ring[i:]...)
	merged = append(merged, pts[j:]...)
	p.ring = merged
	p.n++
	p.total += load
}

// Remove implements Policy.
func (p *Affinity) Remove(m *Member) {
	if m.pos != 1 {
		return
	}
	m.pos = -1
	p.ring = slices.DeleteFunc(p.ring, func(pt point) bool { return pt.m == m })
	p.n--
	p.total -= m.load
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
func (p *Affinity) Cap() int64 {
	if p.n == 0 {
		return 0
	}
	return int64(math.Ceil(p.c * float64(p.total+1) / float64(p.n)))
}

// Pick implements Policy.
func (p *Affinity) Pick(key uint64, exclude []string) (*Member, Reason) {
	if p.n == 0 {
		return nil, ReasonAffinity
	}
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
	var fallback *Member // least loaded non-excluded member, if every one is at the cap
	for step := 0; step < len(p.ring); step++ {
		m := p.ring[(start+step)%len(p.ring)].m
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
