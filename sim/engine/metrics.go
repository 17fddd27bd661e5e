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

// metrics are tlengine's Prometheus series (issue: tlengine_*), plus its load under vLLM's
// names (vllmCollectors). Gauges and the cache counters are read from the scheduler at scrape
// time, so they are the real values, never a copy.
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
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tlengine_kv_blocks_total",
			Help: "KV blocks in the engine's pool.",
		}, status(func(s schedStatus) float64 { return float64(s.kv.TotalBlocks) })),
	)
	m.reg.MustRegister(newLoRACollector(e.loras))
	if e.cfg.KVEvents.Addr != "" {
		// R22: the vLLM-format KV event publisher (zmqevents.go), read at scrape time.
		m.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tlengine_kv_events_batches_total",
				Help: "vLLM-format KV event batches published (encoded and retained for replay)."},
				func() float64 { return float64(e.KVEventStats().Published) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tlengine_kv_events_dropped_batches_total",
				Help: "KV event batches dropped because the publisher's queue was full (their seqs were consumed)."},
				func() float64 { return float64(e.KVEventStats().Dropped) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tlengine_kv_events_withheld_batches_total",
				Help: "KV event batches kept from live subscribers on demand (POST " + GapPath + ")."},
				func() float64 { return float64(e.KVEventStats().Withheld) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tlengine_kv_events_subscribers",
				Help: "Connections subscribed to the KV event topic."},
				func() float64 {
					if e.zpub == nil {
						return 0
					}
					return float64(e.zpub.Subscribers())
				}),
		)
	}
	m.reg.MustRegister(vllmCollectors(e.cfg.Model, e.cfg.KVBlocks, e.cfg.BlockSize, status)...)
	return m
}

// vllmCollectors serve the same live values under vLLM's metric names and labels, so a gateway
// that scrapes engines as `metrics = "vllm"` can be tested end to end against tlengine. The
// series carry vLLM's model_name label; vllm:cache_config_info reports the pool size in its
// num_gpu_blocks label, as vLLM does, with engine "0" (one engine behind the endpoint).
func vllmCollectors(model string, blocks, blockSize int, status func(func(schedStatus) float64) func() float64) []prometheus.Collector {
	byModel := prometheus.Labels{"model_name": model, "engine": "0"}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "vllm:num_requests_waiting",
			Help:        "Requests waiting to be scheduled (tlengine's queue depth).",
			ConstLabels: byModel,
		}, status(func(s schedStatus) float64 { return float64(s.queued) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "vllm:num_requests_running",
			Help:        "Requests in the running set (tlengine's running count).",
			ConstLabels: byModel,
		}, status(func(s schedStatus) float64 { return float64(s.running) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "vllm:kv_cache_usage_perc",
			Help:        "Fraction of KV blocks in use, 0 to 1 (1 - free/total).",
			ConstLabels: byModel,
		}, status(func(s schedStatus) float64 {
			if s.kv.TotalBlocks <= 0 {
				return 0
			}
			return 1 - float64(s.kv.FreeBlocks)/float64(s.kv.TotalBlocks)
		})),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vllm:cache_config_info",
			Help: "KV cache configuration in labels; the value is always 1.",
			ConstLabels: prometheus.Labels{
				"engine":         "0",
				"num_gpu_blocks": strconv.Itoa(blocks),
				"block_size":     strconv.Itoa(blockSize),
			},
		}, func() float64 { return 1 }),
	}
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
