package request

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	timeouts    *prometheus.CounterVec
	budget      *prometheus.CounterVec
}

// NewMetrics registers the series on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_requests_total",
			Help: "Inference requests by public route, served model and HTTP status (499: the client left).",
		}, []string{"route", "model", "code"}),
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
		}, []string{"route"}),
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
	if reg != nil {
		reg.MustRegister(m.requests, m.transitions, m.failovers, m.interrupts, m.firstByte, m.cascade, m.crashes,
			m.timeouts, m.budget)
	}
	return m
}

func (m *Metrics) done(route, model string, code int) {
	m.requests.WithLabelValues(route, model, strconv.Itoa(code)).Inc()
}

func (m *Metrics) transition(from, to State) {
	m.transitions.WithLabelValues(from.String(), to.String()).Inc()
}

func (m *Metrics) ttfb(route string, d time.Duration) {
	m.firstByte.WithLabelValues(route).Observe(d.Seconds())
}

func (m *Metrics) timeout(route, which string) {
	m.timeouts.WithLabelValues(route, which).Inc()
}

func (m *Metrics) budgetSpent(route string) {
	m.budget.WithLabelValues(route).Inc()
}
