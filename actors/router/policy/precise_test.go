package policy

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tlgw/tlgw/internal/kvindex"
)

// TestPreciseWorkedExample is the doc comment's example: the holder at the cap is passed over.
func TestPreciseWorkedExample(t *testing.T) {
	p := NewPrecisePrefix(1.25)
	x := kvindex.New[*Member](0)
	ms := []*Member{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	for i, m := range ms {
		p.Add(m, []int64{2, 0, 0}[i], 1)
	}
	hashes := []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	x.Store(ms[0], hashes)
	x.Store(ms[1], hashes[:4])
	p.SetHeld(x, hashes)
	if m, r := p.Pick(0, nil); m != ms[1] || r != ReasonPrefix {
		t.Fatalf("picked %v (%v), want b for its 4 chunks", m.ID, r)
	}
	// Pick cleared the prefix: the next pick without one is least loaded.
	if m, r := p.Pick(0, nil); m != ms[1] || r != ReasonLeastLoad {
		t.Fatalf("picked %v (%v) with no prefix", m.ID, r)
	}
	p.SetLoad(ms[0], 0)
	p.SetHeld(x, hashes)
	if m, _ := p.Pick(0, []string{"x"}); m != ms[0] {
		t.Fatalf("picked %v, want a once under the cap", m.ID)
	}
	p.SetHeld(x, hashes)
	if m, _ := p.Pick(0, []string{"a"}); m != ms[1] {
		t.Fatalf("picked %v, want b with a excluded", m.ID)
	}
}

// TestPreciseAgainstScan: over random loads and leading-run holdings (some of them other
// pools' members), the pick equals the definition: the deepest match under the cap, then
// (load, id), else the least loaded.
func TestPreciseAgainstScan(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		p := NewPrecisePrefix(1.25)
		x := kvindex.New[*Member](0)
		n := 1 + r.IntN(12)
		if trial%3 == 0 {
			n = wideHolders + 1 + r.IntN(40) // wide enough for firstHeld
		}
		hashes := make([]uint64, 1+r.IntN(20))
		for i := range hashes {
			hashes[i] = r.Uint64()
		}
		var ms []*Member
		for i := range n + 3 {
			m := &Member{ID: fmt.Sprintf("m%02d", i)}
			if i < n {
				p.Add(m, int64(r.IntN(5)), 1)
			}
			d := r.IntN(len(hashes) + 1)
			if trial%3 == 0 && r.IntN(4) > 0 {
				d = len(hashes) // most hold the whole prompt
			}
			x.Store(m, hashes[:d])
			ms = append(ms, m)
		}
		var exclude []string
		if r.IntN(3) == 0 {
			exclude = []string{ms[r.IntN(n)].ID}
		}
		limit := p.Cap()
		var want *Member
		wantDepth := 0
		for _, m := range ms[:n] {
			if m.load >= limit || excluded(m.ID, exclude) {
				continue
			}
			d := x.Match(m, hashes)
			if d > 0 && (d > wantDepth || (d == wantDepth && less(m, want))) {
				want, wantDepth = m, d
			}
		}
		reason := ReasonPrefix
		if want == nil {
			want, reason = p.h.best(exclude), ReasonLeastLoad
		}
		p.SetHeld(x, hashes)
		got, gotReason := p.Pick(0, exclude)
		if got != want || gotReason != reason {
			t.Fatalf("trial %d: picked %v (%v), want %v (%v)", trial, got.ID, gotReason, want.ID, reason)
		}
		if allocs := testing.AllocsPerRun(10, func() { p.SetHeld(x, hashes); p.Pick(0, exclude) }); allocs != 0 {
			t.Fatalf("pick allocates %v", allocs)
		}
	}
}
