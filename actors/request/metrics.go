package request

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/internal/oai"
)

// UnknownLabel is the route and model label of a request the router named no route for (an
// unknown model, or a client that left before the pick): the client's model string is never a
// label, so random model names add no series (R13.4).
const UnknownLabel = "unknown"

// Metrics are the request-level series of R11.
type Metrics struct {
	requests    *prometheus.CounterVec
	transitions *prometheus.CounterVec
	failovers   *prometheus.CounterVec
	interrupts  *prometheus.CounterVec
	firstByte   *prometheus.HistogramVec
	cascade     *prometheus.CounterVec
	crashes     prometheus.Counter
	stages      [numStages]prometheus.Observer // tlgw_stage_seconds{stage} (R17.3), resolved once
	timeouts    *prometheus.CounterVec
	budget      *prometheus.CounterVec
	warmups     [numWarmResults]prometheus.Counter // tlgw_prefix_warmups_sent_total{result}
	// The disaggregated phases (R22) by protocol (a route's pd_protocol: "tl", "vllm" or
	// "sglang", from the configuration) and fixed phase and retry names: bounded series.
	pdPhases   *prometheus.HistogramVec
	pdFailures *prometheus.CounterVec
	pdRetries  *prometheus.CounterVec
	// inFlight is tlgw_requests_in_flight{route}: requests from the router naming their route
	// to their end (R24's history per route).
	inFlight *prometheus.GaugeVec

	// The series every request touches, resolved once: WithLabelValues hashes its labels and
	// takes the vector's lock on each call, and a request made about six such calls. The label
	// values are the gateway's own (states, route names from the configuration, served model
	// names, status codes), so these caches are bounded like the series themselves.
	transitionCounters [len(stateNames)][len(stateNames)]atomic.Pointer[prometheus.Counter]
	doneCounters       sync.Map // doneKey → prometheus.Counter
	firstByteObservers sync.Map // ttfbKey → prometheus.Observer
	inFlightGauges     sync.Map // route → prometheus.Gauge
}

type ttfbKey struct {
	route    string
	endpoint oai.Kind
}

type doneKey struct {
	route, model string
	endpoint     oai.Kind
	code         int
}

// NewMetrics registers the series on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_requests_total",
			Help: "Inference requests by public route, served model, serving endpoint and HTTP status (499: the client left).",
		}, []string{"route", "model", "endpoint", "code"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_request_transitions_total",
			Help: "Request state machine transitions.",
		}, []string{"from", "to"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_failovers_total",
			Help: "Attempts that failed before the first byte and were routed again.",
		}, []string{"route"}),
		interrupts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_streams_interrupted_total",
			Help: "Streams an engine broke off after the first byte (ended with an SSE error event).",
		}, []string{"route"}),
		firstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tlgw_time_to_first_byte_seconds",
			Help:    "From request arrival to the engine's response headers (a stream: its first event).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route", "endpoint"}),
		cascade: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_cascade_steps_total",
			Help: "Cascade steps judged: accepted or escalated.",
		}, []string{"route", "outcome"}),
		crashes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tlgw_request_actor_crashes_total",
			Help: "Request actors that panicked (the client got 502 or an SSE error; everything held was released).",
		}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_upstream_timeouts_total",
			Help: "R14.1 timeouts that fired: stream_first_byte (failed over), stream_idle (error event) or request (answered 504).",
		}, []string{"route", "timeout"}),
		budget: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_retry_budget_exhausted_total",
			Help: "Failures answered 503 no_capacity instead of failed over because the retry budget was spent (R14.3).",
		}, []string{"route"}),
	}
	stages := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tlgw_stage_seconds",
		Help: "Where a request's time goes (R17.3): parse (body parsed to request handed over), queue (a queued pick's wait), " +
			"pick (a router round trip not queued), upstream_first_byte (attempt sent to the engine's first byte) and relay (first byte to the answer's end).",
		Buckets: prometheus.ExponentialBucketsRange(5e-6, 300, 24),
	}, []string{"stage"})
	for i, name := range stageNames {
		m.stages[i] = stages.WithLabelValues(name)
	}
	warmups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tlgw_prefix_warmups_sent_total",
		Help: "Prefix warm-ups the router asked for (tlgw_prefix_warmups_total), by what became of them: ok (the engine answered 2xx), " +
			"failed (an error, a timeout or another status) or skipped (the prompt is not text, or 64 were running).",
	}, []string{"result"})
	for i, name := range warmResultNames {
		m.warmups[i] = warmups.WithLabelValues(name)
	}
	m.pdPhases = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tlgw_pd_phase_seconds",
		Help: "Disaggregated requests' phases by protocol (tl, vllm, sglang): prefill (tl: tokenize and Prefill; vllm: the prefill call) " +
			"and decode_first_byte (the decode attempt to its first byte; sglang: both calls at once).",
		Buckets: prometheus.ExponentialBucketsRange(1e-4, 300, 20),
	}, []string{"protocol", "phase"})
	m.pdFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tlgw_pd_failures_total",
		Help: "Disaggregated attempts that failed before the decode's first byte, by protocol and the phase that failed (prefill, decode).",
	}, []string{"protocol", "phase"})
	m.pdRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tlgw_pd_retries_total",
		Help: "What a disaggregated failure before the first byte retried, by protocol: same_params (vllm: another decode worker with the prefill's KV) or new_prefill (a new prefill, or sglang room).",
	}, []string{"protocol", "retry"})
	m.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tlgw_requests_in_flight",
		Help: "Inference requests in flight by route: from the router naming the request's route to the request's end.",
	}, []string{"route"})
	if reg != nil {
		reg.MustRegister(m.requests, m.transitions, m.failovers, m.interrupts, m.firstByte, m.cascade, m.crashes,
			m.timeouts, m.budget, stages, warmups, m.pdPhases, m.pdFailures, m.pdRetries, m.inFlight)
	}
	return m
}

