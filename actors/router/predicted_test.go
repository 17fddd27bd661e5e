package router

import (
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// TestPredictedLatencyLearnsFromObservations: under predicted_latency a pick carries the
// features its worker's model was asked about, and the TTFTs the requester reports
// (ObservedTTFT) reach that worker's model: once w0 is measured slow and w1 fast, picks go to
// w1; an objective only w0's model misses keeps them there; an observation for an unknown
// worker, or without features, is ignored.
func TestPredictedLatencyLearnsFromObservations(t *testing.T) {
	s, err := NewSim(Config{Policy: PolicyPredictedLatency, LoadFactor: 4, PrefixIndexBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w0", "w1"} {
		s.SetWorker(WorkerInfo{ID: id, Model: "m", HTTPAddress: id})
	}
	hashes := prefixindex.Hashes(nil, make([]byte, 64*8)) // 8 chunks: 128 prompt tokens
	pick := func(slo int64) *Picked {
		t.Helper()
		pk, ok := s.Pick(&Pick{Model: "m", RequestID: "r", PrefixHashes: hashes, SLOTTFTMs: slo})
		if !ok || pk.Err != nil {
			t.Fatalf("pick: %v %v", ok, pk)
		}
		if pk.Reason != policy.ReasonPredicted {
			t.Fatalf("reason %v, want predicted", pk.Reason)
		}
		return pk
	}
	first := pick(0)
	if first.WorkerID != "w0" || first.Features != (ttftmodel.X{1, 0, 0.128}) {
		t.Fatalf("untrained: picked %s with features %v, want w0 (least loaded, smaller id) with [1 0 0.128]",
			first.WorkerID, first.Features)
	}
	s.Release(first, OutcomeSuccess)
	for i := range 50 {
		x := ttftmodel.Features(int64(i%4), 128*(1+i%5))
		s.ObserveTTFT(&Picked{WorkerID: "w0", Features: x}, time.Duration(400+100*x[ttftmodel.KTokens])*time.Millisecond)
		s.ObserveTTFT(&Picked{WorkerID: "w1", Features: x}, time.Duration(20+10*x[ttftmodel.KTokens])*time.Millisecond)
		s.ObserveTTFT(&Picked{WorkerID: "gone", Features: x}, time.Millisecond)
		s.ObserveTTFT(&Picked{WorkerID: "w1"}, time.Hour) // no features: not a model's pick
	}
	for _, slo := range []int64{0, 100} {
		p := pick(slo)
		if p.WorkerID != "w1" {
			t.Fatalf("objective %d: picked %s, want w1 (predicted ~21 ms against ~413)", slo, p.WorkerID)
		}
		s.Release(p, OutcomeSuccess)
	}
	w0 := s.st.view.slots["w0"]
	if got := policy.Predict(&w0.member, ttftmodel.Features(0, 1000)); got < 490 || got > 510 {
		t.Fatalf("w0's model predicts %.1f ms for 1,000 uncached tokens, want 500", got)
	}
}
