package router

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// warmSim is a router of policy with warm-ups of prefixes of 4 chunks or more, over w0…w3
// (all reporting kv_events; w3 with a queue of 8, so the others have room under the cap), and
// its tlgw_prefix_warmups_total.
func warmSim(t *testing.T, pol string) (*Sim, prometheus.Counter) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	cfg := Config{Policy: pol, LoadFactor: 1.25, WarmupMinBytes: 4 * prefixindex.ChunkBytes, Metrics: m}
	if pol == config.PolicyPrefixAware {
		cfg.PrefixIndexBlocks = 1024
	}
	s, err := NewSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		s.SetWorker(WorkerInfo{ID: fmt.Sprintf("w%d", i), Model: "m", HTTPAddress: "127.0.0.1:9", KVEvents: true,
			QueueDepth: int64(8 * (i / 3))})
	}
	return s, m.warmups
}

// heldOn is the picks of held on worker id.
func (s *Sim) heldOn(held []*Picked, id string) (on []*Picked) {
	for _, p := range held {
		if p.WorkerID == id {
			on = append(on, p)
		}
	}
	return on
}

// holdPick picks for hashes and keeps the pick (no release).
func (s *Sim) holdPick(t *testing.T, hashes []uint64) *Picked {
	t.Helper()
	p, ok := s.Pick(&Pick{Model: "m", RequestID: "r", Key: 1, PrefixHashes: hashes})
	if !ok || p.Err != nil {
		t.Fatalf("pick: ok %v %+v", ok, p)
	}
	return p
}

// fillHolder picks for hashes, holding each pick, until one carries a warm-up (at most 20).
func (s *Sim) fillHolder(t *testing.T, hashes []uint64) (held []*Picked) {
	t.Helper()
	for range 20 {
		p := s.holdPick(t, hashes)
		held = append(held, p)
		if p.Warm != nil {
			return held
		}
	}
	t.Fatalf("no warm-up in 20 picks to %s", held[0].WorkerID)
	return nil
}

// TestWarmupReserved: once w0, the one holder of a 10-chunk prompt, is at the cap, the pick
// that put it there also reserves w1 (the least loaded) for a copy of the 10 chunks; w1's
// count includes it until its requester releases it. Under both prefix policies.
func TestWarmupReserved(t *testing.T) {
	for _, pol := range []string{config.PolicyPrecisePrefix, config.PolicyPrefixAware} {
		t.Run(pol, func(t *testing.T) {
			s, warmups := warmSim(t, pol)
			h := longPrompt("the long system prompt ", 10)
			if pol == config.PolicyPrecisePrefix {
				s.KVEvents(&KVEvents{WorkerID: "w0", Stored: h})
			} else {
				s.Release(s.holdPick(t, h), OutcomeSuccess) // the gateway sent it to w0 (least loaded)
			}
			held := s.fillHolder(t, h)
			last := held[len(held)-1]
			if last.WorkerID != "w0" || last.Reason != policy.ReasonPrefix {
				t.Fatalf("the warming pick went to %s (%v)", last.WorkerID, last.Reason)
			}
			w := last.Warm
			if w.WorkerID != "w1" || w.Bytes != 10*prefixindex.ChunkBytes || w.HTTPAddress != "127.0.0.1:9" || w.Worker == nil {
				t.Fatalf("warm-up %+v", w)
			}
			if got := s.InFlight("w1"); got != 1 {
				t.Fatalf("w1 counts %d in flight, want the warm-up's 1", got)
			}
			if got := testutil.ToFloat64(warmups); got != 1 {
				t.Fatalf("tlgw_prefix_warmups_total = %v", got)
			}
			if pol == config.PolicyPrefixAware {
				// The gateway sent w1 the prefix: the approximate index says so at once, and
				// the next pick, w0 being at the cap, goes there for it.
				s.WarmupSent(w)
				p := s.holdPick(t, h)
				held = append(held, p)
				if p.WorkerID != "w1" || p.Reason != policy.ReasonPrefix {
					t.Fatalf("the pick after the warm-up went to %s (%v), want w1 for its prefix", p.WorkerID, p.Reason)
				}
			}
			s.ReleaseWarm(w, OutcomeNone)
			if got := s.InFlight("w1"); got != int64(len(held)-len(s.heldOn(held, "w0"))) {
				t.Fatalf("w1 counts %d in flight after the warm-up's release", got)
			}
			for _, p := range held {
				s.Release(p, OutcomeSuccess)
			}
		})
	}
}

