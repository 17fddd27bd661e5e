package router

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// AdmissionConfig turns the admission queue on (R10).
type AdmissionConfig struct {
	Queue         admission.Config // Now and OnDecision are set by the router
	BusyThreshold int64            // a worker is full at this load; 0 = never
	PolicyName    string           // for the gate metric's label
}

// admitter is the router's admission concern: the queue, the admitted requests by internal
// key, and the queue's host over the worker view.
//
// An admitted request is known from its first pick until its request actor says it ended
// (Finished, sent once from its finish or, after a crash, from its stop): that cancels it if
// it still waits, or completes its turn for the gate, with what its answer cost. So a request
// that ends in any way — answered, crashed, client gone — ends its turn exactly once, without
// a watch per request.
//
// Bounds (R19): entries holds one admitted request from its first pick until its Finished or
// its rejection, so it is bounded by the live admitted requests and empty once they have all
// ended (TestRouterTablesEmptyAfterRequests); the queue's own tables follow its queued
// requests (admission.Queue).
type admitter struct {
	q         *admission.Queue
	view      *workerView
	threshold int64
	entries   map[uint64]*admitted // by request key: the live admitted requests (see above)
	clock     clock.Clock
	armed     time.Time   // when the one queue timer fires (zero: none)
	timer     clock.Timer // that timer, stopped when an earlier time is asked
	metrics   admissionMetrics
	policy    string
	// The queue's Host and a head's View, reused: the router handles one message at a time
	// and the queue keeps neither past the call, so they need no allocation per request.
	h  host
	hv view
	// decided counts the gate's decisions (go, hold) for the policy, resolved once.
	decided [2]prometheus.Counter
	// lengthGauges are the queue-length gauges in the order the queue reports them (gauges):
	// at most configured classes × lane kinds.
	lengthGauges []lengthGauge
	// progs is the policy's programs and their metrics; nil when the policy keeps none.
	progs *programTracker
	// now is the instant of the message at hand (read once per message in host): every head
	// asked for one message sees the same time, so a gate settles its state once for all of
	// them (thunderagent), not once per head.
	now time.Time
	// pending is the workers whose load fell since the queue was last woken for them
	// (wakeFreed; at most one entry per live worker), and wakeSent that an admWake is on its
	// way to flush them.
	pending  []string
	wakeSent bool
	// freed is pending's routable workers while they are woken, for serves, a method value
	// made once: a wake allocates nothing.
	freed  []*slot
	serves func(*admission.Entry) bool
}

// host returns the queue's Host for the message at hand, whose effects are fx.
func (a *admitter) host(fx effects) *host {
	a.h = host{a, fx}
	a.now = a.clock.Now()
	return &a.h
}

// admitted is one admitted request.
type admitted struct {
	e         *admission.Entry // &entry
	requester *actor.PID
	pick      *Pick     // its latest pick: the answer carries that pick's tag
	target    target    // what its first pick resolved to
	pinned    string    // the worker holding the stored response it continues ("" = none)
	arrived   time.Time // its first pick: an objective (Request.Objective) counts from it
	// The queue's entry and request, in the same allocation.
	entry admission.Entry
	req   admission.Request
}

// admTick is the queue's timer firing.
type admTick struct{}

// admWake flushes the capacity frees recorded by wakeFreed (sent to the router itself, so it
// comes after the reports already in its mailbox).
type admWake struct{}

func newAdmitter(cfg *AdmissionConfig, clk clock.Clock, m admissionMetrics, v *workerView) *admitter {
	a := &admitter{view: v, threshold: cfg.BusyThreshold, entries: make(map[uint64]*admitted),
		clock: clk, metrics: m, policy: cfg.PolicyName}
	qc := cfg.Queue
	qc.Now = clk.Now
	qc.Unbounded = cfg.BusyThreshold <= 0
	a.decided = [2]prometheus.Counter{m.gateDecisions.WithLabelValues(a.policy, "go"), m.gateDecisions.WithLabelValues(a.policy, "hold")}
	qc.OnDecision = func(d admission.Decision) {
		if d.Go {
			a.decided[0].Inc()
		} else {
			a.decided[1].Inc()
		}
	}
	a.q = admission.New(qc)
	a.progs = newProgramTracker(qc.Policy, &a.metrics)
	a.serves = a.servesFreed
	return a
}

