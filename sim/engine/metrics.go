package engine

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/status"
)

// metrics are tlengine's Prometheus series (issue: tlengine_*). Gauges and the cache counters
// are read from the scheduler at scrape time, so they are the real values, never a copy.
type metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.CounterVec
	grpcCalls   *prometheus.CounterVec
	expirations prometheus.Counter
}

func newMetrics(e *Engine) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tlengine_requests_total",
		Help: "Requests by endpoint and HTTP status (499: the client left).",
	}, []string{"endpoint", "code"})
	m.grpcCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tlengine_grpc_requests_total",
		Help: "EngineControl and KvTransferService calls by method (Prefill, Push, Release) and gRPC status code.",
	}, []string{"method", "code"})
	m.expirations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tlengine_kv_handle_expirations_total",
		Help: "KV handles freed because their lease ran out before a request used them or they were released.",
	})
	status := func(f func(schedStatus) float64) func() float64 {
		return func() float64 { return f(e.sched.status()) }
	}
	m.reg.MustRegister(m.requests, m.grpcCalls, m.expirations,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tlengine_prefix_cache_hit_tokens_total",
			Help: "Prompt tokens found in the prefix cache.",
		}, status(func(s schedStatus) float64 { return float64(s.kv.HitTokens) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tlengine_prefix_cache_lookup_tokens_total",
			Help: "Prompt tokens looked up in the prefix cache.",
		}, status(func(s schedStatus) float64 { return float64(s.kv.LookupTokens) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tlengine_kv_blocks_free",
			Help: "KV blocks not held by a running sequence (free or evictable cached).",
		}, status(func(s schedStatus) float64 { return float64(s.kv.FreeBlocks) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tlengine_kv_handles_held",
			Help: "KV handles held for disaggregated decode (pushed, not yet released).",
		}, func() float64 { return float64(e.handles.count()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tlengine_queue_depth",
			Help: "Requests waiting for a running slot.",
		}, status(func(s schedStatus) float64 { return float64(s.queued) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tlengine_running",
			Help: "Requests in the running set.",
		}, status(func(s schedStatus) float64 { return float64(s.running) })),
	)
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// grpc counts one finished gRPC call by its status code.
func (m *metrics) grpc(method string, err error) {
	m.grpcCalls.WithLabelValues(method, status.Code(err).String()).Inc()
}

// request counts one finished request by its outcome.
func (m *metrics) request(endpoint string, err error) {
	code := 200
	var ae *apiError
	switch {
	case err == nil:
	case errors.As(err, &ae):
		code = ae.status
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code = 499
	case errors.Is(err, errCut):
		code = 200 // the status line went out before the cut
	default:
		code = 500
	}
	m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
}
