package otlptest

import (
	"context"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func request(names ...string) *coltracepb.ExportTraceServiceRequest {
	ss := &tracepb.ScopeSpans{}
	for _, n := range names {
		ss.Spans = append(ss.Spans, &tracepb.Span{Name: n, TraceId: []byte{0x4b, 0xf9, 15: 0x36}, SpanId: []byte{0, 0xf0, 7: 0xb7},
			Attributes: []*commonpb.KeyValue{str("route", "smol"),
				{Key: "attempt", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: 2}}}}})
	}
	ss.Scope = &commonpb.InstrumentationScope{Name: "scope"}
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   &resourcepb.Resource{Attributes: []*commonpb.KeyValue{str("service.name", "tlgw")}},
		ScopeSpans: []*tracepb.ScopeSpans{ss},
	}}}
}

// TestReceiver: spans sent over gRPC arrive with their resource, scope and attributes, and
// the export's metadata; SetError refuses exports (keeping nothing) until cleared.
func TestReceiver(t *testing.T) {
	r := Start(t)
	if r.Headers() != nil || len(r.Spans()) != 0 {
		t.Fatal("a new receiver holds something")
	}
	conn, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := coltracepb.NewTraceServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer x")
	if _, err := c.Export(ctx, request("a", "b")); err != nil {
		t.Fatal(err)
	}
	spans := r.WaitFor(t, func(s []*Span) bool { return len(s) == 2 }, 5*time.Second)
	s := spans[0]
	if s.Name != "a" || s.ResourceAttr("service.name") != "tlgw" || s.Scope != "scope" ||
		s.TraceIDHex() != "4bf90000000000000000000000000036" || s.SpanIDHex() != "00f00000000000b7" || s.ParentSpanIDHex() != "" {
		t.Errorf("span %s resource %q scope %q trace %s span %s parent %q", s.Name, s.ResourceAttr("service.name"), s.Scope,
			s.TraceIDHex(), s.SpanIDHex(), s.ParentSpanIDHex())
	}
	if v, ok := s.Attr("route"); v != "smol" || !ok {
		t.Errorf("route %q %v", v, ok)
	}
	if v, ok := s.Attr("attempt"); v != "2" || !ok {
		t.Errorf("attempt %q %v", v, ok)
	}
	if _, ok := s.Attr("missing"); ok {
		t.Error("a missing attribute is there")
	}
	if got := r.Headers().Get("authorization"); len(got) != 1 || got[0] != "Bearer x" {
		t.Errorf("authorization %q", got)
	}

	r.SetError(status.Error(codes.Unavailable, "down"))
	if _, err := c.Export(context.Background(), request("c")); status.Code(err) != codes.Unavailable {
		t.Fatalf("export while failing: %v", err)
	}
	r.SetError(nil)
	if _, err := c.Export(context.Background(), request("d")); err != nil {
		t.Fatal(err)
	}
	if got := Names(r.Spans()); len(got) != 3 || got[2] != "d" {
		t.Fatalf("spans %q", got)
	}
	r.Stop()
	r.Stop()
	if _, err := c.Export(context.Background(), request("e")); err == nil {
		t.Fatal("a stopped receiver answered")
	}
}

// TestReceiverBound: it keeps MaxSpans spans and counts the rest.
func TestReceiverBound(t *testing.T) {
	r := Start(t)
	names := make([]string, MaxSpans/2+1)
	for range 2 {
		if _, err := r.Export(context.Background(), request(names...)); err != nil {
			t.Fatal(err)
		}
	}
	if n, d := len(r.Spans()), r.Dropped(); n != MaxSpans || d != 2 {
		t.Fatalf("kept %d, dropped %d; want %d, 2", n, d, MaxSpans)
	}
}
