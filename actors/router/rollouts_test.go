package router

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/rollout"
)

func rolloutRoutes(steps []float64, interval time.Duration) []config.Route {
	return config.NormalizeRoutes([]config.Route{{Model: "smol", Rollout: &config.Rollout{Canary: "v4", Baseline: "v3",
		Steps: steps, StepInterval: config.Duration(interval), MinRequests: 20}}})
}

// canaryShare resolves n picks of route smol with distinct request ids and returns the share
// that went to the canary, and the window the picks carried.
func canaryShare(r *rig, n int) (float64, *rollout.Window) {
	var w *rollout.Window
	canary := 0
	for i := range n {
		t := r.st.table.resolve(&Pick{Model: "smol", RequestID: fmt.Sprintf("req-%d", i)}, r.st.view)
		if t.out.ServedModel == "v4" {
			canary++
		}
		w = t.out.Rollout
	}
	return float64(canary) / float64(n), w
}

// TestRolloutDrivesTheSplit (R25): on the fake clock, a rollout's first step sends its share to
// the canary; healthy windows advance it and then promote it; the picks carry the window while
// it runs and not after; tlgw_rollout_step follows.
func TestRolloutDrivesTheSplit(t *testing.T) {
	m := NewMetrics(nil)
	r := newRig(t, Config{Routes: rolloutRoutes([]float64{10, 50, 100}, time.Minute), Metrics: m})
	r.join("a", "v3", 0)
	r.join("b", "v4", 0)
	share, w := canaryShare(r, 4000)
	if w == nil || share < 0.08 || share > 0.12 {
		t.Fatalf("step 1: canary share %.3f (window %v), want about 0.10", share, w != nil)
	}
	// The same request id sees the same backend within a step.
	first := r.st.table.resolve(&Pick{Model: "smol", RequestID: "sticky"}, r.st.view).out.ServedModel
	for range 10 {
		if got := r.st.table.resolve(&Pick{Model: "smol", RequestID: "sticky"}, r.st.view).out.ServedModel; got != first {
			t.Fatalf("one request id went to %s and %s within a step", first, got)
		}
	}
	healthy := func() {
		for range 30 {
			w.Observe("v4", false, 20*time.Millisecond)
			w.Observe("v3", false, 20*time.Millisecond)
		}
	}
	healthy()
	r.advance(time.Minute - time.Nanosecond)
	if got := testutil.ToFloat64(m.rolloutStep.WithLabelValues("smol")); got != 10 {
		t.Fatalf("before the window's end: step %v", got)
	}
	r.advance(time.Nanosecond)
	if got := testutil.ToFloat64(m.rolloutStep.WithLabelValues("smol")); got != 50 {
		t.Fatalf("after a healthy window: %v%%, want 50", got)
	}
	if share, _ := canaryShare(r, 4000); share < 0.46 || share > 0.54 {
		t.Fatalf("step 2: canary share %.3f", share)
	}
	healthy()
	r.advance(time.Minute)
	healthy()
	r.advance(time.Minute)
	share, w = canaryShare(r, 100)
	if share != 1 || w != nil {
		t.Fatalf("after promotion: share %v, window %v", share, w != nil)
	}
	if got := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues("smol", rollout.Promote)); got != 1 {
		t.Fatalf("promote decisions %v", got)
	}
	if got := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues("smol", rollout.Advance)); got != 2 {
		t.Fatalf("advance decisions %v", got)
	}
	if r.st.rollouts.timer != nil {
		t.Fatal("a timer armed after the rollout ended")
	}
}