// The stages of tlgw_stage_seconds (R17.3).
const (
	stageParse = iota
	stageQueue
	stagePick
	stageUpstream
	stageRelay
	numStages
)

var stageNames = [numStages]string{"parse", "queue", "pick", "upstream_first_byte", "relay"}

func (m *Metrics) stage(s int, d time.Duration) { m.stages[s].Observe(d.Seconds()) }

// EndpointLabel is the endpoint label of kind k: its endpoint name, or "unknown".
func EndpointLabel(k oai.Kind) string {
	if k.Valid() {
		return k.Endpoint()
	}
	return UnknownLabel
}

func (m *Metrics) done(route, model string, k oai.Kind, code int) {
	key := doneKey{route, model, k, code}
	c, ok := m.doneCounters.Load(key)
	if !ok {
		c, _ = m.doneCounters.LoadOrStore(key, m.requests.WithLabelValues(route, model, EndpointLabel(k), strconv.Itoa(code)))
	}
	c.(prometheus.Counter).Inc()
}

// routeInFlight adds d to route's requests in flight.
func (m *Metrics) routeInFlight(route string, d float64) {
	g, ok := m.inFlightGauges.Load(route)
	if !ok {
		g, _ = m.inFlightGauges.LoadOrStore(route, m.inFlight.WithLabelValues(route))
	}
	g.(prometheus.Gauge).Add(d)
}

func (m *Metrics) transition(from, to State) {
	if int(from) >= len(stateNames) || int(to) >= len(stateNames) {
		m.transitions.WithLabelValues(from.String(), to.String()).Inc()
		return
	}
	slot := &m.transitionCounters[from][to]
	c := slot.Load()
	if c == nil {
		v := m.transitions.WithLabelValues(from.String(), to.String())
		c = &v
		slot.Store(c) // a race stores the same counter twice: the vector returns one per labels
	}
	(*c).Inc()
}

func (m *Metrics) ttfb(route string, k oai.Kind, d time.Duration) {
	key := ttfbKey{route, k}
	o, ok := m.firstByteObservers.Load(key)
	if !ok {
		o, _ = m.firstByteObservers.LoadOrStore(key, m.firstByte.WithLabelValues(route, EndpointLabel(k)))
	}
	o.(prometheus.Observer).Observe(d.Seconds())
}

func (m *Metrics) timeout(route, which string) {
	m.timeouts.WithLabelValues(route, which).Inc()
}

func (m *Metrics) budgetSpent(route string) {
	m.budget.WithLabelValues(route).Inc()
}

// The phases and retries of the disaggregated metrics (R22).
const (
	pdPhasePrefill    = "prefill"
	pdPhaseDecode     = "decode_first_byte"
	pdRetrySameParams = "same_params"
	pdRetryNewPrefill = "new_prefill"
)

// pdLabel is a protocol label: the configuration's names only.
func pdLabel(protocol string) string {
	switch protocol {
	case "tl", "vllm", "sglang":
		return protocol
	}
	return UnknownLabel
}

func (m *Metrics) pdPhase(protocol, phase string, d time.Duration) {
	m.pdPhases.WithLabelValues(pdLabel(protocol), phase).Observe(d.Seconds())
}

// pdFailure counts a failure of phase (pdPhasePrefill, or pdPhaseDecode for the decode).
func (m *Metrics) pdFailure(protocol, phase string) {
	if phase == pdPhaseDecode {
		phase = "decode"
	}
	m.pdFailures.WithLabelValues(pdLabel(protocol), phase).Inc()
}

func (m *Metrics) pdRetry(protocol, retry string) {
	m.pdRetries.WithLabelValues(pdLabel(protocol), retry).Inc()
}
