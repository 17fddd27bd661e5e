package policy

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func ids(ms []*Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// bruteMin is R3.1 by definition: minimum load, ties to the smallest id, skipping exclusions.
func bruteMin(ms []*Member, in map[*Member]bool, exclude []string) *Member {
	var best *Member
	for _, m := range ms {
		if !in[m] || excluded(m.ID, exclude) {
			continue
		}
		if best == nil || m.load < best.load || (m.load == best.load && m.ID < best.ID) {
			best = m
		}
	}
	return best
}

func TestLeastOutstandingMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 40).Draw(t, "n")
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("w%02d", i)}
		}
		p := NewLeastOutstanding()
		in := map[*Member]bool{}
		loads := map[*Member]int64{} // the test's own record of what it set: the policy must keep it
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for s := 0; s < steps; s++ {
			m := ms[rapid.IntRange(0, n-1).Draw(t, "m")]
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				if !in[m] {
					loads[m] = rapid.Int64Range(0, 20).Draw(t, "load")
					p.Add(m, loads[m], 1)
					in[m] = true
				}
			case 1:
				p.Remove(m)
				delete(in, m)
			default:
				loads[m] = rapid.Int64Range(0, 20).Draw(t, "load")
				p.SetLoad(m, loads[m])
			}
			for _, x := range ms {
				if x.Load() != loads[x] {
					t.Fatalf("%s: load %d, set %d", x.ID, x.Load(), loads[x])
				}
			}
			var exclude []string
			for k := rapid.IntRange(0, 4).Draw(t, "excl"); k > 0; k-- {
				exclude = append(exclude, ms[rapid.IntRange(0, n-1).Draw(t, "x")].ID)
			}
			got, _ := p.Pick(0, exclude)
			want := bruteMin(ms, in, exclude)
			if got != want {
				t.Fatalf("pick = %v, want %v (exclude %v)", got, want, exclude)
			}
			if p.Len() != len(in) {
				t.Fatalf("Len = %d, want %d", p.Len(), len(in))
			}
		}
	})
}

func TestWeightedByCapacity(t *testing.T) {
	p := NewWeighted()
	// Names chosen so that neither id order nor insertion order favours the big worker.
	small := &Member{ID: "a-small"}
	big := &Member{ID: "b-big"}
	p.Add(small, 0, 1)
	p.Add(big, 0, 3)
	var got []string
	for i := 0; i < 8; i++ {
		m, r := p.Pick(0, nil)
		if r != ReasonWeighted {
			t.Fatalf("reason = %v", r)
		}
		got = append(got, m.ID)
	}
	want := []string{"b-big", "b-big", "a-small", "b-big", "b-big", "b-big", "a-small", "b-big"}
	if !slices.Equal(got, want) {
		t.Fatalf("sequence = %v, want %v", got, want)
	}
}

