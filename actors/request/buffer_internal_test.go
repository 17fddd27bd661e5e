package request

import (
	"testing"

	"pgregory.net/rapid"
)

// TestBufferBudgetModel (R20): answers taking and giving back buffer bytes in any order, against
// a model. A grow succeeds exactly when the bytes fit next to every live answer's; Used is the
// sum of the live answers' bytes and never over the limit; a released answer gives back all it
// took, once, and a grow after its release takes nothing (a reader running on after its
// request ended); a nil hold or budget never limits. Once every answer is released the budget
// holds nothing.
func TestBufferBudgetModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(0, 1<<20).Draw(t, "limit")
		b := NewBufferBudget(limit)
		var holds []*bufHold
		var held []int64 // per hold; -1 once released
		var sum int64
		t.Repeat(map[string]func(*rapid.T){
			"new": func(t *rapid.T) {
				holds, held = append(holds, b.hold()), append(held, 0)
			},
			"grow": func(t *rapid.T) {
				if len(holds) == 0 {
					t.Skip("no answer")
				}
				i := rapid.IntRange(0, len(holds)-1).Draw(t, "answer")
				n := rapid.Int64Range(0, 1<<18).Draw(t, "bytes")
				ok := holds[i].grow(n)
				if want := held[i] >= 0 && sum+n <= limit; ok != want {
					t.Fatalf("grow %d with %d of %d used (answer holds %d): %v, want %v", n, sum, limit, held[i], ok, want)
				}
				if ok {
					held[i] += n
					sum += n
				}
			},
			"release": func(t *rapid.T) {
				if len(holds) == 0 {
					t.Skip("no answer")
				}
				i := rapid.IntRange(0, len(holds)-1).Draw(t, "answer")
				holds[i].release()
				if held[i] > 0 {
					sum -= held[i]
				}
				held[i] = -1
			},
			"": func(t *rapid.T) {
				if b.Used() != sum || sum > limit {
					t.Fatalf("used %d, the model %d (limit %d)", b.Used(), sum, limit)
				}
			},
		})
		for _, h := range holds {
			h.release()
		}
		if b.Used() != 0 {
			t.Fatalf("%d bytes held after every answer was released", b.Used())
		}
	})
	var nilBudget *BufferBudget
	if h := nilBudget.hold(); h != nil || !h.grow(1<<40) {
		t.Fatal("a nil budget limits")
	}
	nilBudget.hold().release()
	if NewBufferBudget(5).Limit() != 5 {
		t.Fatal("Limit")
	}
}
