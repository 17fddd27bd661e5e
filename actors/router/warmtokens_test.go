package router

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// engineWarmSim is a precise_prefix router with warm-ups of prefixes of 4 chunks (64 tokens:
// 4 blocks of 16) or more, over w0…w3 that report only their engines' own events (R22; w3
// with a queue of 8, so the others have room under the cap), and its
// tlgw_prefix_warmups_total; w2 serves only chat (no completions) when chatOnly.
func engineWarmSim(t *testing.T, chatOnly bool) (*Sim, prometheus.Counter) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25, WarmupMinBytes: 4 * prefixindex.ChunkBytes, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		info := WorkerInfo{ID: fmt.Sprintf("w%d", i), Model: "m", HTTPAddress: "127.0.0.1:9", QueueDepth: int64(8 * (i / 3)),
			KVEventsEndpoint: "tcp://127.0.0.1:5557"}
		if chatOnly && i == 2 {
			info.Endpoints = oai.EndpointSet(0).With(oai.Chat)
		}
		s.SetWorker(info)
	}
	return s, m.warmups
}

// engineTokens is a prompt of n token ids from base.
func engineTokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// holdTokens picks for a chat request of tokens and keeps the pick (no release).
func (s *Sim) holdTokens(t *testing.T, tokens []uint32) *Picked {
	t.Helper()
	p, ok := s.Pick(&Pick{Model: "m", RequestID: "r", Key: 1, TokenIDs: tokens, Endpoint: oai.Chat})
	if !ok || p.Err != nil {
		t.Fatalf("pick: ok %v %+v", ok, p)
	}
	return p
}

// TestWarmupInBlocks (R22): in a pool keyed by its engines' own events, once w0, the one holder
// of a prompt's 10 blocks, is at the cap, the pick that put it there reserves w1 (the least
// loaded) for a warm-up of those 10 blocks' tokens (160 of the prompt's 166), with no bytes and
// no chunk hashes; the claim holds until w1's engine reports the blocks, and then the next pick
// goes to w1, a holder under the cap, and warms nothing.
func TestWarmupInBlocks(t *testing.T) {
	s, warmups := engineWarmSim(t, false)
	prompt := engineTokens(5000, 10*16+6)
	keys := vllmkv.BlockKeys(nil, prompt, 16, -1)
	if !s.KVEvents(&KVEvents{WorkerID: "w0", Engine: true, Clear: true, BlockSize: 16, Stored: keys}) {
		t.Fatal("w0's engine events not applied")
	}
	var held []*Picked
	var w *Warmup
	for range 20 {
		p := s.holdTokens(t, prompt)
		held = append(held, p)
		if w = p.Warm; w != nil {
			if p.WorkerID != "w0" || p.Reason != policy.ReasonPrefix {
				t.Fatalf("the warming pick went to %s (%v)", p.WorkerID, p.Reason)
			}
			break
		}
	}
	if w == nil {
		t.Fatal("no warm-up in 20 picks")
	}
	if w.WorkerID != "w1" || w.Tokens != 10*16 || w.Bytes != 0 || w.Hashes != nil || w.HTTPAddress != "127.0.0.1:9" || w.Worker == nil {
		t.Fatalf("warm-up %+v, want 160 tokens to w1", w)
	}
	if got := s.InFlight("w1"); got != 1 {
		t.Fatalf("w1 counts %d in flight, want the warm-up's 1", got)
	}
	again := func() *Picked {
		t.Helper()
		s.Release(held[0], OutcomeSuccess)
		held = held[1:]
		p := s.holdTokens(t, prompt)
		held = append(held, p)
		if p.WorkerID != "w0" {
			t.Fatalf("picked %s, want w0 back under the cap", p.WorkerID)
		}
		return p
	}
	if p := again(); p.Warm != nil {
		t.Fatalf("a second warm-up of a claimed prefix, to %s", p.Warm.WorkerID)
	}
	s.WarmupSent(w) // no chunk hashes: nothing for the approximate index
	s.ReleaseWarm(w, OutcomeNone)
	if !s.KVEvents(&KVEvents{WorkerID: "w1", Engine: true, Clear: true, BlockSize: 16, Stored: keys}) {
		t.Fatal("w1's engine events not applied")
	}
	p := s.holdTokens(t, prompt)
	held = append(held, p)
	if p.WorkerID != "w1" || p.Reason != policy.ReasonPrefix || p.Warm != nil {
		t.Fatalf("with w1 holding the copy: picked %s (%v), warm-up %+v; want w1 for its prefix, no warm-up", p.WorkerID, p.Reason, p.Warm)
	}
	if got := testutil.ToFloat64(warmups); got != 1 {
		t.Fatalf("tlgw_prefix_warmups_total = %v, want 1", got)
	}
	for _, p := range held {
		s.Release(p, OutcomeSuccess)
	}
}

