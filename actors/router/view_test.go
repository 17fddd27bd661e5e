package router

import (
	"errors"
	"testing"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// TestViewCountsPicksUntilTheWorkerReports: a pick sends the worker its Acquire and counts in
// the router's optimistic delta; the worker's report carries the same number, so the figure
// never jumps; a stale report (fewer Acquires seen) is ignored.
func TestViewCountsPicksUntilTheWorkerReports(t *testing.T) {
	r := newRig(t, Config{})
	r.join("w1", "smol", 0)
	q := r.newRequester()
	p := r.st.pick(&Pick{Model: "smol", RequestID: "x", Requester: q.pid}, r)
	if p.Err != nil || p.Ticket == 0 {
		t.Fatalf("pick: %+v", p)
	}
	w := r.workers[r.workerPID("w1").Id]
	if w.holds[p.Ticket] != q.pid || r.inFlight("w1") != 1 {
		t.Fatalf("holds %v, router in flight %d", w.holds, r.inFlight("w1"))
	}
	s := r.st.view.slots["w1"]
	if s.acqSent != 1 || s.acqSeen != 0 {
		t.Fatalf("delta before the report: sent %d seen %d", s.acqSent, s.acqSeen)
	}
	r.report(w) // a heartbeat: in flight 1, 1 Acquire seen
	if s.acqSeen != 1 || s.reported != 1 || r.inFlight("w1") != 1 {
		t.Fatalf("after the report: seen %d reported %d in flight %d", s.acqSeen, s.reported, r.inFlight("w1"))
	}
	r.deliver(w.pid, &LoadReport{ID: "w1", Reg: w.info.Reg, InFlight: 0, AcqSeen: 0}) // stale
	if r.inFlight("w1") != 1 {
		t.Fatalf("a stale report changed the figure to %d", r.inFlight("w1"))
	}
	q.release(p)
	if r.inFlight("w1") != 0 || len(w.holds) != 0 {
		t.Fatalf("after release: %d, holds %v", r.inFlight("w1"), w.holds)
	}
	if r.st.view.list(7).Epoch != 7 {
		t.Fatal("the listing carries the epoch it is given")
	}
}

// TestViewPoolsFollowRoutability: a draining worker leaves its pool (and picks), comes back
// when it stops draining, a model is served while a live worker has it, and an evicted worker
// is gone from the listing.
func TestViewPoolsFollowRoutability(t *testing.T) {
	r := newRig(t, Config{})
	r.join("w1", "smol", 0)
	r.join("w2", "smol", 0)
	if r.st.view.routable != 2 || !(r.st.view.models["smol"] > 0) || (r.st.view.models["big"] > 0) {
		t.Fatalf("routable %d, models %v", r.st.view.routable, r.st.view.models)
	}
	w1 := r.workers[r.workerPID("w1").Id]
	w1.info.Draining = true
	r.report(w1)
	if r.st.view.routable != 1 || len(r.st.view.pools[poolKey{"smol", RoleUnified}].members) != 1 {
		t.Fatalf("draining w1: routable %d", r.st.view.routable)
	}
	for i := 0; i < 3; i++ {
		if p := r.st.pick(&Pick{Model: "smol"}, r); p.WorkerID != "w2" {
			t.Fatalf("pick %d went to %s while w1 drains", i, p.WorkerID)
		}
	}
	w1.info.Draining = false
	r.report(w1)
	if r.st.view.routable != 2 {
		t.Fatalf("w1 back: routable %d", r.st.view.routable)
	}
	r.leave("w2")
	r.leave("w1")
	if r.st.view.routable != 0 || (r.st.view.models["smol"] > 0) || len(r.st.view.list(1).Workers) != 0 || len(r.st.view.pools) != 0 {
		t.Fatalf("after eviction: routable %d, models %v", r.st.view.routable, r.st.view.models)
	}
	if p := r.st.pick(&Pick{Model: "smol"}, r); !errors.Is(p.Err, errs.ErrModelNotFound) {
		t.Fatalf("a model nobody serves and no route names: %v", p.Err)
	}
}

// TestViewDisaggregatedNeedsBoth: a disaggregated route picks a decode and a prefill worker
// (each sent its Acquire) and is no_capacity while either pool is empty.
func TestViewDisaggregatedNeedsBoth(t *testing.T) {
	r := newRig(t, Config{Routes: []config.Route{{Model: "pd", Targets: []string{config.TargetDisaggregated}}}})
	r.joinRole("d1", "pd", RoleDecode, 0)
	if p := r.st.pick(&Pick{Model: "pd"}, r); !errors.Is(p.Err, errs.ErrNoCapacity) {
		t.Fatalf("no prefill worker: %+v", p)
	}
	if r.inFlight("d1") != 0 {
		t.Fatal("a failed disaggregated pick reserved the decode worker")
	}
	r.joinRole("p1", "pd", RolePrefill, 0)
	p := r.st.pick(&Pick{Model: "pd"}, r)
	if p.Err != nil || p.WorkerID != "d1" || p.Prefill == nil || p.Prefill.WorkerID != "p1" || p.Prefill.Ticket == p.Ticket {
		t.Fatalf("pick: %+v", p)
	}
	if r.inFlight("d1") != 1 || r.inFlight("p1") != 1 {
		t.Fatalf("in flight d1 %d p1 %d", r.inFlight("d1"), r.inFlight("p1"))
	}
}

// TestRouteTable: aliases and cascade steps resolve, a served model with no route is its own
// route, an unknown model is model_not_found, and a PUT needs the current epoch.
func TestRouteTable(t *testing.T) {
	rt := newRouteTable([]config.Route{
		{Model: "smol", Aliases: []string{"small"}, Backends: []config.Backend{{Model: "smol-v3", Weight: 1}}},
		{Model: "auto", Cascade: []config.CascadeStep{{Model: "smol", AcceptIf: "mean_logprob > -1"}, {Model: "big"}}},
	}, NewCanaryKey())
	served := &workerView{models: map[string]int{"raw": 1}}
	cases := []struct {
		model, route, served string
		step                 int
		steps                int
	}{
		{"small", "smol", "smol-v3", 0, 1},
		{"raw", "raw", "raw", 0, 1},
		{"auto", "auto", "big", 1, 2}, // Step LastStep
	}
	for _, c := range cases {
		got := rt.resolve(&Pick{Model: c.model, Step: LastStep}, served)
		if got.out.Err != nil || got.out.Route != c.route || got.out.ServedModel != c.served || got.out.Step != c.step || got.out.Steps != c.steps {
			t.Fatalf("%s: %+v", c.model, got.out)
		}
	}
	if got := rt.resolve(&Pick{Model: "auto", Step: 0}, served); got.out.ServedModel != "smol" || got.out.Accept == nil {
		t.Fatalf("first cascade step: %+v", got.out)
	}
	if got := rt.resolve(&Pick{Model: "nope"}, served); !errors.Is(got.out.Err, errs.ErrModelNotFound) {
		t.Fatalf("unknown: %v", got.out.Err)
	}
	if _, err := rt.put(2, nil); !errors.Is(err, errs.ErrEtagMismatch) || rt.epoch != 1 {
		t.Fatalf("stale put: %v, epoch %d", err, rt.epoch)
	}
	out, err := rt.put(1, []config.Route{{Model: "x"}})
	if err != nil || out.Epoch != 2 || len(rt.view().Routes) != 1 {
		t.Fatalf("put: %+v %v", out, err)
	}
	if got := rt.resolve(&Pick{Model: "small"}, served); !errors.Is(got.out.Err, errs.ErrModelNotFound) {
		t.Fatal("the old alias still resolves after the table was replaced")
	}
}

// TestViewCarriesBlockSize (R15.1): a worker's block_size reaches the router's view next to
// its KV total, and its KV capacity in tokens is their product; 0 (unknown) gives none.
func TestViewCarriesBlockSize(t *testing.T) {
	r := newRig(t, Config{})
	r.join("w1", "smol", 0)
	w := r.workers[r.workerPID("w1").Id]
	w.info.BlockSize = 16
	r.report(w)
	if got := r.row(t, "w1").Info; got.BlockSize != 16 || got.KVCapacityTokens() != 1024*16 {
		t.Fatalf("view: block size %d, capacity %d, want 16 and %d", got.BlockSize, got.KVCapacityTokens(), 1024*16)
	}
	w.info.BlockSize = 0
	r.report(w)
	if got := r.row(t, "w1").Info; got.BlockSize != 0 || got.KVCapacityTokens() != 0 {
		t.Fatalf("unknown block size: %d, capacity %d, want 0 and 0", got.BlockSize, got.KVCapacityTokens())
	}
	for _, c := range []struct{ total, bs, want int64 }{{0, 16, 0}, {100, 0, 0}, {-1, 16, 0}, {1 << 31, 1 << 20, 1 << 51}} {
		if got := (WorkerInfo{KVTotalBlocks: c.total, BlockSize: c.bs}).KVCapacityTokens(); got != c.want {
			t.Errorf("capacity of %d blocks × %d = %d, want %d", c.total, c.bs, got, c.want)
		}
	}
}

// TestLoadReportOfAnEarlierRegistration: a worker evicted and registered again has a new actor
// (AcqSeen 0); a report its old actor sent after the Releases of its last requests, arriving
// after the new registration's, is not the new actor's. It changes neither the new
// registration's load (which it would make negative: every pick would go there) nor its
// routability (its ejection request belongs to the old registration).
func TestLoadReportOfAnEarlierRegistration(t *testing.T) {
	r, _ := outlierRig(t, testOutlier)
	for _, id := range []string{"w1", "w2", "w3"} {
		r.join(id, "smol", 0)
	}
	old := r.workers[r.workerPID("w1").Id]
	q := r.newRequester()
	for range 3 {
		if p := r.st.pick(&Pick{Model: "smol", RequestID: "x", Requester: q.pid}, r); p.Err != nil {
			t.Fatalf("pick: %v", p.Err)
		}
	}
	if old.acqSeen != 1 {
		t.Fatalf("w1's old actor saw %d Acquires, want 1", old.acqSeen)
	}
	// w1 is evicted: its last report, then a new actor registers the id before the old one's
	// Terminated has come.
	r.gens["w1"]++
	old.live = false
	r.report(old)
	delete(r.workers, old.pid.Id)
	r.join("w1", "smol", 0)
	// The old actor released its request and asks for an ejection.
	delete(old.holds, 1)
	r.deliver(old.pid, r.loadReportOf(old, Outcome5xx))
	if got := r.inFlight("w1"); got != 0 {
		t.Fatalf("the new registration counts %d in flight, want 0", got)
	}
	if row := r.row(t, "w1"); !row.Routable || row.EjectionReason != "" {
		t.Fatalf("the old actor's ejection request took the new registration out: %+v", row)
	}
	for range 6 {
		if p := r.st.pick(&Pick{Model: "smol", RequestID: "y", Requester: q.pid}, r); p.Err != nil {
			t.Fatalf("pick: %v", p.Err)
		}
	}
	if a, b, c := r.inFlight("w1"), r.inFlight("w2"), r.inFlight("w3"); max(a, b, c)-min(a, b, c) > 1 || a+b+c != 8 {
		t.Fatalf("after six more held picks: in flight w1 %d, w2 %d, w3 %d; want 8 spread evenly", a, b, c)
	}
}

// TestViewDrainEchoIsRoutable: a worker whose draining is the echo of the gateway's own drain
// (DrainEcho, decided by the registry) is routable and in the routable state; one draining by
// itself is not.
func TestViewDrainEchoIsRoutable(t *testing.T) {
	r := newRig(t, Config{})
	r.join("w1", "smol", 0)
	w := r.workers[r.workerPID("w1").Id]
	w.info.Draining, w.info.DrainEcho = true, true
	r.report(w)
	if row := r.row(t, "w1"); !row.Routable || r.st.view.slots["w1"].state != stateRoutable {
		t.Fatalf("draining as the drain's echo: %+v, state %s", row, r.st.view.slots["w1"].state)
	}
	w.info.DrainEcho = false
	r.report(w)
	if row := r.row(t, "w1"); row.Routable || r.st.view.slots["w1"].state != stateDraining {
		t.Fatalf("draining by itself: %+v, state %s", row, r.st.view.slots["w1"].state)
	}
	w.info.Draining, w.info.DrainEcho = false, true // DrainEcho means nothing without Draining
	r.report(w)
	if row := r.row(t, "w1"); !row.Routable {
		t.Fatalf("not draining: %+v", row)
	}
}

// TestViewPDProtocolPick (R22): a disaggregated pick names its route's pd_protocol ("tl"
// when none is given) and its prefill worker's bootstrap port (SGLang's 8998 when the worker
// has none, as a heartbeating one); a DecodeOnly pick reserves a decode worker alone, and an
// endpoint a disaggregated route does not split names no protocol.
func TestViewPDProtocolPick(t *testing.T) {
	r := newRig(t, Config{Routes: []config.Route{
		{Model: "sg", Targets: []string{config.TargetDisaggregated}, PDProtocol: config.PDSGLang},
		{Model: "pd", Targets: []string{config.TargetDisaggregated}},
	}})
	r.joinRole("d1", "sg", RoleDecode, 0)
	r.joinWith("p1", "sg", RolePrefill, 0, func(i *WorkerInfo) { i.BootstrapPort = 9100 })
	r.joinRole("d2", "pd", RoleDecode, 0)
	r.joinRole("p2", "pd", RolePrefill, 0)
	p := r.st.pick(&Pick{Model: "sg", Endpoint: oai.Completions}, r)
	if p.Err != nil || p.PDProtocol != config.PDSGLang || p.Prefill == nil || p.Prefill.BootstrapPort != 9100 {
		t.Fatalf("sglang pick: %+v prefill %+v", p, p.Prefill)
	}
	p = r.st.pick(&Pick{Model: "pd", Endpoint: oai.Chat}, r)
	if p.Err != nil || p.PDProtocol != config.PDTL || p.Prefill == nil || p.Prefill.BootstrapPort != config.DefaultBootstrapPort {
		t.Fatalf("default pick: %+v prefill %+v", p, p.Prefill)
	}
	before := r.inFlight("p1")
	p = r.st.pick(&Pick{Model: "sg", Endpoint: oai.Completions, DecodeOnly: true}, r)
	if p.Err != nil || p.WorkerID != "d1" || p.Prefill != nil || p.PDProtocol != config.PDSGLang || r.inFlight("p1") != before {
		t.Fatalf("decode-only pick: %+v (prefill in flight %d → %d)", p, before, r.inFlight("p1"))
	}
	if p = r.st.pick(&Pick{Model: "sg", Endpoint: oai.Embeddings}, r); p.Err != nil || p.Prefill != nil || p.PDProtocol != "" {
		t.Fatalf("embeddings on a disaggregated route: %+v", p)
	}
}
