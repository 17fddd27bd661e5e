package policy

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/internal/prefixindex"
)

// promptHashes is the hashes of a rendered prompt of chunks 64-byte chunks grown from stem
// that turns into branch from chunk at on: prompts of one stem share their first at chunks.
func promptHashes(stem, branch byte, at, chunks int) []uint64 {
	p := make([]byte, 64*chunks)
	for i := range p {
		p[i] = stem ^ byte(i*7) ^ byte(i>>6)
		if i >= 64*at {
			p[i] ^= branch * 0x55
		}
	}
	return prefixindex.Hashes(nil, p)
}

// matchScores scores by Match in x: the definition SetPrefix must agree with.
func matchScores(x *prefixindex.Index, hashes []uint64) func(string) int {
	return func(id string) int { return x.Match(id, hashes) }
}

func TestPrefixAwareSetPrefix(t *testing.T) {
	x := prefixindex.New(100)
	q := promptHashes(1, 0, 0, 12)
	p, ms := prefixPool(1, 0, 1, 2) // cap = ⌈1.25·5/4⌉ = 2
	x.Record("a", q[:3])
	x.Record("c", q[:7])
	x.Record("d", q)     // d is at the cap
	x.Record("z", q[:9]) // not a member
	p.SetPrefix(x, q)
	if m, r := p.Pick(0, nil); m.ID != "c" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want c (prefix): the longest match under the cap", m.ID, r)
	}
	if m, r := p.Pick(0, nil); m.ID != "b" || r != ReasonLeastLoad {
		t.Fatalf("a second pick used the first pick's prefix: %s (%v)", m.ID, r)
	}
	// Equal matches: the less loaded, then the smaller id.
	x.Record("b", q[:7])
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, nil); m.ID != "b" {
		t.Fatalf("tie: got %s, want b (lower load)", m.ID)
	}
	p.SetLoad(ms[1], 1)
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, nil); m.ID != "b" {
		t.Fatalf("tie at equal load: got %s, want b (smaller id)", m.ID)
	}
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, []string{"b", "x"}); m.ID != "c" {
		t.Fatalf("b excluded: got %s, want c", m.ID)
	}
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, []string{"b", "c"}); m.ID != "a" {
		t.Fatalf("b, c excluded: got %s, want a", m.ID)
	}
	// Under the cap again, d's whole-prompt match counts.
	p.SetLoad(ms[3], 0)
	p.SetPrefix(x, q)
	if m, r := p.Pick(0, nil); m.ID != "d" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want d", m.ID, r)
	}
	// A removed member is not picked for its prefix, and nothing matching means least load.
	p.Remove(ms[3])
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, nil); m.ID != "b" {
		t.Fatalf("after d left: got %s, want b", m.ID)
	}
	p.SetPrefix(x, promptHashes(9, 0, 0, 5))
	if m, r := p.Pick(0, nil); m.ID != "a" || r != ReasonLeastLoad {
		t.Fatalf("no match: got %s (%v), want a (least_load)", m.ID, r)
	}
	p.SetPrefix(x, nil)
	if m, r := p.Pick(0, nil); m.ID != "a" || r != ReasonLeastLoad {
		t.Fatalf("no hashes: got %s (%v)", m.ID, r)
	}
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, []string{"a", "b", "c"}); m != nil {
		t.Fatalf("all excluded: got %s", m.ID)
	}
	empty := NewPrefixAware(1.25)
	empty.SetPrefix(x, q)
	if m, r := empty.Pick(0, nil); m != nil || r != ReasonLeastLoad {
		t.Fatalf("empty pool: %v %v", m, r)
	}
}

