package policy

import (
	"fmt"
	"math"
	"testing"

	"pgregory.net/rapid"
)

// prefixPool builds a prefix_aware pool with the given loads, members "a", "b", … in order.
func prefixPool(loads ...int64) (*PrefixAware, []*Member) {
	p := NewPrefixAware(1.25)
	ms := make([]*Member, len(loads))
	for i, l := range loads {
		ms[i] = &Member{ID: string(rune('a' + i))}
		p.Add(ms[i], l, 1)
	}
	return p, ms
}

func scores(m map[string]int) func(string) int { return func(id string) int { return m[id] } }

func TestPrefixAwareLongestMatchWins(t *testing.T) {
	p, _ := prefixPool(1, 0, 1, 2) // cap = ⌈1.25·5/4⌉ = 2
	p.SetScores(scores(map[string]int{"a": 3, "c": 7, "d": 2}))
	if m, r := p.Pick(0, nil); m.ID != "c" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want c (prefix): the longest match, though not the least loaded", m.ID, r)
	}
	// Equal matches: the less loaded, then the smaller id.
	p.SetScores(scores(map[string]int{"a": 5, "b": 5, "c": 5}))
	if m, r := p.Pick(0, nil); m.ID != "b" || r != ReasonPrefix {
		t.Fatalf("tie: got %s (%v), want b (lower load)", m.ID, r)
	}
	p.SetScores(scores(map[string]int{"a": 5, "c": 5}))
	if m, _ := p.Pick(0, nil); m.ID != "a" {
		t.Fatalf("tie at equal load: got %s, want a (smaller id)", m.ID)
	}
}

func TestPrefixAwareSkipsMemberAtCap(t *testing.T) {
	// The worked example: 4 members, c = 1.25, loads 3, 0, 0, 0: cap = ⌈1.25·4/4⌉ = 2.
	p, ms := prefixPool(3, 0, 0, 0)
	if got := p.Cap(); got != 2 {
		t.Fatalf("cap = %d, want 2", got)
	}
	p.SetScores(scores(map[string]int{"a": 30, "b": 4, "c": 9}))
	if m, r := p.Pick(0, nil); m.ID != "c" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want c: a holds more but is at the cap", m.ID, r)
	}
	// Only the member at the cap matches: least load takes it.
	p.SetScores(scores(map[string]int{"a": 30}))
	if m, r := p.Pick(0, nil); m.ID != "b" || r != ReasonLeastLoad {
		t.Fatalf("got %s (%v), want b (least_load)", m.ID, r)
	}
	// Exactly at the cap (loads 1, 0, 0, 0: cap = ⌈1.25·2/4⌉ = 1) is at the cap.
	p.SetLoad(ms[0], 1)
	p.SetScores(scores(map[string]int{"a": 30, "c": 9}))
	if m, r := p.Pick(0, nil); m.ID != "c" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want c: a's load 1 is the cap", m.ID, r)
	}
	// Under the cap again (cap = ⌈1.25·1/4⌉ = 1 > 0), a's match counts.
	p.SetLoad(ms[0], 0)
	p.SetScores(scores(map[string]int{"a": 30, "c": 9}))
	if m, r := p.Pick(0, nil); m.ID != "a" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want a (prefix)", m.ID, r)
	}
}

func TestPrefixAwareFallsBackToLeastLoad(t *testing.T) {
	p, _ := prefixPool(2, 1, 1, 3)
	if m, r := p.Pick(0, nil); m.ID != "b" || r != ReasonLeastLoad {
		t.Fatalf("no scorer: got %s (%v), want b (least_load, ties to the smaller id)", m.ID, r)
	}
	p.SetScores(scores(nil))
	if m, r := p.Pick(0, nil); m.ID != "b" || r != ReasonLeastLoad {
		t.Fatalf("no match: got %s (%v), want b (least_load)", m.ID, r)
	}
	p.SetScores(func(string) int { return -4 })
	if m, r := p.Pick(0, nil); m.ID != "b" || r != ReasonLeastLoad {
		t.Fatalf("negative scores: got %s (%v)", m.ID, r)
	}
}

func TestPrefixAwareScoresLastOnePick(t *testing.T) {
	p, _ := prefixPool(1, 0)
	calls := 0
	p.SetScores(func(id string) int {
		calls++
		if id == "a" {
			return 1
		}
		return 0
	})
	if m, _ := p.Pick(0, nil); m.ID != "a" || calls != 2 {
		t.Fatalf("got %s after %d calls, want a after 2", m.ID, calls)
	}
	if m, r := p.Pick(0, nil); m.ID != "b" || r != ReasonLeastLoad || calls != 2 {
		t.Fatalf("second pick used the first pick's scores: %s (%v), %d calls", m.ID, r, calls)
	}
}

