// Package tracing is the gateway's distributed tracing (R24 `[tracing]`): an OpenTelemetry SDK
// tracer whose spans are exported over OTLP/gRPC, and W3C Trace Context propagation
// (`traceparent`/`tracestate`) in and out, which works with tracing off too.
//
// A Provider samples with TraceIDRatioBased(SampleRatio), inside ParentBased when ParentBased
// is set (a client's sampled flag decides for its requests; requests without a traceparent are
// sampled at the ratio). Finished sampled spans wait for the SDK's batch span processor, which
// hands them to the otlptracegrpc exporter in batches of at most 512 every second. The request
// path never waits for the collector:
//
//   - at most Options.QueueSize spans wait for export (handed to the batch processor and not yet
//     through the exporter); one more is dropped and counted in
//     tlgw_trace_spans_dropped_total{reason="queue_full"};
//   - one export (retries included) takes at most ExportTimeout (10 s); a batch that fails is
//     dropped and counted in tlgw_trace_spans_dropped_total{reason="export_failed"}, and the
//     failure is logged at most once per ErrorLogInterval with the spans lost meanwhile;
//   - spans exported are counted in tlgw_trace_spans_exported_total.
//
// A span's attributes, events and links are bounded by the span limits below, so a collector
// that is down costs at most QueueSize bounded spans of memory.
package tracing

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Defaults and bounds of Options and of the export.
const (
	DefaultServiceName = "tlgw"
	DefaultQueueSize   = 2048
	MaxQueueSize       = 1 << 16
	// ExportTimeout bounds one export of a batch, the exporter's retries included.
	ExportTimeout = 10 * time.Second
	// BatchTimeout is the longest a finished span waits for its batch to be exported.
	BatchTimeout = time.Second
	// MaxBatch is the most spans exported in one request to the collector.
	MaxBatch = 512
	// ErrorLogInterval is the least time between two log lines about failed exports.
	ErrorLogInterval = 30 * time.Second
	// abandonWait bounds how long Shutdown waits, once its ctx has ended, for the export
	// goroutine to notice its cancelled export and stop.
	abandonWait = 2 * time.Second
	// scopeName is the instrumentation scope of the gateway's spans.
	scopeName = "github.com/tlgw/tlgw"
)

// spanLimits bound what one span holds, whatever the code that makes it adds: the queue's
// memory is QueueSize spans of at most this much.
var spanLimits = sdktrace.SpanLimits{
	AttributeValueLengthLimit:   1024,
	AttributeValueDepthLimit:    4,
	AttributeCountLimit:         64,
	EventCountLimit:             32,
	LinkCountLimit:              8,
	AttributePerEventCountLimit: 16,
	AttributePerLinkCountLimit:  8,
}

// Options configure a Provider.
type Options struct {
	Endpoint    string            // OTLP/gRPC collector "host:port"; "" = tracing off
	SampleRatio float64           // 0..1
	ParentBased bool              // honour the client's sampled flag (ParentBased(TraceIDRatioBased(ratio)))
	Insecure    bool              // plaintext gRPC to the collector; false = TLS with system roots
	Headers     map[string]string // sent with every export (e.g. authorization)
	ServiceName string            // resource service.name, default "tlgw"
	QueueSize   int               // spans waiting for export at most (default 2048); more are dropped and counted
}

// Provider is a running tracer and its export pipeline. A nil *Provider is tracing off: its
// Tracer is nil and its Shutdown does nothing.
type Provider struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	queue  *boundedQueue
	exp    *countingExporter
	log    *slog.Logger
	once   sync.Once
	err    error // Shutdown's result, returned again by later calls
}

// settings are what New fixes and tests vary.
type settings struct {
	// exporter replaces the OTLP/gRPC exporter (nil: otlptracegrpc to Options.Endpoint).
	exporter      sdktrace.SpanExporter
	exportTimeout time.Duration
	batchTimeout  time.Duration
	retry         otlptracegrpc.RetryConfig
	now           func() time.Time // the error log's clock
	logEvery      time.Duration
}

func defaultSettings() settings {
	return settings{
		exportTimeout: ExportTimeout,
		batchTimeout:  BatchTimeout,
		// Within ExportTimeout: 0.5 s, 1 s, 2 s, … at most 5 s apart, given up after 10 s.
		retry:    otlptracegrpc.RetryConfig{Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 5 * time.Second, MaxElapsedTime: ExportTimeout},
		now:      time.Now,
		logEvery: ErrorLogInterval,
	}
}

// New starts a Provider exporting to opts.Endpoint, with its counters registered on reg (nil:
// unregistered) and export failures logged to log (nil: slog.Default()). An empty Endpoint is
// tracing off: (nil, nil). It does not connect: an unreachable collector shows as failed
// exports, never as an error here.
func New(opts Options, reg prometheus.Registerer, log *slog.Logger) (*Provider, error) {
	if opts.Endpoint == "" {
		return nil, nil
	}
	return newProvider(opts, reg, log, defaultSettings())
}