func TestPrefixAwareSetPrefixAndScoresReplaceEachOther(t *testing.T) {
	x := prefixindex.New(100)
	q := promptHashes(1, 0, 0, 4)
	x.Record("a", q)
	p, _ := prefixPool(0, 0)
	p.SetPrefix(x, q)
	p.SetScores(scores(map[string]int{"b": 1}))
	if m, _ := p.Pick(0, nil); m.ID != "b" {
		t.Fatalf("SetScores after SetPrefix: got %s, want b", m.ID)
	}
	p.SetScores(scores(map[string]int{"b": 1}))
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, nil); m.ID != "a" {
		t.Fatalf("SetPrefix after SetScores: got %s, want a", m.ID)
	}
	p.SetScores(scores(map[string]int{"b": 1}))
	p.SetPrefix(x, promptHashes(2, 0, 0, 4))
	if m, r := p.Pick(0, []string{"a"}); m.ID != "b" || r != ReasonLeastLoad {
		t.Fatalf("SetPrefix replaced by one matching nobody: got %s (%v)", m.ID, r)
	}
}

// TestPrefixAwareSetPrefixDeepHolderAtCap: the deepest holder is at the cap, so the pick is the
// best of a shallower depth, found by the search over depths, not the deepest one.
func TestPrefixAwareSetPrefixDeepHolderAtCap(t *testing.T) {
	x := prefixindex.New(1000)
	q := promptHashes(1, 0, 0, 40)
	p, _ := prefixPool(9, 0, 0, 0, 1, 0) // cap = ⌈1.25·11/6⌉ = 3
	for i, d := range []int{40, 2, 0, 17, 17, 5} {
		x.Record(string(rune('a'+i)), q[:d])
	}
	x.Record("g", q) // not a member
	p.SetPrefix(x, q)
	if m, r := p.Pick(0, nil); m.ID != "d" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want d (17 chunks, less loaded than e)", m.ID, r)
	}
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, []string{"d"}); m.ID != "e" {
		t.Fatalf("got %s, want e", m.ID)
	}
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, []string{"d", "e"}); m.ID != "f" {
		t.Fatalf("got %s, want f", m.ID)
	}
	// Exactly at the cap is at the cap: loads 2, 2, 0, 0, 1, 0 make it ⌈1.25·6/6⌉ = 2, so a
	// and b are passed over for their 40 and 2 chunks.
	p.SetLoad(p.byID["a"], 2)
	p.SetLoad(p.byID["b"], 2)
	if got := p.Cap(); got != 2 {
		t.Fatalf("cap = %d, want 2", got)
	}
	p.SetPrefix(x, q)
	if m, _ := p.Pick(0, []string{"d", "e"}); m.ID != "f" {
		t.Fatalf("got %s, want f: a and b are at the cap", m.ID)
	}
}

func TestPrefixAwareSetPrefixAllocatesNothing(t *testing.T) {
	x := prefixindex.New(256)
	p := NewPrefixAware(1.25)
	ms := make([]Member, 64)
	for i := range ms {
		ms[i].ID = fmt.Sprintf("w%02d", i)
		p.Add(&ms[i], int64(i%5), 1)
		x.Record(ms[i].ID, promptHashes(byte(i%4), byte(i%3+1), 8, 8+i%9))
	}
	q := promptHashes(1, 2, 8, 20)
	exclude := []string{"w03", "w10"}
	allocs := testing.AllocsPerRun(100, func() {
		p.SetPrefix(x, q)
		m, _ := p.Pick(0, exclude)
		p.SetLoad(m, m.Load()+1)
		p.SetLoad(m, m.Load()-1)
	})
	if allocs != 0 {
		t.Fatalf("a pick allocates %v times", allocs)
	}
}

