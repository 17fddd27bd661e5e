// Package otlptest is an OTLP/gRPC trace receiver for tests: a TraceService on a loopback
// port that keeps the spans it is sent, for a test to wait for and read.
//
//	rcv := otlptest.Start(t) // stopped by t.Cleanup
//	// … point [tracing] otlp_endpoint at rcv.Addr() with insecure = true, run requests …
//	spans := rcv.WaitFor(t, func(s []*otlptest.Span) bool { return len(s) >= 1 }, 5*time.Second)
//	spans[0].Name, spans[0].TraceIDHex(), spans[0].ResourceAttr("service.name")
//
// It keeps at most MaxSpans spans; later ones are counted (Dropped) and not kept.
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// MaxSpans bounds the spans a Receiver keeps.
const MaxSpans = 100_000

// pollEvery is how often WaitFor looks again.
const pollEvery = 10 * time.Millisecond

// Span is one received span, with the resource and instrumentation scope it was sent under.
type Span struct {
	*tracepb.Span
	Resource []*commonpb.KeyValue // the resource's attributes (service.name, …)
	Scope    string               // the instrumentation scope's name
}

// TraceIDHex is the span's trace id as 32 lowercase hex digits.
func (s *Span) TraceIDHex() string { return hex.EncodeToString(s.GetTraceId()) }

// SpanIDHex is the span's id as 16 lowercase hex digits.
func (s *Span) SpanIDHex() string { return hex.EncodeToString(s.GetSpanId()) }

// ParentSpanIDHex is its parent's span id as 16 lowercase hex digits, or "" for a root span.
func (s *Span) ParentSpanIDHex() string { return hex.EncodeToString(s.GetParentSpanId()) }

// Attr is the span attribute key's value as text (a string as it is, a number or bool
// formatted), and whether the span has it.
func (s *Span) Attr(key string) (string, bool) { return find(s.GetAttributes(), key) }

// ResourceAttr is the resource attribute key's value as text, or "" when absent.
func (s *Span) ResourceAttr(key string) string {
	v, _ := find(s.Resource, key)
	return v
}

func find(kvs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() != key {
			continue
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue, true
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(v.IntValue, 10), true
		case *commonpb.AnyValue_BoolValue:
			return strconv.FormatBool(v.BoolValue), true
		case *commonpb.AnyValue_DoubleValue:
			return strconv.FormatFloat(v.DoubleValue, 'g', -1, 64), true
		default:
			return kv.GetValue().String(), true
		}
	}
	return "", false
}

// Receiver is a running OTLP/gRPC trace receiver. Its methods are safe for concurrent use.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer

	lis    net.Listener
	srv    *grpc.Server
	served chan struct{} // closed when Serve has returned
	once   sync.Once

	mu      sync.Mutex
	spans   []*Span     // at most MaxSpans
	dropped int         // spans received beyond MaxSpans
	headers metadata.MD // the last export's
	err     error       // what exports answer (SetError); nil: success
}

// Start serves a Receiver on 127.0.0.1 at a free port until the test ends (t.Cleanup calls
// Stop).
func Start(t testing.TB) *Receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{lis: lis, srv: grpc.NewServer(), served: make(chan struct{})}
	coltracepb.RegisterTraceServiceServer(r.srv, r)
	go func() { // ends at Stop
		defer close(r.served)
		_ = r.srv.Serve(lis)
	}()
	t.Cleanup(r.Stop)
	return r
}

// Addr is the receiver's host:port, for otlp_endpoint (plaintext: insecure = true).
func (r *Receiver) Addr() string { return r.lis.Addr().String() }

// Stop closes the listener and every connection and waits for the server to end; a later
// export finds nobody. Stopping twice is fine.
func (r *Receiver) Stop() {
	r.once.Do(func() {
		r.srv.Stop()
		<-r.served
	})
}

// SetError makes every later export fail with err (a gRPC status error, e.g.
// status.Error(codes.InvalidArgument, "no")), or succeed again with nil. A failed export keeps
// nothing.
func (r *Receiver) SetError(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// Export keeps the request's spans (up to MaxSpans in all) and its metadata.
func (r *Receiver) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.headers = md.Copy()
	if r.err != nil {
		return nil, r.err
	}
	for _, rs := range req.GetResourceSpans() {
		res := rs.GetResource().GetAttributes()
		for _, ss := range rs.GetScopeSpans() {
			scope := ss.GetScope().GetName()
			for _, sp := range ss.GetSpans() {
				if len(r.spans) >= MaxSpans {
					r.dropped++
					continue
				}
				r.spans = append(r.spans, &Span{Span: sp, Resource: res, Scope: scope})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// Spans is a snapshot of the spans received so far, in arrival order. The spans themselves are
// shared: read them, do not change them.
func (r *Receiver) Spans() []*Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Span(nil), r.spans...)
}

// Dropped is how many spans arrived after MaxSpans were kept.
func (r *Receiver) Dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// Headers is a copy of the metadata of the last export (keys lowercase), or nil before any.
func (r *Receiver) Headers() metadata.MD {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.headers == nil {
		return nil
	}
	return r.headers.Copy()
}

// WaitFor polls the spans received until cond holds for them, and returns them; it fails the
// test when timeout passes first.
func (r *Receiver) WaitFor(t testing.TB, cond func([]*Span) bool, timeout time.Duration) []*Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollEvery) // stopped on return
	defer tick.Stop()
	for {
		spans := r.Spans()
		if cond(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("otlptest: after %v, %d spans received and the condition does not hold", timeout, len(spans))
			return nil
		}
		<-tick.C
	}
}

// Names are the spans' names, in order: for test failure messages.
func Names(spans []*Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.GetName()
	}
	return out
}
