package engine

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
)

// tpOf is a valid version-00 traceparent whose trace id and parent id both end in i+1.
func tpOf(i int, flags string) string { return fmt.Sprintf("00-%032x-%016x-%s", i+1, i+1, flags) }

// get sends GET path to e with the headers hdr (name, value, …) and returns the status.
func get(t *testing.T, e *Engine, path string, hdr ...string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// traceparentsJSON is GET /tlengine/traceparents's body.
func traceparentsJSON(t *testing.T, e *Engine) []byte {
	t.Helper()
	resp, err := http.Get("http://" + e.HTTPAddr + TraceparentsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %q %s", TraceparentsPath, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return b
}

// listed is the engine's received traceparents, read over HTTP.
func listed(t *testing.T, e *Engine) []Traceparent {
	t.Helper()
	var out struct {
		Traceparents []Traceparent `json:"traceparents"`
	}
	dec := json.NewDecoder(bytes.NewReader(traceparentsJSON(t, e)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Traceparents
}

// TestTraceparentRecorded (R24): a served request's valid traceparent is listed with the route's
// path (not the client's) and its X-Request-ID, oldest first; a future version of 55 bytes is
// valid; an unknown path and the list itself record nothing.
func TestTraceparentRecorded(t *testing.T) {
	e := start(t, Config{})
	if got := string(traceparentsJSON(t, e)); got != `{"traceparents":[]}` {
		t.Fatalf("an engine that received nothing lists %s", got)
	}
	a := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b := "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	if resp, out := post(t, e, "/v1/chat/completions", `{"model":"smol","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		"traceparent", a, "X-Request-ID", "req-7"); resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, out)
	}
	if resp, out := post(t, e, "/v1/tokenize", `{"model":"smol","prompt":"hi"}`, "traceparent", b); resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, out)
	}
	if code := get(t, e, "/v1/responses/resp-unknown", "traceparent", tpOf(1, "01")); code != 404 {
		t.Fatalf("an unknown stored response: %d", code)
	}
	if code := get(t, e, "/nowhere", "traceparent", tpOf(2, "01")); code != 404 {
		t.Fatalf("an unknown path: %d", code)
	}
	if code := get(t, e, TraceparentsPath, "traceparent", tpOf(3, "01")); code != 200 {
		t.Fatalf("the list: %d", code)
	}
	want := `{"traceparents":[` +
		`{"traceparent":"` + a + `","path":"/v1/chat/completions","request_id":"req-7"},` +
		`{"traceparent":"` + b + `","path":"/v1/tokenize","request_id":""},` +
		`{"traceparent":"` + tpOf(1, "01") + `","path":"/v1/responses/{id}","request_id":""}]}`
	if got := string(traceparentsJSON(t, e)); got != want {
		t.Fatalf("listed\n%s\nwant\n%s", got, want)
	}
}

