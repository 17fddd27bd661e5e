package policy

import (
	"cmp"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// cand is a LoRA candidate with a load.
func cand(id string, load int64, loaded, free bool) LoRACandidate {
	return LoRACandidate{M: &Member{ID: id, load: load}, Loaded: loaded, Free: free}
}

// TestPickLoRATiers pins PickLoRA's order (R21): a loaded worker under the bounded-load cap,
// else a free slot under the cap, else a loaded worker under twice the cap, else the least
// loaded; and its reasons.
func TestPickLoRATiers(t *testing.T) {
	for _, c := range []struct {
		name   string
		cands  []LoRACandidate
		want   string
		reason Reason
	}{
		// 3 candidates, total load 5: cap ⌈1.25·6/3⌉ = 3.
		{"loaded under the cap beats an idle free one", []LoRACandidate{cand("a", 2, true, false), cand("b", 0, false, true), cand("c", 3, false, false)}, "a", ReasonLoRA},
		{"loaded at the cap: a free slot", []LoRACandidate{cand("a", 3, true, false), cand("b", 2, false, true), cand("c", 0, false, false)}, "b", ReasonLeastLoad},
		// total 6: cap ⌈1.25·7/3⌉ = 3; a at 4 < 2·3: no forced swap onto c.
		{"no free slot: the loaded one under twice the cap", []LoRACandidate{cand("a", 4, true, false), cand("b", 2, false, false), cand("c", 0, false, false)}, "a", ReasonLoRA},
		// total 8: cap ⌈1.25·9/3⌉ = 4; a at 8 ≥ 2·4: the least loaded takes the swap.
		{"the loaded one overrun: the least loaded", []LoRACandidate{cand("a", 8, true, false), cand("b", 0, false, false), cand("c", 0, false, false)}, "b", ReasonLeastLoad},
		{"nothing loaded, no free slot: the least loaded", []LoRACandidate{cand("a", 1, false, false), cand("b", 0, false, false)}, "b", ReasonLeastLoad},
		// total 19: cap ⌈1.25·20/3⌉ = 9; a at 9 is at the cap, b idle but without it: a stays.
		{"loaded at the cap beats a swap onto an idle worker", []LoRACandidate{cand("a", 9, true, false), cand("b", 0, false, false), cand("c", 10, false, false)}, "a", ReasonLoRA},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, r := PickLoRA(c.cands, 0, 1.25)
			if m == nil || m.ID != c.want || r != c.reason {
				t.Fatalf("picked %v (%v), want %s (%v)", m, r, c.want, c.reason)
			}
		})
	}
	if m, _ := PickLoRA(nil, 0, 1.25); m != nil {
		t.Fatal("a pick among no candidates")
	}
}

// TestPickLoRAPrefixAffinity: among loaded workers under the cap, the prefix key decides (the
// same key, the same worker; keys spread over the set), not the load.
func TestPickLoRAPrefixAffinity(t *testing.T) {
	cands := []LoRACandidate{cand("a", 1, true, false), cand("b", 1, true, false), cand("c", 0, true, false), cand("d", 1, true, false)} // cap ⌈1.25·4/4⌉ = 2
	seen := map[string]int{}
	for key := uint64(1); key <= 400; key++ {
		m1, _ := PickLoRA(cands, key*0x9e3779b97f4a7c15, 1.25)
		m2, _ := PickLoRA(cands, key*0x9e3779b97f4a7c15, 1.25)
		if m1 != m2 {
			t.Fatalf("key %d: %s then %s", key, m1.ID, m2.ID)
		}
		seen[m1.ID]++
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if seen[id] < 50 {
			t.Fatalf("keys by owner %v: the prefix keys do not spread over the loaded workers", seen)
		}
	}
}

