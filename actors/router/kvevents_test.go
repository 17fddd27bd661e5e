package router

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// preciseSim is a precise_prefix router with workers w0…w(n-1), all reporting kv_events.
func preciseSim(t *testing.T, n int) *Sim {
	t.Helper()
	s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s.SetWorker(WorkerInfo{ID: fmt.Sprintf("w%d", i), Model: "m", HTTPAddress: "127.0.0.1:9", KVEvents: true})
	}
	return s
}

func longPrompt(tag string, chunks int) []uint64 {
	b := make([]byte, 0, 64*chunks)
	for len(b) < 64*chunks {
		b = append(b, tag...)
	}
	return prefixindex.Hashes(nil, b[:64*chunks])
}

func (s *Sim) pickFor(t *testing.T, hashes []uint64) *Picked {
	t.Helper()
	p, ok := s.Pick(&Pick{Model: "m", RequestID: "r", Key: 1, PrefixHashes: hashes})
	if !ok || p.Err != nil {
		t.Fatalf("pick: ok %v %+v", ok, p)
	}
	s.Release(p, OutcomeSuccess)
	return p
}

// TestPreciseRoutesToHolder: a prompt goes to the worker whose engine reported its longest
// prefix; a CLEARED moves it back to the least loaded; events for unknown workers, for workers
// that do not report kv_events, and oversized messages are not applied.
func TestPreciseRoutesToHolder(t *testing.T) {
	s := preciseSim(t, 3)
	h := longPrompt("the long system prompt ", 8)
	if !s.KVEvents(&KVEvents{WorkerID: "w2", Clear: true, Stored: h[:6]}) ||
		!s.KVEvents(&KVEvents{WorkerID: "w1", Stored: h[:3]}) {
		t.Fatal("events for live workers not applied")
	}
	if p := s.pickFor(t, h); p.WorkerID != "w2" || p.Reason != policy.ReasonPrefix {
		t.Fatalf("picked %s (%v), want w2 for its 6 chunks", p.WorkerID, p.Reason)
	}
	s.KVEvents(&KVEvents{WorkerID: "w2", Removed: h[2:6]}) // evicted under pressure
	if p := s.pickFor(t, h); p.WorkerID != "w1" {
		t.Fatalf("after REMOVED picked %s, want w1 (3 chunks against 2)", p.WorkerID)
	}
	s.KVEvents(&KVEvents{WorkerID: "w1", Clear: true}) // restarted
	if p := s.pickFor(t, h); p.WorkerID != "w2" {
		t.Fatalf("after w1's CLEARED picked %s, want w2", p.WorkerID)
	}

	if s.KVEvents(&KVEvents{WorkerID: "nobody", Stored: h}) {
		t.Fatal("an unknown worker's events were applied")
	}
	s.SetWorker(WorkerInfo{ID: "w3", Model: "m", HTTPAddress: "127.0.0.1:9"}) // no kv_events
	if s.KVEvents(&KVEvents{WorkerID: "w3", Stored: h}) {
		t.Fatal("events of a worker that does not report kv_events were applied")
	}
	// The bound counts stored and removed ids together: exactly MaxKVEventIDs is applied, one
	// more is not, however they are split.
	half := MaxKVEventIDs / 2
	if !s.KVEvents(&KVEvents{WorkerID: "w2", Stored: make([]uint64, half), Removed: make([]uint64, MaxKVEventIDs-half)}) {
		t.Fatal("a message of exactly MaxKVEventIDs ids was refused")
	}
	if s.KVEvents(&KVEvents{WorkerID: "w2", Stored: make([]uint64, half+1), Removed: make([]uint64, MaxKVEventIDs-half)}) {
		t.Fatal("a message of MaxKVEventIDs+1 stored and removed ids was applied")
	}
	big := make([]uint64, MaxKVEventIDs+1)
	copy(big, h)
	if s.KVEvents(&KVEvents{WorkerID: "w2", Stored: big}) {
		t.Fatal("an oversized message was applied")
	}
	if p := s.pickFor(t, h); p.Reason != policy.ReasonLeastLoad {
		t.Fatalf("after an oversized message w2's holdings should be forgotten; picked %s (%v)", p.WorkerID, p.Reason)
	}
}

// TestPreciseForgetsRemovedWorker: an evicted worker's holdings go with its slot; a worker
// registering again under the same id starts from nothing.
func TestPreciseForgetsRemovedWorker(t *testing.T) {
	s := preciseSim(t, 2)
	h := longPrompt("another prompt, long enough ", 4)
	s.KVEvents(&KVEvents{WorkerID: "w1", Clear: true, Stored: h})
	if kidx := s.st.view.kidx; kidx.Entries() != len(h) {
		t.Fatalf("entries %d", kidx.Entries())
	}
	s.RemoveWorker("w1")
	if kidx := s.st.view.kidx; kidx.Entries() != 0 || kidx.Workers() != 0 {
		t.Fatalf("after eviction: entries %d workers %d", kidx.Entries(), kidx.Workers())
	}
	s.SetWorker(WorkerInfo{ID: "w1", Model: "m", HTTPAddress: "127.0.0.1:9", KVEvents: true})
	if p := s.pickFor(t, h); p.Reason != policy.ReasonLeastLoad {
		t.Fatalf("a new registration inherited holdings: %s (%v)", p.WorkerID, p.Reason)
	}
	// A heartbeat that stops reporting kv_events forgets what the worker reported.
	s.KVEvents(&KVEvents{WorkerID: "w1", Stored: h})
	s.SetWorker(WorkerInfo{ID: "w1", Model: "m", HTTPAddress: "127.0.0.1:9"})
	if s.st.view.kidx.Entries() != 0 {
		t.Fatal("holdings kept after kv_events turned off")
	}
}

