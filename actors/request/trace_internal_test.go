package request

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/cascade"
)

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// traced gives the rig a tracer whose spans rec records, sampling by s.
func traced(m *mrig, s sdktrace.Sampler) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithSpanProcessor(rec))
	m.t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	m.d.Tracer = tp.Tracer("tlgw")
	return rec
}

// withClient makes the exchange carry the client's trace context (as the HTTP adapter does).
func withClient(t testing.TB, traceparent string) func(*Exchange) {
	ctx := clientTrace(t, traceparent)
	return func(x *Exchange) {
		x.Ctx = ctx
		x.Traced = true
	}
}

// engineCalls records the trace header of every engine call, in order.
type engineCalls struct {
	mu    sync.Mutex
	calls []engineCall
}

type engineCall struct{ worker, path, parent, state string }

func (e *engineCalls) note(worker string, req *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, engineCall{worker, req.URL.Path, req.Header.Get("Traceparent"), req.Header.Get("Tracestate")})
}

func (e *engineCalls) all() []engineCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]engineCall(nil), e.calls...)
}

// spansNamed is the ended spans named name, in the order they ended.
func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// one is the one ended span named name.
func one(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	s := spansNamed(rec, name)
	if len(s) != 1 {
		t.Fatalf("%d %s spans, want 1 (ended: %v)", len(s), name, names(rec))
	}
	return s[0]
}

func names(rec *tracetest.SpanRecorder) []string {
	var n []string
	for _, s := range rec.Ended() {
		n = append(n, s.Name())
	}
	return n
}

// allEnded checks that every span started was ended: nothing is left open when a request ends.
func allEnded(t *testing.T, rec *tracetest.SpanRecorder) {
	t.Helper()
	if s, e := len(rec.Started()), len(rec.Ended()); s != e {
		t.Fatalf("%d spans started, %d ended", s, e)
	}
}

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func wantAttr(t *testing.T, s sdktrace.ReadOnlySpan, k attribute.Key, want any) {
	t.Helper()
	v, ok := attrOf(s, k)
	if !ok {
		t.Fatalf("%s has no %s (attributes %v)", s.Name(), k, s.Attributes())
	}
	if got := v.AsInterface(); got != want {
		t.Fatalf("%s %s = %v (%T), want %v (%T)", s.Name(), k, got, got, want, want)
	}
}

// parentOf is the traceparent an engine call carries when its parent is span s.
func parentOf(s sdktrace.ReadOnlySpan) string {
	return "00-" + s.SpanContext().TraceID().String() + "-" + s.SpanContext().SpanID().String() + "-01"
}

// TestTraceOfARequest (R24): a request with the client's traceparent makes tlgw.request in the
// client's trace (its parent the client's span), a pick, an attempt whose span is the engine
// call's parent, and the relay; the request span says what the access log says.
func TestTraceOfARequest(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0)))
	var calls engineCalls
	m.pool = []string{"a"}
	m.upstream = func(w string, req *http.Request, _ string) (*http.Response, error) {
		calls.note(w, req)
		return reply(200, "application/json", `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`), nil
	}
	if w := m.start(`{"model":"m","prompt":"hi"}`, withClient(t, clientParent)).wait(t); w.Code != 200 {
		t.Fatalf("client got %d", w.Code)
	}
	allEnded(t, rec)
	req := one(t, rec, SpanRequest)
	if req.SpanContext().TraceID().String() != clientTraceID || req.Parent().SpanID().String() != clientSpanID || !req.Parent().IsRemote() {
		t.Fatalf("tlgw.request is in trace %s under %s: not the client's", req.SpanContext().TraceID(), req.Parent().SpanID())
	}
	if req.SpanKind() != trace.SpanKindServer {
		t.Fatalf("tlgw.request kind %v", req.SpanKind())
	}
	for k, v := range map[attribute.Key]any{attrRequestID: "req", attrRoute: "r", attrModel: "served", attrWorker: "a",
		attrStatus: int64(200), attrOutcome: OutcomeOK, attrAttempts: int64(1), attrTokensIn: int64(3), attrTokensOut: int64(2),
		attrEndpoint: "completions", attrStream: false} {
		wantAttr(t, req, k, v)
	}
	for _, name := range []string{SpanPick, SpanAttempt, SpanRelay} {
		if s := one(t, rec, name); s.Parent().SpanID() != req.SpanContext().SpanID() {
			t.Fatalf("%s's parent is %s, not tlgw.request", name, s.Parent().SpanID())
		}
	}
	att := one(t, rec, SpanAttempt)
	wantAttr(t, att, attrWorker, "a")
	wantAttr(t, att, attrOutcome, stageFirstByte)
	if _, ok := attrOf(att, attrPD); ok {
		t.Fatal("a unified attempt names a disaggregation protocol")
	}
	wantAttr(t, one(t, rec, SpanPick), attrWorker, "a")
	wantAttr(t, one(t, rec, SpanPick), attrRoute, "r")
	wantAttr(t, one(t, rec, SpanPick), attrModel, "served")
	if c := req.Status().Code; c != codes.Unset {
		t.Fatalf("an answered request's span has status %v", c)
	}
	wantAttr(t, one(t, rec, SpanRelay), attrFinished, true)
	got := calls.all()
	if len(got) != 1 || got[0].parent != parentOf(att) {
		t.Fatalf("the engine got %+v, want the traceparent %s (its parent the attempt)", got, parentOf(att))
	}
}