func newProvider(opts Options, reg prometheus.Registerer, log *slog.Logger, s settings) (*Provider, error) {
	if err := check(&opts); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", opts.ServiceName)))
	if err != nil {
		// resource.Default's schema URL against a schemaless resource: cannot conflict.
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	next := s.exporter
	if next == nil {
		if next, err = otlpExporter(opts, s); err != nil {
			return nil, err
		}
	}
	m := newMetrics()
	if reg != nil {
		var done []prometheus.Collector
		for _, c := range []prometheus.Collector{m.exported, m.dropped} {
			if err := reg.Register(c); err != nil {
				for _, d := range done {
					reg.Unregister(d)
				}
				_ = next.Shutdown(context.Background()) // closes the exporter's idle connection
				return nil, fmt.Errorf("tracing: metrics: %w", err)
			}
			done = append(done, c)
		}
	}
	exp := newCountingExporter(next, m, log, s.now, s.logEvery)
	batch := min(MaxBatch, opts.QueueSize)
	bsp := sdktrace.NewBatchSpanProcessor(exp,
		// The bounded queue in front keeps at most QueueSize spans inside, so the batch
		// processor's own queue, as large, never drops one silently.
		sdktrace.WithMaxQueueSize(opts.QueueSize),
		sdktrace.WithMaxExportBatchSize(batch),
		sdktrace.WithBatchTimeout(s.batchTimeout),
		sdktrace.WithExportTimeout(s.exportTimeout),
	)
	q := newBoundedQueue(bsp, &exp.pending, int64(opts.QueueSize), m.queueFull)
	var sampler sdktrace.Sampler = sdktrace.TraceIDRatioBased(opts.SampleRatio)
	if opts.ParentBased {
		sampler = sdktrace.ParentBased(sampler)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sampler),
		sdktrace.WithSpanProcessor(q),
		sdktrace.WithResource(res),
		sdktrace.WithRawSpanLimits(spanLimits),
	)
	return &Provider{tp: tp, tracer: tp.Tracer(scopeName), queue: q, exp: exp, log: log}, nil
}

// check validates opts and fills its defaults.
func check(o *Options) error {
	if !validEndpoint(o.Endpoint) {
		return fmt.Errorf("tracing: endpoint %q is not host:port", o.Endpoint)
	}
	if math.IsNaN(o.SampleRatio) || o.SampleRatio < 0 || o.SampleRatio > 1 {
		return fmt.Errorf("tracing: sample ratio %v is not between 0 and 1", o.SampleRatio)
	}
	if o.QueueSize < 0 || o.QueueSize > MaxQueueSize {
		return fmt.Errorf("tracing: queue size %d is not between 1 and %d", o.QueueSize, MaxQueueSize)
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.ServiceName == "" {
		o.ServiceName = DefaultServiceName
	}
	if len(o.Headers) > MaxHeaders {
		return fmt.Errorf("tracing: %d headers, at most %d", len(o.Headers), MaxHeaders)
	}
	seen := make(map[string]string, len(o.Headers)) // lowercase name -> name; bounded by MaxHeaders
	for name, value := range o.Headers {
		if err := CheckHeaderName(name); err != nil {
			return fmt.Errorf("tracing: %w", err)
		}
		if prev, dup := seen[strings.ToLower(name)]; dup {
			return fmt.Errorf("tracing: headers %s and %s are the same header", prev, name)
		}
		seen[strings.ToLower(name)] = name
		if err := CheckHeaderValue(value); err != nil {
			// Never the value: it is usually a credential.
			return fmt.Errorf("tracing: header %s: %w", name, err)
		}
	}
	return nil
}

// validEndpoint reports whether s is host:port with a non-empty host and a port 1–65535.
func validEndpoint(s string) bool {
	h, p, err := net.SplitHostPort(s)
	if err != nil || h == "" {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536
}

// otlpExporter is the OTLP/gRPC exporter to opts.Endpoint. Every setting the exporter would
// otherwise take from OTEL_EXPORTER_OTLP_* variables is given here, so the configuration
// decides (compression is left to OTEL_EXPORTER_OTLP_COMPRESSION). It does not dial: the
// connection is made by the first export.
func otlpExporter(opts Options, s settings) (sdktrace.SpanExporter, error) {
	headers := make(map[string]string, len(opts.Headers)) // bounded by MaxHeaders
	for k, v := range opts.Headers {
		headers[k] = v
	}
	eo := []otlptracegrpc.Option{
		otlptracegrpc.WithEndpoint(opts.Endpoint),
		otlptracegrpc.WithHeaders(headers), // also when empty: no headers from the environment
		otlptracegrpc.WithTimeout(s.exportTimeout),
		otlptracegrpc.WithRetry(s.retry),
	}
	if opts.Insecure {
		// The dial option after the exporter's own: plaintext even when the environment names
		// a certificate.
		eo = append(eo, otlptracegrpc.WithInsecure(),
			otlptracegrpc.WithDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	} else {
		eo = append(eo, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
	}
	exp, err := otlptrace.New(context.Background(), otlptracegrpc.NewClient(eo...))
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter: %w", err)
	}
	return exp, nil
}

// Tracer makes the gateway's spans; nil for a nil Provider (tracing off).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tracer
}

// Shutdown exports the spans that have ended and stops the export, within ctx: when ctx ends
// first, the export in flight is cancelled and the spans still waiting are dropped and
// counted (export_failed), and the export goroutine is waited for a little longer (it stops at
// once on a cancelled export). Spans that end afterwards are dropped and counted (queue_full).
// It returns ctx's error when the flush did not finish, or the exporter's; later calls return
// the same. A nil Provider returns nil.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.once.Do(func() {
		p.err = p.tp.Shutdown(ctx)
		if p.err == nil {
			return
		}
		// The flush did not finish, or the provider stopped before reaching the processor:
		// cancel what is exporting, make sure the batch processor is told to stop (a no-op
		// when it was), and wait for its goroutine to close the exporter.
		p.exp.abort()
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		_ = p.queue.Shutdown(cancelled)
		t := time.NewTimer(abandonWait) // one, stopped on return
		defer t.Stop()
		select {
		case <-p.exp.stopped:
		case <-t.C:
			p.log.Error("tracing: the span exporter did not stop", "waited", abandonWait)
		}
		if errors.Is(p.err, context.Canceled) || errors.Is(p.err, context.DeadlineExceeded) {
			p.err = fmt.Errorf("tracing: flush not finished: %w", p.err)
		}
	})
	return p.err
}