func TestWeightedSharesAndExclusion(t *testing.T) {
	p := NewWeighted()
	ms := []*Member{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	for i, m := range ms {
		p.Add(m, 0, int64(i+1)) // weights 1, 2, 3
	}
	count := map[string]int{}
	for i := 0; i < 600; i++ {
		m, _ := p.Pick(0, nil)
		count[m.ID]++
	}
	if count["a"] != 100 || count["b"] != 200 || count["c"] != 300 {
		t.Fatalf("shares = %v, want a:100 b:200 c:300", count)
	}
	for i := 0; i < 50; i++ {
		if m, _ := p.Pick(0, []string{"c"}); m.ID == "c" {
			t.Fatal("picked an excluded member")
		}
	}
	if m, _ := p.Pick(0, []string{"a", "b", "c"}); m != nil {
		t.Fatalf("all excluded: got %v", m.ID)
	}
	p.Remove(ms[1])
	if p.Len() != 2 {
		t.Fatalf("Len = %d", p.Len())
	}
	zero := &Member{ID: "z"}
	p.Add(zero, 0, 0)
	seen := false
	for i := 0; i < 20; i++ {
		if m, _ := p.Pick(0, nil); m == zero {
			seen = true
		}
	}
	if !seen {
		t.Fatal("a member reporting no capacity must still get a share")
	}
}

func TestAffinityCapWorkedExample(t *testing.T) {
	p := NewAffinity(1.25, 64)
	ms := make([]*Member, 4)
	for i := range ms {
		ms[i] = &Member{ID: fmt.Sprintf("w%d", i)}
		p.Add(ms[i], 0, 1)
	}
	const key = 0x1234_5678_9abc_def0
	owner, r := p.Pick(key, nil)
	if r != ReasonAffinity {
		t.Fatalf("idle pool: reason %v, want affinity", r)
	}
	p.SetLoad(owner, 3)
	if got := p.Cap(); got != 2 {
		t.Fatalf("cap = %d, want ⌈1.25·4/4⌉ = 2", got)
	}
	next, r := p.Pick(key, nil)
	if next == owner || r != ReasonLoad {
		t.Fatalf("overloaded owner: got %s (%v), want another member with reason load", next.ID, r)
	}
	// The next member clockwise is deterministic: the same key keeps going there.
	again, _ := p.Pick(key, nil)
	if again != next {
		t.Fatalf("spill target moved: %s then %s", next.ID, again.ID)
	}
	p.SetLoad(owner, 0)
	if back, r := p.Pick(key, nil); back != owner || r != ReasonAffinity {
		t.Fatalf("owner under cap again: got %s (%v)", back.ID, r)
	}
	if m, _ := p.Pick(key, []string{owner.ID}); m == owner {
		t.Fatal("picked an excluded owner")
	}
}

func TestAffinityNeverExceedsCapWhileAnyoneIsUnder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "n")
		c := rapid.Float64Range(1, 3).Draw(t, "c")
		p := NewAffinity(c, 16)
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("m%d", i)}
			p.Add(ms[i], 0, 1)
		}
		for k := rapid.IntRange(1, 100).Draw(t, "reqs"); k > 0; k-- {
			key := rapid.Uint64().Draw(t, "key")
			limit := p.Cap()
			m, _ := p.Pick(key, nil)
			if m.load >= limit {
				t.Fatalf("picked %s at load %d with cap %d", m.ID, m.load, limit)
			}
			p.SetLoad(m, m.load+1)
			var sum int64
			for _, x := range ms {
				sum += x.load
			}
			if sum != p.total {
				t.Fatalf("total = %d, want %d", p.total, sum)
			}
			want := int64(math.Ceil(c * float64(sum+1) / float64(n)))
			if p.Cap() != want {
				t.Fatalf("cap = %d, want %d", p.Cap(), want)
			}
		}
	})
}

// TestAffinityDefaultVnodes: a ring size of 0 or less means the default, 64 points per
// member, so such a policy picks exactly as one built with 64.
func TestAffinityDefaultVnodes(t *testing.T) {
	for _, vnodes := range []int{0, -1} {
		p, ref := NewAffinity(1.25, vnodes), NewAffinity(1.25, 64)
		for i := range 5 {
			p.Add(&Member{ID: fmt.Sprintf("m%d", i)}, int64(i%2), 1)
			ref.Add(&Member{ID: fmt.Sprintf("m%d", i)}, int64(i%2), 1)
		}
		for k := range uint64(50) {
			key := k * 0x9e3779b97f4a7c15
			got, gr := p.Pick(key, nil)
			want, wr := ref.Pick(key, nil)
			if got == nil || got.ID != want.ID || gr != wr {
				t.Fatalf("vnodes %d, key %x: picked %v (%v), want %s (%v)", vnodes, key, got, gr, want.ID, wr)
			}
		}
	}
}

func TestAffinityMembershipChanges(t *testing.T) {
	p := NewAffinity(1.25, 32)
	a, b := &Member{ID: "a"}, &Member{ID: "b"}
	p.Add(a, 2, 1)
	p.Add(b, 3, 1)
	p.settle()
	if p.Len() != 2 || p.total != 5 || len(p.ring) != 64 || len(p.pending) != 0 {
		t.Fatalf("len %d total %d ring %d pending %d", p.Len(), p.total, len(p.ring), len(p.pending))
	}
	if !slices.IsSortedFunc(p.ring, cmpPoint) {
		t.Fatal("ring not sorted after merge")
	}
	p.Remove(a)
	p.Remove(a)
	p.settle()
	if p.Len() != 1 || p.total != 3 || len(p.ring) != 32 {
		t.Fatalf("after remove: len %d total %d ring %d", p.Len(), p.total, len(p.ring))
	}
	for i := 0; i < 10; i++ {
		if m, _ := p.Pick(uint64(i)*0x9e3779b97f4a7c15, nil); m != b {
			t.Fatal("only b remains")
		}
	}
	// Removed and re-added before any pick: one set of points, not two.
	p.Add(a, 0, 1)
	p.Remove(a)
	p.Add(a, 0, 1)
	p.settle()
	live := 0
	for _, pt := range p.ring {
		if pt.live() && pt.m == a {
			live++
		}
	}
	if live != 32 {
		t.Fatalf("a has %d live points, want 32", live)
	}
	p.Remove(a)
	p.Remove(b)
	if m, _ := p.Pick(1, nil); m != nil {
		t.Fatal("empty ring picked something")
	}
}

