package policy

import (
	"fmt"
	"testing"
)

// TestAffinityRingBoundedByMembers (R19): the ring and its pending points stay within a
// multiple of the live members' points however often members leave and rejoin, with or
// without picks in between (a worker drained and undrained, ejected and back, on a pool that
// sees no traffic). Before, a pending point went only at the next pick: a pool without picks
// kept every rejoin's points.
func TestAffinityRingBoundedByMembers(t *testing.T) {
	const vnodes, n = 16, 4
	for _, picks := range []bool{false, true} {
		p := NewAffinity(1.25, vnodes)
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprint("w", i)}
			p.Add(ms[i], 0, 1)
		}
		for round := range 1000 {
			m := ms[round%n]
			p.Remove(m)
			p.Add(m, 0, 1)
			if picks && round%7 == 0 {
				p.Pick(uint64(round), nil)
			}
			if held := len(p.ring) + len(p.pending); held > 3*vnodes*n {
				t.Fatalf("picks %v, round %d: %d points held (ring %d, pending %d) for %d live", picks, round, held,
					len(p.ring), len(p.pending), vnodes*n)
			}
		}
		// The ring still answers by the live members only.
		seen := map[string]bool{}
		for k := range 200 {
			m, _ := p.Pick(uint64(k)*0x9e3779b97f4a7c15, nil)
			seen[m.ID] = true
		}
		if len(seen) != n {
			t.Fatalf("picks %v: picks reached %d of %d members", picks, len(seen), n)
		}
	}
}