// pick handles a pick of an admitted request: the first of its key is admitted; later ones
// keep what it was admitted with. A continuation of a stored response (Pick.Response) is
// admitted to its worker's pool with that worker alone as its candidate (admitted.pinned).
func (a *admitter) pick(st *state, m *Pick, fx effects) {
	resolve := func() (target, string) {
		if m.Response == "" {
			return st.table.resolve(m, a.view), ""
		}
		t, s := st.pinnedTarget(m)
		if s == nil {
			return t, ""
		}
		return t, s.info.ID
	}
	if m.Key == 0 || m.Requester == nil {
		fx.respond(&Picked{Tag: m.Tag, Err: fmt.Errorf("an admitted pick needs a key and a requester: %w", errs.ErrInternal)})
		return
	}
	if ad := a.entries[m.Key]; ad != nil {
		ad.pick = m
		if ad.e.Queued() {
			fx.send(m.Requester, &Queued{Tag: m.Tag}) // a repeated pick: answered when it leaves
			return
		}
		t, _ := resolve()
		a.repick(t, ad, fx)
		return
	}
	t, pinned := resolve()
	if t.out.Err == nil && !a.view.servable(t.key, t.disagg) {
		t.out.Err = t.noCapacity() // nothing could serve it: at once, as without admission
	}
	if t.out.Err != nil {
		fx.send(m.Requester, t.out)
		return
	}
	pl := a.view.pools[t.key]
	ad := &admitted{requester: m.Requester, pick: m, target: t, pinned: pinned,
		req: admission.Request{Key: m.Key, ID: m.RequestID, Class: m.Admit.Class,
			SessionID: m.Admit.SessionID, PromptTokens: m.Admit.PromptTokens, OutputTokens: m.Admit.OutputTokens,
			APIKey: m.Admit.APIKey, Final: m.Admit.Final}}
	if _, ok := pl.p.(policy.LatencyScorer); ok && m.SLOTTFTMs > 0 && !t.disagg {
		// R18.4 with admission: dispatched only to a worker predicted to meet what is left of
		// the objective; it waits for one, at most until the objective has passed.
		ad.req.Objective, ad.arrived = time.Duration(m.SLOTTFTMs)*time.Millisecond, a.clock.Now()
	}
	route := pl.memberIDs()
	if pinned != "" {
		route = []string{pinned}
	}
	ad.entry = admission.Entry{Req: &ad.req, Route: route, Pool: pl.name, Payload: ad}
	ad.e = &ad.entry
	a.entries[m.Key] = ad
	a.q.Admit(ad.e, a.host(fx), func(workers []string) int {
		if a.view.pidx == nil || len(m.PrefixHashes) == 0 {
			return 0
		}
		_, chunks := a.view.pidx.Best(workers, m.PrefixHashes)
		return chunks * prefixindex.ChunkBytes / 4 // tokens, at ~4 bytes a token
	})
	if ad.e.Queued() {
		fx.send(m.Requester, &Queued{Tag: m.Tag}) // the requester waits without a pick timeout
	}
	a.gauges()
}

// repick answers a later pick of a dispatched request: any worker of its allowed set (the
// busy threshold is not asked again: the request holds its turn), and the gate's bookkeeping
// follows the worker used.
func (a *admitter) repick(t target, ad *admitted, fx effects) {
	out := t.out
	if out.Err == nil {
		ch := a.choice(ad, t, "", false)
		if !a.view.choose(ch, out, fx) && out.Err == nil {
			out.Err = t.noCapacity()
		}
	}
	if out.Err == nil {
		out.Admitted = true
		a.q.Moved(ad.e, out.WorkerID)
	}
	fx.send(ad.requester, out)
}

// allowedIn is the request's allowed set within the pool of key: all members when it has no
// narrowing; else the allowed members — strictly so in the pool it was admitted to (Cold Pool
// containment), while another pool (a later cascade step) with none of them is taken whole
// (R10.1: an empty intersection keeps the route's).
func (a *admitter) allowedIn(ad *admitted, key poolKey) []string {
	pl := a.view.pools[key]
	if pl == nil {
		return nil
	}
	if ad.pinned != "" {
		if pl.members[ad.pinned] == nil {
			return []string{}
		}
		return []string{ad.pinned}
	}
	members := pl.memberIDs()
	if ad.e.Req.Allowed == nil {
		return members
	}
	var out []string
	for _, id := range ad.e.Req.Allowed {
		if pl.members[id] != nil {
			out = append(out, id)
		}
	}
	if out == nil && key != ad.target.key {
		return members
	}
	slices.Sort(out)
	return out
}