// TestWarmupClaims: a prefix gets one warm-up at a time. Until its target holds the prefix's
// depth (its engine reports it) or the claim lapses after warmPending, a pick that would warm
// it again does not; once the target holds it under the cap, no warm-up is needed.
func TestWarmupClaims(t *testing.T) {
	s, warmups := warmSim(t, config.PolicyPrecisePrefix)
	h := longPrompt("another long prompt ", 10)
	s.KVEvents(&KVEvents{WorkerID: "w0", Stored: h})
	held := s.fillHolder(t, h)
	w := held[len(held)-1].Warm
	// Make room on w0 and fill it again: the same prefix, claimed.
	again := func() *Picked {
		t.Helper()
		s.Release(held[0], OutcomeSuccess)
		held = held[1:]
		p := s.holdPick(t, h)
		held = append(held, p)
		if p.WorkerID != "w0" {
			t.Fatalf("picked %s, want w0 back under the cap", p.WorkerID)
		}
		return p
	}
	if p := again(); p.Warm != nil {
		t.Fatalf("a second warm-up of a claimed prefix, to %s", p.Warm.WorkerID)
	}
	// The claim lapses: the next time w0 fills, the prefix is warmed again (w1 still holds
	// its warm-up's ticket and does not hold the prefix, so the target is w2).
	s.Advance(warmPending)
	p := again()
	if p.Warm == nil || p.Warm.WorkerID != "w2" {
		t.Fatalf("after the claim lapsed: warm-up %+v, want one to w2", p.Warm)
	}
	s.ReleaseWarm(w, OutcomeNone)
	// w2's engine reports the copy (to depth 8: its last block was partial): the claim ends,
	// and w2, under the cap, is a holder, so filling w0 warms nothing.
	s.KVEvents(&KVEvents{WorkerID: "w2", Stored: h[:8]})
	s.ReleaseWarm(p.Warm, OutcomeNone)
	if p := again(); p.Warm != nil {
		t.Fatalf("a warm-up to %s with w2 holding the prefix under the cap", p.Warm.WorkerID)
	}
	if got := testutil.ToFloat64(warmups); got != 2 {
		t.Fatalf("tlgw_prefix_warmups_total = %v, want 2", got)
	}
	for _, p := range held {
		s.Release(p, OutcomeSuccess)
	}
}

// TestWarmupClaimsBounded: at most MaxWarmPending prefixes are claimed at once; a free claim
// is reused once its target holds its prefix, in the index its pools read.
func TestWarmupClaimsBounded(t *testing.T) {
	for _, pol := range []string{config.PolicyPrecisePrefix, config.PolicyPrefixAware} {
		t.Run(pol, func(t *testing.T) { testWarmupClaimsBounded(t, pol) })
	}
}

func testWarmupClaimsBounded(t *testing.T, pol string) {
	s, err := NewSim(Config{Policy: pol, PrefixIndexBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "w", Model: "m", KVEvents: true})
	v := s.st.view
	target := v.slots["w"]
	hold := func(id uint64) {
		if v.kidx != nil {
			v.kidx.Store(&target.member, []uint64{id})
		} else {
			v.pidx.Record("w", []uint64{id})
		}
	}
	for id := range uint64(MaxWarmPending) {
		if !v.claimWarm(id+1, target) {
			t.Fatalf("claim %d of %d refused", id+1, MaxWarmPending)
		}
	}
	if v.claimWarm(MaxWarmPending+1, target) {
		t.Fatal("a claim beyond MaxWarmPending")
	}
	if v.claimWarm(3, target) {
		t.Fatal("prefix 3 claimed twice")
	}
	hold(5) // the target holds prefix 5: its claim is done
	if !v.claimWarm(MaxWarmPending+1, target) {
		t.Fatal("the claim of a held prefix was not reused")
	}
	if v.claimWarm(MaxWarmPending+2, target) {
		t.Fatal("a claim beyond MaxWarmPending after the reuse")
	}
}

