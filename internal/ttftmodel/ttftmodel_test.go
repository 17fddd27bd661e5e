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
			checkState(t, &m)
		}
	})
}

// checkState fails t unless m's state is what Observe promises to leave, checked on its own
// terms rather than through finite: every weight finite and within 10·MaxMs, the covariance
// finite, symmetric and with a positive diagonal. The zero value (nothing observed yet) is
// the one state without a covariance.
func checkState(t interface{ Fatalf(string, ...any) }, m *Model) {
	if *m == (Model{}) {
		return
	}
	for i := range N {
		if w := m.theta[i]; math.IsNaN(w) || math.Abs(w) > MaxMs*10 {
			t.Fatalf("weight %d = %v after %d observations", i, w, m.n)
		}
		if !(m.p[i][i] > 0) {
			t.Fatalf("covariance diagonal %d = %v after %d observations", i, m.p[i][i], m.n)
		}
		for j := range N {
			if math.IsNaN(m.p[i][j]) || math.IsInf(m.p[i][j], 0) || m.p[i][j] != m.p[j][i] {
				t.Fatalf("covariance %d,%d = %v (%d,%d = %v)", i, j, m.p[i][j], j, i, m.p[j][i])
			}
		}
	}
}

// TestRunawayWeightsReset: measurements that differ by the whole range over a few uncached
// tokens ask for a weight of about 10^8 ms per thousand tokens, past the bound of 10·MaxMs: the
// model resets to its prior rather than keep such a weight, observation after observation, and
// its predictions stay within [0, MaxMs].
func TestRunawayWeightsReset(t *testing.T) {
	var m Model
	resets := 0
	for i := range 400 {
		x, y := Features(0, 0), 0.0
		if i%2 == 1 {
			x, y = Features(0, 36), MaxMs // 36 tokens: a slope of 10^8 ms per thousand
		}
		before := m.n
		m.Observe(x, y)
		if m.n <= before {
			resets++
		}
		checkState(t, &m)
		if p := m.Predict(Features(0, 18)); p < 0 || p > MaxMs {
			t.Fatalf("Predict = %v", p)
		}
	}
	if resets == 0 {
		t.Fatal("the weights never ran past the bound: the test does not reach the guard")
	}
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

// TestPredictWithIsTheDotProduct: every feature counts with its own weight, the bias too (a
// caller may scale it), and the result is clamped to [0, MaxMs].
func TestPredictWithIsTheDotProduct(t *testing.T) {
	for _, c := range []struct {
		w, x X
		want float64
	}{
		{X{2, 3, 5}, X{7, 11, 13}, 2*7 + 3*11 + 5*13},
		{X{0.5, 0, 0}, X{4, 1e9, 1e9}, 2},
		{X{-1, 0, 0}, X{1, 0, 0}, 0},
		{X{MaxMs, 1, 0}, X{1, 1, 0}, MaxMs},
		{X{1, 1, 1}, X{1, math.NaN(), 0}, 0}, // a NaN feature predicts 0, never NaN
		{X{math.Inf(1), 0, 0}, X{1, 0, 0}, MaxMs},
	} {
		if got := PredictWith(c.w, c.x); got != c.want {
			t.Errorf("PredictWith(%v, %v) = %v, want %v", c.w, c.x, got, c.want)
		}
	}
}

// TestLearnsWithAScaledBias: the regression is over the features as given; a bias feature
// other than 1 is learnt like any other.
func TestLearnsWithAScaledBias(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var m Model
	truth := func(x X) float64 { return 3*x[Bias] + 4*x[Load] + 50*x[KTokens] }
	for range 300 {
		x := X{2, float64(r.IntN(20)), float64(r.IntN(4000)) / 1000}
		m.Observe(x, truth(x))
	}
	for _, x := range []X{{2, 0, 0}, {2, 7, 1.5}, {2, 19, 3.9}} {
		if got, want := m.Predict(x), truth(x); math.Abs(got-want) > 0.01 {
			t.Errorf("Predict(%v) = %.4f, want %.4f", x, got, want)
		}
	}
}

// TestCovarianceWindUpIsBounded: with features that never vary, forgetting inflates the
// covariance of the directions nothing excites; its trace stops at maxTrace, observation
// after observation.
func TestCovarianceWindUpIsBounded(t *testing.T) {
	var m Model
	peak := 0.0
	for i := range 5_000 {
		m.Observe(Features(0, 0), 42)
		trace := m.p[0][0] + m.p[1][1] + m.p[2][2]
		if trace > maxTrace*(1+1e-12) {
			t.Fatalf("after %d observations the covariance's trace is %v, over %v", i+1, trace, float64(maxTrace))
		}
		peak = max(peak, trace)
	}
	if peak < maxTrace*forget {
		t.Fatalf("the trace peaked at %v: the test never reached the bound %v", peak, float64(maxTrace))
	}
}

// TestLearnsAcrossTheRange: a TTFT near the top of the range is learnt, not taken for a
// runaway state and reset.
func TestLearnsAcrossTheRange(t *testing.T) {
	var m Model
	const y = 3_000_000 // 50 minutes, within MaxMs
	for range 200 {
		m.Observe(Features(0, 0), y)
	}
	if got := m.Predict(Features(0, 0)); math.Abs(got-y) > 1 {
		t.Fatalf("Predict = %v, want %v", got, float64(y))
	}
	if got := m.Observations(); got != 200 {
		t.Fatalf("Observations = %d, want 200 (no reset)", got)
	}
}