// TestTraceparentInvalidIgnored: anything but a valid W3C traceparent of 55 bytes is not
// recorded; a request id that is not 1 to 128 printable ASCII bytes is not kept.
func TestTraceparentInvalidIgnored(t *testing.T) {
	e := start(t, Config{})
	const tid, pid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, bad := range []string{
		"ff-" + tid + "-" + pid + "-01",                     // version ff
		"00-" + strings.Repeat("0", 32) + "-" + pid + "-01", // all-zero trace id
		"00-" + tid + "-" + strings.Repeat("0", 16) + "-01", // all-zero parent id
		"00-" + strings.ToUpper(tid) + "-" + pid + "-01",    // upper-case hex
		"00-" + tid + "-" + strings.ToUpper(pid) + "-01",
		"00-" + tid + "-" + pid + "-0A",
		"00-" + tid[1:] + "-" + pid + "-01",   // 54 bytes
		"00-" + tid + "0-" + pid + "-01",      // 56 bytes
		"00-" + tid + "-" + pid + "-01-",      // version 00 with another field
		"01-" + tid + "-" + pid + "-01-extra", // longer than 55 bytes, whatever the version
		"00_" + tid + "_" + pid + "_01",       // no dashes
		"00-" + tid[:31] + "g-" + pid + "-01", // not hex
		"00-" + tid + "-" + pid + "-0",        // short flags
		"00-" + strings.Repeat("a", 10<<10),   // 10 KB
		strings.Repeat("0", traceparentLen),   // 55 bytes of nothing
	} {
		if resp, out := post(t, e, "/v1/tokenize", `{"model":"smol","prompt":"hi"}`, "traceparent", bad, "X-Request-ID", "r"); resp.StatusCode != 200 {
			t.Fatalf("tokenize with traceparent %.60q: %d %s", bad, resp.StatusCode, out)
		}
	}
	if got := listed(t, e); len(got) != 0 {
		t.Fatalf("invalid traceparents recorded: %+v", got)
	}
	for _, id := range []string{strings.Repeat("x", 129), "réq", "a\tb"} {
		post(t, e, "/v1/tokenize", `{"model":"smol","prompt":"hi"}`, "traceparent", tpOf(0, "01"), "X-Request-ID", id)
	}
	post(t, e, "/v1/tokenize", `{"model":"smol","prompt":"hi"}`, "traceparent", tpOf(0, "01"), "X-Request-ID", strings.Repeat("y", 128))
	want := []Traceparent{
		{tpOf(0, "01"), "/v1/tokenize", ""}, {tpOf(0, "01"), "/v1/tokenize", ""}, {tpOf(0, "01"), "/v1/tokenize", ""},
		{tpOf(0, "01"), "/v1/tokenize", strings.Repeat("y", 128)},
	}
	if diff := cmp.Diff(want, listed(t, e)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

// TestTraceparentRing: the list holds the latest MaxTraceparents, oldest first.
func TestTraceparentRing(t *testing.T) {
	e := start(t, Config{})
	const sent = 300
	var want []Traceparent
	for i := range sent {
		id := fmt.Sprintf("r%d", i)
		if code := get(t, e, "/health", "traceparent", tpOf(i, "01"), "X-Request-ID", id); code != 200 {
			t.Fatalf("health: %d", code)
		}
		want = append(want, Traceparent{tpOf(i, "01"), "/health", id})
	}
	want = want[sent-MaxTraceparents:]
	if diff := cmp.Diff(want, listed(t, e)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, e.Traceparents()); diff != "" {
		t.Fatalf("Traceparents (-want +got):\n%s", diff)
	}
}

// TestTraceparentGRPC: EngineControl/Prefill and KvTransferService/Release record their
// traceparent metadata under the method, with x-request-id metadata, else the request's
// request_id; invalid metadata is not recorded.
func TestTraceparentGRPC(t *testing.T) {
	x := startPD(t, Config{})
	body := map[string]any{"model": "smol", "prompt": "Once upon a time", "max_tokens": 4, "seed": 3}
	md := func(kv ...string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), kv...)
	}
	var handles []string
	for _, ctx := range []context.Context{
		md("traceparent", tpOf(10, "01"), "x-request-id", "gw-10"),
		md("traceparent", tpOf(11, "00")),
		md("traceparent", strings.ToUpper(tpOf(12, "01")), "x-request-id", "gw-12"),
		md("x-request-id", "gw-13"),
	} {
		resp, err := x.ctl.Prefill(ctx, x.prefillReq(t, body))
		if err != nil {
			t.Fatalf("Prefill: %v", err)
		}
		handles = append(handles, resp.GetHandle().GetHandleId())
	}
	for i, h := range handles {
		if _, err := x.kv.Release(md("traceparent", tpOf(20+i, "01"), "x-request-id", fmt.Sprintf("gw-%d", 20+i)), &kvv1.KvHandle{HandleId: h}); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	want := []Traceparent{
		{tpOf(10, "01"), enginev1.EngineControl_Prefill_FullMethodName, "gw-10"},
		{tpOf(11, "00"), enginev1.EngineControl_Prefill_FullMethodName, "req-1"}, // the PrefillRequest's request_id
	}
	if diff := cmp.Diff(want, listed(t, x.p)); diff != "" {
		t.Fatalf("prefill engine (-want +got):\n%s", diff)
	}
	var released []Traceparent
	for i := range handles {
		released = append(released, Traceparent{tpOf(20+i, "01"), kvv1.KvTransferService_Release_FullMethodName, fmt.Sprintf("gw-%d", 20+i)})
	}
	if diff := cmp.Diff(released, listed(t, x.d)); diff != "" {
		t.Fatalf("decode engine (-want +got):\n%s", diff)
	}
}

// TestTraceparentPDSideChannel: under --pd vllm the decode engine's fetch of the KV carries the
// request's trace to the prefill engine's side channel, which records it.
func TestTraceparentPDSideChannel(t *testing.T) {
	x := startPDProto(t, PDVLLM, Config{})
	body := map[string]any{"model": "smol", "prompt": "Once upon a time", "max_tokens": 4, "seed": 3}
	raw := x.vllmPrefill(t, body)
	resp, out := post(t, x.d, "/v1/completions", mustJSON(with(body, "kv_transfer_params", raw)), "traceparent", tpOf(5, "01"), "X-Request-ID", "gw-5")
	if resp.StatusCode != 200 {
		t.Fatalf("decode: %d %s", resp.StatusCode, out)
	}
	if diff := cmp.Diff([]Traceparent{{tpOf(5, "01"), "/v1/completions", "gw-5"}}, listed(t, x.d)); diff != "" {
		t.Fatalf("decode engine (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Traceparent{{tpOf(5, "01"), "/tlengine/pd/send", ""}}, listed(t, x.p)); diff != "" {
		t.Fatalf("prefill engine (-want +got):\n%s", diff)
	}
}

// keptSpans is the SDK's in-memory exporter, except that Shutdown keeps what was exported (and
// says it was called), so a test reads the spans Close flushed.
type keptSpans struct {
	*tracetest.InMemoryExporter
	shut atomic.Bool
}

func (k *keptSpans) Shutdown(context.Context) error { k.shut.Store(true); return nil }

var _ sdktrace.SpanExporter = (*keptSpans)(nil)

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestSpans (R24): each served request is one server span tlengine.request, the child of the
// received traceparent (its trace id, its parent id as the parent span), with the route and the
// status; an unsampled traceparent gives no span (the gateway's sampling decision holds); a
// request without one is a root span; Close flushes the spans and stops the pipeline.
func TestSpans(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	exp := &keptSpans{InMemoryExporter: tracetest.NewInMemoryExporter()}
	e := start(t, Config{SpanExporter: exp})
	const a = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	chat := `{"model":"smol","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`
	if resp, out := post(t, e, "/v1/chat/completions", chat, "traceparent", a); resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, out)
	}
	if resp, _ := post(t, e, "/v1/completions", `{"model":"smol","prompt":`, "traceparent", tpOf(1, "01")); resp.StatusCode != 400 {
		t.Fatalf("bad JSON: %d", resp.StatusCode)
	}
	if resp, _ := post(t, e, "/v1/completions", `{"model":"smol","prompt":"hi","max_tokens":1}`, "traceparent", tpOf(2, "00")); resp.StatusCode != 200 {
		t.Fatalf("unsampled: %d", resp.StatusCode)
	}
	if resp, _ := post(t, e, "/v1/tokenize", `{"model":"smol","prompt":"hi"}`); resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d", resp.StatusCode)
	}
	e.Close()
	if !exp.shut.Load() {
		t.Fatal("Close did not shut the span exporter down")
	}
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3 (the unsampled request has none): %+v", len(spans), spans)
	}
	type seen struct {
		Name          string
		Kind          trace.SpanKind
		Trace, Parent string
		Remote        bool
		Route         string
		Status        int64
	}
	var got []seen
	for _, s := range spans {
		at := attrs(s)
		got = append(got, seen{s.Name, s.SpanKind, s.SpanContext.TraceID().String(), s.Parent.SpanID().String(), s.Parent.IsRemote(),
			at["http.route"].AsString(), at["http.response.status_code"].AsInt64()})
		if !s.SpanContext.IsValid() || s.SpanContext.SpanID() == s.Parent.SpanID() {
			t.Errorf("span %s: its own span id %s", s.Name, s.SpanContext.SpanID())
		}
		if n := s.Resource.Set(); !n.HasValue("service.name") {
			t.Errorf("span without service.name: %v", s.Resource)
		}
	}
	// Spans are exported as they end: in the routes' order here, whatever the requests' overlap.
	slices.SortFunc(got, func(x, y seen) int { return strings.Compare(x.Route, y.Route) })
	root := got[2].Trace // a request without a traceparent starts its own trace
	want := []seen{
		{SpanName, trace.SpanKindServer, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true, "/v1/chat/completions", 200},
		{SpanName, trace.SpanKindServer, fmt.Sprintf("%032x", 2), fmt.Sprintf("%016x", 2), true, "/v1/completions", 400},
		{SpanName, trace.SpanKindServer, root, trace.SpanID{}.String(), false, "/v1/tokenize", 200},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("spans (-want +got):\n%s", diff)
	}
	if root == fmt.Sprintf("%032x", 0) {
		t.Fatal("the root span has no trace id")
	}
}

