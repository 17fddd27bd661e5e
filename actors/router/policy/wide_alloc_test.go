package policy

import (
	"fmt"
	"testing"

	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// TestWideWalksAllocateNothing: the walk in (load, id) order that a pick makes when more
// than wideHolders workers hold the prompt grows its frontier by one member a visit, up to its
// budget of wideHolders visits, and then gives up for the walk of the holders: its fixed buffer
// holds that whole frontier, so even the longest such walk allocates nothing, over either
// index. 100 members: the 60 least loaded hold nothing, the 40 others the whole prompt, so the
// walk spends its whole budget before it gives up.
func TestWideWalksAllocateNothing(t *testing.T) {
	hashes := promptHashes(1, 0, 0, 6)
	const n, first = 100, 60
	mk := func() []*Member {
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("m%02d", i)}
		}
		return ms
	}
	load := func(i int) int64 { return int64(i / first) } // holders at 1, the rest at 0

	t.Run("prefix_aware", func(t *testing.T) {
		ms, p, x := mk(), NewPrefixAware(3), prefixindex.New(256)
		for i, m := range ms {
			p.Add(m, load(i), 1)
			if i >= first {
				x.Record(m.ID, hashes)
			}
		}
		pick := func() *Member { p.SetPrefix(x, hashes); m, _ := p.Pick(0, nil); return m }
		if m := pick(); m != ms[first] {
			t.Fatalf("picked %v, want %s (the least loaded holder)", m, ms[first].ID)
		}
		if allocs := testing.AllocsPerRun(20, func() { pick() }); allocs != 0 {
			t.Fatalf("a pick allocates %v times", allocs)
		}
	})
	t.Run("precise_prefix", func(t *testing.T) {
		ms, p, x := mk(), NewPrecisePrefix(3), kvindex.New[*Member](0)
		for i, m := range ms {
			p.Add(m, load(i), 1)
			if i >= first {
				x.Store(m, hashes)
			}
		}
		pick := func() *Member { p.SetHeld(x, hashes); m, _ := p.Pick(0, nil); return m }
		if m := pick(); m != ms[first] {
			t.Fatalf("picked %v, want %s (the least loaded holder)", m, ms[first].ID)
		}
		if allocs := testing.AllocsPerRun(20, func() { pick() }); allocs != 0 {
			t.Fatalf("a pick allocates %v times", allocs)
		}
	})
}
