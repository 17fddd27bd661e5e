package router

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/admission"
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

// admissionState is the router's admission queue and what it needs around it.
type admissionState struct {
	q         *admission.Queue
	threshold int64
	entries   map[string]*admission.Entry // admitted requests by request id, until Finished
	clock     clock.Clock
	armed     time.Time
	metrics   admissionMetrics
	policy    string
}

// pending is an admitted pick waiting for its answer.
type pending struct {
	pick   *Pick
	sender *actor.PID
	target target
}

// admTick is the queue's timer firing.
type admTick struct{}

func newAdmission(cfg *AdmissionConfig, clk clock.Clock, m admissionMetrics) *admissionState {
	a := &admissionState{threshold: cfg.BusyThreshold, entries: make(map[string]*admission.Entry),
		clock: clk, metrics: m, policy: cfg.PolicyName}
	qc := cfg.Queue
	qc.Now = clk.Now
	qc.Unbounded = cfg.BusyThreshold <= 0
	qc.OnDecision = func(d admission.Decision) {
		v := "go"
		if !d.Go {
			v = "hold"
		}
		m.gateDecisions.WithLabelValues(a.policy, v).Inc()
	}
	a.q = admission.New(qc)
	return a
}

// host adapts the router's state to admission.Host for the duration of one message.
type host struct {
	st *state
	c  actor.Context
}

var _ admission.Host = host{}

// view is a head's candidate workers with their loads.
type view struct {
	workers []admission.Worker
	now     time.Time
}

func (v view) Workers() []admission.Worker { return v.workers }
func (v view) Now() time.Time              { return v.now }

func (h host) candidates(e *admission.Entry) []*slot {
	p := e.Payload.(*pending)
	pl := h.st.pools[p.target.key]
	if pl == nil {
		return nil
	}
	var out []*slot
	for _, id := range admission.Intersect(e.Route, e.Req.Allowed) {
		if s := pl.members[id]; s != nil && !slices.Contains(p.pick.Exclude, id) {
			out = append(out, s)
		}
	}
	return out
}

func (h host) full(s *slot) bool {
	return h.st.adm.threshold > 0 && s.load() >= h.st.adm.threshold
}

// View implements admission.Host.
func (h host) View(e *admission.Entry) admission.View {
	v := view{now: h.st.adm.clock.Now()}
	for _, s := range h.candidates(e) {
		v.workers = append(v.workers, admission.Worker{ID: s.info.ID, Load: s.load(), Full: h.full(s)})
	}
	return v
}

// Dispatch implements admission.Host: the pick among the candidates that are not full, the
// gate's soft target first, answered to the waiting requester.
func (h host) Dispatch(e *admission.Entry, soft string) (string, bool) {
	st, p := h.st, e.Payload.(*pending)
	exclude := p.pick.Exclude
	if e.Req.Allowed != nil || st.adm.threshold > 0 {
		var allowed map[string]bool
		if e.Req.Allowed != nil {
			allowed = make(map[string]bool)
			for _, id := range admission.Intersect(e.Route, e.Req.Allowed) {
				allowed[id] = true
			}
		}
		if pl := st.pools[p.target.key]; pl != nil {
			exclude = slices.Clone(exclude)
			for id, s := range pl.members {
				if h.full(s) || (allowed != nil && !allowed[id]) {
					exclude = append(exclude, id)
				}
			}
		}
	}
	out := st.choose(p.target, p.pick.PrefixHash, p.pick.PrefixHashes, exclude, soft)
	if out.Err != nil {
		return "", false
	}
	out.Admitted = true
	if !e.Enqueued().IsZero() {
		st.adm.metrics.queueWait.WithLabelValues(e.Req.Class).Observe(st.adm.clock.Now().Sub(e.Enqueued()).Seconds())
	}
	st.adm.entries[e.Req.ID] = e
	h.c.Send(p.sender, out)
	return out.WorkerID, true
}

// Reject implements admission.Host.
func (h host) Reject(e *admission.Entry, err error) {
	p := e.Payload.(*pending)
	out := *p.target.out
	reason := "queue_full"
	if errors.Is(err, admission.ErrQueueTimeout) {
		reason = "queue_timeout"
		out.Err = fmt.Errorf("the request waited its class's max_wait in the %q queue: %w", e.Req.Class, errs.ErrQueueTimeout)
	} else {
		out.Err = fmt.Errorf("the %q queue is full: %w", e.Req.Class, errs.ErrQueueFull)
	}
	h.st.adm.metrics.queueRejections.WithLabelValues(e.Req.Class, reason).Inc()
	delete(h.st.adm.entries, e.Req.ID)
	h.c.Send(p.sender, &out)
}

