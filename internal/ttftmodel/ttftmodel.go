// Package ttftmodel is predicted_latency's online model of one worker's time to first token
// (SPEC R18.2): a linear regression of TTFT on a few features of the worker and the request,
// fitted by recursive least squares with exponential forgetting from the gateway's own
// measurements, so it follows a worker whose speed or traffic changes. It is pure, bounded
// (N weights and an N×N covariance, whatever the number of observations) and numerically
// guarded: inputs are clamped, a non-finite or runaway state is reset to the prior, and a
// prediction is always finite and within [0, MaxMs].
//
// Worked example: a worker whose TTFT is 5 ms + 2 ms per request in flight + 100 ms per 1,000
// uncached prompt tokens is learnt from a few dozen varied observations to within a
// millisecond (see TestConvergesOnSyntheticData).
package ttftmodel

import "math"

// N is the number of features.
const N = 3

// X is one observation's features: Bias (always 1), Load (the worker's load when it was
// picked, R2: in flight + queue depth) and KTokens (thousands of prompt tokens the worker is
// not believed to hold in its cache).
type X [N]float64

// Feature positions in X.
const (
	Bias = iota
	Load
	KTokens
)

// Features returns the features of a request of uncached prompt tokens on a worker at load.
func Features(load int64, uncached int) X {
	return X{1, float64(load), float64(max(uncached, 0)) / 1000}
}

// Bounds that keep the model finite whatever it is fed.
const (
	// MaxMs bounds observations and predictions (an hour).
	MaxMs = 3_600_000
	// maxX bounds each feature's magnitude.
	maxX = 1e6
	// prior is the initial covariance's diagonal: large, so the first observations dominate.
	prior = 1e4
	// maxTrace stops the covariance's growth when the features do not vary (forgetting
	// would otherwise inflate it without bound: "covariance wind-up").
	maxTrace = 1e6
	// forget is λ: an observation's weight halves after about 70 newer ones.
	forget = 0.99
)

// Model is one worker's regression; its zero value predicts 0 and learns from the first
// Observe.
type Model struct {
	theta X
	p     [N][N]float64
	n     uint64 // observations applied since the last reset
}

// Observations is how many observations the model has learnt from since its last reset.
func (m *Model) Observations() uint64 { return m.n }

// Predict returns the predicted TTFT in milliseconds for features x, in [0, MaxMs].
func (m *Model) Predict(x X) float64 { return PredictWith(m.theta, x) }

// Weights are the model's current weights, for PredictWith: a caller that predicts for many
// workers at once keeps a copy of each next to its other data.
func (m *Model) Weights() X { return m.theta }

// PredictWith is Predict for a model whose Weights are w.
func PredictWith(w, x X) float64 {
	return clamp(w[0]*x[0]+w[1]*x[1]+w[2]*x[2], 0, MaxMs)
}

// Observe learns one measured TTFT (milliseconds) for features x.
func (m *Model) Observe(x X, ttftMs float64) {
	if math.IsNaN(ttftMs) {
		return
	}
	for i := range x {
		if math.IsNaN(x[i]) {
			return
		}
		x[i] = clamp(x[i], -maxX, maxX)
	}
	y := clamp(ttftMs, 0, MaxMs)
	if m.n == 0 {
		m.reset()
	}
	// RLS with forgetting: k = P·x / (λ + xᵀ·P·x); θ += k·(y − θᵀx); P = (P − k·xᵀ·P) / λ.
	var px X
	for i := range N {
		for j := range N {
			px[i] += m.p[i][j] * x[j]
		}
	}
	den := forget
	for i := range N {
		den += x[i] * px[i]
	}
	if !(den > 0) || math.IsInf(den, 0) {
		m.reset()
		return
	}
	err := y - (m.theta[0]*x[0] + m.theta[1]*x[1] + m.theta[2]*x[2])
	var k X
	for i := range N {
		k[i] = px[i] / den
		m.theta[i] += k[i] * err
	}
	trace := 0.0
	for i := range N {
		for j := range N {
			m.p[i][j] -= k[i] * px[j] // P symmetric: xᵀ·P = (P·x)ᵀ
		}
		trace += m.p[i][i]
	}
	scale := 1 / forget
	if trace*scale > maxTrace {
		scale = 1
	}
	for i := range N {
		for j := i; j < N; j++ {
			v := (m.p[i][j] + m.p[j][i]) / 2 * scale // kept symmetric against rounding
			m.p[i][j], m.p[j][i] = v, v
		}
	}
	m.n++
	if !m.finite() {
		m.reset()
	}
}

func (m *Model) reset() {
	*m = Model{}
	for i := range N {
		m.p[i][i] = prior
	}
}

// finite reports whether the state is usable: finite, weights bounded, covariance diagonal
// positive.
func (m *Model) finite() bool {
	for i := range N {
		if math.IsNaN(m.theta[i]) || math.Abs(m.theta[i]) > MaxMs*10 || !(m.p[i][i] > 0) {
			return false
		}
		for j := range N {
			if math.IsNaN(m.p[i][j]) || math.IsInf(m.p[i][j], 0) {
				return false
			}
		}
	}
	return true
}

func clamp(v, lo, hi float64) float64 {
	switch {
	case v < lo:
		return lo
	case v > hi:
		return hi
	case v != v:
		return lo
	}
	return v
}
