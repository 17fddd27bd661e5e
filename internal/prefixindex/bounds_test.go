package prefixindex

import (
	"fmt"
	"testing"
)

// TestEmptyAfterWorkersGo (R19): workers come (each registration a new id, as a restarted
// engine's), record prompts and are forgotten, round after round. Once the last round's
// workers are forgotten the index holds nothing: no worker, entry or number, and its holder
// table is back to its smallest size; while they live, their numbers never outgrow the most
// workers known at once.
func TestEmptyAfterWorkersGo(t *testing.T) {
	x := New(64)
	const rounds, per = 50, 6
	for round := range rounds {
		for i := range per {
			id := fmt.Sprintf("r%d-w%d", round, i)
			for p := range 20 {
				x.Record(id, Hashes(nil, prompt(byte(p+i), 64*(1+p%9))))
			}
		}
		if len(x.byNum) > per+1 || x.Workers() != per {
			t.Fatalf("round %d: %d numbers, %d workers, for %d live", round, len(x.byNum)-1, x.Workers(), per)
		}
		for i := range per {
			x.Forget(fmt.Sprintf("r%d-w%d", round, (i*5)%per))
		}
	}
	if x.Workers() != 0 || x.Entries() != 0 || x.Distinct() != 0 || len(x.byNum) != 1 || len(x.free) != 0 ||
		len(x.holders.slots) != minHolderSlots {
		t.Fatalf("after every worker went: %d workers, %d entries, %d distinct, %d numbers, %d free, %d holder slots",
			x.Workers(), x.Entries(), x.Distinct(), len(x.byNum)-1, len(x.free), len(x.holders.slots))
	}
}
