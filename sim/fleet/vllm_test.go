package fleet

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// vllmRun runs precise_prefix on shared-prefix over a small fleet with the given event path.
func vllmRun(t *testing.T, o Options) Result {
	t.Helper()
	o.Trace, o.Workers, o.Requests, o.Load, o.Seed, o.Policies = TraceSharedPrefix, 8, 1000, 0.8, 1, []string{"precise_prefix"}
	o.audit = true
	rep, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Results[0]
	if r.Completed != r.Requests {
		t.Fatalf("%+v: completed %d of %d", o, r.Completed, r.Requests)
	}
	return r
}

// TestVLLMEventsDeterministic: the same seed gives the same report on the vLLM path, lost
// batches included (they are drawn from the run's seeded RNG).
func TestVLLMEventsDeterministic(t *testing.T) {
	o := Options{KVEvents: KVEventsVLLM, KVGap: 0.02, RestartEvery: time.Second}
	a, b := vllmRun(t, o), vllmRun(t, o)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs of one seed differ:\n%+v\n%+v", a, b)
	}
	if a.KVLost == 0 || a.KVBatches == 0 {
		t.Fatalf("no batches lost: %+v", a)
	}
}

// TestVLLMEventsMatchTL: routing by the engines' own block events finds as much of the prompts
// cached as routing by tlengine's chunk ids: within half a point of hit rate and 3% of TTFT
// p99, with warm-ups off and with restarts (AllBlocksCleared against CLEARED); with warm-ups on
// (the vLLM path's cut in tokens, the tl path's in rendered bytes) both run warm-ups, the hit
// rate stays within a point and the vLLM path's p99 no more than 3% above the tl path's.
func TestVLLMEventsMatchTL(t *testing.T) {
	for _, o := range []Options{
		{WarmupMinBytes: -1},
		{WarmupMinBytes: -1, RestartEvery: time.Second},
		{},
	} {
		tl := vllmRun(t, o)
		o.KVEvents = KVEventsVLLM
		v := vllmRun(t, o)
		t.Logf("warm-ups %d, restarts %v: tl hit %.4f p99 %.1f (%d warm-ups); vllm hit %.4f p99 %.1f (%d warm-ups, %d batches)",
			o.WarmupMinBytes, o.RestartEvery, tl.HitRate, tl.TTFTP99Ms, tl.Warmups, v.HitRate, v.TTFTP99Ms, v.Warmups, v.KVBatches)
		band := 0.005
		if o.WarmupMinBytes == 0 {
			band = 0.01
			if tl.Warmups == 0 || v.Warmups == 0 || v.TTFTP99Ms > 1.03*tl.TTFTP99Ms {
				t.Errorf("warm-ups on: vllm p99 %.1f ms (%d warm-ups) against tl's %.1f (%d)", v.TTFTP99Ms, v.Warmups, tl.TTFTP99Ms, tl.Warmups)
			}
		} else if rel := math.Abs(v.TTFTP99Ms-tl.TTFTP99Ms) / tl.TTFTP99Ms; rel > 0.03 || v.Warmups != 0 {
			t.Errorf("restarts %v: vllm p99 %.1f ms (%d warm-ups) against tl's %.1f", o.RestartEvery, v.TTFTP99Ms, v.Warmups, tl.TTFTP99Ms)
		}
		if math.Abs(v.HitRate-tl.HitRate) > band {
			t.Errorf("warm-ups %d, restarts %v: vllm hit rate %.4f against tl's %.4f", o.WarmupMinBytes, o.RestartEvery, v.HitRate, tl.HitRate)
		}
		if v.KVBatches == 0 || v.KVOrphans != 0 || v.KVGaps != 0 {
			t.Errorf("vllm without gaps: %+v", v)
		}
	}
}