// choice is the view's choice for an admitted request's pick: its exclusions plus the pool
// members it may not use (and, from the queue, those that are full).
func (a *admitter) choice(ad *admitted, t target, soft string, checkFull bool) choice {
	exclude := ad.pick.Exclude
	pl := a.view.pools[t.key]
	restricted, full := ad.e.Req.Allowed != nil || ad.pinned != "", checkFull && a.threshold > 0
	if pl != nil && (restricted || full) {
		var allowed map[string]bool
		if restricted {
			ids := a.allowedIn(ad, t.key)
			allowed = make(map[string]bool, len(ids))
			for _, id := range ids {
				allowed[id] = true
			}
		}
		exclude = slices.Clone(exclude)
		for id, s := range pl.members {
			if (restricted && !allowed[id]) || (full && a.full(s)) {
				exclude = append(exclude, id)
			}
		}
	}
	ch := choice{key: t.key, disagg: t.disagg, prefixHash: ad.pick.PrefixHash, hashes: ad.pick.PrefixHashes, tokens: ad.pick.TokenIDs,
		exclude: exclude, soft: soft, requester: ad.requester, sloMs: ad.pick.SLOTTFTMs,
		endpoint: t.endpoint, adapter: t.adapter, load: t.load}
	if checkFull && ad.req.Objective > 0 {
		// A dispatch from the queue: what is left of the objective, in whole milliseconds
		// (none left: nothing is in time, and its deadline rejects it).
		ch.strict = true
		ch.sloMs = max((ad.req.Objective - a.clock.Now().Sub(ad.arrived)).Milliseconds(), 0)
	}
	return ch
}

func (a *admitter) full(s *slot) bool { return a.threshold > 0 && s.load() >= a.threshold }

// finished ends an admitted request its request actor says ended: cancelled if it still
// waits, completed for the gate (with its answer's cost and outcome) if it was dispatched.
// Only the request's own actor can end it: the key is the router's internal id, never a
// client's string.
func (a *admitter) finished(m *Finished, fx effects) {
	if a == nil {
		return
	}
	ad, ok := a.entries[m.Key]
	if !ok {
		return
	}
	a.forget(m.Key)
	ad.req.ContextTokens, ad.req.Aborted = int(min(max(m.Tokens, 0), maxContextTokens)), m.Aborted
	if h := a.host(fx); !a.q.Cancel(ad.e, h) {
		a.q.Completed(ad.e, h)
	}
	a.gauges()
}

// maxContextTokens bounds what an answer's usage can add to a program's context (an engine's
// usage is its own claim): far above any model's context window.
const maxContextTokens = 1 << 30

func (a *admitter) forget(key uint64) {
	delete(a.entries, key)
}

func (a *admitter) tick(fx effects) {
	if a == nil {
		return
	}
	a.armed, a.timer = time.Time{}, nil
	a.q.Tick(a.host(fx))
	a.gauges()
}

// wakeCapacity tells the queue that room may have freed.
func (a *admitter) wakeCapacity(fx effects) {
	if a != nil && a.q.Len() > 0 {
		a.q.WakeCapacity(a.host(fx))
		a.gauges()
	}
}

// wakeFreed records that worker id's load fell (a report after a release, a heartbeat). The
// queue is woken for it once per run of such reports — by an admWake sent to the router
// itself, or earlier by the next message of another kind (flush) — so a burst of completions
// asks each held head once, not once per completion; and then only the heads that could be
// sent to a worker that freed (a worker outside every pool — draining, ejected, gone — frees
// nothing a head can use).
func (a *admitter) wakeFreed(id string, fx effects) {
	if a == nil || a.q.Len() == 0 {
		return
	}
	if !slices.Contains(a.pending, id) {
		a.pending = append(a.pending, id)
	}
	if !a.wakeSent {
		a.wakeSent = true
		fx.later(admWake{})
	}
}

// woken handles the admWake wakeFreed sent.
func (a *admitter) woken(fx effects) {
	if a == nil {
		return
	}
	a.wakeSent = false
	a.flush(fx)
}

// flush wakes the queue for the workers whose load fell since it was last woken (wakeFreed).
func (a *admitter) flush(fx effects) {
	if a == nil || len(a.pending) == 0 {
		return
	}
	for _, id := range a.pending {
		if s := a.view.slots[id]; s != nil && s.pool != nil {
			a.freed = append(a.freed, s)
		}
	}
	a.pending = a.pending[:0]
	if len(a.freed) > 0 && a.q.Len() > 0 {
		a.q.WakeCapacityFor(a.host(fx), a.serves)
		a.gauges()
	}
	clear(a.freed)
	a.freed = a.freed[:0]
}