// TestWarmupOff: no warm-up when they are off, for a prefix shorter than the minimum, or in a
// pool with a member that does not report kv_events (its cache may not follow the rendered
// prompt, R18.3).
func TestWarmupOff(t *testing.T) {
	h := longPrompt("a prompt warmed nowhere ", 10)
	cases := map[string]func(t *testing.T) (*Sim, []uint64){
		"off": func(t *testing.T) (*Sim, []uint64) {
			s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				s.SetWorker(WorkerInfo{ID: fmt.Sprintf("w%d", i), Model: "m", KVEvents: true, QueueDepth: int64(8 * (i / 3))})
			}
			return s, h
		},
		"short": func(t *testing.T) (*Sim, []uint64) {
			s, _ := warmSim(t, config.PolicyPrecisePrefix)
			return s, h[:3]
		},
		"a member without kv_events": func(t *testing.T) (*Sim, []uint64) {
			s, _ := warmSim(t, config.PolicyPrecisePrefix)
			s.SetWorker(WorkerInfo{ID: "w4", Model: "m"})
			return s, h
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			s, hashes := mk(t)
			s.KVEvents(&KVEvents{WorkerID: "w0", Stored: hashes})
			for range 20 {
				p := s.holdPick(t, hashes)
				if p.Warm != nil {
					t.Fatalf("a warm-up to %s", p.Warm.WorkerID)
				}
				if p.WorkerID != "w0" {
					return // w0 reached the cap without a warm-up
				}
			}
			t.Fatal("w0 never reached the cap")
		})
	}
}

func TestWarmSlack(t *testing.T) {
	for bs, want := range map[int64]int{0: 2, 1: 2, 16: 2, 17: 3, 32: 3, 64: 5, 1 << 40: 4097} {
		if got := warmSlack(bs); got != want {
			t.Errorf("warmSlack(%d) = %d, want %d", bs, got, want)
		}
	}
	for b, want := range map[int]int{0: 0, -5: 0, 1: 1, 64: 1, 65: 2, 12288: 192} {
		if got := warmMinChunks(b); got != want {
			t.Errorf("warmMinChunks(%d) = %d, want %d", b, got, want)
		}
	}
}