// TestRolloutRollsBack (R25): a window whose canary fails over its error rate sends everything
// to the baseline at the window's end, and the rollout stops.
func TestRolloutRollsBack(t *testing.T) {
	m := NewMetrics(nil)
	r := newRig(t, Config{Routes: rolloutRoutes(nil, time.Minute), Metrics: m})
	r.st.rollouts.arm(r) // as the actor's Started does
	_, w := canaryShare(r, 10)
	for i := range 40 {
		w.Observe("v4", i%4 == 0, 0) // 25% errors
		w.Observe("v3", false, 0)
	}
	r.advance(time.Minute)
	if share, w := canaryShare(r, 1000); share != 0 || w != nil {
		t.Fatalf("after a rollback: share %v, window %v", share, w != nil)
	}
	v := r.st.rollouts.view(r.st.table).Rollouts
	if len(v) != 1 || v[0].Status != rollout.RolledBack || v[0].Percent != 0 || len(v[0].History) != 1 ||
		v[0].History[0].Decision != rollout.Rollback || v[0].History[0].Canary.Errors != 10 {
		t.Fatalf("view %+v", v)
	}
	if got := testutil.ToFloat64(m.rolloutStep.WithLabelValues("smol")); got != 0 {
		t.Fatalf("step %v after a rollback", got)
	}
	r.advance(time.Hour)
	if n := len(r.st.rollouts.runs["smol"].state.History); n != 1 {
		t.Fatalf("%d decisions after the rollout stopped", n)
	}
}

// TestRolloutActionsAndTable (R25): the operator's actions through the router's messages; a new
// route table with the same rollout keeps its state, a changed one starts again, a route without
// one forgets it.
func TestRolloutActionsAndTable(t *testing.T) {
	r := newRig(t, Config{Routes: rolloutRoutes(nil, time.Minute)})
	admin := actor.NewPID("local", "admin")
	ask := func(msg any) any {
		r.deliver(admin, msg)
		in := r.inbox[admin.Id]
		if len(in) == 0 {
			t.Fatalf("no answer to %T", msg)
		}
		return in[len(in)-1]
	}
	if err, _ := ask(&RolloutAction{Route: "big", Action: rollout.Pause}).(error); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("no such rollout: %v", err)
	}
	if err, _ := ask(&RolloutAction{Route: "smol", Action: "faster"}).(error); !errors.Is(err, errs.ErrInvalidRequest) {
		t.Fatalf("an unknown action: %v", err)
	}
	version := r.st.rollouts.view(r.st.table).Version
	stale := version + 1
	if err, _ := ask(&RolloutAction{Route: "smol", Action: rollout.Pause, IfMatch: &stale}).(error); !errors.Is(err, errs.ErrEtagMismatch) {
		t.Fatalf("a stale If-Match: %v", err)
	}
	if v, _ := ask(&RolloutAction{Route: "smol", Action: rollout.Pause, IfMatch: &version}).(*RolloutView); v == nil ||
		v.Status != rollout.Paused || v.Version != version+1 {
		t.Fatalf("pause: %+v", v)
	}
	r.advance(time.Hour) // paused: nothing is decided
	if n := len(r.st.rollouts.runs["smol"].state.History); n != 1 {
		t.Fatalf("%d records while paused", n)
	}
	if v, _ := ask(&RolloutAction{Route: "smol", Action: rollout.Promote}).(*RolloutView); v == nil || v.Percent != 100 {
		t.Fatalf("promote: %+v", v)
	}
	if share, _ := canaryShare(r, 100); share != 1 {
		t.Fatalf("promoted: share %v", share)
	}
	// The same table again keeps the promoted state; a changed rollout starts over.
	routes := rolloutRoutes(nil, time.Minute)
	before := r.st.rollouts.view(r.st.table).Version
	if out, _ := ask(&PutRoutes{IfMatch: 1, Routes: routes}).(*RouteTable); out == nil {
		t.Fatal("put refused")
	}
	if got := r.st.rollouts.view(r.st.table).Version; got <= before {
		t.Fatalf("a new table left the version at %d", got)
	}
	if s := r.st.rollouts.runs["smol"].state.Status; s != rollout.Completed {
		t.Fatalf("after the same table: %s", s)
	}
	ask(&PutRoutes{IfMatch: 2, Routes: rolloutRoutes([]float64{20, 100}, time.Minute)})
	if v := r.st.rollouts.view(r.st.table).Rollouts[0]; v.Status != rollout.Running || v.Percent != 20 {
		t.Fatalf("a changed rollout: %+v", v)
	}
	ask(&PutRoutes{IfMatch: 3, Routes: config.NormalizeRoutes([]config.Route{{Model: "smol", Backends: []config.Backend{{Model: "v3", Weight: 1}}}})})
	if len(r.st.rollouts.runs) != 0 || len(r.st.rollouts.view(r.st.table).Rollouts) != 0 {
		t.Fatal("a route without a rollout kept its run")
	}
	if n := testutil.CollectAndCount(r.st.rollouts.step); n != 0 {
		t.Fatalf("%d tlgw_rollout_step series left for a route without a rollout", n)
	}
}

