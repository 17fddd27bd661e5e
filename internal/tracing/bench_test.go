package tracing

import (
	"context"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// nopExporter drops every batch as exported.
type nopExporter struct{}

func (nopExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (nopExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkUnsampledStart: a request's root span at the default sampling (ratio 0.01,
// parent-based, no client traceparent): Start and End, the 1% sampled included (their export
// is batched off the caller's path).
func BenchmarkUnsampledStart(b *testing.B) {
	p, err := newProvider(Options{Endpoint: "collector.invalid:4317", SampleRatio: 0.01, ParentBased: true}, nil, quiet(), func() settings {
		s := defaultSettings()
		s.exporter = nopExporter{}
		return s
	}())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	tr := p.Tracer()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, s := tr.Start(ctx, "tlgw.request")
		s.End()
	}
}

// BenchmarkExtract: a client's traceparent and tracestate into the request's context.
func BenchmarkExtract(b *testing.B) {
	for _, c := range []struct {
		name string
		h    http.Header
	}{
		{"traceparent", http.Header{"Traceparent": {validTP}}},
		{"traceparent+tracestate", http.Header{"Traceparent": {validTP}, "Tracestate": {"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}}},
		{"absent", http.Header{"Content-Type": {"application/json"}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_ = Extract(ctx, c.h)
			}
		})
	}
}