// TestTraceOfAFailover (R24): each worker tried is an attempt span of its own, the failed one
// naming why, and each engine's traceparent names its own attempt as its parent.
func TestTraceOfAFailover(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.AlwaysSample())
	var calls engineCalls
	m.pool = []string{"a", "b"}
	m.upstream = func(w string, req *http.Request, _ string) (*http.Response, error) {
		calls.note(w, req)
		if w == "a" {
			return reply(503, "application/json", `{}`), nil
		}
		return reply(200, "application/json", okJSON), nil
	}
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 {
		t.Fatalf("client got %d", w.Code)
	}
	allEnded(t, rec)
	att := spansNamed(rec, SpanAttempt)
	if len(att) != 2 || len(spansNamed(rec, SpanPick)) != 2 {
		t.Fatalf("spans %v: want two picks and two attempts", names(rec))
	}
	wantAttr(t, att[0], attrWorker, "a")
	wantAttr(t, att[0], attrOutcome, stageFailover)
	wantAttr(t, att[0], attrFailover, router.Outcome5xx.String())
	wantAttr(t, att[0], attrAttempt, int64(1))
	wantAttr(t, att[1], attrWorker, "b")
	wantAttr(t, att[1], attrOutcome, stageFirstByte)
	wantAttr(t, att[1], attrAttempt, int64(2))
	got := calls.all()
	if len(got) != 2 || got[0].parent != parentOf(att[0]) || got[1].parent != parentOf(att[1]) {
		t.Fatalf("engine calls %+v, want their parents %s and %s", got, parentOf(att[0]), parentOf(att[1]))
	}
	req := one(t, rec, SpanRequest)
	wantAttr(t, req, attrAttempts, int64(2))
	wantAttr(t, req, attrWorker, "b")
	if req.Parent().IsValid() {
		t.Fatalf("a request without a client trace has a parent %s", req.Parent().SpanID())
	}
}

// TestUnsampledRequest (R24): an unsampled request records nothing, and the engine still gets
// its trace context, flagged unsampled (so the engine's own spans follow the decision).
func TestUnsampledRequest(t *testing.T) {
	for _, c := range []struct {
		name   string
		client string // "": none
		ratio  float64
	}{{"no client trace, ratio 0", "", 0}, {"client says unsampled, ratio 1", "00-" + clientTraceID + "-" + clientSpanID + "-00", 1}} {
		t.Run(c.name, func(t *testing.T) {
			m := newMRig(t)
			rec := traced(m, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.ratio)))
			var calls engineCalls
			m.pool = []string{"a"}
			m.upstream = func(w string, req *http.Request, _ string) (*http.Response, error) {
				calls.note(w, req)
				return reply(200, "application/json", okJSON), nil
			}
			var adjust []func(*Exchange)
			if c.client != "" {
				adjust = append(adjust, withClient(t, c.client))
			}
			if w := m.start(`{"model":"m","prompt":"hi"}`, adjust...).wait(t); w.Code != 200 {
				t.Fatalf("client got %d", w.Code)
			}
			if n := len(rec.Started()); n != 0 {
				t.Fatalf("%d spans recorded for an unsampled request", n)
			}
			got := calls.all()
			if len(got) != 1 {
				t.Fatalf("calls %+v", got)
			}
			tp := strings.Split(got[0].parent, "-")
			if len(tp) != 4 || tp[0] != "00" || len(tp[1]) != 32 || len(tp[2]) != 16 || tp[3] != "00" {
				t.Fatalf("the engine got traceparent %q: want an unsampled one", got[0].parent)
			}
			if c.client != "" && (tp[1] != clientTraceID || tp[2] == clientSpanID) {
				t.Fatalf("the engine got %q: want the client's trace, a span of the gateway", got[0].parent)
			}
		})
	}
}