// TestPreciseForgetsAWorkerThatIsNotLive: a worker whose heartbeats lapsed (not live, not yet
// evicted) has its events refused, so what it holds is unknown from then on: its holdings are
// forgotten at once, and when it is live again it holds nothing in the index until its
// subscriber sends a fresh snapshot.
func TestPreciseForgetsAWorkerThatIsNotLive(t *testing.T) {
	s := preciseSim(t, 2)
	h := longPrompt("a prompt held by the worker that lapses ", 4)
	if !s.KVEvents(&KVEvents{WorkerID: "w1", Clear: true, Stored: h}) {
		t.Fatal("snapshot refused")
	}
	w := s.byID["w1"]
	s.deliver(&WorkerState{PID: w.pid, Info: w.info, Live: false})
	if e := s.st.view.kidx.Entries(); e != 0 {
		t.Fatalf("%d entries kept for a worker that is not live", e)
	}
	if s.KVEvents(&KVEvents{WorkerID: "w1", Removed: h[2:]}) {
		t.Fatal("events of a worker that is not live were applied")
	}
	s.SetWorker(w.info) // live again
	if p := s.pickFor(t, h); p.Reason != policy.ReasonLeastLoad {
		t.Fatalf("back from a lapse with holdings from before it: %s (%v)", p.WorkerID, p.Reason)
	}
	if !s.KVEvents(&KVEvents{WorkerID: "w1", Clear: true, Stored: h[:2]}) {
		t.Fatal("the fresh snapshot was refused")
	}
	if p := s.pickFor(t, h); p.WorkerID != "w1" || p.Reason != policy.ReasonPrefix {
		t.Fatalf("after the fresh snapshot: %s (%v), want w1 for its prefix", p.WorkerID, p.Reason)
	}
}

// TestPreciseIndexOffForOtherPolicies: only precise_prefix keeps the exact index.
func TestPreciseIndexOffForOtherPolicies(t *testing.T) {
	s, err := NewSim(Config{Policy: "prefix_aware", PrefixIndexBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", HTTPAddress: "127.0.0.1:9", KVEvents: true})
	if s.KVEvents(&KVEvents{WorkerID: "w0", Stored: []uint64{1}}) || s.st.view.kidx != nil {
		t.Fatal("exact index on for prefix_aware")
	}
}

// TestPreciseIndexCountsDropped: ids past a worker's bound are not recorded, and
// tlgw_kv_index_dropped_total counts them (once each, after the message that dropped them);
// tlgw_kv_index_entries shows what is held.
func TestPreciseIndexCountsDropped(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, KVIndexBlocks: 4, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", HTTPAddress: "127.0.0.1:9", KVEvents: true})
	h := longPrompt("a prompt longer than the bound ", 7)
	if !s.KVEvents(&KVEvents{WorkerID: "w0", Clear: true, Stored: h[:6]}) {
		t.Fatal("not applied")
	}
	if got := testutil.ToFloat64(m.kvDropped); got != 2 {
		t.Fatalf("dropped %v, want 2 (6 stored, bound 4)", got)
	}
	s.KVEvents(&KVEvents{WorkerID: "w0", Stored: h[6:]})
	s.KVEvents(&KVEvents{WorkerID: "w0"})
	if got, entries := testutil.ToFloat64(m.kvDropped), testutil.ToFloat64(m.kvIndex); got != 3 || entries != 4 {
		t.Fatalf("dropped %v, entries %v; want 3 and 4", got, entries)
	}
}

// TestOversizedKVEventsLogTheirSize: the warning for a dropped message names the worker, how
// many ids the message carried (stored and removed together) and the bound, so an operator
// sees by how much the engine overshot.
func TestOversizedKVEventsLogTheirSize(t *testing.T) {
	var buf bytes.Buffer
	s, err := NewSim(Config{Policy: config.PolicyPrecisePrefix, LoadFactor: 1.25,
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", HTTPAddress: "127.0.0.1:9", KVEvents: true})
	half := MaxKVEventIDs / 2
	if s.KVEvents(&KVEvents{WorkerID: "w0", Stored: make([]uint64, half+1), Removed: make([]uint64, MaxKVEventIDs-half)}) {
		t.Fatal("an oversized message was applied")
	}
	want := fmt.Sprintf("worker=w0 ids=%d max=%d", MaxKVEventIDs+1, MaxKVEventIDs)
	if got := buf.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, want) {
		t.Fatalf("log %q, want a warning with %q", got, want)
	}
}
