package policy

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestRoundRobinWorkedExample(t *testing.T) {
	p := NewRoundRobin()
	c, a, b := &Member{ID: "c"}, &Member{ID: "a"}, &Member{ID: "b"}
	for _, m := range []*Member{c, a, b} { // insertion order does not matter: id order does
		p.Add(m, 0, 1)
	}
	var got []string
	pick := func(exclude ...string) {
		t.Helper()
		m, r := p.Pick(0, exclude)
		if r != ReasonRoundRobin {
			t.Fatalf("reason = %v, want round_robin", r)
		}
		got = append(got, m.ID)
	}
	for range 5 {
		pick()
	}
	if want := []string{"a", "b", "c", "a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("sequence = %v, want %v", got, want)
	}
	// After b, a joining bb is next (it sorts after b), then c; excluding c wraps to a.
	got = nil
	p.Add(&Member{ID: "bb"}, 7, 1)
	pick()
	pick("c")
	if want := []string{"bb", "a"}; !slices.Equal(got, want) {
		t.Fatalf("after a join: %v, want %v", got, want)
	}
	// The last picked member leaving does not lose the turn.
	p.Remove(a)
	p.Remove(a) // twice is a no-op
	got = nil
	pick()
	if want := []string{"b"}; !slices.Equal(got, want) {
		t.Fatalf("after the last picked left: %v, want %v", got, want)
	}
	if m, _ := p.Pick(0, []string{"b", "bb", "c"}); m != nil {
		t.Fatalf("all excluded: got %s", m.ID)
	}
	if p.Len() != 3 {
		t.Fatalf("Len = %d, want 3", p.Len())
	}
}

func TestRoundRobinIgnoresLoadAndWeight(t *testing.T) {
	p := NewRoundRobin()
	ms := []*Member{{ID: "a"}, {ID: "b"}}
	p.Add(ms[0], 100, 1)
	p.Add(ms[1], 0, 100)
	p.SetLoad(ms[0], 1000)
	p.SetWeight(ms[1], 5)
	count := map[string]int{}
	for range 100 {
		m, _ := p.Pick(0, nil)
		count[m.ID]++
	}
	if count["a"] != 50 || count["b"] != 50 {
		t.Fatalf("shares = %v, want 50 each", count)
	}
	if ms[0].Load() != 1000 || ms[1].Weight() != 5 {
		t.Fatalf("load %d weight %d not recorded", ms[0].Load(), ms[1].Weight())
	}
	empty := NewRoundRobin()
	if m, _ := empty.Pick(0, nil); m != nil {
		t.Fatal("an empty policy picked a member")
	}
}

// refRoundRobin is R18.2 by definition: the first member in id order after last, cyclically,
// that is not excluded.
func refRoundRobin(in map[*Member]bool, last string, started bool, exclude []string) *Member {
	var ms []*Member
	for m, ok := range in {
		if ok {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b *Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	var after, before []*Member
	for _, m := range ms {
		if started && m.ID <= last {
			before = append(before, m)
		} else {
			after = append(after, m)
		}
	}
	for _, m := range append(after, before...) {
		if !excluded(m.ID, exclude) {
			return m
		}
	}
	return nil
}

func TestRoundRobinMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 20).Draw(t, "n")
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("w%02d", i)}
		}
		p := NewRoundRobin()
		in := map[*Member]bool{}
		last, started := "", false
		for step := rapid.IntRange(1, 200).Draw(t, "steps"); step > 0; step-- {
			m := ms[rapid.IntRange(0, n-1).Draw(t, "m")]
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				if !in[m] {
					p.Add(m, 0, 1)
					in[m] = true
				}
			case 1:
				p.Remove(m)
				delete(in, m)
			default:
				var exclude []string
				for k := rapid.IntRange(0, 3).Draw(t, "excl"); k > 0; k-- {
					exclude = append(exclude, ms[rapid.IntRange(0, n-1).Draw(t, "x")].ID)
				}
				want := refRoundRobin(in, last, started, exclude)
				got, _ := p.Pick(0, exclude)
				if got != want {
					t.Fatalf("pick = %v, want %v (last %q, exclude %v)", got, want, last, exclude)
				}
				if got != nil {
					last, started = got.ID, true
				}
			}
			if p.Len() != len(in) {
				t.Fatalf("Len = %d, want %d", p.Len(), len(in))
			}
		}
	})
}

func TestRoundRobinPickDoesNotAllocate(t *testing.T) {
	p := NewRoundRobin()
	for i := range 64 {
		p.Add(&Member{ID: fmt.Sprintf("w%02d", i)}, 0, 1)
	}
	exclude := []string{"w03"}
	if allocs := testing.AllocsPerRun(1000, func() { p.Pick(0, exclude) }); allocs != 0 {
		t.Fatalf("a pick allocates %v times", allocs)
	}
}
