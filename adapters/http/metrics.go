package httpapi

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// httpMetrics are the request-level series of R11.
type httpMetrics struct {
	requests   *prometheus.CounterVec
	failovers  *prometheus.CounterVec
	interrupts *prometheus.CounterVec
	firstByte  *prometheus.HistogramVec
	rejected   *prometheus.CounterVec
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_requests_total",
			Help: "Inference requests by public route, served model and HTTP status (499: the client left).",
		}, []string{"route", "model", "code"}),
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
			Help:    "From request arrival to the engine's response headers.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_requests_rejected_total",
			Help: "Inference requests answered before routing (bad input, auth, shutdown) by HTTP status.",
		}, []string{"code"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.failovers, m.interrupts, m.firstByte, m.rejected)
	}
	return m
}

func (m *httpMetrics) done(route, model string, code int) {
	m.requests.WithLabelValues(route, model, strconv.Itoa(code)).Inc()
}

func (m *httpMetrics) reject(code int) { m.rejected.WithLabelValues(strconv.Itoa(code)).Inc() }

func (m *httpMetrics) failover(route string) { m.failovers.WithLabelValues(route).Inc() }

func (m *httpMetrics) interrupted(route string) { m.interrupts.WithLabelValues(route).Inc() }

func (m *httpMetrics) ttfb(route string, d time.Duration) {
	m.firstByte.WithLabelValues(route).Observe(d.Seconds())
}
