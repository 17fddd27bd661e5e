package router

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/coldpool"
	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
)

// checkedPolicy wraps a policy (nil: the default classifier) and checks the gate's contract
// as the queue drives it: the gate's bookkeeping per request key, one turn per session under
// session_serial, containment to the allowed set, and nothing dispatched over the threshold.
type checkedPolicy struct {
	inner   admission.Policy
	gate    admission.Gate
	serial  bool // the policy is session_serial: at most one turn in flight per session
	r       *rig // for the loads of the router's view
	asks    int
	base    int                           // asks before the step at hand
	limit   int                           // asks allowed in one step (0 = no limit)
	running map[uint64]*admission.Request // dispatched, not completed
	on      map[uint64]string             // where each runs
	events  map[uint64][]string
	fail    func(format string, args ...any)
	tw      *thunderWatch // the thunderagent policy's own checks (nil: another policy)
}

var (
	_ admission.Policy        = (*checkedPolicy)(nil)
	_ admission.Gate          = (*checkedPolicy)(nil)
	_ admission.QueueObserver = (*checkedPolicy)(nil)
	_ admission.LaneLimiter   = (*checkedPolicy)(nil)
)

func checked(inner admission.Policy) *checkedPolicy {
	p := &checkedPolicy{inner: inner, running: map[uint64]*admission.Request{}, on: map[uint64]string{},
		events: map[uint64][]string{}}
	if inner != nil {
		p.gate = inner.Gate()
	}
	_, p.serial = inner.(*sessionserial.Policy)
	return p
}

func (p *checkedPolicy) Classify(r *admission.Request, route []string, cached func([]string) int) {
	if p.tw != nil {
		p.tw.classify(p, r, route, cached)
		return
	}
	if p.inner != nil {
		p.inner.Classify(r, route, cached)
	}
}
func (p *checkedPolicy) Gate() admission.Gate { return p }
func (p *checkedPolicy) Check(r *admission.Request, v admission.View) admission.Decision {
	p.asks++
	if p.limit > 0 && p.asks-p.base > p.limit && p.fail != nil {
		p.fail("one message asked the gate more than %d times: the router loops", p.limit) // never returns
	}
	if p.gate == nil {
		return admission.Decision{Go: true}
	}
	d := p.gate.Check(r, v)
	if p.tw != nil {
		p.tw.checked(r, d)
	}
	return d
}

func (p *checkedPolicy) placed(r *admission.Request, w string) {
	if r.Allowed != nil && !slices.Contains(r.Allowed, w) && p.fail != nil {
		p.fail("request %d (%s) placed on %s outside its allowed set %v", r.Key, r.Tag, w, r.Allowed)
	}
}

func (p *checkedPolicy) Dispatched(r *admission.Request, w string) {
	p.events[r.Key] = append(p.events[r.Key], "dispatched "+w)
	if _, dup := p.running[r.Key]; dup && p.fail != nil {
		p.fail("request %d dispatched twice", r.Key)
	}
	if p.serial && r.SessionID != "" && p.fail != nil {
		for _, o := range p.running {
			if o.SessionID == r.SessionID {
				p.fail("session %q has two turns in flight (%d and %d)", r.SessionID, o.Key, r.Key)
			}
		}
	}
	if p.r != nil && p.r.st.adm.threshold > 0 && p.fail != nil {
		// Dispatched runs after the pick reserved the worker: its load then is at most the
		// threshold exactly when it was under it before.
		if s := p.r.st.view.slots[w]; s != nil && s.load() > p.r.st.adm.threshold {
			p.fail("request %d dispatched to %s at load %d over threshold %d", r.Key, w, s.load()-1, p.r.st.adm.threshold)
		}
	}
	if p.tw != nil {
		p.tw.dispatched(p, r)
	}
	p.placed(r, w)
	p.running[r.Key], p.on[r.Key] = r, w
	if p.gate != nil {
		p.gate.Dispatched(r, w)
	}
}

