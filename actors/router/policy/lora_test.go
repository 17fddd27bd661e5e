package policy

import "testing"

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
