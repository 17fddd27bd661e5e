package router

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/internal/errs"
)

// unreachable is worker id's report after its address refused a connection (R19).
func (r *rig) unreachable(id string, down bool) {
	w := r.workers[r.workerPID(id).Id]
	r.deliver(w.pid, &WorkerState{PID: w.pid, Info: w.info, Live: true, InFlight: int64(len(w.holds)),
		AcqSeen: w.acqSeen, Unreachable: down})
}

// TestUnreachableLeavesRoutingOutsideTheEjectionCap (R19): a worker reported unreachable is out
// of every pick at once, listed as not routable and unreachable, and counted in
// tlgw_workers{state="unreachable"}; it counts on neither side of max_ejected_percent, so with
// two of four workers unreachable one of the other two may still be ejected (50%), but not
// both (one must stay routable); a report that it is reachable again brings it back.
func TestUnreachableLeavesRoutingOutsideTheEjectionCap(t *testing.T) {
	r, m := outlierRig(t, testOutlier)
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		r.join(id, "smol", 0)
	}
	r.unreachable("w1", true)
	r.unreachable("w2", true)
	if row := r.row(t, "w1"); row.Routable || !row.Unreachable {
		t.Fatalf("w1 after the refusal: %+v", row)
	}
	if got := testutil.ToFloat64(m.workers.WithLabelValues(stateUnreachable)); got != 2 {
		t.Fatalf("tlgw_workers{state=unreachable} = %v, want 2", got)
	}
	if got := r.picksOf(t, "smol", 20); got["w1"]+got["w2"] != 0 {
		t.Fatalf("picks %v went to unreachable workers", got)
	}
	r.askEject("w3", Outcome5xx)
	if row := r.row(t, "w3"); row.Routable || row.EjectionReason != "5xx" {
		t.Fatalf("w3 not ejected (the unreachable workers were counted against the cap): %+v", row)
	}
	r.askEject("w4", Outcome5xx)
	if row := r.row(t, "w4"); !row.Routable {
		t.Fatalf("the last routable worker was ejected: %+v", row)
	}
	if got := r.picksOf(t, "smol", 10); got["w4"] != 10 {
		t.Fatalf("picks %v, want all on w4", got)
	}
	r.unreachable("w1", false) // it heartbeat after the refusal
	if row := r.row(t, "w1"); !row.Routable || row.Unreachable {
		t.Fatalf("w1 after a heartbeat: %+v", row)
	}
	if got := testutil.ToFloat64(m.workers.WithLabelValues(stateUnreachable)); got != 1 {
		t.Fatalf("tlgw_workers{state=unreachable} = %v, want 1", got)
	}
	if got := r.picksOf(t, "smol", 10); got["w1"] == 0 {
		t.Fatalf("picks %v: w1 is back, yet gets none", got)
	}
}

// TestAllUnreachableIsNoCapacity (R19): when every worker of a model is unreachable, a pick is
// answered no_capacity at once (no engine listens: there is nothing to try).
func TestAllUnreachableIsNoCapacity(t *testing.T) {
	r, _ := outlierRig(t, testOutlier)
	r.join("w1", "smol", 0)
	r.join("w2", "smol", 0)
	r.unreachable("w1", true)
	r.unreachable("w2", true)
	q := r.newRequester()
	if p := r.st.pick(&Pick{Model: "smol", RequestID: "x", Requester: q.pid}, r); !errors.Is(p.Err, errs.ErrNoCapacity) {
		t.Fatalf("pick with every worker unreachable: %+v", p)
	}
}

// TestFailureLoadSteersLoadBasedPolicies (R19): a worker's reported failure load is part of
// the load every load-based policy reads, so a worker that fails fast does not attract picks.
// w1 holds nothing but reports a failure load of 5; w2 and w3 are idle. Picks released at once
// all avoid w1 (least_outstanding: the least loaded; affinity, prefix_aware and precise_prefix:
// w1 is over the bounded-load cap; predicted_latency: load is its model's feature); once the
// load has decayed to 0 w1 is picked again. round_robin and weighted read no load.
func TestFailureLoadSteersLoadBasedPolicies(t *testing.T) {
	for _, pol := range []string{"least_outstanding", "affinity", "prefix_aware", "precise_prefix", "predicted_latency"} {
		t.Run(pol, func(t *testing.T) {
			r := newRig(t, Config{Policy: pol})
			for _, id := range []string{"w1", "w2", "w3"} {
				r.join(id, "smol", 0)
			}
			fail := func(n int64) {
				w := r.workers[r.workerPID("w1").Id]
				r.deliver(w.pid, &LoadReport{ID: "w1", Reg: w.info.Reg, InFlight: int64(len(w.holds)), AcqSeen: w.acqSeen, FailLoad: n})
			}
			fail(5)
			if got := r.picksOf(t, "smol", 30); got["w1"] != 0 {
				t.Fatalf("with a failure load of 5: picks %v, want none on w1", got)
			}
			if got := r.inFlight("w1"); got != 0 {
				t.Fatalf("the failure load shows as in flight: %d", got)
			}
			fail(0)
			if got := r.picksOf(t, "smol", 300); got["w1"] == 0 {
				t.Fatalf("with the failure load gone: picks %v, want some on w1", got)
			}
		})
	}
}