// TestRolloutFailoverGoesToTheBaseline (R25): during a rollout, a pick after a failed attempt
// (its Exclude not empty) is served by the baseline even when its draw is the canary's; once
// the rollout has ended the draw stands again.
func TestRolloutFailoverGoesToTheBaseline(t *testing.T) {
	r := newRig(t, Config{Routes: rolloutRoutes([]float64{100}, time.Minute)})
	if got := r.st.table.resolve(&Pick{Model: "smol", RequestID: "x"}, r.st.view).out; got.ServedModel != "v3" {
		t.Fatalf("a canary without a live worker: %s", got.ServedModel)
	}
	r.join("b", "v4", 0)
	first := r.st.table.resolve(&Pick{Model: "smol", RequestID: "x"}, r.st.view).out
	again := r.st.table.resolve(&Pick{Model: "smol", RequestID: "x", Exclude: []string{"b"}}, r.st.view).out
	if first.ServedModel != "v4" || again.ServedModel != "v3" || again.Rollout == nil {
		t.Fatalf("first %s, after a failure %s", first.ServedModel, again.ServedModel)
	}
	r.deliver(nil, &RolloutAction{Route: "smol", Action: rollout.Promote})
	if got := r.st.table.resolve(&Pick{Model: "smol", RequestID: "x", Exclude: []string{"b"}}, r.st.view).out; got.ServedModel != "v4" || got.Rollout != nil {
		t.Fatalf("after the rollout: %s", got.ServedModel)
	}
}

// TestRolloutBookkeeping: the version moves with every decision and action; counts made while
// paused are not the resumed window's; only promote and abort of the operator's actions are
// decisions; the view is in route order; one timer stays armed while the due time holds.
func TestRolloutBookkeeping(t *testing.T) {
	m := NewMetrics(nil)
	routes := config.NormalizeRoutes([]config.Route{
		{Model: "zeta", Rollout: &config.Rollout{Canary: "z4", Baseline: "z3", StepInterval: config.Duration(time.Minute), MinRequests: 20}},
		{Model: "alpha", Rollout: &config.Rollout{Canary: "a4", Baseline: "a3", StepInterval: config.Duration(time.Minute), MinRequests: 20}},
	})
	r := newRig(t, Config{Routes: routes, Metrics: m})
	r.join("w", "a3", 0)
	timer := r.st.rollouts.timer
	r.join("w2", "z3", 0)
	if timer == nil || r.st.rollouts.timer != timer {
		t.Fatal("the rollout timer was replaced though its due time held")
	}
	v := r.st.rollouts.view(r.st.table)
	if len(v.Rollouts) != 2 || v.Rollouts[0].Route != "alpha" || v.Rollouts[1].Route != "zeta" {
		t.Fatalf("view order %+v", v.Rollouts)
	}
	version := v.Version
	r.deliver(nil, &RolloutAction{Route: "alpha", Action: rollout.Pause})
	w := r.st.rollouts.runs["alpha"].window
	for range 40 {
		w.Observe("a4", true, 0) // while paused: not the next window's
	}
	r.deliver(nil, &RolloutAction{Route: "alpha", Action: rollout.Resume})
	r.advance(time.Minute)
	runs := r.st.rollouts.runs
	if s := runs["alpha"].state; s.Status != rollout.Running || s.History[len(s.History)-1].Decision != rollout.Hold {
		t.Fatalf("after resuming: %s, %+v", s.Status, s.History)
	}
	if got := r.st.rollouts.view(r.st.table).Version; got != version+4 { // pause, resume, two holds
		t.Fatalf("version %d after four changes from %d", got, version)
	}
	if n := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues("alpha", rollout.Pause)); n != 0 {
		t.Fatalf("a pause counted as a decision")
	}
	r.deliver(nil, &RolloutAction{Route: "zeta", Action: rollout.Promote})
	r.deliver(nil, &RolloutAction{Route: "alpha", Action: rollout.Abort})
	for route, d := range map[string]string{"zeta": rollout.Promote, "alpha": rollout.Abort} {
		if n := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues(route, d)); n != 1 {
			t.Fatalf("%s %s counted %v", route, d, n)
		}
	}
}