// TestPrefixAwareSetPrefixMatchesScan: the pick from the prefix index's holder lists is the
// pick of the scan that scores every member by Match (and of the definition), under random
// records, evictions, Forget, membership, loads, exclusions and prompts.
func TestPrefixAwareSetPrefixMatchesScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 10).Draw(t, "n")
		c := rapid.Float64Range(1, 3).Draw(t, "c")
		x := prefixindex.New(rapid.IntRange(1, 30).Draw(t, "blocks"))
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("m%02d", i)}
		}
		// Workers the index knows that are not members of the pool: another pool's, a gone one.
		ids := append([]string{"other", "m99"}, func() (ids []string) {
			for _, m := range ms {
				ids = append(ids, m.ID)
			}
			return ids
		}()...)
		gen := func(t *rapid.T) []uint64 {
			return promptHashes(byte(rapid.IntRange(0, 2).Draw(t, "stem")), byte(rapid.IntRange(0, 3).Draw(t, "branch")),
				rapid.IntRange(0, 16).Draw(t, "at"), rapid.IntRange(0, 16).Draw(t, "chunks"))
		}
		p, scan, wide := NewPrefixAware(c), NewPrefixAware(c), NewPrefixAware(c)
		// wide looks for the holders in (load, id) order from a few holders on, with a budget
		// of as many visits.
		wide.wide = rapid.IntRange(0, 4).Draw(t, "wide")
		in := map[*Member]bool{}
		twins := map[*Member]*Member{} // each member's copy in scan
		wides := map[*Member]*Member{} // and in wide
		for _, m := range ms {
			twins[m] = &Member{ID: m.ID}
			wides[m] = &Member{ID: m.ID}
		}
		for step := rapid.IntRange(1, 200).Draw(t, "steps"); step > 0; step-- {
			m := ms[rapid.IntRange(0, n-1).Draw(t, "m")]
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0:
				if !in[m] {
					load := rapid.Int64Range(0, 6).Draw(t, "load")
					p.Add(m, load, 1)
					scan.Add(twins[m], load, 1)
					wide.Add(wides[m], load, 1)
					in[m] = true
				}
			case 1:
				p.Remove(m)
				scan.Remove(twins[m])
				wide.Remove(wides[m])
				delete(in, m)
			case 2:
				load := rapid.Int64Range(0, 6).Draw(t, "load")
				p.SetLoad(m, load)
				scan.SetLoad(twins[m], load)
				wide.SetLoad(wides[m], load)
			case 3, 4, 5:
				x.Record(ids[rapid.IntRange(0, len(ids)-1).Draw(t, "worker")], gen(t))
			case 6:
				x.Forget(ids[rapid.IntRange(0, len(ids)-1).Draw(t, "worker")])
			default:
				var exclude []string
				for k := rapid.IntRange(0, 3).Draw(t, "excl"); k > 0; k-- {
					exclude = append(exclude, ids[rapid.IntRange(0, len(ids)-1).Draw(t, "x")])
				}
				q := gen(t)
				p.SetPrefix(x, q)
				got, gr := p.Pick(0, exclude)
				scan.SetScores(matchScores(x, q))
				sm, sr := scan.Pick(0, exclude)
				want, wr := refPrefixAware(ms, in, c, matchScores(x, q), exclude)
				if got != want || gr != wr {
					t.Fatalf("pick = %v (%v), want %v (%v)", got, gr, want, wr)
				}
				if (sm == nil) != (got == nil) || (sm != nil && sm != twins[got]) || sr != gr {
					t.Fatalf("pick = %v (%v), scan %v (%v)", got, gr, sm, sr)
				}
				wide.SetPrefix(x, q)
				if wm, wr := wide.Pick(0, exclude); (wm == nil) != (got == nil) || (wm != nil && wm != wides[got]) || wr != gr {
					t.Fatalf("pick = %v (%v), wide %v (%v)", got, gr, wm, wr)
				}
				if got != nil {
					// As the router does: the reservation, and the prompt on the chosen worker.
					p.SetLoad(got, got.Load()+1)
					scan.SetLoad(twins[got], twins[got].Load()+1)
					wide.SetLoad(wides[got], wides[got].Load()+1)
					x.Record(got.ID, q)
				}
			}
			if p.Len() != len(in) || len(p.byID) != len(in) {
				t.Fatalf("Len = %d, byID %d, want %d", p.Len(), len(p.byID), len(in))
			}
		}
	})
}