func (p *checkedPolicy) Moved(r *admission.Request, from, to string) {
	p.events[r.Key] = append(p.events[r.Key], "moved "+from+" "+to)
	if p.on[r.Key] != from && p.fail != nil {
		p.fail("request %d moved from %s but runs on %s", r.Key, from, p.on[r.Key])
	}
	p.on[r.Key] = to
	if p.gate != nil {
		p.gate.Moved(r, from, to)
	}
}

func (p *checkedPolicy) Completed(r *admission.Request, w string) {
	p.events[r.Key] = append(p.events[r.Key], "completed "+w)
	if _, ok := p.running[r.Key]; !ok && p.fail != nil {
		p.fail("request %d completed but not running", r.Key)
	}
	delete(p.running, r.Key)
	delete(p.on, r.Key)
	if p.gate != nil {
		p.gate.Completed(r, w)
	}
}

func (p *checkedPolicy) Recheck() time.Duration {
	if p.gate == nil {
		return 0
	}
	return p.gate.Recheck()
}

func (p *checkedPolicy) Enqueued(r *admission.Request) {
	if o, ok := p.inner.(admission.QueueObserver); ok {
		o.Enqueued(r)
	}
}

func (p *checkedPolicy) Left(r *admission.Request) {
	if o, ok := p.inner.(admission.QueueObserver); ok {
		o.Left(r)
	}
}

func (p *checkedPolicy) LaneLimits() map[string]admission.LaneLimit {
	if l, ok := p.inner.(admission.LaneLimiter); ok {
		return l.LaneLimits()
	}
	return nil
}

// modelRequest is the model's record of one request actor.
type modelRequest struct {
	q        *requester
	model    string
	session  string
	id       string
	prompt   int
	apiKey   int  // the API key it came with: the queue's and the policies' per-key shares
	final    bool // the session's last turn (thunderagent runs only)
	exclude  []string
	outcome  int     // answers that ended its admission (a *Picked to its first pick)
	holding  *Picked // the pick whose tickets it holds
	answered map[uint64]int
}

// TestAdmissionRouterModel drives the real router logic (route table, worker view, admitter,
// queue and the registered classifiers) through random sequences — admit, finish, cancel,
// failover, repeated picks, duplicate request ids, workers joining, leaving, draining and
// changing load, the clock moving — and checks after every step: no message does unbounded
// work, every request gets exactly one outcome, nothing dispatched over busy_threshold, one
// turn per session under session_serial, Cold only on its pool, the router's in-flight
// figures equal the workers' own; and once everything has ended, an empty queue and every
// ledger and count at zero. RAPID_CHECKS=100000 runs it long (go test -run
// TestAdmissionRouterModel ./actors/router/ -rapid.checks=100000 does the same).
func TestAdmissionRouterModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		kind := rapid.SampledFrom([]string{"default", "session_serial", "cold_pool", "cold_pool_baseline"}).Draw(rt, "classifier")
		threshold := rapid.Int64Range(0, 2).Draw(rt, "busy_threshold")
		var inner admission.Policy
		switch kind {
		case "session_serial":
			inner = sessionserial.New()
		case "cold_pool", "cold_pool_baseline":
			workers := 1
			if kind == "cold_pool_baseline" {
				workers = 0
			}
			inner = coldpool.New(coldpool.Config{ColdThresholdTokens: 100, Workers: workers,
				SoftDrainTimeout: time.Duration(rapid.IntRange(0, 2).Draw(rt, "soft_drain_s")) * time.Second,
				SteerWarm:        rapid.Bool().Draw(rt, "steer_warm"), QueueLimit: 4, MaxWait: 5 * time.Second}, nil)
		}
		runRouterModel(rt, checked(inner), threshold)
	})
}