func TestPrefixAwareExclusions(t *testing.T) {
	p, _ := prefixPool(0, 0, 1)
	p.SetScores(scores(map[string]int{"a": 9, "b": 5}))
	if m, r := p.Pick(0, []string{"a"}); m.ID != "b" || r != ReasonPrefix {
		t.Fatalf("got %s (%v), want b: a is excluded", m.ID, r)
	}
	p.SetScores(scores(map[string]int{"a": 9, "b": 5}))
	if m, r := p.Pick(0, []string{"a", "b"}); m.ID != "c" || r != ReasonLeastLoad {
		t.Fatalf("got %s (%v), want c (least_load): every match is excluded", m.ID, r)
	}
	if m, _ := p.Pick(0, []string{"b", "a"}); m.ID != "c" {
		t.Fatalf("no scorer: got %s, want c", m.ID)
	}
	p.SetScores(scores(map[string]int{"a": 9}))
	if m, _ := p.Pick(0, []string{"a", "b", "c"}); m != nil {
		t.Fatalf("all excluded: got %s", m.ID)
	}
	empty := NewPrefixAware(1.25)
	empty.SetScores(scores(nil))
	if m, r := empty.Pick(0, nil); m != nil || r != ReasonLeastLoad {
		t.Fatalf("empty pool: %v %v", m, r)
	}
}

func TestPrefixAwarePickAllocatesNothing(t *testing.T) {
	p := NewPrefixAware(1.25)
	ms := make([]Member, 64)
	match := make(map[string]int)
	for i := range ms {
		ms[i].ID = fmt.Sprintf("w%02d", i)
		p.Add(&ms[i], int64(i%5), 1)
		match[ms[i].ID] = i % 7
	}
	score := func(id string) int { return match[id] } // made once, as the router should
	exclude := []string{"w03", "w10"}
	allocs := testing.AllocsPerRun(100, func() {
		p.SetScores(score)
		m, _ := p.Pick(0, exclude)
		p.SetLoad(m, m.Load()+1)
		p.SetLoad(m, m.Load()-1)
	})
	if allocs != 0 {
		t.Fatalf("a pick allocates %v times", allocs)
	}
}

// refPrefixAware is the definition: among members not excluded and under the cap, the highest
// positive score (ties: lower load, then smaller id); else the minimum load, ties smallest id.
func refPrefixAware(ms []*Member, in map[*Member]bool, c float64, score func(string) int, exclude []string) (*Member, Reason) {
	var total int64
	n := 0
	for _, m := range ms {
		if in[m] {
			total += m.load
			n++
		}
	}
	if n == 0 {
		return nil, ReasonLeastLoad
	}
	limit := int64(math.Ceil(c * float64(total+1) / float64(n)))
	var best *Member
	bestScore := 0
	if score != nil {
		for _, m := range ms {
			if !in[m] || excluded(m.ID, exclude) || m.load >= limit {
				continue
			}
			s := score(m.ID)
			if s > bestScore || (s > 0 && s == bestScore && less(m, best)) {
				best, bestScore = m, s
			}
		}
	}
	if best != nil {
		return best, ReasonPrefix
	}
	return bruteMin(ms, in, exclude), ReasonLeastLoad
}

func TestPrefixAwareMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "n")
		c := rapid.Float64Range(1, 3).Draw(t, "c")
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("m%02d", i)}
		}
		p := NewPrefixAware(c)
		in := map[*Member]bool{}
		for step := rapid.IntRange(1, 150).Draw(t, "steps"); step > 0; step-- {
			m := ms[rapid.IntRange(0, n-1).Draw(t, "m")]
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0:
				if !in[m] {
					p.Add(m, rapid.Int64Range(0, 6).Draw(t, "load"), 1)
					in[m] = true
				}
			case 1:
				p.Remove(m)
				delete(in, m)
			case 2:
				p.SetLoad(m, rapid.Int64Range(0, 6).Draw(t, "load"))
			default:
				var exclude []string
				for k := rapid.IntRange(0, 3).Draw(t, "excl"); k > 0; k-- {
					exclude = append(exclude, ms[rapid.IntRange(0, n-1).Draw(t, "x")].ID)
				}
				var score func(string) int
				if rapid.Bool().Draw(t, "scored") {
					match := map[string]int{}
					for _, x := range ms {
						match[x.ID] = rapid.IntRange(0, 4).Draw(t, "score")
					}
					score = scores(match)
					p.SetScores(score)
				}
				got, gr := p.Pick(0, exclude)
				want, wr := refPrefixAware(ms, in, c, score, exclude)
				if got != want || gr != wr {
					t.Fatalf("pick = %v (%v), want %v (%v)", got, gr, want, wr)
				}
			}
			if p.Len() != len(in) {
				t.Fatalf("Len = %d, want %d", p.Len(), len(in))
			}
		}
	})
}

func TestPrefixAwareRegistered(t *testing.T) {
	p, err := New("prefix_aware", Options{LoadFactor: 2})
	if err != nil {
		t.Fatal(err)
	}
	pa, ok := p.(*PrefixAware)
	if !ok || pa.c != 2 {
		t.Fatalf("New(prefix_aware) = %T %+v", p, p)
	}
	if _, ok := p.(PrefixScorer); !ok {
		t.Fatal("prefix_aware is not a PrefixScorer")
	}
	if NewPrefixAware(0.5).c != 1.25 || NewPrefixAware(math.NaN()).c != 1.25 {
		t.Fatal("a bad load factor is not replaced by the default")
	}
	if ReasonPrefix.String() != "prefix" || ReasonLoad.String() != "load" || Reason(200).String() != "unknown" {
		t.Fatal("reason names")
	}
}
