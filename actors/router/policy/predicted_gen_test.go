package policy

import (
	"testing"

	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// TestPredictedLatencyMarksAreNotReused: picks over the exact index and over the approximate
// one, in turn, each stamp the holders of the prompt's deepest cached chunk with a fresh
// generation, so no pick takes a member for a holder from a mark an earlier pick left (nor
// from a row never marked). a holds 120 of the prompt's 128 chunks in both indexes, b none:
// a is predicted 22.8 ms, b 56.2 ms (8.2 ms had it counted as holding the prompt), so every
// pick must go to a with features for a's cached prefix.
func TestPredictedLatencyMarksAreNotReused(t *testing.T) {
	p := NewPredictedLatency(10)
	a, b := &Member{ID: "a"}, &Member{ID: "b"}
	p.Add(a, 1, 1)
	p.Add(b, 1, 1)
	teach(p, a, 10, 100)
	teach(p, b, 5, 25)
	x, held := prefixindex.New(0), kvindex.New[*Member](0)
	prompt := chunks(1, 128) // 2,048 tokens
	x.Record("a", prompt[:120])
	held.Store(a, prompt[:120])
	want := ttftmodel.X{1, 1, 0.128}
	for i, exact := range []bool{true, false, true, false, true} {
		p.SetLatencyRequest(x, prompt, 0)
		if exact {
			p.SetHeld(held, prompt)
		}
		if m, _ := p.Pick(0, nil); m != a || p.Features() != want {
			t.Fatalf("pick %d (exact index %v): %s with features %v, want a with %v", i, exact, m.ID, p.Features(), want)
		}
	}
}

// TestPredictedLatencyForeignMember: a member that was never added (its row is the zero
// value, which names no row of an empty pool or points past a small one) is not taken for a
// member: removing it, setting its load or teaching it leaves the pool as it was.
func TestPredictedLatencyForeignMember(t *testing.T) {
	p := NewPredictedLatency(1.25)
	stranger := &Member{ID: "s"}
	p.Remove(stranger)
	p.SetLoad(stranger, 5)
	p.Observe(stranger, ttftmodel.X{1, 0, 1}, 10)
	if p.Len() != 0 || p.Cap() != 0 {
		t.Fatalf("empty pool after a stranger's calls: len %d, cap %d", p.Len(), p.Cap())
	}
	a := &Member{ID: "a"}
	p.Add(a, 0, 1)
	other := &Member{ID: "o", row: 1} // row 1 of another pool: past this one's single row
	p.Remove(other)
	p.SetLoad(other, 7)
	p.Observe(other, ttftmodel.X{1, 0, 1}, 10)
	if p.Len() != 1 || p.Cap() != 2 { // a alone at load 0: ⌈1.25·1/1⌉
		t.Fatalf("pool of a after a stranger's calls: len %d, cap %d", p.Len(), p.Cap())
	}
	if m, _ := p.Pick(0, nil); m != a {
		t.Fatalf("picked %v, want a", m)
	}
}

// TestPredictedLatencyWorkerNumberCacheBound (Bounds): the cache of rows by the prefix index's
// worker number grows to the largest number a pick met, no further, so it stays within the
// index's own table of workers. Five members hold the whole prompt (numbers 1 to 5 in an index
// that never forgot a worker); a sixth worker outside the pool holds it too.
func TestPredictedLatencyWorkerNumberCacheBound(t *testing.T) {
	p := NewPredictedLatency(10)
	x := prefixindex.New(0)
	prompt := chunks(1, 8)
	var ms []*Member
	for i := range 5 {
		m := &Member{ID: string(rune('a' + i))}
		ms = append(ms, m)
		p.Add(m, int64(i), 1)
		x.Record(m.ID, chunks(2, 1)) // a is number 1, b 2, …
	}
	x.Record("outsider", prompt)
	for i := len(ms) - 1; i >= 0; i-- { // last to first: a walk may meet them by number, in steps
		x.Record(ms[i].ID, prompt)
	}
	for range 3 {
		p.SetLatencyRequest(x, prompt, 0)
		if m, _ := p.Pick(0, nil); m != ms[0] {
			t.Fatalf("picked %v, want a (a holder, the least loaded)", m)
		}
	}
	if len(p.nums) > 5+1 {
		t.Fatalf("worker number cache of %d entries for the numbers 1 to 5", len(p.nums))
	}
}