// servesFreed reports whether head e could be sent to a worker whose load fell: a member of
// its pool within its allowed set, or (a disaggregated route) of its model's prefill pool. Its
// pick's exclusions are not read (see admission.Queue.WakeCapacityFor).
func (a *admitter) servesFreed(e *admission.Entry) bool {
	ad := e.Payload.(*admitted)
	for _, s := range a.freed {
		if s.pool.key == ad.target.key && (ad.pinned == "" || ad.pinned == s.info.ID) {
			if e.Req.Allowed == nil || slices.Contains(e.Req.Allowed, s.info.ID) {
				return true
			}
		} else if ad.target.disagg && s.pool.key == (poolKey{model: ad.target.key.model, role: RolePrefill}) {
			return true
		}
	}
	return false
}

// wakeAll tells the queue that workers came, went or changed: every held head is asked again,
// which covers the capacity frees not yet woken for.
func (a *admitter) wakeAll(fx effects) {
	if a != nil {
		a.pending = a.pending[:0]
	}
	if a != nil && a.q.Len() > 0 {
		a.q.Wake(a.host(fx))
		a.gauges()
	}
}

func (a *admitter) queueView() *QueueView {
	if a == nil {
		return &QueueView{}
	}
	return &QueueView{Enabled: true, Snapshot: a.q.Snapshot()}
}

// gauges refreshes the queue-length gauges, and the program series of a policy that keeps
// programs. It runs twice per admitted request: the gauges
// are resolved once and kept in the order the queue reports them (a class or kind that is not
// where it was is resolved again).
func (a *admitter) gauges() {
	i := 0
	a.q.Lengths(func(class, kind string, n int) {
		if i == len(a.lengthGauges) {
			a.lengthGauges = append(a.lengthGauges, lengthGauge{})
		}
		lg := &a.lengthGauges[i]
		if lg.g == nil || lg.class != class || lg.kind != kind {
			*lg = lengthGauge{class: class, kind: kind, g: a.metrics.queueLength.WithLabelValues(class, kind)}
		}
		lg.g.Set(float64(n))
		i++
	})
	if a.progs != nil {
		a.progs.refresh()
	}
}

// lengthGauge is one queue-length gauge, resolved.
type lengthGauge struct {
	class, kind string
	g           prometheus.Gauge
}

// host adapts the admitter to admission.Host for the duration of one message.
type host struct {
	a  *admitter
	fx effects
}

var _ admission.Host = (*host)(nil)

// view is a head's candidate workers with their loads, and its pool's routable workers.
type view struct {
	workers []admission.Worker
	pool    []string // the pool's memberIDs (shared, read only; nil: no routable worker)
	now     time.Time
}

var _ admission.PoolView = (*view)(nil)

func (v *view) Workers() []admission.Worker { return v.workers }
func (v *view) PoolWorkers() []string       { return v.pool }
func (v *view) Now() time.Time              { return v.now }

// View implements admission.Host: the head's allowed members of its pool now, none when its
// pool (or a disaggregated route's prefill pool) has no worker.
func (h host) View(e *admission.Entry) admission.View {
	a, ad := h.a, e.Payload.(*admitted)
	v := &a.hv // the queue reads it during the call only
	v.workers, v.pool, v.now = v.workers[:0], nil, a.now
	pl := a.view.pools[ad.target.key]
	if pl != nil {
		v.pool = pl.memberIDs() // also when the route is not servable: its workers are not gone
	}
	if !a.view.servable(ad.target.key, ad.target.disagg) {
		return v
	}
	for _, id := range a.allowedIn(ad, ad.target.key) {
		if s := pl.members[id]; s != nil && !slices.Contains(ad.pick.Exclude, id) {
			v.workers = append(v.workers, admission.Worker{ID: id, Load: s.load(), Full: a.full(s),
				Capacity: s.info.KVCapacityTokens()})
		}
	}
	return v
}

// Dispatch implements admission.Host: the pick among the allowed candidates that are not
// full, the gate's soft target first, answered to the requester.
func (h host) Dispatch(e *admission.Entry, soft string) (string, bool) {
	a, ad := h.a, e.Payload.(*admitted)
	out := *ad.target.out
	out.Tag = ad.pick.Tag
	if !a.view.servable(ad.target.key, ad.target.disagg) || !a.view.choose(a.choice(ad, ad.target, soft, true), &out, h.fx) {
		return "", false
	}
	out.Admitted = true
	if !e.Enqueued().IsZero() {
		a.metrics.queueWait.WithLabelValues(e.Req.Class).Observe(a.clock.Now().Sub(e.Enqueued()).Seconds())
	}
	h.fx.send(ad.requester, &out)
	return out.WorkerID, true
}