// refAffinity is R3.3 from scratch: build the ring of the live members, walk it. The reason
// is affinity when the member is the key's owner (the first member met that is not
// excluded), load when it is another.
func refAffinity(ms []*Member, in map[*Member]bool, c float64, vnodes int, key uint64, exclude []string) (*Member, Reason) {
	var ring []point
	var total int64
	n := 0
	for _, m := range ms {
		if !in[m] {
			continue
		}
		n++
		total += m.load
		for i := 0; i < vnodes; i++ {
			ring = append(ring, point{hash: pointHash(m.ID, i), m: m})
		}
	}
	if n == 0 {
		return nil, ReasonAffinity
	}
	slices.SortFunc(ring, cmpPoint)
	limit := int64(math.Ceil(c * float64(total+1) / float64(n)))
	start, _ := slices.BinarySearchFunc(ring, key, func(pt point, k uint64) int { return cmpUint(pt.hash, k) })
	var owner, fallback *Member
	reason := func(m *Member) (*Member, Reason) {
		if m == owner {
			return m, ReasonAffinity
		}
		return m, ReasonLoad
	}
	for s := 0; s < len(ring); s++ {
		m := ring[(start+s)%len(ring)].m
		if excluded(m.ID, exclude) {
			continue
		}
		if owner == nil {
			owner = m
		}
		if m.load < limit {
			return reason(m)
		}
		if fallback == nil || less(m, fallback) {
			fallback = m
		}
	}
	return reason(fallback)
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestAffinityMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 10).Draw(t, "n")
		ms := make([]*Member, n)
		for i := range ms {
			ms[i] = &Member{ID: fmt.Sprintf("m%d", i)}
		}
		p := NewAffinity(1.25, 8)
		in := map[*Member]bool{}
		for step := rapid.IntRange(1, 200).Draw(t, "steps"); step > 0; step-- {
			m := ms[rapid.IntRange(0, n-1).Draw(t, "m")]
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0:
				if !in[m] {
					p.Add(m, rapid.Int64Range(0, 5).Draw(t, "load"), 1)
					in[m] = true
				}
			case 1:
				p.Remove(m)
				delete(in, m)
			case 2:
				p.SetLoad(m, rapid.Int64Range(0, 5).Draw(t, "load"))
			default:
				var exclude []string
				if rapid.Bool().Draw(t, "ex") {
					exclude = append(exclude, ms[rapid.IntRange(0, n-1).Draw(t, "x")].ID)
				}
				key := rapid.Uint64().Draw(t, "key")
				got, gr := p.Pick(key, exclude)
				if want, wr := refAffinity(ms, in, 1.25, 8, key, exclude); got != want || gr != wr {
					t.Fatalf("pick = %v (%v), want %v (%v)", got, gr, want, wr)
				}
			}
		}
	})
}

func TestNewByName(t *testing.T) {
	for _, name := range Names() {
		if _, err := New(name, Options{}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if _, err := New("random", Options{}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if got := ids([]*Member{{ID: "x"}}); got[0] != "x" {
		t.Fatal(got)
	}
}

// TestReadsOf: what each registered policy reads, as its type says; an unknown name reads
// nothing.
func TestReadsOf(t *testing.T) {
	want := map[string]Reads{
		"least_outstanding": {},
		"weighted":          {},
		"affinity":          {},
		"round_robin":       {},
		"prefix_aware":      {PrefixIndex: true},
		"precise_prefix":    {KVEvents: true},
		"predicted_latency": {PrefixIndex: true, KVEvents: true, TTFT: true},
	}
	for _, name := range Names() {
		w, ok := want[name]
		if !ok {
			t.Errorf("%s: registered but not in this table", name)
		}
		if got := ReadsOf(name); got != w {
			t.Errorf("ReadsOf(%q) = %+v, want %+v", name, got, w)
		}
	}
	if len(Names()) != len(want) {
		t.Errorf("registered %v, want the %d policies of this table", Names(), len(want))
	}
	if got := ReadsOf("random"); got != (Reads{}) {
		t.Errorf("ReadsOf(unknown) = %+v", got)
	}
}
