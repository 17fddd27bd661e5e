package tracing

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

const validTP = "00-" + clientTrace + "-" + clientParent + "-01"

// TestExtract: what a client's headers make of a request's trace context.
func TestExtract(t *testing.T) {
	// Four members of 127 bytes and commas: 511 bytes; a last one of 1 byte more makes 512.
	long := strings.Join([]string{"a=" + strings.Repeat("x", 125), "b=" + strings.Repeat("x", 125),
		"c=" + strings.Repeat("x", 125), "d=" + strings.Repeat("x", 125)}, ",") + "e"
	if len(long) != MaxTracestateLen {
		t.Fatalf("long tracestate is %d bytes", len(long))
	}
	for _, c := range []struct {
		name       string
		h          http.Header
		trace      string // the trace id extracted; "": none
		tracestate string
		sampled    bool
	}{
		{"valid", http.Header{"Traceparent": {validTP}}, clientTrace, "", true},
		{"not sampled", http.Header{"Traceparent": {"00-" + clientTrace + "-" + clientParent + "-00"}}, clientTrace, "", false},
		{"with tracestate", http.Header{"Traceparent": {validTP}, "Tracestate": {"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}},
			clientTrace, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", true},
		{"tracestate headers joined", http.Header{"Traceparent": {validTP}, "Tracestate": {"rojo=1", "congo=2"}}, clientTrace, "rojo=1,congo=2", true},
		{"tracestate at its bound", http.Header{"Traceparent": {validTP}, "Tracestate": {long}}, clientTrace, long, true},
		{"tracestate past its bound", http.Header{"Traceparent": {validTP}, "Tracestate": {long + "a"}}, clientTrace, "", true},
		{"tracestate headers past the bound together", http.Header{"Traceparent": {validTP}, "Tracestate": {long[:256], "f" + long[256:]}}, clientTrace, "", true},
		{"bad tracestate keeps the traceparent", http.Header{"Traceparent": {validTP}, "Tracestate": {"=nokey"}}, clientTrace, "", true},
		{"later version with a field", http.Header{"Traceparent": {"01-" + clientTrace + "-" + clientParent + "-01-what-ever"}}, clientTrace, "", true},
		{"absent", http.Header{}, "", "", false},
		{"empty", http.Header{"Traceparent": {""}}, "", "", false},
		{"two traceparent headers", http.Header{"Traceparent": {validTP, validTP}}, "", "", false},
		{"uppercase hex", http.Header{"Traceparent": {strings.ToUpper(validTP)}}, "", "", false},
		{"version 00 with a field", http.Header{"Traceparent": {validTP + "-x"}}, "", "", false},
		{"version ff", http.Header{"Traceparent": {"ff" + validTP[2:]}}, "", "", false},
		{"zero trace id", http.Header{"Traceparent": {"00-" + strings.Repeat("0", 32) + "-" + clientParent + "-01"}}, "", "", false},
		{"zero parent id", http.Header{"Traceparent": {"00-" + clientTrace + "-" + strings.Repeat("0", 16) + "-01"}}, "", "", false},
		{"short trace id", http.Header{"Traceparent": {"00-" + clientTrace[1:] + "-" + clientParent + "-01"}}, "", "", false},
		{"too long", http.Header{"Traceparent": {"01-" + clientTrace + "-" + clientParent + "-01-" + strings.Repeat("x", MaxTraceparentLen)}}, "", "", false},
	} {
		ctx := Extract(context.Background(), c.h)
		sc := trace.SpanContextFromContext(ctx)
		if got := TraceID(ctx); got != c.trace {
			t.Errorf("%s: trace id %q, want %q", c.name, got, c.trace)
		}
		if c.trace == "" {
			if ctx != context.Background() {
				t.Errorf("%s: ctx changed", c.name)
			}
			continue
		}
		if !sc.IsRemote() || sc.IsSampled() != c.sampled || sc.SpanID().String() != clientParent {
			t.Errorf("%s: %+v", c.name, sc)
		}
		if got := sc.TraceState().String(); got != c.tracestate {
			t.Errorf("%s: tracestate %q, want %q", c.name, got, c.tracestate)
		}
	}
}

// TestInjectHTTP: an outgoing request carries the context's traceparent and tracestate; a
// stale tracestate is removed; without a valid span context the headers stay as they were.
func TestInjectHTTP(t *testing.T) {
	in := http.Header{"Traceparent": {validTP}, "Tracestate": {"rojo=1"}}
	ctx := Extract(context.Background(), in)
	out := http.Header{"Tracestate": {"stale=1"}, "Content-Type": {"application/json"}}
	InjectHTTP(ctx, out)
	if diff := cmp.Diff(http.Header{"Traceparent": {validTP}, "Tracestate": {"rojo=1"}, "Content-Type": {"application/json"}}, out); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}

	out = http.Header{"Tracestate": {"stale=1"}}
	InjectHTTP(Extract(context.Background(), http.Header{"Traceparent": {validTP}}), out)
	if diff := cmp.Diff(http.Header{"Traceparent": {validTP}}, out); diff != "" {
		t.Errorf("without tracestate (-want +got):\n%s", diff)
	}

	out = http.Header{"Traceparent": {"kept"}}
	InjectHTTP(context.Background(), out)
	if diff := cmp.Diff(http.Header{"Traceparent": {"kept"}}, out); diff != "" {
		t.Errorf("no span context (-want +got):\n%s", diff)
	}

	// A local span's context: its own span id is the engine's parent.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	sctx, span := tp.Tracer("t").Start(ctx, "tlgw.attempt")
	defer span.End()
	out = http.Header{}
	InjectHTTP(sctx, out)
	want := "00-" + clientTrace + "-" + span.SpanContext().SpanID().String() + "-01"
	if got := out.Get("traceparent"); got != want || out.Get("tracestate") != "rojo=1" {
		t.Errorf("traceparent %q tracestate %q, want %q, rojo=1", got, out.Get("tracestate"), want)
	}
}

// TestOutgoingGRPC: a control call's metadata carries the context's traceparent and
// tracestate, appended to what it had; without a valid span context it is unchanged.
func TestOutgoingGRPC(t *testing.T) {
	base := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "r1")
	ctx := Extract(base, http.Header{"Traceparent": {validTP}, "Tracestate": {"rojo=1"}})
	md, _ := metadata.FromOutgoingContext(OutgoingGRPC(ctx))
	if diff := cmp.Diff(metadata.MD{"x-request-id": {"r1"}, "traceparent": {validTP}, "tracestate": {"rojo=1"}}, md); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	md, _ = metadata.FromOutgoingContext(OutgoingGRPC(Extract(context.Background(), http.Header{"Traceparent": {validTP}})))
	if diff := cmp.Diff(metadata.MD{"traceparent": {validTP}}, md); diff != "" {
		t.Errorf("without tracestate (-want +got):\n%s", diff)
	}
	if got := OutgoingGRPC(base); got != base {
		t.Error("no span context: ctx changed")
	}
}

// FuzzExtract: Extract never panics; the trace id is "" or 32 lowercase hex digits; a valid
// context round-trips through InjectHTTP: a version-00 traceparent comes out unchanged, a
// tracestate without optional whitespace or empty members too, and extracting what was
// injected gives the same context.
func FuzzExtract(f *testing.F) {
	f.Add(validTP, "", "")
	f.Add(validTP, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "")
	f.Add(validTP, "rojo=1", "congo=2")
	f.Add("01-"+clientTrace+"-"+clientParent+"-03-extra", "a=b , c=d", "")
	f.Add(strings.ToUpper(validTP), "", "")
	f.Add("00-"+clientTrace+"-"+clientParent+"-ff", "k@v=x", "")
	f.Fuzz(func(t *testing.T, tp, ts1, ts2 string) {
		h := http.Header{"Traceparent": {tp}}
		switch {
		case ts1 != "" && ts2 != "":
			h["Tracestate"] = []string{ts1, ts2}
		case ts1 != "":
			h["Tracestate"] = []string{ts1}
		}
		ctx := Extract(context.Background(), h)
		id := TraceID(ctx)
		if id != "" && !lowerHex(id, 32) {
			t.Fatalf("trace id %q", id)
		}
		sc := trace.SpanContextFromContext(ctx)
		if id == "" {
			if sc.IsValid() || ctx != context.Background() {
				t.Fatalf("no trace id but a span context %+v", sc)
			}
			return
		}
		if len(tp) > MaxTraceparentLen || len(sc.TraceState().String()) > MaxTracestateLen {
			t.Fatalf("past the bounds: traceparent %d bytes, tracestate %d", len(tp), len(sc.TraceState().String()))
		}
		out := http.Header{}
		InjectHTTP(ctx, out)
		if strings.HasPrefix(tp, "00-") && out.Get("traceparent") != tp {
			t.Fatalf("traceparent %q came out as %q", tp, out.Get("traceparent"))
		}
		joined := strings.Join(h["Tracestate"], ",")
		if sc.TraceState().Len() > 0 && canonicalTracestate(joined) && out.Get("tracestate") != joined {
			t.Fatalf("tracestate %q came out as %q", joined, out.Get("tracestate"))
		}
		again := trace.SpanContextFromContext(Extract(context.Background(), out))
		if !again.Equal(sc) {
			t.Fatalf("re-extracted %+v, want %+v", again, sc)
		}
	})
}

func lowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// canonicalTracestate: no optional whitespace and no empty list member, so a parsed one
// prints back the same.
func canonicalTracestate(s string) bool {
	if strings.ContainsAny(s, " \t") {
		return false
	}
	for _, m := range strings.Split(s, ",") {
		if m == "" {
			return false
		}
	}
	return true
}
