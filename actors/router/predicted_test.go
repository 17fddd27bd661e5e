package router

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// TestPredictedLatencyLearnsFromObservations: under predicted_latency a pick carries the
// features its worker's model was asked about, and the TTFTs the requester reports
// (ObservedTTFT) reach that worker's model: once w0 is measured slow and w1 fast, picks go to
// w1; an objective only w0's model misses keeps them there; an observation for an unknown
// worker, or without features, is ignored.
func TestPredictedLatencyLearnsFromObservations(t *testing.T) {
	s, err := NewSim(Config{Policy: config.PolicyPredictedLatency, LoadFactor: 4, PrefixIndexBlocks: 64})
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
	for _, w := range s.st.view.list(0).Workers {
		if w.TTFT != nil {
			t.Fatalf("%s lists a TTFT model before any observation: %+v", w.Info.ID, *w.TTFT)
		}
	}
	first := pick(0)
	if first.WorkerID != "w0" || first.Features != (ttftmodel.X{1, 0, 0.128}) {
		t.Fatalf("untrained: picked %s with features %v, want w0 (least loaded, smaller id) with [1 0 0.128]",
			first.WorkerID, first.Features)
	}
	s.Release(first, OutcomeSuccess)
	for i := range 50 {
		x := ttftmodel.Features(int64(i%4), 128*(1+i%5))
		s.ObserveTTFT(&Picked{WorkerID: "w0", WorkerReg: s.regOf("w0"), Features: x}, time.Duration(400+100*x[ttftmodel.KTokens])*time.Millisecond)
		s.ObserveTTFT(&Picked{WorkerID: "w1", WorkerReg: s.regOf("w1"), Features: x}, time.Duration(20+10*x[ttftmodel.KTokens])*time.Millisecond)
		s.ObserveTTFT(&Picked{WorkerID: "gone", WorkerReg: s.regOf("gone"), Features: x}, time.Millisecond)
		s.ObserveTTFT(&Picked{WorkerID: "w1", WorkerReg: s.regOf("w1")}, time.Hour) // no features: not a model's pick
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
	// The admin listing shows each model: what it learnt from and its weights.
	near := func(got, want float64) bool { return got > want-2.5 && got < want+2.5 } // observations in whole ms
	for _, c := range []struct {
		id            string
		bias, perKTok float64
	}{{"w0", 400, 100}, {"w1", 20, 10}} {
		var m *TTFTModelView
		for _, w := range s.st.view.list(0).Workers {
			if w.Info.ID == c.id {
				m = w.TTFT
			}
		}
		if m == nil || m.Observations != 50 || !near(m.BiasMs, c.bias) || !near(m.MsPerLoad, 0) ||
			!near(m.MsPer1kUncachedTokens, c.perKTok) {
			t.Fatalf("%s's listed model %+v, want 50 observations, %v ms + 0 ms per load + %v ms per 1,000 tokens",
				c.id, m, c.bias, c.perKTok)
		}
	}
}

// TestObjectiveWaitsForAWorkerInTime (R18.4 with admission): under predicted_latency with the
// admission queue on (no busy threshold), a request whose objective no worker is predicted to
// meet waits in the queue instead of going to the lowest prediction; a request without an
// objective is not held back by it; nor is one no worker would serve in time even idle (it
// goes now, to the lowest prediction); a release that brings a prediction within what is left of
// the objective dispatches it (not one that only meets the whole objective); one that waits
// until its objective has passed is answered 503 queue_timeout (reason slo_unmet) well before
// the class's max_wait; a class that never queues answers 429 at once.
func TestObjectiveWaitsForAWorkerInTime(t *testing.T) {
	cfg := admissionCfg(nil, 0)
	cfg.Queue.Classes = append(cfg.Queue.Classes, admission.ClassConfig{Name: "noqueue", Quantum: 1, MaxWait: time.Second})
	s, err := NewSim(Config{Policy: config.PolicyPredictedLatency, LoadFactor: 100, Admission: cfg})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w0", "w1"} {
		s.SetWorker(WorkerInfo{ID: id, Model: "m", HTTPAddress: id})
		for i := range 60 { // TTFT = 20 ms + 100 ms per request in flight
			x := ttftmodel.Features(int64(i%5), 64*(i%7))
			s.ObserveTTFT(&Picked{WorkerID: id, WorkerReg: s.regOf(id), Features: x}, time.Duration(20+100*x[ttftmodel.Load])*time.Millisecond)
		}
	}
	n := 0
	pick := func(slo int64, class string) (*actor.PID, *Picked, bool) {
		n++
		pid := actor.NewPID("sim", fmt.Sprint("req/", n))
		pk, ok := s.Pick(&Pick{Model: "m", RequestID: fmt.Sprint(n), Key: uint64(n), Requester: pid, Tag: 1,
			Admit: &AdmitInfo{Class: class}, SLOTTFTMs: slo})
		return pid, pk, ok
	}
	// 10 ms: no worker would be in time even idle (20 ms at best), so waiting cannot help: it
	// goes now, to the lowest prediction.
	if _, pk, ok := pick(10, ""); !ok || pk.Err != nil || pk.WorkerID != "w0" {
		t.Fatalf("an objective no idle worker meets: %+v %v, want w0 at once", pk, ok)
	} else {
		s.Release(pk, OutcomeSuccess)
	}
	// Two requests on each worker: predicted 20 then 120 ms, both within 150.
	var w0 []*Picked
	for range 4 {
		_, pk, ok := pick(150, "")
		if !ok || pk.Err != nil {
			t.Fatalf("pick within the objective: %+v %v", pk, ok)
		}
		if pk.WorkerID == "w0" {
			w0 = append(w0, pk)
		}
	}
	if len(w0) != 2 || s.InFlight("w1") != 2 {
		t.Fatalf("in flight %d / %d, want 2 / 2", len(w0), s.InFlight("w1"))
	}
	// Both predicted at 220 ms now: it waits.
	waiting, _, ok := pick(150, "")
	if ok {
		t.Fatal("a request no worker is predicted to serve in time was dispatched")
	}
	// No objective: goes at once, to the lowest prediction.
	if _, pk, ok := pick(0, ""); !ok || pk.Err != nil {
		t.Fatalf("a request without an objective was held: %+v %v", pk, ok)
	} else if pk.WorkerID == "w0" {
		w0 = append(w0, pk)
	}
	// A class that never queues: 429 at once.
	if _, pk, ok := pick(150, "noqueue"); !ok || !errors.Is(pk.Err, errs.ErrQueueFull) {
		t.Fatalf("never-queue class: %+v %v, want 429 queue_full", pk, ok)
	}
	s.Advance(50 * time.Millisecond)
	// w0 down to one in flight: 120 ms would meet the whole objective, not the 100 ms left.
	for len(w0) > 1 {
		s.Release(w0[0], OutcomeSuccess)
		w0 = w0[1:]
	}
	if ds := s.Deliveries(); len(ds) != 0 {
		t.Fatalf("dispatched on 120 ms with 100 ms left: %v", ds)
	}
	s.Release(w0[0], OutcomeSuccess) // w0 idle: 20 ms
	ds := s.Deliveries()
	if len(ds) != 1 || !ds[0].To.Equal(waiting) {
		t.Fatalf("deliveries %v, want the waiting request's", ds)
	}
	if pk, ok := ds[0].Msg.(*Picked); !ok || pk.Err != nil || pk.WorkerID != "w0" || !pk.Admitted {
		t.Fatalf("delivered %#v, want w0", ds[0].Msg)
	}
	// Another that cannot be served in time: shed when its objective passes.
	if _, _, ok := pick(100, ""); ok {
		t.Fatal("dispatched at 120 ms against 100")
	}
	s.Advance(99*time.Millisecond + 500*time.Microsecond)
	// A wake with less than a millisecond left: nothing is in time (an objective of 0 must not
	// read as no objective).
	s.ObserveTTFT(&Picked{WorkerID: "w1", WorkerReg: s.regOf("w1"), Features: ttftmodel.Features(1, 0)}, 120*time.Millisecond)
	if ds := s.Deliveries(); len(ds) != 0 {
		t.Fatalf("dispatched or shed before its objective passed: %v", ds)
	}
	s.Advance(500 * time.Microsecond)
	ds = s.Deliveries()
	if len(ds) != 1 {
		t.Fatalf("%d deliveries when the objective passed, want its rejection", len(ds))
	}
	if pk, ok := ds[0].Msg.(*Picked); !ok || !errors.Is(pk.Err, errs.ErrQueueTimeout) || !strings.Contains(pk.Err.Error(), "100 ms") {
		t.Fatalf("delivered %#v, want 503 queue_timeout naming the objective", ds[0].Msg)
	}
	if got := testutil.ToFloat64(s.st.adm.metrics.queueRejections.WithLabelValues("default", "slo_unmet")); got != 1 {
		t.Fatalf("slo_unmet rejections %v, want 1", got)
	}
	if got := s.st.adm.q.Len(); got != 0 {
		t.Fatalf("%d still queued", got)
	}
	// w0 holds one request (120 ms): 110 waits, until w0's model learns it is faster.
	learner, _, ok := pick(110, "")
	if ok {
		t.Fatal("dispatched at 120 ms against 110")
	}
	for i := range 60 { // TTFT = 10 ms + 50 ms per request in flight
		x := ttftmodel.Features(int64(i%5), 64*(i%7))
		s.ObserveTTFT(&Picked{WorkerID: "w0", WorkerReg: s.regOf("w0"), Features: x}, time.Duration(10+50*x[ttftmodel.Load])*time.Millisecond)
	}
	ds = s.Deliveries()
	if len(ds) != 1 || !ds[0].To.Equal(learner) {
		t.Fatalf("deliveries %v after w0's model learnt, want the waiting request's", ds)
	}
}

