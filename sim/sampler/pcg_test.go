package sampler

import (
	"math"
	"testing"

	"pgregory.net/rapid"
)

// The reference pcg32 demo, seeded with pcg32_srandom_r(&rng, 42u, 54u),
// prints these first six 32-bit outputs.
func TestPCG32ReferenceOutput(t *testing.T) {
	want := []uint32{0xa15c02b7, 0x7b47f409, 0xba1d3330, 0x83d2f293, 0xbfa4784b, 0xcbed606e}
	r := NewPCG32(42, 54)
	for i, w := range want {
		if got := r.Uint32(); got != w {
			t.Fatalf("output %d = %#08x, want %#08x", i, got, w)
		}
	}
	if r.Draws() != uint64(len(want)) {
		t.Fatalf("Draws = %d, want %d", r.Draws(), len(want))
	}
}

func TestPCG32SeedResets(t *testing.T) {
	r := NewPCG32(42, 54)
	first := r.Uint32()
	r.Uint32()
	r.Seed(42, 54)
	if r.Draws() != 0 {
		t.Fatalf("Draws after Seed = %d", r.Draws())
	}
	if got := r.Uint32(); got != first {
		t.Fatalf("after re-seeding got %#x, want %#x", got, first)
	}
	if NewPCG32(42, 54).Uint32() == NewPCG32(42, 55).Uint32() {
		t.Fatal("stream selector ignored")
	}
	if NewPCG32(42, 54).Uint32() == NewPCG32(43, 54).Uint32() {
		t.Fatal("seed ignored")
	}
}

func TestPCG32AdvanceEqualsSteps(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.Uint64().Draw(t, "seed")
		seq := rapid.Uint64().Draw(t, "seq")
		pre := rapid.IntRange(0, 50).Draw(t, "pre")
		n := rapid.IntRange(0, 3000).Draw(t, "n")

		stepped := NewPCG32(seed, seq)
		jumped := NewPCG32(seed, seq)
		for range pre {
			stepped.Uint32()
			jumped.Uint32()
		}
		for range n {
			stepped.Uint32()
		}
		jumped.Advance(uint64(n))
		if *stepped != *jumped {
			t.Fatalf("Advance(%d) state %+v, %d calls gave %+v", n, *jumped, n, *stepped)
		}
		for i := range 4 {
			if a, b := stepped.Uint32(), jumped.Uint32(); a != b {
				t.Fatalf("output %d after advance differs: %#x vs %#x", i, b, a)
			}
		}
	})
}

func TestPCG32AdvanceLongJump(t *testing.T) {
	const n = 1 << 17
	stepped, jumped := NewPCG32(7, 9), NewPCG32(7, 9)
	for range n {
		stepped.Uint32()
	}
	jumped.Advance(n)
	if *stepped != *jumped {
		t.Fatalf("Advance(%d) differs from %d calls", n, n)
	}
}

func TestPCG32AdvanceComposesAndWraps(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.Uint64().Draw(t, "seed")
		seq := rapid.Uint64().Draw(t, "seq")
		a := rapid.Uint64().Draw(t, "a")
		b := rapid.Uint64().Draw(t, "b")

		x := NewPCG32(seed, seq)
		x.Advance(a)
		x.Advance(b)
		y := NewPCG32(seed, seq)
		y.Advance(a + b)
		if *x != *y {
			t.Fatalf("Advance(a); Advance(b) != Advance(a+b)")
		}
		// The LCG has period 2^64: advancing by -a returns to the start.
		x.Advance(-(a + b))
		if *x != *NewPCG32(seed, seq) {
			t.Fatalf("advancing by the negated distance does not return to the start")
		}
	})
}

func TestPCG32Float64(t *testing.T) {
	r := NewPCG32(1, 2)
	ref := NewPCG32(1, 2)
	for i := range 10000 {
		f := r.Float64()
		if !(f >= 0 && f < 1) {
			t.Fatalf("Float64 #%d = %v, outside [0,1)", i, f)
		}
		hi, lo := uint64(ref.Uint32()), uint64(ref.Uint32())
		if want := float64((hi<<32|lo)>>11) / (1 << 53); f != want {
			t.Fatalf("Float64 #%d = %v, want %v", i, f, want)
		}
	}
	if r.Draws() != 2*10000 {
		t.Fatalf("Draws = %d after 10000 Float64, want 20000", r.Draws())
	}
	// The largest possible value is below 1.
	if m := float64((uint64(math.MaxUint64))>>11) * 0x1p-53; m >= 1 {
		t.Fatalf("max Float64 = %v", m)
	}
}
