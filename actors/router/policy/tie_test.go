package policy

import "testing"

// Equally loaded members go by Tie before id; a round robin's first pick starts at the least
// Tie (the first id when none is set).
func TestTieOrdersEquallyLoaded(t *testing.T) {
	for _, name := range []string{"least_outstanding", "prefix_aware", "precise_prefix"} {
		p, err := New(name, Options{LoadFactor: 1.25})
		if err != nil {
			t.Fatal(err)
		}
		a, b, c := &Member{ID: "a", Tie: 9}, &Member{ID: "b", Tie: 3}, &Member{ID: "c", Tie: 3}
		p.Add(a, 0, 1)
		p.Add(b, 0, 1)
		p.Add(c, 1, 1)
		if m, _ := p.Pick(0, nil); m != b {
			t.Fatalf("%s: picked %s, want b (least Tie among the least loaded)", name, m.ID)
		}
		p.SetLoad(b, 1)
		if m, _ := p.Pick(0, nil); m != a {
			t.Fatalf("%s: picked %s, want a (least loaded)", name, m.ID)
		}
		p.SetLoad(a, 1)
		if m, _ := p.Pick(0, nil); m != b {
			t.Fatalf("%s: picked %s, want b (ties 3 and 3: by id)", name, m.ID)
		}
	}
	rr := NewRoundRobin()
	ms := []*Member{{ID: "a", Tie: 5}, {ID: "b", Tie: 2}, {ID: "c", Tie: 7}}
	for _, m := range ms {
		rr.Add(m, 0, 1)
	}
	var got string
	for range 4 {
		m, _ := rr.Pick(0, nil)
		got += m.ID
	}
	if got != "bcab" {
		t.Fatalf("round robin with ties: %s, want bcab", got)
	}
	plain := NewRoundRobin()
	for _, id := range []string{"b", "a"} {
		plain.Add(&Member{ID: id}, 0, 1)
	}
	if m, _ := plain.Pick(0, nil); m.ID != "a" {
		t.Fatalf("round robin without ties starts at %s, want a", m.ID)
	}
}
