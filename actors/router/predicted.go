package router

import (
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// setLatency hands a predicted_latency pool the request's part for the Pick that follows (the
// policy clears it) and returns the pool's policy; nil for other policies.
func (v *workerView) setLatency(ch choice) policy.LatencyScorer {
	if !v.predicted {
		return nil // other policies pay one branch per pick
	}
	pl := v.pools[ch.key]
	if pl == nil {
		return nil
	}
	ls, ok := pl.p.(policy.LatencyScorer)
	if !ok {
		return nil
	}
	ls.SetLatencyRequest(v.pidx, ch.hashes, float64(ch.sloMs))
	return ls
}

// observeTTFT teaches the worker's model a TTFT its request actor measured; a worker no longer
// registered under the pick's registration is ignored (an engine registered again under the
// id may be another process on other hardware: its model starts afresh), and so is a pick the
// model was not asked about (the admission gate's soft target: no features). The model lives
// on the slot's member, so a worker out of its pool (draining, ejected) still learns.
func (v *workerView) observeTTFT(m *ObservedTTFT) {
	s := v.registered(m.WorkerID, m.Reg)
	if s == nil || m.Features[ttftmodel.Bias] != 1 {
		return
	}
	ms := float64(m.TTFT) / 1e6
	if s.pool != nil {
		if ls, ok := s.pool.p.(policy.LatencyScorer); ok {
			ls.Observe(&s.member, m.Features, ms)
			return
		}
	}
	policy.Observe(&s.member, m.Features, ms)
}
