package tracing

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/internal/otlptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an exporter that keeps what it is sent, and remembers its Shutdown.
type recorder struct {
	mu       sync.Mutex
	spans    []sdktrace.ReadOnlySpan
	shutdown bool
}

func (r *recorder) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, spans...)
	return nil
}

func (r *recorder) Shutdown(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shutdown = true
	return nil
}

func (r *recorder) got() ([]sdktrace.ReadOnlySpan, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sdktrace.ReadOnlySpan(nil), r.spans...), r.shutdown
}

// blocker is an exporter whose exports wait for release (or their ctx); entered receives each
// export's size as it begins.
type blocker struct {
	entered chan int
	release chan struct{}
	stopped chan struct{}
}

func newBlocker() *blocker {
	return &blocker{entered: make(chan int, 16), release: make(chan struct{}), stopped: make(chan struct{})}
}

func (b *blocker) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	b.entered <- len(spans)
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *blocker) Shutdown(context.Context) error { close(b.stopped); return nil }

// failer fails every export.
type failer struct{}

func (failer) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	return errors.New("collector says no")
}
func (failer) Shutdown(context.Context) error { return nil }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(discard{}, nil)) }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// testProvider is a provider exporting to exp, batches every hour (so only a full batch or
// Shutdown exports), its counters on a fresh registry.
func testProvider(t *testing.T, o Options, exp sdktrace.SpanExporter) (*Provider, *prometheus.Registry) {
	t.Helper()
	if o.Endpoint == "" {
		o.Endpoint = "collector.invalid:4317"
	}
	s := defaultSettings()
	s.exporter = exp
	s.batchTimeout = time.Hour
	reg := prometheus.NewRegistry()
	p, err := newProvider(o, reg, quiet(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p, reg
}

func counts(p *Provider) (exported, full, failed float64) {
	m := p.exp.m
	return testutil.ToFloat64(m.exported), testutil.ToFloat64(m.queueFull), testutil.ToFloat64(m.failed)
}

const (
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientParent = "00f067aa0ba902b7"
)

// TestSampling: the ratio decides for a request without a traceparent; with ParentBased a
// client's sampled flag decides for its request whatever the ratio; without it the ratio
// decides for those too. A sampled span is exported, in the client's trace under its span.
func TestSampling(t *testing.T) {
	for _, c := range []struct {
		name        string
		ratio       float64
		parentBased bool
		flags       string // the client's traceparent flags; "": no traceparent
		sampled     bool
	}{
		{"ratio 0", 0, true, "", false},
		{"ratio 1", 1, true, "", true},
		{"parent sampled, ratio 0", 0, true, "01", true},
		{"parent not sampled, ratio 1", 1, true, "00", false},
		{"parent random+sampled, ratio 0", 0, true, "03", true},
		{"not parent-based: sampled flag, ratio 0", 0, false, "01", false},
		{"not parent-based: unsampled flag, ratio 1", 1, false, "00", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{}
			p, _ := testProvider(t, Options{SampleRatio: c.ratio, ParentBased: c.parentBased}, rec)
			ctx := context.Background()
			if c.flags != "" {
				ctx = Extract(ctx, http.Header{"Traceparent": {"00-" + clientTrace + "-" + clientParent + "-" + c.flags}})
			}
			_, span := p.Tracer().Start(ctx, "tlgw.request")
			if span.SpanContext().IsSampled() != c.sampled {
				t.Errorf("sampled %v, want %v", span.SpanContext().IsSampled(), c.sampled)
			}
			span.End()
			if err := p.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans, _ := rec.got()
			if !c.sampled {
				if len(spans) != 0 {
					t.Fatalf("%d spans exported, want none", len(spans))
				}
				return
			}
			if len(spans) != 1 || spans[0].Name() != "tlgw.request" {
				t.Fatalf("exported %v, want one tlgw.request", spans)
			}
			if c.flags != "" {
				if got := spans[0].SpanContext().TraceID().String(); got != clientTrace {
					t.Errorf("trace %s, want the client's %s", got, clientTrace)
				}
				if got := spans[0].Parent().SpanID().String(); got != clientParent || !spans[0].Parent().IsRemote() {
					t.Errorf("parent %s (remote %v), want the client's %s", got, spans[0].Parent().IsRemote(), clientParent)
				}
			}
			if e, full, failed := counts(p); e != 1 || full != 0 || failed != 0 {
				t.Errorf("exported %v, queue_full %v, export_failed %v", e, full, failed)
			}
		})
	}
}

// TestSpanLimits: however many attributes and events the code adds, and however long a value
// (a client's string, say), an exported span holds at most the span limits.
func TestSpanLimits(t *testing.T) {
	rec := &recorder{}
	p, _ := testProvider(t, Options{SampleRatio: 1}, rec)
	_, s := p.Tracer().Start(context.Background(), "s")
	s.SetAttributes(attribute.String("long", strings.Repeat("x", 5000)))
	for i := range 100 {
		s.SetAttributes(attribute.Int("a"+strconv.Itoa(i), i))
		s.AddEvent("e")
	}
	s.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans, _ := rec.got()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	sp := spans[0]
	if n := len(sp.Attributes()); n != spanLimits.AttributeCountLimit {
		t.Errorf("%d attributes", n)
	}
	if v := sp.Attributes()[0].Value.AsString(); len(v) != spanLimits.AttributeValueLengthLimit {
		t.Errorf("a value of %d characters", len(v))
	}
	if n := len(sp.Events()); n != spanLimits.EventCountLimit {
		t.Errorf("%d events", n)
	}
}

// TestQueueFullDrops: with the exporter stuck on a full batch, QueueSize spans are pending;
// every further span is dropped and counted at once, none waits; once the export finishes,
// spans are taken again.
func TestQueueFullDrops(t *testing.T) {
	b := newBlocker()
	p, _ := testProvider(t, Options{SampleRatio: 1, QueueSize: 4}, b)
	end := func(n int) {
		for range n {
			_, s := p.Tracer().Start(context.Background(), "s")
			s.End()
		}
	}
	end(4) // a full batch (MaxBatch is cut to the queue's 4): exported at once, and stuck
	if n := <-b.entered; n != 4 {
		t.Fatalf("export of %d spans, want 4", n)
	}
	end(3)
	if e, full, failed := counts(p); e != 0 || full != 3 || failed != 0 {
		t.Fatalf("exported %v, queue_full %v, export_failed %v; want 0, 3, 0", e, full, failed)
	}
	if n := p.exp.pending.Load(); n != 4 {
		t.Fatalf("pending %d, want 4", n)
	}
	close(b.release)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e, full, _ := counts(p); e != 4 || full != 3 {
		t.Fatalf("exported %v, queue_full %v; want 4, 3", e, full)
	}
	if n := p.exp.pending.Load(); n != 0 {
		t.Fatalf("pending %d after shutdown, want 0", n)
	}
}

// TestQueueTakesSpansAgain: a queue that was full takes spans again once its export is done.
func TestQueueTakesSpansAgain(t *testing.T) {
	b := newBlocker()
	p, _ := testProvider(t, Options{SampleRatio: 1, QueueSize: 2}, b)
	end := func() {
		_, s := p.Tracer().Start(context.Background(), "s")
		s.End()
	}
	end()
	end()
	<-b.entered
	end() // dropped
	close(b.release)
	// The export returns; its spans leave the pending count once ExportSpans has returned.
	eventually(t, "the exported spans leave the pending count", func() bool { return p.exp.pending.Load() == 0 })
	end()
	end()
	if n := <-b.entered; n != 2 {
		t.Fatalf("second export of %d spans, want 2", n)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e, full, _ := counts(p); e != 4 || full != 1 {
		t.Fatalf("exported %v, queue_full %v; want 4, 1", e, full)
	}
}

// TestShutdownFlushes: spans waiting for their batch are exported by Shutdown, the exporter is
// shut down after them, and a span that ends afterwards is dropped and counted.
func TestShutdownFlushes(t *testing.T) {
	rec := &recorder{}
	p, _ := testProvider(t, Options{SampleRatio: 1}, rec)
	for range 10 {
		_, s := p.Tracer().Start(context.Background(), "s")
		s.End()
	}
	if spans, _ := rec.got(); len(spans) != 0 {
		t.Fatalf("%d spans exported before their batch was due", len(spans))
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans, shut := rec.got()
	if len(spans) != 10 || !shut {
		t.Fatalf("%d spans exported, exporter shut down %v; want 10, true", len(spans), shut)
	}
	_, s := p.Tracer().Start(context.Background(), "late")
	s.End()
	if e, full, _ := counts(p); e != 10 || full != 0 {
		// The SDK's provider is shut down: its tracer makes non-recording spans, which reach
		// no processor at all.
		t.Fatalf("exported %v, queue_full %v", e, full)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
}

// TestShutdownBoundedWhenExportHangs: a collector that never answers holds Shutdown no longer
// than its ctx (plus the export's cancellation): the export is cancelled, its spans counted as
// failed, and the exporter shut down — no goroutine is left (goleak in TestMain).
func TestShutdownBoundedWhenExportHangs(t *testing.T) {
	b := newBlocker()
	p, _ := testProvider(t, Options{SampleRatio: 1, QueueSize: 2}, b)
	for range 2 {
		_, s := p.Tracer().Start(context.Background(), "s")
		s.End()
	}
	<-b.entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want the deadline's error", err)
	}
	if took := time.Since(start); took > abandonWait {
		t.Fatalf("Shutdown took %v", took)
	}
	select {
	case <-b.stopped:
	default:
		t.Fatal("the exporter was not shut down")
	}
	if e, full, failed := counts(p); e != 0 || full != 0 || failed != 2 {
		t.Fatalf("exported %v, queue_full %v, export_failed %v; want 0, 0, 2", e, full, failed)
	}
}

// TestShutdownWithDoneContext: a ctx already ended still stops everything.
func TestShutdownWithDoneContext(t *testing.T) {
	rec := &recorder{}
	p, _ := testProvider(t, Options{SampleRatio: 1}, rec)
	_, s := p.Tracer().Start(context.Background(), "s")
	s.End()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, shut := rec.got(); !shut {
		t.Fatal("the exporter was not shut down")
	}
}

// lockedBuffer is a log destination the export goroutine writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSuffix(l.b.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestExportFailuresLoggedRateLimited: failed batches are counted span by span; the first
// failure is logged at once, the next ones only once ErrorLogInterval has passed, in one line
// that says how many batches and spans were lost meanwhile.
func TestExportFailuresLoggedRateLimited(t *testing.T) {
	var logs lockedBuffer
	now := time.Unix(1_700_000_000, 0)
	m := newMetrics()
	e := newCountingExporter(failer{}, m, slog.New(slog.NewTextHandler(&logs, nil)), func() time.Time { return now }, ErrorLogInterval)
	batch := make([]sdktrace.ReadOnlySpan, 3)
	e.pending.Store(3 * 100)
	for range 100 {
		if err := e.ExportSpans(context.Background(), batch); err != nil {
			t.Fatalf("ExportSpans returned %v: the batch processor would hand it to the global error handler", err)
		}
		now = now.Add(100 * time.Millisecond) // 100 batches in 10 s
	}
	if got := testutil.ToFloat64(m.failed); got != 300 {
		t.Fatalf("export_failed %v, want 300", got)
	}
	if e.pending.Load() != 0 {
		t.Fatalf("pending %d", e.pending.Load())
	}
	if l := logs.lines(); len(l) != 1 || !strings.Contains(l[0], "collector says no") || !strings.Contains(l[0], "spans_dropped=3") {
		t.Fatalf("log after 10 s of failures: %q", l)
	}
	now = now.Add(ErrorLogInterval)
	_ = e.ExportSpans(context.Background(), batch)
	l := logs.lines()
	if len(l) != 2 || !strings.Contains(l[1], "failed_exports=100") || !strings.Contains(l[1], "spans_dropped=300") {
		t.Fatalf("log after the interval: %q", l)
	}
}

// TestNewOff: no endpoint is tracing off, and a nil Provider is usable as one.
func TestNewOff(t *testing.T) {
	p, err := New(Options{SampleRatio: 5}, prometheus.NewRegistry(), nil)
	if p != nil || err != nil {
		t.Fatalf("New without an endpoint: %v, %v", p, err)
	}
	if p.Tracer() != nil {
		t.Fatal("a nil Provider has a tracer")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestNewRejects: New refuses what it could not use, naming the option and never a header's
// value.
func TestNewRejects(t *testing.T) {
	const secret = "Bearer s3cret\n"
	for name, c := range map[string]struct {
		o    Options
		want string
	}{
		"endpoint with scheme": {Options{Endpoint: "http://collector:4317"}, "not host:port"},
		"endpoint no port":     {Options{Endpoint: "collector"}, "not host:port"},
		"endpoint port 0":      {Options{Endpoint: "collector:0"}, "not host:port"},
		"ratio above 1":        {Options{Endpoint: "c:4317", SampleRatio: 1.5}, "sample ratio"},
		"ratio below 0":        {Options{Endpoint: "c:4317", SampleRatio: -0.1}, "sample ratio"},
		"ratio NaN":            {Options{Endpoint: "c:4317", SampleRatio: math.NaN()}, "sample ratio"},
		"queue negative":       {Options{Endpoint: "c:4317", QueueSize: -1}, "queue size"},
		"queue huge":           {Options{Endpoint: "c:4317", QueueSize: MaxQueueSize + 1}, "queue size"},
		"header name space":    {Options{Endpoint: "c:4317", Headers: map[string]string{"x y": "v"}}, "not an HTTP header token"},
		"header grpc-":         {Options{Endpoint: "c:4317", Headers: map[string]string{"grpc-timeout": "1S"}}, "reserved"},
		"header -bin":          {Options{Endpoint: "c:4317", Headers: map[string]string{"x-key-bin": "v"}}, "reserved"},
		"header te":            {Options{Endpoint: "c:4317", Headers: map[string]string{"TE": "trailers"}}, "reserved"},
		"header twice":         {Options{Endpoint: "c:4317", Headers: map[string]string{"X-Team": "a", "x-team": "b"}}, "same header"},
		"header value newline": {Options{Endpoint: "c:4317", Headers: map[string]string{"authorization": secret}}, "printable ASCII"},
		"header value empty":   {Options{Endpoint: "c:4317", Headers: map[string]string{"authorization": ""}}, "printable ASCII"},
		"header value long":    {Options{Endpoint: "c:4317", Headers: map[string]string{"authorization": strings.Repeat("a", MaxHeaderValueLen+1)}}, "printable ASCII"},
		"too many headers":     {Options{Endpoint: "c:4317", Headers: manyHeaders(MaxHeaders + 1)}, "at most 32"},
	} {
		p, err := New(c.o, nil, quiet())
		if err == nil {
			_ = p.Shutdown(context.Background())
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v, want it to say %q (and never the value)", name, err, c.want)
		}
	}
	p, err := New(Options{Endpoint: "c:4317", Headers: manyHeaders(MaxHeaders)}, nil, quiet())
	if err != nil {
		t.Fatalf("%d headers: %v", MaxHeaders, err)
	}
	_ = p.Shutdown(context.Background())
}

func manyHeaders(n int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h["x-h"+string(rune('a'+i%26))+string(rune('a'+i/26))] = "v"
	}
	return h
}

// TestMetrics: both counters are registered, with both reasons present at 0; a second
// provider on the same registry is refused, not a panic.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := New(Options{Endpoint: "collector.invalid:4317", Insecure: true}, reg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	n, err := testutil.GatherAndCount(reg, "tlgw_trace_spans_exported_total", "tlgw_trace_spans_dropped_total")
	if err != nil || n != 3 {
		t.Fatalf("%d series (%v), want exported and dropped{queue_full,export_failed}", n, err)
	}
	if _, err := New(Options{Endpoint: "collector.invalid:4317"}, reg, quiet()); err == nil {
		t.Fatal("a second provider registered the same counters")
	}
}

// TestOTLPReceiver: a span goes over OTLP/gRPC to a real receiver on loopback, under the
// configured service name, with the configured headers; the counters say so.
func TestOTLPReceiver(t *testing.T) {
	rcv := otlptest.Start(t)
	reg := prometheus.NewRegistry()
	p, err := New(Options{Endpoint: rcv.Addr(), Insecure: true, SampleRatio: 1,
		Headers: map[string]string{"Authorization": "Bearer tok", "x-tenant": "t1"}}, reg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx := Extract(context.Background(), http.Header{"Traceparent": {"00-" + clientTrace + "-" + clientParent + "-01"}})
	_, s := p.Tracer().Start(ctx, "tlgw.request")
	s.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	if len(spans) != 1 {
		t.Fatalf("received %v", otlptest.Names(spans))
	}
	sp := spans[0]
	if sp.Name != "tlgw.request" || sp.TraceIDHex() != clientTrace || sp.ParentSpanIDHex() != clientParent {
		t.Errorf("span %s trace %s parent %s", sp.Name, sp.TraceIDHex(), sp.ParentSpanIDHex())
	}
	if got := sp.ResourceAttr("service.name"); got != "tlgw" {
		t.Errorf("service.name %q", got)
	}
	if sp.Scope != scopeName {
		t.Errorf("scope %q", sp.Scope)
	}
	h := rcv.Headers()
	if got := h.Get("authorization"); len(got) != 1 || got[0] != "Bearer tok" {
		t.Errorf("authorization %q", got)
	}
	if got := h.Get("x-tenant"); len(got) != 1 || got[0] != "t1" {
		t.Errorf("x-tenant %q", got)
	}
	if e, full, failed := counts(p); e != 1 || full != 0 || failed != 0 {
		t.Errorf("exported %v, queue_full %v, export_failed %v", e, full, failed)
	}
}

// TestOTLPReceiverRefuses: a collector that refuses a batch (a permanent error, not retried)
// costs its spans, counted as export_failed, and a log line; nothing is kept.
func TestOTLPReceiverRefuses(t *testing.T) {
	rcv := otlptest.Start(t)
	rcv.SetError(status.Error(codes.InvalidArgument, "bad batch"))
	var logs lockedBuffer
	p, err := New(Options{Endpoint: rcv.Addr(), Insecure: true, SampleRatio: 1, ServiceName: "gw-a"},
		nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, s := p.Tracer().Start(context.Background(), "s")
		s.End()
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e, _, failed := counts(p); e != 0 || failed != 3 {
		t.Fatalf("exported %v, export_failed %v; want 0, 3", e, failed)
	}
	if n := len(rcv.Spans()); n != 0 {
		t.Fatalf("the receiver kept %d spans", n)
	}
	if l := logs.lines(); len(l) != 1 || !strings.Contains(l[0], "bad batch") {
		t.Fatalf("log %q", l)
	}
}

// TestTLSByDefault: without Insecure the exporter speaks TLS, which a plaintext collector
// cannot answer: the batch fails and is counted, nothing arrives.
func TestTLSByDefault(t *testing.T) {
	rcv := otlptest.Start(t)
	s := defaultSettings()
	s.exportTimeout = 500 * time.Millisecond
	s.retry.MaxElapsedTime = 500 * time.Millisecond
	p, err := newProvider(Options{Endpoint: rcv.Addr(), SampleRatio: 1}, nil, quiet(), s)
	if err != nil {
		t.Fatal(err)
	}
	_, sp := p.Tracer().Start(context.Background(), "s")
	sp.End()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if e, _, failed := counts(p); e != 0 || failed != 1 {
		t.Fatalf("exported %v, export_failed %v; want 0, 1", e, failed)
	}
	if n := len(rcv.Spans()); n != 0 || rcv.Headers() != nil {
		t.Fatalf("a plaintext receiver got an export over TLS (%d spans)", n)
	}
}

// TestCollectorDown: with no collector listening, spans are counted as failed after the
// export's bounded retries, and Shutdown within its ctx stops everything.
func TestCollectorDown(t *testing.T) {
	rcv := otlptest.Start(t)
	addr := rcv.Addr()
	rcv.Stop()
	s := defaultSettings()
	s.exportTimeout = 300 * time.Millisecond
	s.retry.InitialInterval, s.retry.MaxElapsedTime = 50*time.Millisecond, 300*time.Millisecond
	p, err := newProvider(Options{Endpoint: addr, Insecure: true, SampleRatio: 1}, nil, quiet(), s)
	if err != nil {
		t.Fatal(err)
	}
	_, sp := p.Tracer().Start(context.Background(), "s")
	sp.End()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if e, _, failed := counts(p); e != 0 || failed != 1 {
		t.Fatalf("exported %v, export_failed %v; want 0, 1", e, failed)
	}
}

// eventually polls cond every millisecond until it holds, failing t after 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond) // stopped on return
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}
