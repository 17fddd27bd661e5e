package policy

import (
	"fmt"
	"testing"
)

// staleIn counts the points of pts that no longer belong to a member's current time on the
// ring.
func staleIn(pts []point) int {
	n := 0
	for _, pt := range pts {
		if !pt.live() {
			n++
		}
	}
	return n
}

// TestAffinityPendingDropIsAmortised pins when the pending list drops its stale points: only
// once they are more than half of it (pending above twice the live members' points), all at
// once — so a fleet registering with no picks does not rescan the pending list on every join
// (10,000 joins would be quadratic) — and the stale count then loses exactly the points
// dropped, so that the next pick's decision to compact the ring rests on the stale points
// still held.
func TestAffinityPendingDropIsAmortised(t *testing.T) {
	const vnodes, n = 4, 3
	p := NewAffinity(1.25, vnodes)
	ms := make([]*Member, n)
	for i := range ms {
		ms[i] = &Member{ID: fmt.Sprint("w", i)}
		p.Add(ms[i], 0, 1)
	}
	// Each rejoin of w0 before any pick leaves its previous points stale in pending.
	for rejoin := 1; ; rejoin++ {
		p.Remove(ms[0])
		p.Add(ms[0], 0, 1)
		held := (n + rejoin) * vnodes // every point added so far
		if held <= 2*vnodes*n {
			// At or below twice the live points (exactly twice at rejoin 3): kept as they are.
			if len(p.pending) != held || staleIn(p.pending) != rejoin*vnodes || p.stale != rejoin*vnodes {
				t.Fatalf("rejoin %d: pending %d (%d stale), stale count %d; want %d (%d stale) kept",
					rejoin, len(p.pending), staleIn(p.pending), p.stale, held, rejoin*vnodes)
			}
			continue
		}
		// Past it: the stale ones go, and the count with them.
		if len(p.pending) != n*vnodes || staleIn(p.pending) != 0 || p.stale != 0 {
			t.Fatalf("rejoin %d: pending %d (%d stale), stale count %d; want the %d live points and no stale",
				rejoin, len(p.pending), staleIn(p.pending), p.stale, n*vnodes)
		}
		break
	}
	// With a ring: the stale count keeps the ring's stale points and drops pending's.
	p.Pick(0, nil)
	if len(p.ring) != n*vnodes || p.stale != 0 {
		t.Fatalf("after a pick: ring %d, stale %d; want %d, 0", len(p.ring), p.stale, n*vnodes)
	}
	for range 2*n + 1 {
		p.Remove(ms[1])
		p.Add(ms[1], 0, 1)
	}
	if got, want := p.stale, staleIn(p.ring)+staleIn(p.pending); got != want || len(p.pending) > 2*vnodes*n {
		t.Fatalf("stale count %d, want %d (ring %d stale, pending %d of which %d stale)",
			got, want, staleIn(p.ring), len(p.pending), staleIn(p.pending))
	}
}

// TestAffinityCompactsAtAQuarter pins the ring's bound: a pick compacts the ring once its stale
// points are a quarter of it, so after a pick the ring holds under 4/3 of the live members'
// points; below a quarter the stale points stay (compaction is amortised over removals).
func TestAffinityCompactsAtAQuarter(t *testing.T) {
	const vnodes = 8
	for _, c := range []struct {
		members, removed int
		ring             int // after the next pick
	}{
		{4, 1, 3 * vnodes}, // 8 of 32 stale: exactly a quarter, compacted
		{5, 1, 5 * vnodes}, // 8 of 40: kept
		{8, 2, 6 * vnodes}, // 16 of 64: compacted
	} {
		p := NewAffinity(1.25, vnodes)
		ms := make([]*Member, c.members)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprint("w", i)}
			p.Add(ms[i], 0, 1)
		}
		p.Pick(0, nil)
		for _, m := range ms[:c.removed] {
			p.Remove(m)
		}
		p.Pick(0, nil)
		if len(p.ring) != c.ring {
			t.Errorf("%d members, %d removed: ring %d after the pick, want %d", c.members, c.removed, len(p.ring), c.ring)
		}
		if live := (c.members - c.removed) * vnodes; 3*len(p.ring) >= 4*live {
			t.Errorf("%d members, %d removed: ring %d, not under 4/3 of the %d live points", c.members, c.removed, len(p.ring), live)
		}
	}
}
