package router

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestSetLoRAsKeepsTheIndex: whatever sequence of sorted adapter lists a few workers report,
// the adapter index after each is what it would be built from scratch: each adapter with
// exactly the workers listing it, no empty entry.
func TestSetLoRAsKeepsTheIndex(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := &workerView{loraIdx: make(map[string][]*slot)} // setLoRAs reads and writes the index only
		slots := make([]*slot, 3)
		lists := make([][]string, 3)
		for i := range slots {
			slots[i] = &slot{}
		}
		names := []string{"a", "b", "c", "d", "e", "f"}
		for step := range rapid.IntRange(1, 30).Draw(t, "steps") {
			i := rapid.IntRange(0, 2).Draw(t, "worker")
			var now []string
			for _, n := range names {
				if rapid.Bool().Draw(t, n) {
					now = append(now, n)
				}
			}
			v.setLoRAs(slots[i], lists[i], now)
			lists[i] = now
			for _, n := range names {
				var want []*slot
				for k, l := range lists {
					if slices.Contains(l, n) {
						want = append(want, slots[k])
					}
				}
				got := v.loraIdx[n]
				if len(got) != len(want) {
					t.Fatalf("step %d: %s on %d workers, want %d", step, n, len(got), len(want))
				}
				for _, s := range want {
					if !slices.Contains(got, s) {
						t.Fatalf("step %d: %s misses a worker listing it", step, n)
					}
				}
				if _, ok := v.loraIdx[n]; ok && len(want) == 0 {
					t.Fatalf("step %d: an empty entry for %s", step, n)
				}
			}
		}
	})
}
