package kvindex

import (
	"fmt"
	"testing"
)

// TestEmptyAfterWorkersGo (R19): workers come (a new key each registration), report what they
// hold, shared and not, and are forgotten (the router's Forget when a worker leaves), round
// after round. Once the last round's are forgotten the index holds no worker, entry or holder,
// and its slots and shared lists never outgrow the most known at once.
func TestEmptyAfterWorkersGo(t *testing.T) {
	x := New[string](512)
	const rounds, per = 40, 5
	for round := range rounds {
		for i := range per {
			w := fmt.Sprintf("r%d-w%d", round, i)
			var ids []uint64
			for k := range 300 {
				ids = append(ids, uint64(k%100+i*50)) // overlapping ranges: shared ids
			}
			x.Store(w, ids)
			x.Remove(w, ids[:10])
		}
		if x.Workers() != per || len(x.slots) > per || len(x.lists) > x.Distinct() {
			t.Fatalf("round %d: %d workers in %d slots, for %d live; %d lists for %d distinct ids", round, x.Workers(),
				len(x.slots), per, len(x.lists), x.Distinct())
		}
		for i := range per {
			x.Forget(fmt.Sprintf("r%d-w%d", round, i))
		}
	}
	if x.Workers() != 0 || x.Entries() != 0 || x.Distinct() != 0 || len(x.lists) != len(x.unused) {
		t.Fatalf("after every worker went: %d workers, %d entries, %d distinct, %d lists (%d unused)",
			x.Workers(), x.Entries(), x.Distinct(), len(x.lists), len(x.unused))
	}
}