// TestSpansOff: without --otlp-endpoint or an exporter there is no span pipeline, and a
// traceparent is still recorded.
func TestSpansOff(t *testing.T) {
	e := start(t, Config{})
	if e.tp != nil || e.tracer != nil {
		t.Fatal("a span pipeline without --otlp-endpoint")
	}
	if code := get(t, e, "/health", "traceparent", tpOf(0, "01")); code != 200 || len(e.Traceparents()) != 1 {
		t.Fatalf("health %d, recorded %v", code, e.Traceparents())
	}
	for _, bad := range []string{"collector", "collector:0", ":4317", "collector:65536", "collector:x"} {
		if _, err := Start(Config{ID: "e", Model: "smol", OTLPEndpoint: bad}); err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
			t.Errorf("--otlp-endpoint %q: %v", bad, err)
		}
	}
}

// collector is a loopback OTLP/gRPC trace receiver: it hands each export to got (bounded: a
// test's few exports; more are refused with an error, never blocked on).
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	got chan *collectortrace.ExportTraceServiceRequest
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	select {
	case c.got <- req:
		return &collectortrace.ExportTraceServiceResponse{}, nil
	default:
		return nil, fmt.Errorf("the test collector is full")
	}
}

// TestOTLPEndpoint: with OTLPEndpoint the spans go over OTLP/gRPC to the collector there, with
// the received traceparent's ids and tlengine's service name, flushed by Close.
func TestOTLPEndpoint(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{got: make(chan *collectortrace.ExportTraceServiceRequest, 8)}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	e := start(t, Config{ID: "otlp-1", OTLPEndpoint: lis.Addr().String()})
	const a = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if resp, out := post(t, e, "/v1/completions", `{"model":"smol","prompt":"hi","max_tokens":1}`, "traceparent", a); resp.StatusCode != 200 {
		t.Fatalf("completions: %d %s", resp.StatusCode, out)
	}
	e.Close()
	var req *collectortrace.ExportTraceServiceRequest
	select {
	case req = <-c.got:
	default:
		t.Fatal("Close returned with no span exported")
	}
	rs := req.GetResourceSpans()
	if len(rs) != 1 || len(rs[0].GetScopeSpans()) != 1 || len(rs[0].GetScopeSpans()[0].GetSpans()) != 1 {
		t.Fatalf("export: %v", req)
	}
	var service string
	for _, kv := range rs[0].GetResource().GetAttributes() {
		if kv.GetKey() == "service.name" {
			service = kv.GetValue().GetStringValue()
		}
	}
	s := rs[0].GetScopeSpans()[0].GetSpans()[0]
	if s.GetName() != SpanName || hex.EncodeToString(s.GetTraceId()) != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		hex.EncodeToString(s.GetParentSpanId()) != "00f067aa0ba902b7" || service != "tlengine" {
		t.Fatalf("span %v of service %q", s, service)
	}
}