// TestTracingOffForwardsTheClients (R24): with tracing off, a client's traceparent and
// tracestate reach the engine unchanged; a request without one sends none.
func TestTracingOffForwardsTheClients(t *testing.T) {
	m := newMRig(t)
	var calls engineCalls
	m.pool = []string{"a"}
	m.upstream = func(w string, req *http.Request, _ string) (*http.Response, error) {
		calls.note(w, req)
		return reply(200, "application/json", okJSON), nil
	}
	ctx := w3c.Extract(context.Background(), headerCarrier(clientParent, "vendor=abc,other=x"))
	m.start(`{"model":"m","prompt":"hi"}`, func(x *Exchange) { x.Ctx, x.Traced = ctx, true }).wait(t)
	m.do(`{"model":"m","prompt":"hi"}`)
	got := calls.all()
	if len(got) != 2 || got[0].parent != clientParent || got[0].state != "vendor=abc,other=x" {
		t.Fatalf("the engine got %+v, want the client's %s unchanged", got, clientParent)
	}
	if got[1].parent != "" || got[1].state != "" {
		t.Fatalf("a request without trace context sent %+v", got[1])
	}
}

func headerCarrier(parent, state string) interface {
	Get(string) string
	Set(string, string)
	Keys() []string
} {
	h := http.Header{}
	h.Set("Traceparent", parent)
	h.Set("Tracestate", state)
	return carrier(h)
}

type carrier http.Header

func (c carrier) Get(k string) string { return http.Header(c).Get(k) }
func (c carrier) Set(k, v string)     { http.Header(c).Set(k, v) }
func (c carrier) Keys() []string      { return nil }

// TestTraceOfACrash: a request actor that panics still ends its spans, the request's saying
// crashed and the status its client got.
func TestTraceOfACrash(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.AlwaysSample())
	m.pool = []string{"a"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		return reply(200, "application/json", okJSON), nil
	}
	m.runCrashing(t)
	allEnded(t, rec)
	req := one(t, rec, SpanRequest)
	wantAttr(t, req, attrOutcome, OutcomeCrashed)
	wantAttr(t, req, attrStatus, int64(502))
	wantAttr(t, one(t, rec, SpanAttempt), attrOutcome, OutcomeCrashed)
}

// tracingEngines records the trace context of the control calls.
type tracingEngines struct {
	*fakeEngines
	mu       sync.Mutex
	prefills []string
	releases []string
	states   [][]string // each Prefill's tracestate metadata
}

func mdParent(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	if v := md.Get("traceparent"); len(v) == 1 {
		return v[0]
	}
	return ""
}

func mdState(ctx context.Context) []string {
	md, _ := metadata.FromOutgoingContext(ctx)
	return md.Get("tracestate")
}

func (e *tracingEngines) Prefill(ctx context.Context, at Endpoint, call PrefillCall) (PrefillResult, error) {
	e.mu.Lock()
	e.prefills = append(e.prefills, mdParent(ctx))
	e.states = append(e.states, mdState(ctx))
	e.mu.Unlock()
	return e.fakeEngines.Prefill(ctx, at, call)
}

func (e *tracingEngines) Release(ctx context.Context, at Endpoint, handle string) error {
	e.mu.Lock()
	e.releases = append(e.releases, mdParent(ctx))
	e.mu.Unlock()
	return e.fakeEngines.Release(ctx, at, handle)
}