// runRouterModel runs one sequence of the model with pol and busy threshold.
func runRouterModel(rt *rapid.T, pol *checkedPolicy, threshold int64) {
	cfg := admissionCfg(pol, threshold)
	cfg.Queue.Classes = []admission.ClassConfig{
		{Name: "default", Quantum: 2, QueueLimit: 6, MaxWait: 10 * time.Second},
		{Name: "batch", Quantum: 1, QueueLimit: rapid.IntRange(0, 3).Draw(rt, "batch_limit"), MaxWait: 4 * time.Second},
	}
	r := newRig(rt, Config{Admission: cfg, Routes: []config.Route{routeOf("r", "nobody")}})
	pol.r = r
	if pol.tw != nil {
		pol.tw.r = r
	}
	r.onMessage = func() { pol.base = pol.asks }
	pol.fail = func(format string, args ...any) { rt.Fatalf(format, args...) }
	m := &routerModel{r: r, pol: pol, t: rt, tw: pol.tw}
	actions := map[string]func(*rapid.T){
		"admit":    m.admit,
		"finish":   m.finish,
		"cancel":   m.cancel,
		"failover": m.failover,
		"repeat":   m.repeat,
		"join":     m.join,
		"leave":    m.leave,
		"drain":    m.drain,
		"advance":  m.advance,
		"":         m.check,
	}
	if m.tw != nil {
		m.thunderActions(actions)
	}
	rt.Repeat(actions)
	m.drainAll()
}

type routerModel struct {
	r    *rig
	pol  *checkedPolicy
	t    *rapid.T
	reqs []*modelRequest
	ids  int
	tw   *thunderWatch // thunderagent runs: its sessions, capacities and ends
}

var modelWorkers = []string{"a1", "a2", "a3", "b1", "b2"}

func modelOf(id string) string { return id[:1] }

func (m *routerModel) live() []*modelRequest {
	var out []*modelRequest
	for _, q := range m.reqs {
		if q.q != nil {
			out = append(out, q)
		}
	}
	return out
}

// collect reads the answers of every live request and checks them. A request answered an
// error ends, as its actor does.
func (m *routerModel) collect() {
	var ended []*modelRequest
	defer func() {
		for _, q := range ended {
			m.stop(q)
		}
	}()
	for _, q := range m.live() {
		for _, a := range q.q.answers() {
			switch v := a.(type) {
			case *Queued:
				if m.tw != nil && m.tw.refused[q.q.key] {
					m.t.Fatalf("request %d refused by the policy but queued", q.q.key)
				}
				if q.outcome > 0 {
					m.t.Fatalf("request %d queued after its outcome", q.q.key)
				}
			case *Picked:
				if m.tw != nil && m.tw.refused[q.q.key] && !errors.Is(v.Err, errs.ErrQueueFull) {
					m.t.Fatalf("request %d refused by the policy answered %v, want queue_full", q.q.key, v.Err)
				}
				q.answered[v.Tag]++
				if q.answered[v.Tag] > 1 {
					m.t.Fatalf("request %d answered twice for pick %d", q.q.key, v.Tag)
				}
				if q.outcome == 0 {
					q.outcome++
				}
				if v.Err != nil && v.Tag == q.q.tag {
					ended = append(ended, q)
				}
				if v.Err == nil {
					if v.Tag != q.q.tag || q.holding != nil {
						q.q.release(v) // a late answer (or one it does not need): given back
						continue
					}
					q.holding = v
				}
			default:
				m.t.Fatalf("request %d got %T", q.q.key, a)
			}
		}
	}
}

func (m *routerModel) admit(t *rapid.T) {
	if len(m.live()) >= 12 {
		return // enough requests live
	}
	m.ids++
	sessions, prompts := []string{"", "", "s1", "s2"}, []int{10, 1000}
	if m.tw != nil {
		sessions, prompts = thunderSessions, thunderPrompts
	}
	q := &modelRequest{q: m.r.newRequester(), answered: map[uint64]int{},
		model:   rapid.SampledFrom([]string{"a", "a", "b", "r", "zzz"}).Draw(t, "model"),
		session: rapid.SampledFrom(sessions).Draw(t, "session"),
		id:      rapid.SampledFrom([]string{"dup", fmt.Sprint("id-", m.ids)}).Draw(t, "request_id"),
		prompt:  rapid.SampledFrom(prompts).Draw(t, "prompt_tokens"),
		apiKey:  rapid.IntRange(-1, 2).Draw(t, "api_key"),
	}
	if m.tw != nil {
		q.final = rapid.SampledFrom([]bool{false, false, false, true}).Draw(t, "final")
	}
	class := rapid.SampledFrom([]string{"", "batch"}).Draw(t, "class")
	m.reqs = append(m.reqs, q)
	m.pick(q, class)
}