// TestVLLMEventsGaps: lost batches never break the run's invariants (every request ends, the
// router counts none in flight, the engine model's audit holds: vllmRun); a gap that is not
// replayed keeps the worker's entries (only the lost batch's blocks are unknown) and costs at
// most a point of hit rate; replaying every gap keeps it within half a point of the run
// without losses.
func TestVLLMEventsGaps(t *testing.T) {
	base := Options{KVEvents: KVEventsVLLM, WarmupMinBytes: -1}
	none := vllmRun(t, base)
	base.KVGap = 0.05
	kept := vllmRun(t, base)
	base.KVReplay = true
	replay := vllmRun(t, base)
	t.Logf("hit rate: no loss %.4f, kept %.4f (%d gaps, %d orphans), replay %.4f (%d gaps)",
		none.HitRate, kept.HitRate, kept.KVGaps, kept.KVOrphans, replay.HitRate, replay.KVGaps)
	if kept.KVGaps == 0 || kept.KVKept != kept.KVGaps || kept.KVClears != 0 || kept.KVReplays != 0 || kept.KVOrphans == 0 ||
		math.Abs(kept.HitRate-none.HitRate) > 0.01 {
		t.Errorf("gaps kept: %+v against %.4f without loss", kept, none.HitRate)
	}
	if replay.KVGaps == 0 || replay.KVReplays != replay.KVGaps || replay.KVClears+replay.KVKept != 0 || replay.KVOrphans != 0 ||
		math.Abs(replay.HitRate-none.HitRate) > 0.005 {
		t.Errorf("gaps replayed: %+v against %.4f without loss", replay, none.HitRate)
	}
}

// TestVLLMClearEmptiesWorker: the router holds nothing of a worker after its engine's
// AllBlocksCleared (a restart) and learns its blocks again from the next stores; a gap replayed
// loses nothing, one that cannot be replayed loses only the lost batch's blocks.
func TestVLLMClearEmptiesWorker(t *testing.T) {
	for _, replay := range []bool{false, true} {
		o := &Options{Seed: 3, KVEvents: KVEventsVLLM, KVReplay: replay, Engine: DefaultEngine}
		o.Engine.MaxRunning = 1000 // every prompt below runs at once
		s, err := router.NewSim(router.Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25, KVIndexBlocks: 4096})
		if err != nil {
			t.Fatal(err)
		}
		r := &runner{o: o, sims: []*router.Sim{s}, precise: true, vllm: true, gap: rand.New(rand.NewPCG(1, 2))}
		e := newEngine("w0", o.Engine)
		e.vk = &vllmKV{tr: vllmkv.NewTracker(kvMaxBlocks), needClear: true}
		r.engines = []*engine{e}
		e.pool = r.newVLLMPool(0)
		r.beat(0, true)
		prompt := func(base uint32, n int) []uint32 {
			p := make([]uint32, n)
			for i := range p {
				p[i] = base + uint32(i)
			}
			return p
		}
		start := func(p []uint32) {
			t.Helper()
			if _, _, ok := e.tryStart(p); !ok {
				t.Fatal("no room")
			}
		}
		start(prompt(1, 64)) // 4 blocks
		if n := s.KVHeld("w0"); n != 4 || e.vk.tr.Len() != 4 {
			t.Fatalf("replay %v: the router holds %d blocks, the tracker %d, want 4", replay, n, e.vk.tr.Len())
		}
		r.restart(0)
		if n := s.KVHeld("w0"); n != 0 || e.vk.tr.Len() != 0 {
			t.Fatalf("replay %v: after AllBlocksCleared the router holds %d blocks, the tracker %d", replay, n, e.vk.tr.Len())
		}
		start(prompt(1000, 32))
		// The next batch is lost (KVGap 1 for one batch), the one after arrives with a gap.
		r.o.KVGap = MaxKVGap
		for r.kv.lost == 0 {
			start(prompt(uint32(2000+100*r.kv.batches), 16))
		}
		r.o.KVGap = 0
		start(prompt(9000, 48))
		held := s.KVHeld("w0")
		if r.kv.gaps != 1 {
			t.Fatalf("replay %v: %d gaps seen", replay, r.kv.gaps)
		}
		if replay {
			// Everything since the restart: 2 blocks, one per batch of the loop (the batches but
			// the first, the restart's, the 2-block one and the last), and the last's 3.
			if want := 2 + (r.kv.batches - 4) + 3; held != want || r.kv.replays != 1 {
				t.Fatalf("replay: the router holds %d blocks, want %d (%+v)", held, want, r.kv)
			}
		} else if want := 2 + (r.kv.batches - 4) + 3 - 1; held != want || r.kv.kept != 1 || r.kv.clears != 0 {
			// Kept at the gap: all but the lost batch's one block.
			t.Fatalf("kept: the router holds %d blocks, want %d (%+v)", held, want, r.kv)
		}
	}
}