// TestTraceOfADisaggregatedRequest (R24): tokenize and the Prefill control call are the
// prefill stage (tlgw.prefill, their traceparent's parent: the HTTP header and the gRPC
// metadata), the decode is an attempt, and a KV handle given back is tlgw.release, whose span
// is its control call's parent.
func TestTraceOfADisaggregatedRequest(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.AlwaysSample())
	te := &tracingEngines{fakeEngines: m.engines}
	m.d.Engines = te
	m.d.MaxAttempts = 1
	var calls engineCalls
	m.pool, m.prefill = []string{"d"}, "p"
	m.upstream = func(w string, req *http.Request, body string) (*http.Response, error) {
		calls.note(w, req)
		if w == "d" {
			return reply(503, "application/json", `{}`), nil // the decode fails over: its handle is released
		}
		return tokenizer(w, req, body)
	}
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 503 {
		t.Fatalf("client got %d", w.Code)
	}
	allEnded(t, rec)
	pre, att, rel := one(t, rec, SpanPrefill), one(t, rec, SpanAttempt), one(t, rec, SpanRelease)
	wantAttr(t, pre, attrWorker, "p")
	wantAttr(t, pre, attrOutcome, stageDone)
	wantAttr(t, att, attrWorker, "d")
	wantAttr(t, att, attrOutcome, stageFailover)
	got := calls.all()
	if len(got) != 2 || got[0].path != "/v1/tokenize" || got[0].parent != parentOf(pre) || got[1].parent != parentOf(att) {
		t.Fatalf("engine calls %+v: tokenize's parent must be %s, the decode's %s", got, parentOf(pre), parentOf(att))
	}
	te.mu.Lock()
	defer te.mu.Unlock()
	if len(te.prefills) != 1 || te.prefills[0] != parentOf(pre) {
		t.Fatalf("Prefill's metadata traceparent %q, want %s", te.prefills, parentOf(pre))
	}
	if len(te.releases) != 1 || te.releases[0] != parentOf(rel) {
		t.Fatalf("Release's metadata traceparent %q, want %s", te.releases, parentOf(rel))
	}
	wantAttr(t, rel, attrHandle, "h1")
	if len(te.states) != 1 || te.states[0] != nil {
		t.Fatalf("Prefill's metadata tracestate %q without one to send", te.states)
	}
}

// TestControlCallsCarryTheTracestate (R24): a client's tracestate reaches the gRPC control
// calls' metadata with their traceparent.
func TestControlCallsCarryTheTracestate(t *testing.T) {
	m := newMRig(t)
	traced(m, sdktrace.AlwaysSample())
	te := &tracingEngines{fakeEngines: m.engines}
	m.d.Engines = te
	m.pool, m.prefill = []string{"d"}, "p"
	m.upstream = tokenizer
	ctx := w3c.Extract(context.Background(), headerCarrier(clientParent, "vendor=abc"))
	if w := m.start(`{"model":"m","prompt":"hi"}`, func(x *Exchange) { x.Ctx, x.Traced = ctx, true }).wait(t); w.Code != 200 {
		t.Fatalf("client got %d", w.Code)
	}
	te.mu.Lock()
	defer te.mu.Unlock()
	if len(te.states) != 1 || len(te.states[0]) != 1 || te.states[0][0] != "vendor=abc" {
		t.Fatalf("Prefill's metadata tracestate %q, want the client's", te.states)
	}
}

// TestRequestSpanStatus: the request span is an error when the gateway answered 5xx, or made
// the failure itself; an engine's own 4xx relayed, or the client leaving, is not. Usage the
// engine reported is on it, zeros included; none reported, none.
func TestRequestSpanStatus(t *testing.T) {
	for _, c := range []struct {
		name         string
		status       int
		body         string
		wantErr      bool
		wantIn, wOut int64 // -1: no attribute
	}{
		{"engine 400 relayed", 400, `{"error":{"message":"bad"}}`, false, -1, -1},
		{"engine 500 relayed", 500, `{"error":{"message":"boom"}}`, true, -1, -1},
		{"usage with zero completion", 200, `{"choices":[{"text":""}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`, false, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMRig(t)
			rec := traced(m, sdktrace.AlwaysSample())
			m.pool = []string{"a"}
			m.upstream = func(string, *http.Request, string) (*http.Response, error) {
				return reply(c.status, "application/json", c.body), nil
			}
			if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != c.status {
				t.Fatalf("client got %d", w.Code)
			}
			req := one(t, rec, SpanRequest)
			if got := req.Status().Code == codes.Error; got != c.wantErr {
				t.Fatalf("status %v, want error %v", req.Status(), c.wantErr)
			}
			for k, want := range map[attribute.Key]int64{attrTokensIn: c.wantIn, attrTokensOut: c.wOut} {
				v, ok := attrOf(req, k)
				if want < 0 && ok {
					t.Fatalf("%s = %v with no usage reported", k, v.AsInterface())
				}
				if want >= 0 && (!ok || v.AsInt64() != want) {
					t.Fatalf("%s = %v (%v), want %d", k, v.AsInterface(), ok, want)
				}
			}
		})
	}
	t.Run("client gone", func(t *testing.T) {
		m := newMRig(t)
		rec := traced(m, sdktrace.AlwaysSample())
		at := make(chan string, 1)
		m.pool = []string{"a"}
		m.upstream = blockUntilDone(at)
		r := m.start(`{"model":"m","prompt":"hi"}`)
		waitAt(t, at, "a")
		r.cancel()
		r.wait(t)
		req := one(t, rec, SpanRequest)
		wantAttr(t, req, attrOutcome, OutcomeClientGone)
		if c := req.Status().Code; c != codes.Unset {
			t.Fatalf("a request its client left has status %v", c)
		}
	})
}

