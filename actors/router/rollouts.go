package router

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/rollout"
)

// rollouts runs the route table's progressive rollouts (R25): for each route with a rollout,
// its state (internal/rollout) and its window's counts, which every pick of the route carries
// to its requester. At each window's end on the injected clock (rolloutTick) the window is
// judged and the route's split set to the canary's new share. The router owns all of it: the
// split, the state and the decisions change only here.
type rollouts struct {
	clock     clock.Clock
	step      *prometheus.GaugeVec
	decisions *prometheus.CounterVec
	// runs by route id: bounded by the table's routes with a rollout.
	runs map[string]*rolloutRun
	// timer is the pending rolloutTick, due at armedFor (nil: none).
	timer    clock.Timer
	armedFor time.Time
	// version counts the changes of any rollout (RolloutsView.Version); in a cluster it is
	// the store's version of the stored states.
	version uint64

	// In a cluster (closeWindow set) the states live in etcd (adapters/cluster): this router
	// counts, closes each window at its end and hands its counts to closeWindow (the store
	// publishes them for the replica that decides), and follows the stored states the store
	// pushes (SetRolloutStates); it decides nothing itself.
	closeWindow func(route string, window time.Time, canary, baseline rollout.Tally)
	// stored are the states last pushed, by route id: bounded by the store (at most
	// config.MaxRollouts); decider is the replica that decides ("" while none is known).
	stored  map[string]rollout.Stored
	decider string
}

type rolloutRun struct {
	spec   rollout.Spec
	key    string // rollout.SpecKey(spec)
	state  rollout.State
	window *rollout.Window
	// closedFor is the window start of the window this replica closed and handed on (a
	// cluster's), until a state with another window start is taken.
	closedFor time.Time
	// adopted: state is a stored one (the decisions of a state taken later are counted).
	adopted bool
}

// rolloutTick is a rollout window's end on the clock.
type rolloutTick struct{}

// IgnoreDeadLetterLogging: the timer may fire as the router stops.
func (rolloutTick) IgnoreDeadLetterLogging() {}

// sync matches the runs to the table just set: a route whose rollout is unchanged keeps its
// state and window, a new or changed one starts at its first step now, a route without one
// loses its run. Then every route's split is set from its run (the table was compiled from
// the configured weights).
func (r *rollouts) sync(t *routeTable, log *slog.Logger) {
	now := r.clock.Now()
	next := make(map[string]*rolloutRun)
	for _, rc := range t.routes {
		if rc.Rollout == nil {
			continue
		}
		spec := rc.Rollout.Spec()
		run := r.runs[rc.Model]
		if run == nil || !sameSpec(run.spec, spec) {
			run = &rolloutRun{spec: spec, key: rollout.SpecKey(spec), state: rollout.Start(now), window: rollout.NewWindow(spec.Canary, spec.Baseline)}
			log.Info("rollout started", "route", rc.Model, "canary", spec.Canary, "baseline", spec.Baseline,
				"percent", run.state.Percent(spec))
		}
		next[rc.Model] = run
	}
	for id := range r.runs {
		if next[id] == nil {
			r.step.DeleteLabelValues(id)
		}
	}
	r.runs = next
	if r.closeWindow == nil {
		r.version++
	}
	for id, run := range r.runs {
		r.adopt(id, run, log)
		r.apply(t, id, run)
	}
}

// setStored takes the stored states a cluster's store pushes: each run whose spec they fit
// follows its stored state.
func (r *rollouts) setStored(m *SetRolloutStates, t *routeTable, log *slog.Logger) {
	r.stored, r.version, r.decider = m.States, m.Version, m.Decider
	for id, run := range r.runs {
		if r.adopt(id, run, log) {
			r.apply(t, id, run)
		}
	}
}

// adopt moves run to route id's stored state, when there is one for its spec that differs;
// it reports whether it did. The window goes on counting when the stored window starts where
// the one this replica closed ended (the decider judged it, and the counts since are the new
// window's); otherwise it starts over. The decisions the state brings are counted, except
// those of the first state taken (a restarted replica does not count the fleet's history).
func (r *rollouts) adopt(id string, run *rolloutRun, log *slog.Logger) bool {
	st, ok := r.stored[id]
	if !ok || !st.Fits(run.spec) || (run.adopted && st.State.Same(run.state)) {
		return false
	}
	if !st.State.WindowStart.Equal(run.state.WindowStart) {
		goesOn := !run.closedFor.IsZero() && run.closedFor.Equal(run.state.WindowStart) &&
			st.State.WindowStart.Equal(run.state.WindowStart.Add(run.spec.Interval))
		if !goesOn {
			run.window.Take()
		}
		run.closedFor = time.Time{}
	}
	if run.adopted {
		for _, rec := range st.State.After(run.state) {
			if rec.Counted() {
				r.decisions.WithLabelValues(id, rec.Decision).Inc()
			}
		}
	}
	run.state, run.adopted = st.State.Clone(), true
	log.Info("rollout state taken from the cluster store", "route", id, "status", run.state.Status,
		"percent", run.state.Percent(run.spec), "decider", r.decider)
	return true
}

func sameSpec(a, b rollout.Spec) bool {
	return a.Canary == b.Canary && a.Baseline == b.Baseline && slices.Equal(a.Steps, b.Steps) && a.Interval == b.Interval &&
		a.MinRequests == b.MinRequests && a.MaxErrorRatio == b.MaxErrorRatio && a.MaxTTFTP99Ratio == b.MaxTTFTP99Ratio &&
		a.MaxErrorRate == b.MaxErrorRate
}