// Reject implements admission.Host.
func (h host) Reject(e *admission.Entry, err error) {
	a, ad := h.a, e.Payload.(*admitted)
	out := *ad.target.out
	out.Tag = ad.pick.Tag
	var reason string
	switch {
	case errors.Is(err, admission.ErrQueueTimeout) && e.Req.Objective > 0 && a.clock.Now().Sub(ad.arrived) >= e.Req.Objective:
		// R18.4: no worker was predicted to meet its objective before it passed.
		reason = "slo_unmet"
		out.Err = fmt.Errorf("no worker was predicted to answer within the request's TTFT objective of %d ms: %w",
			e.Req.Objective.Milliseconds(), errs.ErrQueueTimeout)
	case errors.Is(err, admission.ErrQueueTimeout):
		reason = "queue_timeout"
		out.Err = fmt.Errorf("the request waited its class's max_wait in the %q queue: %w", e.Req.Class, errs.ErrQueueTimeout)
	case errors.Is(err, admission.ErrClassifierFailed):
		// R15.3: the policy panicked on this request; the class may not be resolved yet.
		reason = "classifier_failed"
		out.Err = fmt.Errorf("the admission classifier failed on this request: %w", errs.ErrInternal)
	case err != admission.ErrQueueFull && errors.Is(err, admission.ErrQueueFull):
		// The classifier's own refusal (Request.Refuse, e.g. a program limit): still 429
		// queue_full, but the client reads the policy's reason, not a queue limit.
		reason = "refused"
		out.Err = fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+admission.ErrQueueFull.Error()), errs.ErrQueueFull)
	default:
		reason = "queue_full"
		out.Err = fmt.Errorf("the %q queue is full: %w", e.Req.Class, errs.ErrQueueFull)
	}
	a.metrics.queueRejections.WithLabelValues(e.Req.Class, reason).Inc()
	a.forget(e.Req.Key)
	h.fx.send(ad.requester, &out)
}

// ArmTimer implements admission.Host: one clock timer, for the earliest time asked (a timer
// for a later time is stopped, so no stale tick wakes the queue).
func (h host) ArmTimer(at time.Time) {
	a := h.a
	now := a.clock.Now()
	if !a.armed.IsZero() && a.armed.After(now) && !at.Before(a.armed) {
		return
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	a.armed = at
	a.timer = h.fx.after(at.Sub(now), admTick{})
}

// admissionMetrics are the queue's series (R11). Their labels are bounded sets: class is a
// configured class (the HTTP adapter refuses an X-TL-Class naming none, and the queue puts an
// unknown one in the default class), lane_kind, decision and reason are fixed, policy is the
// configured classifier's name.
type admissionMetrics struct {
	queueLength     *prometheus.GaugeVec
	queueWait       *prometheus.HistogramVec
	gateDecisions   *prometheus.CounterVec
	queueRejections *prometheus.CounterVec
	// The program series (R15.1) are registered, and the three states resolved at 0, whatever
	// the policy: every gateway exports them, and only a policy that keeps programs (a
	// programLister: thunderagent) moves them.
	programs             *prometheus.GaugeVec // by state
	programPauses        prometheus.Counter
	programForcedResumes prometheus.Counter
}

func newAdmissionMetrics() admissionMetrics {
	m := admissionMetrics{
		queueLength: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tlgw_queue_length", Help: "Requests waiting in the admission queue by class and lane kind.",
		}, []string{"class", "lane_kind"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tlgw_queue_wait_seconds", Help: "Time queued requests waited before dispatch.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"class"}),
		gateDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_gate_decisions_total", Help: "Dispatch gate answers by policy and decision (go, hold).",
		}, []string{"policy", "decision"}),
		queueRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_queue_rejections_total", Help: "Requests the queue rejected by class and reason (queue_full, queue_timeout, slo_unmet, classifier_failed, refused).",
		}, []string{"class", "reason"}),
		programs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tlgw_programs", Help: "Agent programs the admission classifier keeps, by state (reasoning, acting, paused).",
		}, []string{"state"}),
		programPauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tlgw_program_pauses_total", Help: "Agent programs paused because their worker's programs outgrew its KV capacity.",
		}),
		programForcedResumes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tlgw_program_forced_resumes_total", Help: "Paused agent programs resumed after resume_timeout, room or not.",
		}),
	}
	for _, s := range programStates {
		m.programs.WithLabelValues(s)
	}
	return m
}
