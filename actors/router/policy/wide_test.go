package policy

import (
	"fmt"
	"testing"

	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// widePool is a pool of n members m00… with load i/perLoad each, where every member from
// first on holds the whole prompt: the least loaded members hold nothing, so a pick that looks
// for the holders in (load, id) order (firstHolding, firstHeld) walks past the heap's root and
// down several levels before it meets one.
func widePool(n, perLoad, first int) (ms []*Member, in map[*Member]bool, loads []int64) {
	in = map[*Member]bool{}
	for i := range n {
		ms = append(ms, &Member{ID: fmt.Sprintf("m%02d", i)})
		loads = append(loads, int64(i/perLoad))
		in[ms[i]] = true
	}
	return ms, in, loads
}

// wideExclusions are the exclusion lists the walks are checked under: none, the first
// holders met (so the walk must go on past them), a non-holder on the way, and members that
// are not in the pool.
func wideExclusions(ms []*Member, first int) [][]string {
	return [][]string{
		nil,
		{ms[first].ID},
		{ms[first].ID, ms[first+1].ID, ms[first+2].ID},
		{ms[0].ID, ms[first+1].ID},
		{"other"},
	}
}

// TestPrefixAwareWalksTheHeapToTheFirstHolder: with more holders than the walk's budget and
// the least loaded members holding nothing, the pick walks the heap level by level (several
// members on its frontier at once) and returns what the definition does, exclusions included,
// for every budget from none to more than the pool.
func TestPrefixAwareWalksTheHeapToTheFirstHolder(t *testing.T) {
	q := promptHashes(1, 0, 0, 6)
	for n := 4; n <= 20; n++ {
		for first := 1; first+3 <= n; first++ {
			ms, _, _ := widePool(n, 1, first)
			for wide := 0; wide <= n+1; wide++ {
				for _, exclude := range wideExclusions(ms, first) {
					ms, in, loads := widePool(n, 1, first) // fresh members: Add takes them over
					p := NewPrefixAware(3)
					p.wide = wide
					x := prefixindex.New(64)
					for i, m := range ms {
						p.Add(m, loads[i], 1)
						if i >= first {
							x.Record(m.ID, q)
						}
					}
					x.Record("other", q) // a holder outside the pool
					want, wr := refPrefixAware(ms, in, 3, matchScores(x, q), exclude)
					p.SetPrefix(x, q)
					if got, gr := p.Pick(0, exclude); got != want || gr != wr {
						t.Fatalf("n %d, first %d, wide %d, exclude %v: picked %v (%v), want %v (%v)",
							n, first, wide, exclude, got.ID, gr, want.ID, wr)
					}
				}
			}
		}
	}
}

// TestPreciseWalksTheHeapToTheFirstHolder is the same for precise_prefix, whose walk starts
// once more than wideHolders workers hold the prompt's deepest cached chunk.
func TestPreciseWalksTheHeapToTheFirstHolder(t *testing.T) {
	hashes := []uint64{101, 102, 103, 104, 105, 106}
	for n := wideHolders + 4; n <= 2*wideHolders+4; n++ {
		for first := 1; first+wideHolders+1 <= n; first++ {
			ms, _, _ := widePool(n, 1, first)
			for _, exclude := range wideExclusions(ms, first) {
				ms, in, loads := widePool(n, 1, first) // fresh members: Add takes them over
				p := NewPrecisePrefix(3)
				x := kvindex.New[*Member](0)
				byID := map[string]*Member{}
				for i, m := range ms {
					p.Add(m, loads[i], 1)
					byID[m.ID] = m
					if i >= first {
						x.Store(m, hashes)
					}
				}
				x.Store(&Member{ID: "other"}, hashes) // a holder outside the pool
				want, wr := refPrefixAware(ms, in, 3, func(id string) int { return x.Match(byID[id], hashes) }, exclude)
				p.SetHeld(x, hashes)
				if got, gr := p.Pick(0, exclude); got != want || gr != wr {
					t.Fatalf("n %d, first %d, exclude %v: picked %v (%v), want %v (%v)", n, first, exclude, got.ID, gr, want.ID, wr)
				}
			}
		}
	}
}