// validW3C is the definition the engine's parser is held to: 55 bytes, four dash-separated
// lower-case hex fields of 2, 32, 16 and 2, the version not ff, neither id all zeros, and (the
// propagator's rule for version 00) no reserved flag bit.
func validW3C(s string) bool {
	if len(s) != traceparentLen || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if i == 2 || i == 35 || i == 52 {
			continue
		}
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	ver, tid, pid, flags := s[0:2], s[3:35], s[36:52], s[53:55]
	return ver != "ff" && tid != strings.Repeat("0", 32) && pid != strings.Repeat("0", 16) &&
		(ver != "00" || flags[0] == '0' && flags[1] <= '3')
}

// FuzzTraceparent holds extractTraceparent to validW3C: it keeps exactly the valid values, as
// they came, and the context it returns carries their ids.
func FuzzTraceparent(f *testing.F) {
	for _, s := range []string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-04",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", "", "00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ctx, got := extractTraceparent(context.Background(), propagation.MapCarrier{"traceparent": s})
		if (got != "") != validW3C(s) || (got != "" && got != s) {
			t.Fatalf("%q: kept %q, valid %v", s, got, validW3C(s))
		}
		sc := trace.SpanContextFromContext(ctx)
		if got == "" {
			if sc.IsValid() {
				t.Fatalf("%q refused, yet the context carries %v", s, sc)
			}
			return
		}
		if !sc.IsRemote() || sc.TraceID().String() != s[3:35] || sc.SpanID().String() != s[36:52] {
			t.Fatalf("%q: the context carries %v", s, sc)
		}
	})
}
