package router

import (
	"fmt"
	"testing"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// TestPreciseOnEngineEvents (R22): workers that report only their own (vLLM-format) events,
// keyed by the router's block keys, are picked for a request carrying its token ids; without
// token ids the pick is by load; a worker's events are refused once it is gone.
func TestPreciseOnEngineEvents(t *testing.T) {
	s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		s.SetWorker(WorkerInfo{ID: fmt.Sprintf("w%d", i), Model: "m", HTTPAddress: "127.0.0.1:9"}) // no kv_events
	}
	prompt := make([]uint32, 70) // four blocks of 16 and 6 tokens over
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	keys := vllmkv.BlockKeys(nil, prompt, 16, -1)
	if len(keys) != 4 {
		t.Fatalf("keys %d", len(keys))
	}
	if !s.KVEvents(&KVEvents{WorkerID: "w2", Engine: true, Clear: true, BlockSize: 16, Stored: keys[:3]}) ||
		!s.KVEvents(&KVEvents{WorkerID: "w1", Engine: true, BlockSize: 16, Stored: keys[:1]}) {
		t.Fatal("engine events for live workers not applied")
	}
	if s.KVEvents(&KVEvents{WorkerID: "w0", Stored: keys}) {
		t.Fatal("tl.kv events of a worker that does not report kv_events were applied")
	}
	pick := func(tokens []uint32) *Picked {
		t.Helper()
		p, ok := s.Pick(&Pick{Model: "m", RequestID: "r", Key: 1, TokenIDs: tokens})
		if !ok || p.Err != nil {
			t.Fatalf("pick: %v %+v", ok, p)
		}
		s.Release(p, OutcomeSuccess)
		return p
	}
	for range 3 {
		if p := pick(prompt); p.WorkerID != "w2" || p.Reason != policy.ReasonPrefix {
			t.Fatalf("picked %s (%v), want w2 for its three blocks", p.WorkerID, p.Reason)
		}
	}
	// A prompt shorter than one block, or none: by load.
	if p := pick(prompt[:15]); p.Reason != policy.ReasonLeastLoad {
		t.Fatalf("a 15-token prompt picked %s for %v", p.WorkerID, p.Reason)
	}
	if p := pick(nil); p.Reason != policy.ReasonLeastLoad {
		t.Fatalf("no tokens picked %s for %v", p.WorkerID, p.Reason)
	}
	// Another prompt sharing only the first block goes to a holder of it.
	other := append(append([]uint32(nil), prompt[:16]...), 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
	if p := pick(other); p.WorkerID != "w1" && p.WorkerID != "w2" {
		t.Fatalf("a prompt sharing the first block picked %s", p.WorkerID)
	}
	// w2's engine restarted: it holds nothing, and w1 takes the prompt for its one block.
	s.KVEvents(&KVEvents{WorkerID: "w2", Engine: true, Clear: true})
	if p := pick(prompt); p.WorkerID != "w1" {
		t.Fatalf("after w2's clear picked %s, want w1", p.WorkerID)
	}
}

// TestEngineEventsOutliveHeartbeats (R22): a worker fed by its engine's own events reports no
// kv_events in its heartbeats (or scrapes); a heartbeat keeps what its events said — the
// subscriber sends only changes, so a forget would lose the blocks until the engine evicted and
// stored them again — while a worker that stops being live is forgotten.
func TestEngineEventsOutliveHeartbeats(t *testing.T) {
	s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25})
	if err != nil {
		t.Fatal(err)
	}
	info := WorkerInfo{ID: "w0", Model: "m", HTTPAddress: "127.0.0.1:9", KVEventsEndpoint: "tcp://127.0.0.1:5557"}
	s.SetWorker(info)
	s.SetWorker(WorkerInfo{ID: "w1", Model: "m", HTTPAddress: "127.0.0.1:8"})
	prompt := make([]uint32, 48)
	for i := range prompt {
		prompt[i] = uint32(7 + i)
	}
	keys := vllmkv.BlockKeys(nil, prompt, 16, -1)
	// A first message with Clear and no block size yet (the subscriber's first contact), then
	// the stores.
	if !s.KVEvents(&KVEvents{WorkerID: "w0", Engine: true, Clear: true}) ||
		!s.KVEvents(&KVEvents{WorkerID: "w0", Engine: true, BlockSize: 16, Stored: keys}) {
		t.Fatal("engine events not applied")
	}
	for beat := range 3 {
		s.SetWorker(info)
		if n := s.KVHeld("w0"); n != len(keys) {
			t.Fatalf("after heartbeat %d the index holds %d of w0's %d blocks", beat, n, len(keys))
		}
		p, ok := s.Pick(&Pick{Model: "m", RequestID: "r", Key: 1, TokenIDs: prompt})
		if !ok || p.Err != nil || p.WorkerID != "w0" || p.Reason != policy.ReasonPrefix {
			t.Fatalf("after heartbeat %d: %v %+v, want w0 by prefix", beat, ok, p)
		}
		s.Release(p, OutcomeSuccess)
	}
	// The tl path is unchanged: a worker that stops reporting kv_events is forgotten.
	s.SetWorker(WorkerInfo{ID: "w1", Model: "m", HTTPAddress: "127.0.0.1:8", KVEvents: true})
	if !s.KVEvents(&KVEvents{WorkerID: "w1", Stored: []uint64{1, 2}}) || s.KVHeld("w1") != 2 {
		t.Fatalf("tl.kv events of w1 not applied: holds %d", s.KVHeld("w1"))
	}
	s.SetWorker(WorkerInfo{ID: "w1", Model: "m", HTTPAddress: "127.0.0.1:8"})
	if n := s.KVHeld("w1"); n != 0 {
		t.Fatalf("w1 stopped reporting kv_events and the index still holds %d of its ids", n)
	}
	s.RemoveWorker("w0")
	if n := s.KVHeld("w0"); n != 0 {
		t.Fatalf("a removed worker's %d blocks are still held", n)
	}
}