// TestWarmupInBlocksTarget (R22): an engine-keyed pool's warm-up goes to a worker that serves
// completions (it is sent as one): w1 and w2 are the least loaded, w1 is made busier, and w2
// serves only chat, so the copy goes to w1.
func TestWarmupInBlocksTarget(t *testing.T) {
	s, _ := engineWarmSim(t, true)
	s.SetWorker(WorkerInfo{ID: "w1", Model: "m", HTTPAddress: "127.0.0.1:9", QueueDepth: 1, KVEventsEndpoint: "tcp://127.0.0.1:5557"})
	prompt := engineTokens(9000, 8*16)
	keys := vllmkv.BlockKeys(nil, prompt, 16, -1)
	s.KVEvents(&KVEvents{WorkerID: "w0", Engine: true, Clear: true, BlockSize: 16, Stored: keys})
	var held []*Picked
	defer func() {
		for _, p := range held {
			s.Release(p, OutcomeSuccess)
		}
	}()
	for range 20 {
		p := s.holdTokens(t, prompt)
		held = append(held, p)
		if p.Warm != nil {
			if p.Warm.WorkerID != "w1" || p.Warm.Tokens != 8*16 {
				t.Fatalf("warm-up %+v, want 128 tokens to w1 (w2 serves no completions)", p.Warm)
			}
			s.ReleaseWarm(p.Warm, OutcomeNone)
			return
		}
	}
	t.Fatal("no warm-up in 20 picks")
}

// TestWarmupInBlocksOff (R22): an engine-keyed pool warms nothing for a matched prefix shorter
// than the minimum (3 blocks of the 4), for a pick without token ids (the approximate index
// picks; its chunks are not the engines' blocks), or with warm-ups off; the same pool and
// picks with 10 blocks matched and token ids do warm.
func TestWarmupInBlocksOff(t *testing.T) {
	prompt := engineTokens(7000, 10*16)
	keys := vllmkv.BlockKeys(nil, prompt, 16, -1)
	for name, tc := range map[string]struct {
		min    int
		stored []uint64
		tokens []uint32
		warms  bool
	}{
		"short":     {min: 4 * prefixindex.ChunkBytes, stored: keys[:3], tokens: prompt},
		"no tokens": {min: 4 * prefixindex.ChunkBytes, stored: keys},
		"off":       {stored: keys, tokens: prompt},
		"on":        {min: 4 * prefixindex.ChunkBytes, stored: keys, tokens: prompt, warms: true},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25, WarmupMinBytes: tc.min,
				PrefixIndexBlocks: 1024, FallbackIndexBlocks: 1024})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				s.SetWorker(WorkerInfo{ID: fmt.Sprintf("w%d", i), Model: "m", QueueDepth: int64(8 * (i / 3))})
			}
			s.KVEvents(&KVEvents{WorkerID: "w0", Engine: true, Clear: true, BlockSize: 16, Stored: tc.stored})
			hashes := longPrompt("the same prompt rendered ", 10)
			var held []*Picked
			defer func() {
				for _, p := range held {
					s.Release(p, OutcomeSuccess)
				}
			}()
			for range 20 {
				p, ok := s.Pick(&Pick{Model: "m", RequestID: "r", Key: 1, TokenIDs: tc.tokens, PrefixHashes: hashes})
				if !ok || p.Err != nil {
					t.Fatalf("pick: ok %v %+v", ok, p)
				}
				held = append(held, p)
				if p.Warm != nil {
					if !tc.warms {
						t.Fatalf("a warm-up to %s (%+v)", p.Warm.WorkerID, p.Warm)
					}
					s.ReleaseWarm(p.Warm, OutcomeNone)
					return
				}
			}
			if tc.warms {
				t.Fatal("no warm-up in 20 picks")
			}
		})
	}
}

func TestWarmBlocks(t *testing.T) {
	for _, tc := range []struct{ chunks, bs, want int }{
		{0, 16, 1}, {1, 16, 1}, {4, 16, 4}, {192, 16, 192}, {192, 32, 96}, {5, 32, 3}, {1, 1 << 20, 1},
	} {
		if got := warmBlocks(tc.chunks, tc.bs); got != tc.want {
			t.Errorf("warmBlocks(%d, %d) = %d, want %d", tc.chunks, tc.bs, got, tc.want)
		}
	}
}