func (m *routerModel) pick(q *modelRequest, class string) {
	q.q.tag++
	m.r.deliver(q.q.pid, &Pick{Model: q.model, RequestID: q.id, Key: q.q.key, Requester: q.q.pid, Tag: q.q.tag,
		Exclude: slices.Clone(q.exclude), Admit: &AdmitInfo{Class: class, SessionID: q.session, PromptTokens: q.prompt, APIKey: q.apiKey, Final: q.final}})
	key := q.q.key
	m.collect()
	if m.tw != nil && m.tw.refused[key] && q.q != nil {
		m.t.Fatalf("request %d refused by the policy but not answered at once", key)
	}
}

func (m *routerModel) pickLive(t *rapid.T, ok func(*modelRequest) bool) *modelRequest {
	var cands []*modelRequest
	for _, q := range m.live() {
		if ok(q) {
			cands = append(cands, q)
		}
	}
	if len(cands) == 0 {
		return nil // nothing to act on: the action does nothing
	}
	return rapid.SampledFrom(cands).Draw(t, "request")
}

// finish ends a request that holds a worker: release, then its actor stops.
func (m *routerModel) finish(t *rapid.T) {
	q := m.pickLive(t, func(q *modelRequest) bool { return q.holding != nil || q.outcome > 0 })
	if q == nil {
		return
	}
	if q.holding != nil {
		q.q.release(q.holding)
	}
	aborted := false
	if m.tw != nil {
		aborted = rapid.SampledFrom([]bool{false, false, true}).Draw(t, "aborted")
	}
	m.end(q, aborted)
}

// cancel stops a request that has no outcome yet (its client left while it waited).
func (m *routerModel) cancel(t *rapid.T) {
	if q := m.pickLive(t, func(q *modelRequest) bool { return q.outcome == 0 }); q != nil {
		m.stop(q)
	}
}

// stop ends a request without a whole answer (cancelled, failed).
func (m *routerModel) stop(q *modelRequest) { m.end(q, true) }

// end ends a request: the router is told it finished (under thunderagent, with what its
// answer cost and whether it was aborted).
func (m *routerModel) end(q *modelRequest, aborted bool) {
	if m.tw == nil {
		q.q.stop()
	} else {
		q.q.end(rapid.SampledFrom([]int64{0, 100, 1500, 5000}).Draw(m.t, "answer_tokens"), aborted)
	}
	q.q = nil
	m.collect()
}

// failover: the attempt failed before the first byte; the worker is excluded and picked again.
func (m *routerModel) failover(t *rapid.T) {
	q := m.pickLive(t, func(q *modelRequest) bool { return q.holding != nil })
	if q == nil {
		return
	}
	q.q.release(q.holding)
	q.exclude = append(q.exclude, q.holding.WorkerID)
	q.holding = nil
	m.pick(q, "")
}

// repeat is a pick asked again after a timeout (the first answer may be late or lost).
func (m *routerModel) repeat(t *rapid.T) {
	q := m.pickLive(t, func(*modelRequest) bool { return true })
	if q == nil {
		return
	}
	if q.holding != nil {
		q.q.release(q.holding)
		q.holding = nil
	}
	m.pick(q, "")
}

func (m *routerModel) join(t *rapid.T) {
	id := rapid.SampledFrom(modelWorkers).Draw(t, "worker")
	if m.tw != nil {
		m.joinKV(t, id)
		return
	}
	m.r.join(id, modelOf(id), rapid.Int64Range(0, 2).Draw(t, "queue_depth"))
	m.collect()
}