// TestRenderTarget: a pool is rendered on only once its engines report block sizes, on its
// least loaded member; unknown models and other policies get no target.
func TestRenderTarget(t *testing.T) {
	s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "a", Model: "m", HTTPAddress: "127.0.0.1:1", QueueDepth: 3})
	s.SetWorker(WorkerInfo{ID: "b", Model: "m", HTTPAddress: "127.0.0.1:2"})
	ask := func(model string) *RenderTargetReply {
		return s.RenderTarget(&RenderTarget{Model: model, RequestID: "r", Endpoint: oai.Chat})
	}
	if r := ask("m"); r.Address != "" {
		t.Fatalf("a pool without engine events got a target %+v", r)
	}
	s.KVEvents(&KVEvents{WorkerID: "a", Engine: true, BlockSize: 16, Clear: true})
	if r := ask("m"); r.Address != "127.0.0.1:2" || r.ServedModel != "m" {
		t.Fatalf("target %+v, want the least loaded b", r)
	}
	if r := ask("nope"); r.Address != "" {
		t.Fatalf("an unknown model got %+v", r)
	}
	rr, _ := NewSim(Config{Policy: config.PolicyRoundRobin})
	rr.SetWorker(WorkerInfo{ID: "a", Model: "m", HTTPAddress: "127.0.0.1:1"})
	if r := rr.RenderTarget(&RenderTarget{Model: "m"}); r.Address != "" {
		t.Fatalf("round_robin got a target %+v", r)
	}
}

// TestPreciseFallsBackToTheApproximateIndex (R22): once engines report their own events, a
// request without token ids is picked on the approximate index (where the same prompt went
// before), when the router has its bound; without it, by load.
func TestPreciseFallsBackToTheApproximateIndex(t *testing.T) {
	hashes := []uint64{11, 12, 13}
	for _, fallback := range []int{0, 64} {
		s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 4, FallbackIndexBlocks: fallback})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			s.SetWorker(WorkerInfo{ID: fmt.Sprintf("w%d", i), Model: "m", HTTPAddress: "127.0.0.1:9"})
		}
		if !s.KVEvents(&KVEvents{WorkerID: "w0", Engine: true, Clear: true, BlockSize: 16}) {
			t.Fatal("engine events refused")
		}
		// Hold one request on w0 so that a pick by load avoids it; the next request with the
		// first one's prompt goes back to it only on the approximate index.
		first, ok := s.Pick(&Pick{Model: "m", RequestID: "a", Key: 1, PrefixHashes: hashes})
		if !ok || first.Err != nil {
			t.Fatalf("pick: %+v", first)
		}
		second, _ := s.Pick(&Pick{Model: "m", RequestID: "b", Key: 2, PrefixHashes: hashes})
		if fallback > 0 && (second.WorkerID != first.WorkerID || second.Reason != policy.ReasonPrefix) {
			t.Fatalf("with the fallback index: %s (%v) after %s", second.WorkerID, second.Reason, first.WorkerID)
		}
		if fallback == 0 && (second.WorkerID == first.WorkerID || second.Reason != policy.ReasonLeastLoad) {
			t.Fatalf("without it: %s (%v) after %s", second.WorkerID, second.Reason, first.WorkerID)
		}
		// Token ids, when they come, are read instead: no block is held, so by load.
		third, _ := s.Pick(&Pick{Model: "m", RequestID: "c", Key: 3, PrefixHashes: hashes, TokenIDs: make([]uint32, 32)})
		if third.Reason != policy.ReasonLeastLoad {
			t.Fatalf("with token ids: %s (%v)", third.WorkerID, third.Reason)
		}
	}
}
