package policy

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// refSWRR is R3.2 by its definition: one counter per member, a full pass per pick.
type refSWRR struct {
	cur map[string]int64
	w   map[string]int64
}

func (r *refSWRR) pick(exclude []string) string {
	ids := make([]string, 0, len(r.cur))
	for id := range r.cur {
		ids = append(ids, id)
	}
	// The tie-break order: larger weight first, then smaller id.
	slices.SortFunc(ids, func(a, b string) int {
		if r.w[a] != r.w[b] {
			return cmp.Compare(r.w[b], r.w[a])
		}
		return cmp.Compare(a, b)
	})
	best, total := "", int64(0)
	for _, id := range ids {
		if slices.Contains(exclude, id) {
			continue
		}
		r.cur[id] += r.w[id]
		total += r.w[id]
		if best == "" || r.cur[id] > r.cur[best] {
			best = id
		}
	}
	if best != "" {
		r.cur[best] -= total
	}
	return best
}

func TestWeightedMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "n")
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("m%02d", i)}
		}
		p := NewWeighted()
		ref := &refSWRR{cur: map[string]int64{}, w: map[string]int64{}}
		for step := rapid.IntRange(1, 300).Draw(t, "steps"); step > 0; step-- {
			m := ms[rapid.IntRange(0, n-1).Draw(t, "m")]
			_, in := ref.cur[m.ID]
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0:
				if !in {
					w := rapid.Int64Range(0, 4).Draw(t, "w")
					p.Add(m, 0, w)
					ref.cur[m.ID], ref.w[m.ID] = 0, effWeight(w)
				}
			case 1:
				p.Remove(m)
				delete(ref.cur, m.ID)
				delete(ref.w, m.ID)
			case 2:
				w := rapid.Int64Range(0, 4).Draw(t, "w")
				p.SetWeight(m, w)
				if in {
					ref.w[m.ID] = effWeight(w)
				}
			default:
				var exclude []string
				for k := rapid.IntRange(0, 3).Draw(t, "excl"); k > 0; k-- {
					exclude = append(exclude, ms[rapid.IntRange(0, n-1).Draw(t, "x")].ID)
				}
				got, _ := p.Pick(0, exclude)
				want := ref.pick(exclude)
				gotID := ""
				if got != nil {
					gotID = got.ID
				}
				if gotID != want {
					t.Fatalf("pick = %q, want %q (exclude %v)", gotID, want, exclude)
				}
			}
			if p.Len() != len(ref.cur) {
				t.Fatalf("Len = %d, want %d", p.Len(), len(ref.cur))
			}
		}
	})
}

func TestWeightedRenormalizes(t *testing.T) {
	p := NewWeighted()
	a, b := &Member{ID: "a"}, &Member{ID: "b"}
	p.Add(a, 0, 3)
	p.Add(b, 0, 1)
	var first []string
	for i := 0; i < 8; i++ {
		m, _ := p.Pick(0, nil)
		first = append(first, m.ID)
	}
	if p.rounds == 0 {
		t.Fatal("rounds folded into the keys far from the limit (an O(n) pass per pick)")
	}
	// Jump the round count close to the limit: the sequence must go on unchanged.
	p.rounds += (1 << 61) / 3 / 4 * 4 // a multiple of the period (4) keeps the phase
	for _, m := range []*Member{a, b} {
		m.key -= m.class.w * ((1 << 61) / 3 / 4 * 4)
	}
	var later []string
	for i := 0; i < 8; i++ {
		m, _ := p.Pick(0, nil)
		later = append(later, m.ID)
	}
	if !slices.Equal(first, later) {
		t.Fatalf("after renormalisation %v, want %v", later, first)
	}
	if p.rounds >= 1<<40 {
		t.Fatalf("rounds = %d: not renormalised", p.rounds)
	}
}
