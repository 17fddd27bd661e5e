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

// closedWindow is one window a clustered router handed on.
type closedWindow struct {
	route            string
	window           time.Time
	canary, baseline rollout.Tally
}

// storedAt is route smol's stored state for spec at step, its window starting at start.
func storedAt(spec rollout.Spec, status rollout.Status, step int, start time.Time, history ...rollout.Record) map[string]rollout.Stored {
	return map[string]rollout.Stored{"smol": {Spec: rollout.SpecKey(spec), State: rollout.State{Step: step, Status: status,
		WindowStart: start, History: history}}}
}

// TestRolloutInACluster (R25, [cluster]): a clustered router decides nothing: at each window's
// end it hands its counts on (once), and it follows the stored states it is given — a stored
// state of its spec sets the split (a restart resumes the fleet's step, not the first), the
// window goes on counting when the stored window starts where the closed one ended and starts
// over otherwise, the decisions a later state brings are counted (not the first state's), and a
// state of another spec or of a step the spec lacks is not taken.
func TestRolloutInACluster(t *testing.T) {
	m := NewMetrics(nil)
	var closed []closedWindow
	routes := rolloutRoutes([]float64{10, 50, 100}, time.Minute)
	spec := routes[0].Rollout.Spec()
	r := newRig(t, Config{Routes: routes, Metrics: m, RolloutWindows: func(route string, w time.Time, c, b rollout.Tally) {
		closed = append(closed, closedWindow{route, w, c, b})
	}})
	r.st.rollouts.arm(r)
	r.join("a", "v3", 0)
	r.join("b", "v4", 0)

	// A restart: the fleet's rollout is at its second step, with one advance behind it.
	past := rollout.Record{At: t0.Add(-time.Minute), Decision: rollout.Advance, From: 10, To: 50}
	r.deliver(nil, &SetRolloutStates{Version: 7, Decider: "gw-2", States: storedAt(spec, rollout.Running, 1, t0, past)})
	if share, _ := canaryShare(r, 4000); share < 0.46 || share > 0.54 {
		t.Fatalf("resumed at step 2: canary share %.3f", share)
	}
	v := r.st.rollouts.view(r.st.table)
	if v.Version != 7 || v.Decider != "gw-2" || v.Rollouts[0].Step != 1 || len(v.Rollouts[0].History) != 1 {
		t.Fatalf("view %+v", v)
	}
	if got := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues("smol", rollout.Advance)); got != 0 {
		t.Fatalf("the first state's history counted: %v", got)
	}
	_, w := canaryShare(r, 1)
	for range 30 {
		w.Observe("v4", true, time.Millisecond) // all errors: a lone router would roll back
		w.Observe("v3", false, time.Millisecond)
	}
	r.advance(time.Minute)
	if len(closed) != 1 || closed[0].route != "smol" || !closed[0].window.Equal(t0) || closed[0].canary.Errors != 30 ||
		closed[0].baseline.Requests != 30 || closed[0].baseline.TTFT[1] != 30 {
		t.Fatalf("closed %+v", closed)
	}
	if st := r.st.rollouts.runs["smol"].state; st.Status != rollout.Running || st.Step != 1 || len(st.History) != 1 {
		t.Fatalf("a clustered router decided: %+v", st)
	}
	r.advance(time.Hour)
	if len(closed) != 1 || r.st.rollouts.timer != nil {
		t.Fatalf("a closed window closed again (%d) or a timer is armed", len(closed))
	}
	// Counted after the close: the next window's, kept when the decider's state starts there.
	w.Observe("v4", false, 0)
	adv := rollout.Record{At: t0.Add(time.Minute), Decision: rollout.Advance, From: 50, To: 100}
	r.deliver(nil, &SetRolloutStates{Version: 9, Decider: "gw-2", States: storedAt(spec, rollout.Running, 2, t0.Add(time.Minute), past, adv)})
	if got := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues("smol", rollout.Advance)); got != 1 {
		t.Fatalf("advance decisions %v, want the new one", got)
	}
	if share, _ := canaryShare(r, 100); share != 1 {
		t.Fatalf("step 3: share %v", share)
	}
	r.advance(time.Hour) // due since t0+2m: closes at once
	if len(closed) != 2 || closed[1].canary.Requests != 1 || !closed[1].window.Equal(t0.Add(time.Minute)) {
		t.Fatalf("closed %+v", closed)
	}
	// A state that starts elsewhere (a resume): the counts start over.
	w.Observe("v4", false, 0)
	pause := rollout.Record{At: t0.Add(time.Hour), Decision: rollout.Pause}
	resume := rollout.Record{At: t0.Add(2 * time.Hour), Decision: rollout.Resume}
	r.deliver(nil, &SetRolloutStates{Version: 10, States: storedAt(spec, rollout.Running, 2, t0.Add(2*time.Hour), past, adv, pause, resume)})
	if got := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues("smol", rollout.Pause)); got != 0 {
		t.Fatalf("a pause counted as a decision: %v", got)
	}
	if c, _ := r.st.rollouts.runs["smol"].window.Take(); c.Requests != 0 {
		t.Fatalf("a resumed window kept %d requests", c.Requests)
	}
	// Not taken: another spec's state, a step the spec lacks.
	other := spec
	other.MinRequests++
	for _, states := range []map[string]rollout.Stored{storedAt(other, rollout.RolledBack, 0, t0), storedAt(spec, rollout.Running, 3, t0)} {
		r.deliver(nil, &SetRolloutStates{Version: 11, States: states})
		if st := r.st.rollouts.runs["smol"].state; st.Step != 2 || st.Status != rollout.Running {
			t.Fatalf("took %+v", states)
		}
	}
	// A rollback stored by the decider: the canary's share goes to 0.
	rb := rollout.Record{At: t0.Add(3 * time.Hour), Decision: rollout.Rollback, From: 100, To: 0}
	r.deliver(nil, &SetRolloutStates{Version: 12, States: storedAt(spec, rollout.RolledBack, 2, t0.Add(3*time.Hour), past, adv, pause, resume, rb)})
	if share, w := canaryShare(r, 100); share != 0 || w != nil {
		t.Fatalf("rolled back: share %v window %v", share, w != nil)
	}
	if got := testutil.ToFloat64(m.rolloutDecisions.WithLabelValues("smol", rollout.Rollback)); got != 1 {
		t.Fatalf("rollback decisions %v", got)
	}
}

// TestRolloutTableAfterTheStoredState ([cluster]): a rollout that appears in a table installed
// after the stored states came takes its stored state at once.
func TestRolloutTableAfterTheStoredState(t *testing.T) {
	routes := rolloutRoutes([]float64{10, 50, 100}, time.Minute)
	r := newRig(t, Config{Metrics: NewMetrics(nil), RolloutWindows: func(string, time.Time, rollout.Tally, rollout.Tally) {}})
	r.deliver(nil, &SetRolloutStates{Version: 3, States: storedAt(routes[0].Rollout.Spec(), rollout.Paused, 1, t0)})
	r.deliver(nil, &SetRoutes{Epoch: 2, Routes: routes})
	v := r.st.rollouts.view(r.st.table)
	if len(v.Rollouts) != 1 || v.Rollouts[0].Status != rollout.Paused || v.Rollouts[0].Percent != 50 || v.Version != 3 {
		t.Fatalf("view %+v", v)
	}
}