// apply sets route id's split to its run's share: the canary gets the share, the baseline the
// rest, over the same draw of the request id (one request id, one backend within a step). An
// ended rollout's route carries no window.
func (r *rollouts) apply(t *routeTable, id string, run *rolloutRun) {
	rt := t.byName[id]
	if rt == nil {
		return
	}
	p := run.state.Percent(run.spec)
	rt.total, rt.backends = 0, rt.backends[:0]
	for _, b := range rt.cfg.Backends {
		w := b.Weight
		switch b.Model {
		case run.spec.Canary:
			w = p
		case run.spec.Baseline:
			w = 100 - p
		}
		rt.total += w
		rt.backends = append(rt.backends, backend{model: b.Model, cum: rt.total})
	}
	rt.window = run.window
	if run.state.Status.Ended() {
		rt.window = nil
	}
	r.step.WithLabelValues(id).Set(p)
}

// arm keeps one rolloutTick pending for the earliest running window's end.
func (r *rollouts) arm(fx effects) {
	var due time.Time
	for _, run := range r.runs {
		if run.state.Status != rollout.Running || (!run.closedFor.IsZero() && run.closedFor.Equal(run.state.WindowStart)) {
			continue
		}
		if end := run.state.WindowStart.Add(run.spec.Interval); due.IsZero() || end.Before(due) {
			due = end
		}
	}
	if due.Equal(r.armedFor) && (r.timer != nil) == !due.IsZero() {
		return
	}
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.armedFor = due
	if !due.IsZero() {
		r.timer = fx.after(max(due.Sub(r.clock.Now()), 0), rolloutTick{})
	}
}

// tick judges every window that has ended.
func (r *rollouts) tick(_ rolloutTick, t *routeTable, log *slog.Logger) {
	r.timer, r.armedFor = nil, time.Time{}
	now := r.clock.Now()
	for id, run := range r.runs {
		if !run.state.Due(run.spec, now) || (!run.closedFor.IsZero() && run.closedFor.Equal(run.state.WindowStart)) {
			continue
		}
		canary, baseline := run.window.Take()
		if r.closeWindow != nil {
			// A cluster's: the counts go to the replica that decides.
			r.closeWindow(id, run.state.WindowStart, canary, baseline)
			run.closedFor = run.state.WindowStart
			continue
		}
		rec := run.state.Decide(run.spec, now, canary.Counts(), baseline.Counts())
		r.decisions.WithLabelValues(id, rec.Decision).Inc()
		r.version++
		log.Info("rollout decision", "route", id, "decision", rec.Decision, "reason", rec.Reason, "from", rec.From, "to", rec.To,
			"canary_requests", rec.Canary.Requests, "canary_errors", rec.Canary.Errors, "canary_ttft_p99_ms", rec.Canary.TTFTP99Ms,
			"baseline_requests", rec.Baseline.Requests, "baseline_errors", rec.Baseline.Errors, "baseline_ttft_p99_ms", rec.Baseline.TTFTP99Ms)
		r.apply(t, id, run)
	}
}

// act applies an operator's action; the answer is the rollout's view or an error.
func (r *rollouts) act(m *RolloutAction, t *routeTable, log *slog.Logger) any {
	run := r.runs[m.Route]
	if run == nil {
		return fmt.Errorf("no rollout on route %s: %w", errs.Echo(m.Route), errs.ErrNotFound)
	}
	if m.IfMatch != nil && *m.IfMatch != r.version {
		return fmt.Errorf("the rollouts are at version %d, If-Match names %d: %w", r.version, *m.IfMatch, errs.ErrEtagMismatch)
	}
	if m.Action == rollout.Resume && run.state.Status == rollout.Paused {
		run.window.Take() // what was counted while paused is not the new window's
	}
	rec, did, err := run.state.Act(run.spec, m.Action, r.clock.Now())
	if err != nil {
		return fmt.Errorf("route %s: %v: %w", errs.Echo(m.Route), err, errs.ErrInvalidRequest)
	}
	if did {
		r.version++
		if m.Action == rollout.Promote || m.Action == rollout.Abort {
			r.decisions.WithLabelValues(m.Route, m.Action).Inc()
		}
		log.Info("rollout action", "route", m.Route, "action", m.Action, "from", rec.From, "to", rec.To)
		r.apply(t, m.Route, run)
	}
	v := r.viewOf(m.Route, run)
	return &v
}

// view is every rollout's view.
func (r *rollouts) view(*routeTable) *RolloutsView {
	out := &RolloutsView{Version: r.version, Decider: r.decider, Rollouts: make([]RolloutView, 0, len(r.runs))}
	for id, run := range r.runs {
		out.Rollouts = append(out.Rollouts, r.viewOf(id, run))
	}
	sort.Slice(out.Rollouts, func(i, j int) bool { return out.Rollouts[i].Route < out.Rollouts[j].Route })
	return out
}

func (r *rollouts) viewOf(id string, run *rolloutRun) RolloutView {
	return RolloutView{Route: id, Canary: run.spec.Canary, Baseline: run.spec.Baseline, Steps: slices.Clone(run.spec.Steps),
		Percent: run.state.Percent(run.spec), Status: run.state.Status, Step: run.state.Step,
		WindowStart: run.state.WindowStart, WindowEnd: run.state.WindowStart.Add(run.spec.Interval),
		StepInterval: run.spec.Interval.String(), History: slices.Clone(run.state.History), Version: r.version}
}
