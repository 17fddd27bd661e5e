package rollout

import (
	"math"
	"sync/atomic"
	"time"
)

// TTFTBuckets are the upper bounds (seconds) of a window's TTFT histogram: those of
// tlgw_time_to_first_byte_seconds (0.5 ms doubling, 16 buckets, up to about 16 s), so a
// window's p99 reads as the metric's would.
var TTFTBuckets = func() []float64 {
	b := make([]float64, 16)
	for i := range b {
		b[i] = 0.0005 * math.Pow(2, float64(i))
	}
	return b
}()

// Window counts a rollout route's two backends over the current window: the request actors
// write it as each request ends (Observe, lock-free), the rollout's driver reads it and starts
// the next window at once (Take). Bounded: two sides of fixed counters, one Window per route
// with a rollout.
type Window struct {
	canary, baseline string
	sides            [2]side // 0: canary, 1: baseline
}

type side struct {
	requests, errors atomic.Uint64
	ttft             [TTFTBucketCount]atomic.Uint64 // per bucket (not cumulative); the last is +Inf
}

// NewWindow counts for the rollout from baseline to canary.
func NewWindow(canary, baseline string) *Window { return &Window{canary: canary, baseline: baseline} }

// Observe counts one request that ended, served by model: failed (5xx, an interrupted stream, a
// timeout; a 4xx is the client's), and its time to first byte when it had one (ttft > 0). A
// request for another model (the route's backends changed under it) is not counted.
func (w *Window) Observe(model string, failed bool, ttft time.Duration) {
	var s *side
	switch model {
	case w.canary:
		s = &w.sides[0]
	case w.baseline:
		s = &w.sides[1]
	default:
		return
	}
	s.requests.Add(1)
	if failed {
		s.errors.Add(1)
	}
	if ttft > 0 {
		sec := ttft.Seconds()
		i := 0
		for i < len(TTFTBuckets) && sec > TTFTBuckets[i] {
			i++
		}
		s.ttft[i].Add(1)
	}
}

// Take returns the window's counts and starts the next window. Counters are taken one by one,
// so a request ending during Take may count in this window for one figure and the next for
// another: one request in a window of hundreds (errors are held to at most requests).
func (w *Window) Take() (canary, baseline Tally) {
	return w.sides[0].take(), w.sides[1].take()
}

func (s *side) take() Tally {
	t := Tally{Requests: s.requests.Swap(0), Errors: s.errors.Swap(0)}
	for i := range s.ttft {
		t.TTFT[i] = s.ttft[i].Swap(0)
	}
	return t
}

// Tally is one backend's counts over a window in a fixed form: requests, errors and the TTFT
// observations per bucket of TTFTBuckets (not cumulative; the last is +Inf). Tallies of the
// same window from several replicas add up (Add); Counts is the form Decide reads.
type Tally struct {
	Requests, Errors uint64
	TTFT             [TTFTBucketCount]uint64
}

// TTFTBucketCount is the number of a Tally's TTFT buckets: TTFTBuckets and +Inf.
const TTFTBucketCount = 17

// Add is t with u's counts added (saturating: a sum never wraps).
func (t Tally) Add(u Tally) Tally {
	t.Requests = satAdd(t.Requests, u.Requests)
	t.Errors = satAdd(t.Errors, u.Errors)
	for i := range t.TTFT {
		t.TTFT[i] = satAdd(t.TTFT[i], u.TTFT[i])
	}
	return t
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}

// Counts is the tally as Decide reads it: the TTFT buckets cumulative, by upper bound.
func (t Tally) Counts() Counts {
	c := Counts{Requests: t.Requests, Errors: t.Errors, TTFT: make(map[float64]uint64, TTFTBucketCount)}
	var cum uint64
	for i, n := range t.TTFT {
		cum = satAdd(cum, n)
		le := math.Inf(1)
		if i < len(TTFTBuckets) {
			le = TTFTBuckets[i]
		}
		c.TTFT[le] = cum
	}
	return c
}
