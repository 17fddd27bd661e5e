package ttftmodel

import (
	"math"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"
)

// TestConvergesOnSyntheticData: the doc comment's worked example, with noise.
func TestConvergesOnSyntheticData(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var m Model
	truth := func(x X) float64 { return 5 + 2*x[Load] + 100*x[KTokens] }
	for range 300 {
		x := Features(int64(r.IntN(20)), r.IntN(4000))
		m.Observe(x, truth(x)+r.NormFloat64()*0.5)
	}
	for _, c := range []struct {
		load     int64
		uncached int
	}{{0, 0}, {10, 1000}, {19, 3900}, {3, 250}} {
		x := Features(c.load, c.uncached)
		if got, want := m.Predict(x), truth(x); math.Abs(got-want) > 1 {
			t.Errorf("Predict(load %d, uncached %d) = %.2f, want %.2f ± 1", c.load, c.uncached, got, want)
		}
	}
}

// TestFollowsAChange: forgetting lets the model follow a worker that became twice as slow.
func TestFollowsAChange(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var m Model
	for _, slope := range []float64{100, 200} {
		for range 500 {
			x := Features(int64(r.IntN(10)), r.IntN(4000))
			m.Observe(x, 10+slope*x[KTokens])
		}
	}
	if got := m.Predict(Features(0, 1000)); math.Abs(got-210) > 2 {
		t.Errorf("after the change Predict(0, 1000) = %.2f, want 210", got)
	}
}

func TestZeroValuePredictsZero(t *testing.T) {
	var m Model
	if got := m.Predict(Features(5, 5000)); got != 0 {
		t.Fatalf("zero model predicted %v, want 0", got)
	}
}

// TestConstantFeatures: features that never vary (a worker always idle, always sent the same
// prompt) must not wind the covariance up into overflow.
func TestConstantFeatures(t *testing.T) {
	var m Model
	for range 100_000 {
		m.Observe(Features(0, 0), 42)
	}
	if got := m.Predict(Features(0, 0)); math.Abs(got-42) > 1e-6 {
		t.Fatalf("Predict = %v, want 42", got)
	}
	for i := range N {
		for j := range N {
			if math.IsNaN(m.p[i][j]) || math.Abs(m.p[i][j]) > maxTrace*2 {
				t.Fatalf("covariance %d,%d = %v", i, j, m.p[i][j])
			}
		}
	}
}

// TestPredictionsStayFinite: whatever it is fed — huge, negative, infinite or NaN features
// and measurements — every prediction is finite and within [0, MaxMs].
func TestPredictionsStayFinite(t *testing.T) {
	val := rapid.OneOf(rapid.Float64(), rapid.SampledFrom([]float64{math.Inf(1), math.Inf(-1), math.NaN(), 0, 1e300, -1e300, 5e-324}))
	rapid.Check(t, func(t *rapid.T) {
		var m Model
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for range steps {
			x := X{1, val.Draw(t, "load"), val.Draw(t, "ktokens")}
			m.Observe(x, val.Draw(t, "ttft"))
			q := X{1, val.Draw(t, "qload"), val.Draw(t, "qktokens")}
			if p := m.Predict(q); math.IsNaN(p) || p < 0 || p > MaxMs {
				t.Fatalf("Predict(%v) = %v after observing %v", q, p, x)
			}
			if m.n > 0 && !m.finite() {
				t.Fatalf("state not finite: %+v", m)
			}
		}
	})
}

// TestObservationsCount: each usable observation counts; a NaN one is ignored.
func TestObservationsCount(t *testing.T) {
	var m Model
	for i := range 5 {
		m.Observe(Features(int64(i), 100*i), 10+float64(i))
	}
	m.Observe(Features(1, 1), math.NaN())
	m.Observe(X{1, math.NaN(), 0}, 10)
	if got := m.Observations(); got != 5 {
		t.Fatalf("Observations = %d, want 5", got)
	}
}
