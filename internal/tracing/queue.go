package tracing

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Reasons a span is dropped: the values of tlgw_trace_spans_dropped_total's reason label.
const (
	// DropQueueFull: QueueSize spans were already waiting for export, or the provider was
	// shut down.
	DropQueueFull = "queue_full"
	// DropExportFailed: the export of its batch failed (after the exporter's retries), timed
	// out, or was cancelled by Shutdown.
	DropExportFailed = "export_failed"
)

// metrics are a Provider's counters.
type metrics struct {
	exported  prometheus.Counter
	dropped   *prometheus.CounterVec
	queueFull prometheus.Counter // dropped{reason="queue_full"}
	failed    prometheus.Counter // dropped{reason="export_failed"}
}

func newMetrics() *metrics {
	m := &metrics{
		exported: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tlgw_trace_spans_exported_total",
			Help: "Sampled spans the OTLP collector accepted.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_trace_spans_dropped_total",
			Help: "Sampled spans not exported: queue_full (tracing's export queue held its bound, or the gateway was shutting down), export_failed (the collector refused or did not answer their batch in time).",
		}, []string{"reason"}),
	}
	// The two values there are, so both series exist from the start.
	m.queueFull = m.dropped.WithLabelValues(DropQueueFull)
	m.failed = m.dropped.WithLabelValues(DropExportFailed)
	return m
}

// boundedQueue is the span processor in front of the SDK's batch processor: it hands a sampled
// span over only while fewer than limit spans are pending (handed over, not yet through the
// exporter), and otherwise drops and counts it. The SDK's own queue would drop silently.
type boundedQueue struct {
	next    sdktrace.SpanProcessor // the batch processor
	pending *atomic.Int64          // shared with the exporter, which subtracts what it exported
	limit   int64
	full    prometheus.Counter
	closed  atomic.Bool
}

var _ sdktrace.SpanProcessor = (*boundedQueue)(nil)

func newBoundedQueue(next sdktrace.SpanProcessor, pending *atomic.Int64, limit int64, full prometheus.Counter) *boundedQueue {
	return &boundedQueue{next: next, pending: pending, limit: limit, full: full}
}

// OnStart does nothing: the batch processor's OnStart does nothing either.
func (*boundedQueue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd hands s to the batch processor, or drops and counts it when limit spans are pending
// or the queue is shut down. It never blocks.
func (q *boundedQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor ignores it too (a recorded, unsampled span)
	}
	if q.closed.Load() {
		q.full.Inc()
		return
	}
	// Add first, then check: concurrent callers may each see the others' increments and drop
	// one span too many, never hand over one too many.
	if q.pending.Add(1) > q.limit {
		q.pending.Add(-1)
		q.full.Inc()
		return
	}
	q.next.OnEnd(s)
}

// Shutdown stops taking spans and shuts the batch processor down: it exports what is pending
// within ctx.
func (q *boundedQueue) Shutdown(ctx context.Context) error {
	q.closed.Store(true)
	return q.next.Shutdown(ctx)
}

// ForceFlush exports what is pending within ctx.
func (q *boundedQueue) ForceFlush(ctx context.Context) error { return q.next.ForceFlush(ctx) }

// errAborted fails the exports that Shutdown cancelled.
var errAborted = errors.New("tracing: export cancelled by shutdown")

// countingExporter wraps the real exporter: it counts each batch's spans as exported or
// dropped, releases them from the pending count, logs failures at most once per logEvery, and
// lets Shutdown cancel an export in flight. It returns nil to the batch processor for a failed
// batch, which would otherwise hand every failure to OpenTelemetry's global error handler (a
// log line per batch).
type countingExporter struct {
	next    sdktrace.SpanExporter
	pending atomic.Int64 // spans handed to the batch processor and not yet through ExportSpans
	m       *metrics

	abortCtx context.Context // cancelled by abort: every export after it fails at once
	abort    context.CancelFunc
	stopped  chan struct{} // closed when Shutdown has returned
	stopOnce sync.Once

	log      *slog.Logger
	now      func() time.Time
	logEvery time.Duration
	mu       sync.Mutex // guards the fields below
	lastLog  time.Time  // when a failure was last logged (zero: never)
	lost     int64      // spans lost to failures since the last line
	failures int64      // failed batches since the last line
}

var _ sdktrace.SpanExporter = (*countingExporter)(nil)

func newCountingExporter(next sdktrace.SpanExporter, m *metrics, log *slog.Logger, now func() time.Time, every time.Duration) *countingExporter {
	ctx, cancel := context.WithCancel(context.Background())
	return &countingExporter{next: next, m: m, abortCtx: ctx, abort: cancel, stopped: make(chan struct{}),
		log: log, now: now, logEvery: every}
}

// ExportSpans exports one batch (the batch processor calls it from one goroutine at a time).
func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	n := int64(len(spans))
	defer e.pending.Add(-n)
	err := e.abortCtx.Err()
	if err == nil {
		ctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(e.abortCtx, cancel) // ends with the export
		err = e.next.ExportSpans(ctx, spans)
		stop()
		cancel()
	} else {
		err = errAborted
	}
	if err != nil {
		e.m.failed.Add(float64(n))
		e.failed(err, n)
		return nil
	}
	e.m.exported.Add(float64(n))
	return nil
}

// failed logs a failed export of n spans: the first at once, then at most one line per
// logEvery, saying how many batches and spans failed since the last one.
func (e *countingExporter) failed(err error, n int64) {
	e.mu.Lock()
	e.failures++
	e.lost += n
	now := e.now()
	if !e.lastLog.IsZero() && now.Sub(e.lastLog) < e.logEvery {
		e.mu.Unlock()
		return
	}
	failures, lost := e.failures, e.lost
	e.failures, e.lost, e.lastLog = 0, 0, now
	e.mu.Unlock()
	e.log.Warn("tracing: span export failed; the spans are dropped (tlgw_trace_spans_dropped_total{reason=\"export_failed\"})",
		"err", truncate(err.Error(), maxErrLen), "failed_exports", failures, "spans_dropped", lost, "next_report_after", e.logEvery)
}

// maxErrLen bounds the error text logged: a collector's partial-success message is its own.
const maxErrLen = 512

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Shutdown shuts the wrapped exporter down (the batch processor calls it once it has exported
// the last batch).
func (e *countingExporter) Shutdown(ctx context.Context) error {
	defer e.stopOnce.Do(func() {
		e.abort() // releases abortCtx
		close(e.stopped)
	})
	return e.next.Shutdown(ctx)
}