// TestPrefixIndexFollowsKV: the approximate index remembers no more of a worker's prompts
// than its KV cache can hold (KV blocks × block size, about 16 tokens a chunk), and the
// config's bound for a worker that does not report its KV.
func TestPrefixIndexFollowsKV(t *testing.T) {
	s, err := NewSim(Config{Policy: config.PolicyPrefixAware, LoadFactor: 1.25, PrefixIndexBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", KVTotalBlocks: 4, BlockSize: 16}) // 64 tokens: 4 chunks
	s.SetWorker(WorkerInfo{ID: "w1", Model: "m"})
	for i := range 4 {
		p := s.holdPick(t, longPrompt(fmt.Sprintf("prompt %d ", i), 20))
		defer s.Release(p, OutcomeSuccess)
	}
	if got := s.st.view.pidx.Len("w0"); got != 4 {
		t.Fatalf("w0's index holds %d chunks, want its KV's 4", got)
	}
	if got := s.st.view.pidx.Len("w1"); got != 40 {
		t.Fatalf("w1's index holds %d chunks, want both its prompts' 40 (bound 64)", got)
	}
	for _, tc := range []struct {
		info WorkerInfo
		want int
	}{
		{WorkerInfo{}, 0},
		{WorkerInfo{KVTotalBlocks: 2048, BlockSize: 16}, 2048},
		{WorkerInfo{KVTotalBlocks: 2048}, 0},
		{WorkerInfo{KVTotalBlocks: 1, BlockSize: 15}, 0},
		{WorkerInfo{KVTotalBlocks: 1 << 40, BlockSize: 1 << 20}, math.MaxInt32},
	} {
		if got := kvChunks(tc.info); got != tc.want {
			t.Errorf("kvChunks(%d blocks of %d) = %d, want %d", tc.info.KVTotalBlocks, tc.info.BlockSize, got, tc.want)
		}
	}
}

// alwaysWarm is precise_prefix whose every pick asks for a warm-up of a new prefix, to w.
type alwaysWarm struct {
	*policy.PrecisePrefix
	w  *policy.Member
	id uint64
}

func (a *alwaysWarm) Warm(int, int, []string) (*policy.Member, int, uint64) {
	a.id++
	return a.w, 1, a.id
}

// TestWarmupBudget: warm-ups are at most one per warmPicks prefix picks after a first burst
// of warmBurst, however many picks ask for one: over 100 such picks, the first 71 (the burst
// of 64 and the credit their own picks add, the credit full before the first), then one each
// time 10 picks have added up (the 81st and 91st).
func TestWarmupBudget(t *testing.T) {
	s, warmups := warmSim(t, config.PolicyPrecisePrefix)
	h := longPrompt("a prompt on every worker ", 10)
	for i := range 4 {
		s.KVEvents(&KVEvents{WorkerID: fmt.Sprintf("w%d", i), Stored: h})
	}
	pl := s.st.view.pools[poolKey{model: "m", role: RoleUnified}]
	pl.p = &alwaysWarm{PrecisePrefix: pl.p.(*policy.PrecisePrefix), w: &s.st.view.slots["w1"].member}
	var at []int
	for i := range 100 {
		p := s.holdPick(t, h)
		if p.Reason != policy.ReasonPrefix {
			t.Fatalf("pick %d: reason %v", i, p.Reason)
		}
		if p.Warm != nil {
			at = append(at, i+1)
			s.ReleaseWarm(p.Warm, OutcomeNone)
		}
		s.Release(p, OutcomeSuccess)
		s.Advance(warmPending) // its claim lapses: only the budget holds warm-ups back
	}
	var want []int
	for i := range 71 {
		want = append(want, i+1)
	}
	want = append(want, 81, 91)
	if !slices.Equal(at, want) {
		t.Fatalf("warm-ups at picks %v, want %v", at, want)
	}
	if got := testutil.ToFloat64(warmups); got != float64(len(want)) {
		t.Fatalf("tlgw_prefix_warmups_total = %v", got)
	}
}

// TestWarmupLearntWhenSent: under prefix_aware the approximate index learns that a warm-up's
// target holds the prefix when the requester has sent the warm-up (WarmupSent), not when the
// pick reserved it: a warm-up the requester skipped (its prompt is token ids, or as many
// warm-ups as allowed are running) or never got (its pick was given back) leaves the target
// holding nothing, and the next pick does not go there as if it were cached.
func TestWarmupLearntWhenSent(t *testing.T) {
	s, _ := warmSim(t, config.PolicyPrefixAware)
	h := longPrompt("a prompt warmed late ", 10)
	s.Release(s.holdPick(t, h), OutcomeSuccess) // the gateway sent it to w0
	held := s.fillHolder(t, h)
	w := held[len(held)-1].Warm
	if w.WorkerID != "w1" {
		t.Fatalf("warm-up %+v, want one to w1", w)
	}
	p := s.holdPick(t, h)
	held = append(held, p)
	if p.WorkerID == "w1" && p.Reason == policy.ReasonPrefix {
		t.Fatalf("a pick went to w1 for a prefix its warm-up has not been sent")
	}
	// A report from another registration of w1, or of a worker the router does not know, is
	// not the target's.
	s.WarmupSent(&Warmup{PickedWorker: PickedWorker{Worker: actor.NewPID("sim", "worker/w1-old"), WorkerID: "w1"}, Hashes: w.Hashes})
	s.WarmupSent(&Warmup{PickedWorker: PickedWorker{Worker: w.Worker, WorkerID: "w9"}, Hashes: w.Hashes})
	if got := s.st.view.pidx.Match("w1", h); got != 0 {
		t.Fatalf("w1 is believed to hold %d chunks of the prefix; its warm-up was not sent", got)
	}
	// Sent: w1 holds the prefix (its 10 chunks), and the next pick, w0 being at the cap, goes
	// there for it.
	s.WarmupSent(w)
	if got := s.st.view.pidx.Match("w1", h); got != 10 {
		t.Fatalf("after the warm-up was sent w1 is believed to hold %d chunks, want 10", got)
	}
	p = s.holdPick(t, h)
	held = append(held, p)
	if p.WorkerID != "w1" || p.Reason != policy.ReasonPrefix {
		t.Fatalf("the pick after the warm-up was sent went to %s (%v), want w1 for its prefix", p.WorkerID, p.Reason)
	}
	for _, p := range held {
		s.Release(p, OutcomeSuccess)
	}
	s.ReleaseWarm(w, OutcomeNone)
}