func (m *routerModel) leave(t *rapid.T) {
	var live []string
	for _, id := range modelWorkers {
		if m.r.workers[m.r.workerPID(id).Id] != nil {
			live = append(live, id)
		}
	}
	if len(live) == 0 {
		return // no worker to leave
	}
	m.r.leave(rapid.SampledFrom(live).Draw(t, "worker"))
	m.collect()
}

func (m *routerModel) drain(t *rapid.T) {
	var live []*fakeWorker
	for _, id := range modelWorkers {
		if w := m.r.workers[m.r.workerPID(id).Id]; w != nil {
			live = append(live, w)
		}
	}
	if len(live) == 0 {
		return // no worker to drain
	}
	w := rapid.SampledFrom(live).Draw(t, "worker")
	w.info.Draining = !w.info.Draining
	m.r.report(w)
	m.collect()
}

func (m *routerModel) advance(t *rapid.T) {
	m.r.advance(time.Duration(rapid.IntRange(0, 3000).Draw(t, "ms")) * time.Millisecond)
	m.collect()
}

// check runs after every step.
func (m *routerModel) check(t *rapid.T) {
	// Bounded work: one message asks the gate at most a few times per live request and
	// worker (a loop would ask without end: the checked gate stops it at the limit).
	m.pol.limit = 4 * (len(m.live()) + len(modelWorkers) + 2)
	// The router's in-flight figure is the workers' own count.
	for _, w := range m.r.workers {
		if got := m.r.inFlight(w.info.ID); w.live && got != int64(len(w.holds)) {
			t.Fatalf("%s: router shows %d in flight, the worker holds %d", w.info.ID, got, len(w.holds))
		}
	}
	// Every request without an outcome is queued; nobody is answered twice (collect).
	for _, q := range m.live() {
		ad := m.r.st.adm.entries[q.q.key]
		if q.outcome == 0 && (ad == nil || !ad.e.Queued()) {
			t.Fatalf("request %d has no outcome and is not queued", q.q.key)
		}
	}
	if m.tw != nil {
		m.tw.checkLedger(t)
	}
}

// drainAll ends every request and checks that nothing is left anywhere.
func (m *routerModel) drainAll() {
	for _, q := range m.live() {
		if q.q == nil {
			continue // ended meanwhile (an earlier end answered it)
		}
		if q.holding != nil {
			q.q.release(q.holding)
		}
		m.stop(q)
	}
	a := m.r.st.adm
	if a.q.Len() != 0 || len(a.entries) != 0 {
		m.t.Fatalf("after the end: %d queued, %d entries", a.q.Len(), len(a.entries))
	}
	if len(m.pol.running) != 0 {
		m.t.Fatalf("the gate still counts %d requests running", len(m.pol.running))
	}
	if m.tw != nil {
		m.expireAll() // every program ends by its final turn or its expiry
	}
	if tr, ok := m.pol.inner.(interface{ Tracked() int }); ok && tr.Tracked() != 0 {
		m.t.Fatalf("the policy's ledgers still hold %d entries%s", tr.Tracked(), m.tw.describe())
	}
	for _, w := range m.r.workers {
		if len(w.holds) != 0 || m.r.inFlight(w.info.ID) > 0 {
			m.t.Fatalf("%s: %d holds, router shows %d", w.info.ID, len(w.holds), m.r.inFlight(w.info.ID))
		}
	}
	// A new request of every session runs at once when a worker has room (no ghost turn).
	m.r.join("a1", "a", 0)
	for _, s := range []string{"s1", "s2"} {
		q := &modelRequest{q: m.r.newRequester(), model: "a", session: s, id: "after", prompt: 10, answered: map[uint64]int{}}
		m.reqs = append(m.reqs, q)
		m.pick(q, "")
		if q.holding == nil {
			m.t.Fatalf("session %s: a new turn did not run on an idle worker", s)
		}
		q.q.release(q.holding)
		m.stop(q)
	}
}