// TestPickLoRARendezvousOrder: the prefix key's rendezvous order, not the candidates' order,
// decides both the owner among loaded workers under the cap (the more loaded one when it
// owns the key) and a tie in load of a later tier, whichever candidate comes first — the
// router lists a pool's workers in no particular order, so a pick that leaned on it would
// move a prompt between workers as they join and leave.
func TestPickLoRARendezvousOrder(t *testing.T) {
	seen := map[string]bool{}
	for key := range uint64(64) {
		for _, cands := range [][]LoRACandidate{
			{cand("w1", 2, false, false), cand("w2", 2, false, false)},
			{cand("w2", 2, false, false), cand("w1", 2, false, false)},
		} {
			want := "w1"
			if rendezvous(key, "w2") > rendezvous(key, "w1") {
				want = "w2"
			}
			if got, _ := PickLoRA(cands, key, 1.25); got.ID != want {
				t.Fatalf("key %d, a tie in load: picked %s, want %s first in the rendezvous order", key, got.ID, want)
			}
		}
	}
	for key := range uint64(64) {
		// m = 2, n = 3: cap 1.25·3/3 → 2; both loaded workers are under it, w2 listed first.
		cands := []LoRACandidate{cand("w2", 0, true, false), cand("w1", 1, true, false), cand("w3", 1, false, true)}
		want := "w1"
		if rendezvous(key, "w2") > rendezvous(key, "w1") {
			want = "w2"
		}
		got, reason := PickLoRA(cands, key, 1.25)
		if got.ID != want || reason != ReasonLoRA {
			t.Fatalf("key %d: picked %s (%v), want the owner %s", key, got.ID, reason, want)
		}
		seen[got.ID] = true
	}
	if !seen["w1"] || !seen["w2"] {
		t.Fatalf("64 keys all went to %v", seen)
	}
}

// TestPickLoRAMatchesDefinition checks PickLoRA against its doc comment written from scratch
// (sorting instead of one pass) over random candidate sets in any order, loads (few values,
// so that ties, which the rendezvous order settles, are common) and load factors.
func TestPickLoRAMatchesDefinition(t *testing.T) {
	names := []string{"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"}
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.Permutation(names).Draw(t, "ids")[:rapid.IntRange(1, len(names)).Draw(t, "n")]
		cands := make([]LoRACandidate, len(ids))
		for i, id := range ids {
			cands[i] = LoRACandidate{M: &Member{ID: id, load: int64(rapid.IntRange(0, 4).Draw(t, "load"))},
				Loaded: rapid.Bool().Draw(t, "loaded"), Free: rapid.Bool().Draw(t, "free")}
		}
		key := rapid.Uint64().Draw(t, "key")
		c := rapid.SampledFrom([]float64{1, 1.25, 2}).Draw(t, "c")
		got, reason := PickLoRA(cands, key, c)
		want, wantReason := pickLoRADefinition(cands, key, c)
		if got != want || reason != wantReason {
			t.Fatalf("picked %s (%v), the definition %s (%v)", got.ID, reason, want.ID, wantReason)
		}
	})
}

// pickLoRADefinition is PickLoRA's doc comment, tier by tier.
func pickLoRADefinition(cands []LoRACandidate, key uint64, c float64) (*Member, Reason) {
	var total int64
	for _, x := range cands {
		total += x.M.load
	}
	capLoad := int64(0)
	for float64(capLoad) < c*float64(total+1)/float64(len(cands)) {
		capLoad++ // ⌈c·(m+1)/n⌉
	}
	// byLoad orders least loaded first, then the rendezvous order, then the smaller id.
	byLoad := func(a, b LoRACandidate) int {
		return cmp.Or(cmp.Compare(a.M.load, b.M.load), cmp.Compare(rendezvous(key, b.M.ID), rendezvous(key, a.M.ID)),
			cmp.Compare(a.M.ID, b.M.ID))
	}
	byOwner := func(a, b LoRACandidate) int {
		return cmp.Or(cmp.Compare(rendezvous(key, b.M.ID), rendezvous(key, a.M.ID)), cmp.Compare(a.M.ID, b.M.ID))
	}
	pick := func(ok func(LoRACandidate) bool, order func(a, b LoRACandidate) int) *LoRACandidate {
		var set []LoRACandidate
		for _, x := range cands {
			if ok(x) {
				set = append(set, x)
			}
		}
		if len(set) == 0 {
			return nil
		}
		slices.SortFunc(set, order)
		return &set[0]
	}
	if x := pick(func(x LoRACandidate) bool { return x.Loaded && x.M.load < capLoad }, byOwner); x != nil {
		return x.M, ReasonLoRA
	}
	if x := pick(func(x LoRACandidate) bool { return x.Free && x.M.load < capLoad }, byLoad); x != nil {
		return x.M, ReasonLeastLoad
	}
	if x := pick(func(x LoRACandidate) bool { return x.Loaded }, byLoad); x != nil && x.M.load < 2*capLoad {
		return x.M, ReasonLoRA
	}
	x := pick(func(LoRACandidate) bool { return true }, byLoad)
	if x.Loaded {
		return x.M, ReasonLoRA
	}
	return x.M, ReasonLeastLoad
}