// TestTraceOfACascade (R24): a non-final step's answer judged is tlgw.cascade_step with its
// verdict; the last step's answer is relayed.
func TestTraceOfACascade(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.AlwaysSample())
	m.d.MaxAttempts = 1
	m.steps = []string{"s0", "s1"}
	acc, err := cascade.ParseAcceptIf("mean_logprob > -1")
	if err != nil {
		t.Fatal(err)
	}
	m.accept = &acc
	m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
		if worker == "s0" {
			return reply(200, "application/json", cascadeAnswer(-3)), nil
		}
		return reply(200, "application/json", `{"choices":[{"text":"big"}]}`), nil
	}
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 {
		t.Fatalf("client got %d", w.Code)
	}
	allEnded(t, rec)
	cs := one(t, rec, SpanCascadeStep)
	wantAttr(t, cs, attrVerdict, verdictEscalated)
	wantAttr(t, cs, attrStep, int64(0))
	if n := len(spansNamed(rec, SpanAttempt)); n != 2 {
		t.Fatalf("%d attempts, want one a step", n)
	}
	one(t, rec, SpanRelay)
}

// TestTraceOfAQueuedPick (R24): a pick that waited in the admission queue shows the wait as
// tlgw.queue inside its tlgw.pick.
func TestTraceOfAQueuedPick(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.AlwaysSample())
	m.pool = []string{"a"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		return reply(200, "application/json", okJSON), nil
	}
	m.d.Router = m.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if p, ok := c.Message().(*router.Pick); ok {
			c.Respond(&router.Queued{Tag: p.Tag})
			c.Respond(m.answer(c, p))
		}
	}))
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 {
		t.Fatalf("client got %d", w.Code)
	}
	allEnded(t, rec)
	pick, q := one(t, rec, SpanPick), one(t, rec, SpanQueue)
	if q.Parent().SpanID() != pick.SpanContext().SpanID() {
		t.Fatal("tlgw.queue is not inside its pick")
	}
	wantAttr(t, pick, attrQueued, true)
	if q.StartTime().Before(pick.StartTime()) || q.EndTime().After(pick.EndTime()) {
		t.Fatalf("queue [%v, %v] outside its pick [%v, %v]", q.StartTime(), q.EndTime(), pick.StartTime(), pick.EndTime())
	}
}

// TestTraceOfNoCapacity: a request nobody can serve ends its span with the outcome, an error.
func TestTraceOfNoCapacity(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.AlwaysSample())
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 503 {
		t.Fatalf("client got %d", w.Code)
	}
	allEnded(t, rec)
	req := one(t, rec, SpanRequest)
	wantAttr(t, req, attrOutcome, OutcomeNoCapacity)
	if req.Status().Code.String() != "Error" {
		t.Fatalf("status %v", req.Status())
	}
	wantAttr(t, one(t, rec, SpanPick), attrOutcome, OutcomeNoCapacity)
	if len(spansNamed(rec, SpanAttempt)) != 0 {
		t.Fatal("an attempt span without an attempt")
	}
}

// TestAccessLogNamesTheTrace (R24): the access log's trace_id is the request's trace, a new one
// the gateway started when the client sent none.
func TestAccessLogNamesTheTrace(t *testing.T) {
	m := newMRig(t)
	rec := traced(m, sdktrace.AlwaysSample())
	lines := withAccessLog(m)
	m.pool = []string{"a"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		return reply(200, "application/json", okJSON), nil
	}
	m.do(`{"model":"m","prompt":"hi"}`)
	line := oneLine(t, m, lines())
	id := one(t, rec, SpanRequest).SpanContext().TraceID().String()
	if line["trace_id"] != id {
		t.Fatalf("the access log says trace %v, the request's span is in %s", line["trace_id"], id)
	}
}
