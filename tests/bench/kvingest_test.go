package bench

import (
	"fmt"
	"testing"

	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// BenchmarkKVEventIngest (R22): the gateway's cost per engine KV event at 1,000 workers — a
// three-frame message decoded (vllmkv.DecodeMessage), each BlockStored mapped to the router's
// block keys through the worker's Tracker, and the keys stored in the exact index (the
// router's part); every message of 16 events, each a chained run of 4 blocks of 16 tokens, as
// a busy engine's batch of finished prefills, with one BlockRemoved of an older run per
// message once a worker's tracker holds 4,096 blocks (steady churn). Reported: events/s on one
// core (the benchmark runs on one goroutine).
func BenchmarkKVEventIngest(b *testing.B) {
	const workers, perMsg, blocks, bs = 1000, 16, 4, 16
	type worker struct {
		tr   *vllmkv.Tracker
		next uint64 // the engine's next block hash
		old  uint64 // the oldest run's first hash still held
	}
	ws := make([]worker, workers)
	for i := range ws {
		ws[i] = worker{tr: vllmkv.NewTracker(65536), next: uint64(i) << 40, old: uint64(i) << 40}
	}
	idx := kvindex.New[int](65536)
	// Pre-encode one message per worker shape: hashes are rewritten per message below, so
	// encode on the fly but outside the timer.
	tokens := make([]uint32, blocks*bs)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	mk := func(w *worker, seq uint64) [][]byte {
		evs := make([]vllmkv.Event, 0, perMsg+1)
		for range perMsg {
			hs := make([]uint64, blocks)
			for j := range hs {
				hs[j] = w.next
				w.next++
			}
			tokens[0]++ // another prompt: other keys
			evs = append(evs, vllmkv.Event{Kind: vllmkv.BlockStored, Hashes: hs, Tokens: append([]uint32(nil), tokens...), BlockSize: bs})
		}
		if w.tr.Len() >= 4096 {
			rm := make([]uint64, 0, perMsg*blocks)
			for range perMsg * blocks {
				rm = append(rm, w.old)
				w.old++
			}
			evs = append(evs, vllmkv.Event{Kind: vllmkv.BlockRemoved, Hashes: rm})
		}
		f, err := vllmkv.EncodeMessage(vllmkv.Batch{Topic: fmt.Sprintf("kv@10.0.0.%d:8000@m", seq%250), Seq: seq, Events: evs, Rank: -1}, vllmkv.Array)
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	events := 0
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		wi := n % workers
		w := &ws[wi]
		b.StopTimer()
		msg := mk(w, uint64(n))
		b.StartTimer()
		batch, err := vllmkv.DecodeMessage(msg, vllmkv.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		for i := range batch.Events {
			e := &batch.Events[i]
			keys, _, err := w.tr.Apply(e)
			if err != nil {
				b.Fatal(err)
			}
			if e.Kind == vllmkv.BlockRemoved {
				idx.Remove(wi, keys)
			} else {
				idx.Store(wi, keys)
			}
			events++
		}
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(events*blocks)/b.Elapsed().Seconds(), "blocks/s")
}