// TestPredictedLatencyReadsEngineCaches: under predicted_latency, a pool whose every member
// reports kv_events is read through the exact index (what the engines hold), so a prompt goes
// to the worker whose engine reports holding it although the gateway sent it elsewhere; once a
// member stops reporting (a heartbeat, in place), the pool falls back to the approximate index
// of what the gateway sent; when it reports again, the exact index is back.
func TestPredictedLatencyReadsEngineCaches(t *testing.T) {
	s, err := NewSim(Config{Policy: config.PolicyPredictedLatency, LoadFactor: 4, PrefixIndexBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	set := func(id string, kv bool) {
		s.SetWorker(WorkerInfo{ID: id, Model: "m", HTTPAddress: id, KVEvents: kv})
	}
	set("w0", true)
	set("w1", true)
	hashes := prefixindex.Hashes(nil, []byte(strings.Repeat("a long shared system prompt. ", 20)))
	pick := func() string {
		t.Helper()
		pk, ok := s.Pick(&Pick{Model: "m", RequestID: "r", PrefixHashes: hashes})
		if !ok || pk.Err != nil {
			t.Fatalf("pick: %v %+v", ok, pk)
		}
		s.Release(pk, OutcomeSuccess)
		return pk.WorkerID
	}
	if got := pick(); got != "w0" {
		t.Fatalf("first pick %s, want w0 (a tie: the smaller id)", got)
	}
	// The engines say w1 holds the prompt; w0's engine reports nothing (it evicted it).
	if !s.KVEvents(&KVEvents{WorkerID: "w1", Clear: true, Stored: hashes}) || !s.KVEvents(&KVEvents{WorkerID: "w0", Clear: true}) {
		t.Fatal("events not applied")
	}
	if got := pick(); got != "w1" {
		t.Fatalf("every member reports: picked %s, want w1 (its engine holds the prompt)", got)
	}
	set("w0", false) // w0 stops reporting: the approximate index, where w0 and w1 both hold it
	if got := pick(); got != "w0" {
		t.Fatalf("a member does not report: picked %s, want w0 (both sent the prompt, the smaller id)", got)
	}
	set("w0", true)
	s.KVEvents(&KVEvents{WorkerID: "w0", Clear: true})
	if got := pick(); got != "w1" {
		t.Fatalf("every member reports again: picked %s, want w1", got)
	}
}
