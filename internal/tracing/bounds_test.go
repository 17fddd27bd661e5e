package tracing

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

const validParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestBoundsAreInclusive: every bound on what a client or the configuration gives is its
// largest accepted size, the next one refused.
func TestBoundsAreInclusive(t *testing.T) {
	if err := CheckHeaderName(strings.Repeat("a", MaxHeaderNameLen)); err != nil {
		t.Errorf("a %d-character name: %v", MaxHeaderNameLen, err)
	}
	if CheckHeaderName(strings.Repeat("a", MaxHeaderNameLen+1)) == nil {
		t.Errorf("a %d-character name accepted", MaxHeaderNameLen+1)
	}
	if err := CheckHeaderValue(strings.Repeat("v", MaxHeaderValueLen)); err != nil {
		t.Errorf("a %d-character value: %v", MaxHeaderValueLen, err)
	}
	if CheckHeaderValue(strings.Repeat("v", MaxHeaderValueLen+1)) == nil {
		t.Errorf("a %d-character value accepted", MaxHeaderValueLen+1)
	}
	for _, v := range []string{" ", "~", "a b~"} {
		if err := CheckHeaderValue(v); err != nil {
			t.Errorf("%q: %v", v, err)
		}
	}
	for _, v := range []string{"\x1f", "\x7f", "a\tb", "é"} {
		if CheckHeaderValue(v) == nil {
			t.Errorf("%q accepted", v)
		}
	}
	for port, ok := range map[string]bool{"1": true, "65535": true, "0": false, "65536": false} {
		if got := validEndpoint("127.0.0.1:" + port); got != ok {
			t.Errorf("port %s: valid %v", port, got)
		}
	}
	for size, ok := range map[int]bool{MaxQueueSize: true, MaxQueueSize + 1: false} {
		o := Options{Endpoint: "127.0.0.1:4317", SampleRatio: 0.5, QueueSize: size}
		if err := check(&o); (err == nil) != ok {
			t.Errorf("queue size %d: %v", size, err)
		}
	}
}

// TestExtractBounds: a later version's traceparent of MaxTraceparentLen bytes is read, one byte
// more is not; a tracestate of MaxTracestateLen bytes, alone or joined from two headers, is
// kept, one byte more is dropped (the traceparent still counts).
func TestExtractBounds(t *testing.T) {
	future := "01" + validParent[2:] + "-"
	longest := future + strings.Repeat("x", MaxTraceparentLen-len(future))
	for v, want := range map[string]string{longest: "4bf92f3577b34da6a3ce929d0e0e4736", longest + "x": ""} {
		if got := TraceID(Extract(context.Background(), http.Header{"Traceparent": {v}})); got != want {
			t.Errorf("a %d-byte traceparent: trace %q, want %q", len(v), got, want)
		}
	}
	// Two members making exactly MaxTracestateLen bytes with the comma between them.
	m1 := "a=" + strings.Repeat("x", 254)
	m2 := "b=" + strings.Repeat("y", MaxTracestateLen-len(m1)-1-2)
	state := func(h http.Header) string {
		out := http.Header{}
		InjectHTTP(Extract(context.Background(), h), out)
		if out.Get("Traceparent") == "" {
			t.Fatal("the traceparent was dropped with the tracestate")
		}
		return out.Get("Tracestate")
	}
	for _, c := range []struct {
		name  string
		state []string
		want  string
	}{
		{"one header at the bound", []string{m1 + "," + m2}, m1 + "," + m2},
		{"one header over it", []string{m1 + "," + m2 + "y"}, ""},
		{"two headers joined at the bound", []string{m1, m2}, m1 + "," + m2},
		{"two headers joined over it", []string{m1, m2 + "y"}, ""},
	} {
		if len(strings.Join(c.state, ",")) > MaxTracestateLen+1 {
			t.Fatalf("%s: the case is built wrong", c.name)
		}
		if got := state(http.Header{"Traceparent": {validParent}, "Tracestate": c.state}); got != c.want {
			t.Errorf("%s: tracestate %d bytes, want %d", c.name, len(got), len(c.want))
		}
	}
	if got := joinBounded([]string{"ab", "cd"}, 5); got != "ab,cd" {
		t.Errorf("joinBounded at its bound: %q", got)
	}
	if got := joinBounded([]string{"ab", "cd"}, 4); got != "" {
		t.Errorf("joinBounded over its bound: %q", got)
	}
}

// TestFailureLogAtTheInterval: the next failure log may come exactly one interval after the
// last.
func TestFailureLogAtTheInterval(t *testing.T) {
	var logs lockedBuffer
	now := time.Unix(1_700_000_000, 0)
	e := newCountingExporter(failer{}, newMetrics(), slog.New(slog.NewTextHandler(&logs, nil)), func() time.Time { return now }, ErrorLogInterval)
	batch := make([]sdktrace.ReadOnlySpan, 1)
	e.pending.Store(3)
	_ = e.ExportSpans(context.Background(), batch)
	now = now.Add(ErrorLogInterval - time.Nanosecond)
	_ = e.ExportSpans(context.Background(), batch)
	if n := len(logs.lines()); n != 1 {
		t.Fatalf("%d log lines within the interval", n)
	}
	now = now.Add(time.Nanosecond)
	_ = e.ExportSpans(context.Background(), batch)
	if n := len(logs.lines()); n != 2 {
		t.Fatalf("%d log lines at the interval, want 2", n)
	}
}