// ArmTimer implements admission.Host: one clock timer for the earliest time asked.
func (h host) ArmTimer(at time.Time) {
	a := h.st.adm
	now := a.clock.Now()
	if !a.armed.IsZero() && a.armed.After(now) && !at.Before(a.armed) {
		return
	}
	a.armed = at
	self, root := h.c.Self(), h.c.ActorSystem().Root
	a.clock.AfterFunc(at.Sub(now), func() { root.Send(self, admTick{}) })
}

// admit passes a request's first pick through the queue (R10).
func (st *state) admit(c actor.Context, m *Pick) {
	t := st.resolve(m)
	if t.out.Err != nil {
		c.Respond(t.out)
		return
	}
	var route []string
	if pl := st.pools[t.key]; pl != nil {
		route = pl.memberIDs()
	}
	e := &admission.Entry{
		Req: &admission.Request{ID: m.RequestID, Class: m.Admit.Class, SessionID: m.Admit.SessionID,
			PromptTokens: m.Admit.PromptTokens},
		Route:   route,
		Payload: &pending{pick: m, sender: c.Sender(), target: t},
	}
	h := host{st: st, c: c}
	st.adm.entries[m.RequestID] = e // Reject forgets it again
	st.adm.q.Admit(e, h, func(workers []string) int {
		if st.pidx == nil || len(m.PrefixHashes) == 0 {
			return 0
		}
		_, chunks := st.pidx.Best(workers, m.PrefixHashes)
		return chunks * prefixindex.ChunkBytes / 4 // tokens, at ~4 bytes a token
	})
	if waiting := e.Worker() == "" && st.adm.entries[m.RequestID] == e; waiting {
		c.Respond(&Queued{Tag: m.Tag}) // the requester waits without a pick timeout
	}
	st.adm.gauges()
}

// admissionMessage handles the queue's own messages; it reports whether m was one.
func (st *state) admissionMessage(c actor.Context, m any) bool {
	if st.adm == nil {
		return false
	}
	h := host{st: st, c: c}
	switch m := m.(type) {
	case admTick:
		st.adm.armed = time.Time{}
		st.adm.q.Tick(h)
	case *Finished:
		if e := st.adm.entries[m.RequestID]; e != nil {
			delete(st.adm.entries, m.RequestID)
			st.adm.q.Completed(e, h)
		}
	case *CancelPick:
		e := st.adm.entries[m.RequestID]
		if e == nil {
			return true
		}
		delete(st.adm.entries, m.RequestID)
		if !st.adm.q.Cancel(e, h) && e.Worker() != "" {
			// Dispatched, but its requester left before it saw the answer: it will never
			// Acquire, so the reservation is given back here, and the gate learns the end.
			st.unreserve(e.Payload.(*pending), e.Worker())
			st.adm.q.Completed(e, h)
		}
	case *GetQueue:
		c.Respond(&QueueView{Enabled: true, Snapshot: st.adm.q.Snapshot()})
	default:
		return false
	}
	st.adm.gauges()
	return true
}

// unreserve takes back a reservation whose Acquire will never come.
func (st *state) unreserve(p *pending, worker string) {
	if s := st.slots[worker]; s != nil && s.acqSent > s.acqSeen {
		s.acqSent--
		if s.pool != nil {
			s.pool.p.SetLoad(&s.member, s.load())
		}
	}
}

// gauges refreshes the queue-length gauges.
func (a *admissionState) gauges() {
	a.q.Lengths(func(class, kind string, n int) {
		a.metrics.queueLength.WithLabelValues(class, kind).Set(float64(n))
	})
}

// wakeCapacity tells the queue that room may have freed.
func (st *state) wakeCapacity(c actor.Context) {
	if st.adm != nil && st.adm.q.Len() > 0 {
		st.adm.q.WakeCapacity(host{st: st, c: c})
		st.adm.gauges()
	}
}

// wakeAll tells the queue that workers came, went or changed.
func (st *state) wakeAll(c actor.Context) {
	if st.adm != nil && st.adm.q.Len() > 0 {
		st.adm.q.Wake(host{st: st, c: c})
		st.adm.gauges()
	}
}

// admissionMetrics are the queue's series (R11).
type admissionMetrics struct {
	queueLength     *prometheus.GaugeVec
	queueWait       *prometheus.HistogramVec
	gateDecisions   *prometheus.CounterVec
	queueRejections *prometheus.CounterVec
}

func newAdmissionMetrics() admissionMetrics {
	return admissionMetrics{
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
			Name: "tlgw_queue_rejections_total", Help: "Requests the queue rejected by class and reason (queue_full, queue_timeout).",
		}, []string{"class", "reason"}),
	}
}
