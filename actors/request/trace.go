package request

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/tracing"
)

// Span names (SPEC R24): the request's span and its stages.
const (
	SpanRequest     = "tlgw.request"
	SpanQueue       = "tlgw.queue"
	SpanPick        = "tlgw.pick"
	SpanAttempt     = "tlgw.attempt"
	SpanCascadeStep = "tlgw.cascade_step"
	SpanPrefill     = "tlgw.prefill"
	SpanRelease     = "tlgw.release"
	SpanRelay       = "tlgw.relay"
)

// Span attribute keys. No prompt text, no client address: what an operator needs to find
// where one request's time went.
var (
	attrRequestID   = attribute.Key("tlgw.request_id")
	attrEndpoint    = attribute.Key("tlgw.endpoint")
	attrStream      = attribute.Key("tlgw.stream")
	attrRoute       = attribute.Key("tlgw.route")
	attrModel       = attribute.Key("tlgw.model")
	attrWorker      = attribute.Key("tlgw.worker")
	attrStatus      = attribute.Key("http.response.status_code")
	attrOutcome     = attribute.Key("tlgw.outcome")
	attrAttempts    = attribute.Key("tlgw.attempts")
	attrAttempt     = attribute.Key("tlgw.attempt")
	attrStep        = attribute.Key("tlgw.cascade_step")
	attrFailover    = attribute.Key("tlgw.failover_reason")
	attrPD          = attribute.Key("tlgw.pd_protocol")
	attrEvents      = attribute.Key("tlgw.events")
	attrTokensIn    = attribute.Key("gen_ai.usage.input_tokens")
	attrTokensOut   = attribute.Key("gen_ai.usage.output_tokens")
	attrQueued      = attribute.Key("tlgw.queued")
	attrVerdict     = attribute.Key("tlgw.verdict")
	attrFinished    = attribute.Key("tlgw.finished")
	attrHandle      = attribute.Key("tlgw.kv_handle")
	attrUnreachable = attribute.Key("tlgw.unreachable")
)

// The outcomes of a stage span (tlgw.outcome on it); a request's are the access log's words.
const (
	stageFirstByte = "first_byte" // an attempt whose answer's first byte came
	stageFailover  = "failover"   // an attempt (or prefill) that failed before the first byte
	stageElsewhere = "elsewhere"  // an engine without the endpoint or adapter: routed again
	stageDone      = "done"       // a prefill whose part is done

	verdictAccepted  = "accepted"  // a cascade step's answer kept
	verdictEscalated = "escalated" // a cascade step's answer judged short, or failed
)

// w3c is the W3C Trace Context propagator (traceparent, tracestate).
var w3c propagation.TraceContext

// Span start options made once (an option made per span is an allocation per span).
var (
	serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// reqTrace is one request's trace (R24), kept by its actor: the context its spans hang from,
// and the stage spans open now (each nil when none). Bounds: one per live request, at most one
// span of each stage open at once; every open span is ended in finish or stopping.
type reqTrace struct {
	tracer trace.Tracer // nil: tracing off, ctx is the client's and is only forwarded
	// ctx is the request span's context (tracing on), or the client's (off): the parent of the
	// stage spans, and the engines' traceparent when no stage span records.
	ctx  context.Context
	span trace.Span // tlgw.request (nil: off)
	// rec: the request span records (sampled), so stage spans are made (st). An unsampled
	// request makes its request span only (the engines still get its trace id, flagged
	// unsampled), and allocates no more than this struct.
	rec bool
	// own is the header of the request's own context (ctx), made once: every engine call of
	// an unsampled request, or with tracing off, carries it. scratch is the propagator's
	// carrier (a field, so injecting allocates nothing more than the header's text).
	ownMade bool
	own     traceHeader
	scratch traceHeader
	st      *stageSpans // nil unless rec
}

// stageSpans are a sampled request's stage spans open now (each nil when none).
type stageSpans struct {
	queuedAt time.Time // when the current pick was queued (zero: not queued)
	attempts int       // attempts made, over all cascade steps

	attempt    trace.Span
	attemptCtx context.Context
	prefill    trace.Span
	prefillCtx context.Context
	cascade    trace.Span
	relay      trace.Span
}

// startTrace makes the request's trace at its start: a tlgw.request span continuing the
// client's trace context (or a new trace), or, with tracing off, the client's context alone.
func (r *requestActor) startTrace() {
	t := &reqTrace{tracer: r.d.Tracer, ctx: r.x.Ctx}
	r.tr = t
	if t.tracer == nil {
		return
	}
	// The span starts as the actor does, the body read and parsed (tlgw_stage_seconds{stage=
	// "parse"} times that): a start timestamp would cost every request an allocation.
	t.ctx, t.span = t.tracer.Start(r.x.Ctx, SpanRequest, serverSpan...)
	if t.rec = t.span.IsRecording(); t.rec {
		t.st = &stageSpans{}
		t.span.SetAttributes(attrRequestID.String(r.x.ID), attrEndpoint.String(EndpointLabel(r.x.Kind)),
			attrStream.Bool(r.x.Req.Stream))
	}
}

// recording reports whether stage spans are made for the request.
func (t *reqTrace) recording() bool { return t != nil && t.rec }

// traceHeader is a traceparent (and tracestate) an engine call carries; empty: none. Made by
// the actor once per stage (the request's own once per request) and handed to the call's
// goroutine as text, where internal/tracing's InjectHTTP and OutgoingGRPC would read a context
// and build the text again on every call.
type traceHeader struct{ parent, state string }

// Get, Set and Keys make traceHeader the propagator's carrier.
func (h *traceHeader) Get(string) string { return "" }
func (h *traceHeader) Set(k, v string) {
	switch k {
	case "traceparent":
		h.parent = v
	case "tracestate":
		h.state = v
	}
}
func (h *traceHeader) Keys() []string { return nil }

// headerOf is the trace context of ctx as an engine call's header (empty when ctx has none).
func headerOf(ctx context.Context) traceHeader {
	var h traceHeader
	w3c.Inject(ctx, &h)
	return h
}

// inject is headerOf through the trace's own carrier.
func (t *reqTrace) inject(ctx context.Context) traceHeader {
	t.scratch = traceHeader{}
	w3c.Inject(ctx, &t.scratch)
	return t.scratch
}

// set puts the header on an engine call's HTTP request.
func (h traceHeader) set(hdr http.Header) {
	if h.parent == "" {
		return
	}
	hdr["Traceparent"] = []string{h.parent}
	if h.state != "" {
		hdr["Tracestate"] = []string{h.state}
	}
}

// outgoing is ctx with the header as a gRPC call's metadata (the control calls).
func (h traceHeader) outgoing(ctx context.Context) context.Context {
	if h.parent == "" {
		return ctx
	}
	if h.state != "" {
		return metadata.AppendToOutgoingContext(ctx, "traceparent", h.parent, "tracestate", h.state)
	}
	return metadata.AppendToOutgoingContext(ctx, "traceparent", h.parent)
}

// header is the trace context an engine call of the current stage carries: the stage span's
// when one records, else the request's (unsampled, or the client's with tracing off).
func (t *reqTrace) header(stage context.Context) traceHeader {
	if t == nil {
		return traceHeader{}
	}
	if stage != nil {
		return t.inject(stage)
	}
	if !t.ownMade {
		t.own, t.ownMade = t.inject(t.ctx), true
	}
	return t.own
}

// traceID is the request's trace id (32 lowercase hex digits), or "" when it has none: the
// access log's trace_id.
func (t *reqTrace) traceID() string {
	if t == nil {
		return ""
	}
	return tracing.TraceID(t.ctx)
}

// queued notes that the current pick waits in the admission queue.
func (t *reqTrace) queued(now time.Time) {
	if t.recording() {
		t.st.queuedAt = now
	}
}

// picked records the pick just answered: tlgw.pick from its sending, and tlgw.queue inside it
// for the time it waited in the admission queue.
func (t *reqTrace) picked(sent, now time.Time, p *router.Picked) {
	if !t.recording() {
		return
	}
	ctx, sp := t.tracer.Start(t.ctx, SpanPick, trace.WithTimestamp(sent))
	sp.SetAttributes(attrQueued.Bool(!t.st.queuedAt.IsZero()), attrStep.Int(p.Step))
	if !t.st.queuedAt.IsZero() {
		_, q := t.tracer.Start(ctx, SpanQueue, trace.WithTimestamp(t.st.queuedAt))
		q.End(trace.WithTimestamp(now))
		t.st.queuedAt = time.Time{}
	}
	if p.Route != "" {
		sp.SetAttributes(attrRoute.String(p.Route), attrModel.String(p.ServedModel))
	}
	if p.Err != nil {
		sp.SetStatus(codes.Error, p.Err.Error())
		sp.SetAttributes(attrOutcome.String(failOutcome(p.Err)))
	} else {
		sp.SetAttributes(attrWorker.String(p.WorkerID))
		if p.Prefill != nil {
			sp.SetAttributes(attribute.String("tlgw.prefill_worker", p.Prefill.WorkerID))
		}
	}
	sp.End(trace.WithTimestamp(now))
}

// startAttempt opens tlgw.attempt for the call to the picked worker and returns the header
// the call carries (its parent is the attempt).
func (t *reqTrace) startAttempt(p *router.Picked, at time.Time) traceHeader {
	if t == nil {
		return traceHeader{}
	}
	t.endPrefill(stageDone, nil) // a prefill before this attempt is over
	if !t.rec {
		return t.header(nil)
	}
	t.st.attempts++
	t.st.attemptCtx, t.st.attempt = t.tracer.Start(t.ctx, SpanAttempt, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(at))
	t.st.attempt.SetAttributes(attrWorker.String(p.WorkerID), attrAttempt.Int(t.st.attempts), attrStep.Int(p.Step))
	if p.PDProtocol != "" {
		t.st.attempt.SetAttributes(attrPD.String(p.PDProtocol))
	}
	return t.header(t.st.attemptCtx)
}

// endAttempt closes the open attempt span with its outcome (err: why it failed).
func (t *reqTrace) endAttempt(outcome string, err error) {
	if t == nil || t.st == nil || t.st.attempt == nil {
		return
	}
	endStage(t.st.attempt, outcome, err)
	t.st.attempt, t.st.attemptCtx = nil, nil
}

// failedOver closes the stage that failed before the first byte (the attempt, or a prefill),
// naming the verdict on the worker.
func (t *reqTrace) failedOver(o router.Outcome, unreachable bool, err error) {
	if !t.recording() {
		return
	}
	for _, sp := range [2]trace.Span{t.st.attempt, t.st.prefill} {
		if sp != nil {
			sp.SetAttributes(attrFailover.String(o.String()), attrUnreachable.Bool(unreachable))
		}
	}
	t.endAttempt(stageFailover, err)
	t.endPrefill(stageFailover, err)
}

// startPrefill opens tlgw.prefill (tokenize and Prefill, or vLLM's call 1) on the prefill
// worker and returns the header its calls carry.
func (t *reqTrace) startPrefill(p *router.Picked) traceHeader {
	if t == nil {
		return traceHeader{}
	}
	if !t.rec {
		return t.header(nil)
	}
	if t.st.prefill == nil {
		t.st.prefillCtx, t.st.prefill = t.tracer.Start(t.ctx, SpanPrefill, clientSpan...)
		t.st.prefill.SetAttributes(attrWorker.String(p.Prefill.WorkerID), attrPD.String(p.PDProtocol),
			attribute.String("tlgw.decode_worker", p.WorkerID))
	}
	return t.header(t.st.prefillCtx)
}

// endPrefill closes the open prefill span.
func (t *reqTrace) endPrefill(outcome string, err error) {
	if t == nil || t.st == nil || t.st.prefill == nil {
		return
	}
	endStage(t.st.prefill, outcome, err)
	t.st.prefill, t.st.prefillCtx = nil, nil
}

// startRelay opens tlgw.relay at the answer's first byte (the attempt ends there).
func (t *reqTrace) startRelay(at time.Time) {
	if !t.recording() {
		return
	}
	t.endAttempt(stageFirstByte, nil)
	_, t.st.relay = t.tracer.Start(t.ctx, SpanRelay, trace.WithTimestamp(at))
}

// endRelay closes the relay span with what was relayed.
func (t *reqTrace) endRelay(m *relayResult) {
	if t == nil || t.st == nil || t.st.relay == nil {
		return
	}
	t.st.relay.SetAttributes(attrStatus.Int(m.code), attrEvents.Int64(m.events), attrFinished.Bool(m.finished))
	if !m.finished {
		t.st.relay.SetStatus(codes.Error, "the answer did not reach its end")
	}
	t.st.relay.End()
	t.st.relay = nil
}

// startCascade opens tlgw.cascade_step while a non-final step's answer is read and judged.
func (t *reqTrace) startCascade(step int, at time.Time) {
	if !t.recording() {
		return
	}
	t.endAttempt(stageFirstByte, nil)
	_, t.st.cascade = t.tracer.Start(t.ctx, SpanCascadeStep, trace.WithTimestamp(at))
	t.st.cascade.SetAttributes(attrStep.Int(step))
}

// endCascade closes the cascade step span with its verdict (accepted, escalated).
func (t *reqTrace) endCascade(verdict string, err error) {
	if t == nil || t.st == nil || t.st.cascade == nil {
		return
	}
	t.st.cascade.SetAttributes(attrVerdict.String(verdict))
	if err != nil {
		t.st.cascade.SetStatus(codes.Error, err.Error())
	}
	t.st.cascade.End()
	t.st.cascade = nil
}

// releaser returns what a KV Release call runs in: tlgw.release under the request, and the
// context carrying its traceparent. It runs on the Release's goroutine (the span's fields are
// the call's own; the tracer and the request's context never change).
func (t *reqTrace) releaser() func(ctx context.Context, handle string) (context.Context, func(error)) {
	if t == nil {
		return nil
	}
	tracer, parent, rec := t.tracer, t.ctx, t.rec
	return func(ctx context.Context, handle string) (context.Context, func(error)) {
		if !rec {
			return headerOf(parent).outgoing(ctx), func(error) {}
		}
		sctx, sp := tracer.Start(parent, SpanRelease, clientSpan...)
		sp.SetAttributes(attrHandle.String(handle))
		return headerOf(sctx).outgoing(ctx), func(err error) {
			if err != nil {
				sp.SetStatus(codes.Error, err.Error())
			}
			sp.End()
		}
	}
}

// endStage ends a stage span with its outcome.
func endStage(sp trace.Span, outcome string, err error) {
	sp.SetAttributes(attrOutcome.String(outcome))
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// end closes the request's trace: every stage span still open (the request ended in it), then
// tlgw.request with what the access log says of the request.
func (t *reqTrace) end(rec *requestEnd) {
	if t == nil || t.span == nil {
		return
	}
	if t.rec {
		t.endAttempt(rec.outcome, nil)
		t.endPrefill(rec.outcome, nil)
		t.endCascade(rec.outcome, nil)
		if t.st.relay != nil {
			t.st.relay.End()
			t.st.relay = nil
		}
		t.span.SetAttributes(attrRoute.String(rec.route), attrModel.String(rec.model), attrStatus.Int(rec.status),
			attrOutcome.String(rec.outcome), attrAttempts.Int(rec.attempts))
		if rec.worker != "" {
			t.span.SetAttributes(attrWorker.String(rec.worker))
		}
		if rec.prompt >= 0 {
			t.span.SetAttributes(attrTokensIn.Int64(rec.prompt))
		}
		if rec.completion >= 0 {
			t.span.SetAttributes(attrTokensOut.Int64(rec.completion))
		}
		if rec.status >= 500 || (rec.outcome != OutcomeOK && rec.outcome != OutcomeEngineError && rec.outcome != OutcomeClientGone) {
			t.span.SetStatus(codes.Error, rec.outcome+" ("+strconv.Itoa(rec.status)+")")
		}
	}
	t.span.End()
}

// requestEnd is what the request span says of the request when it ends.
type requestEnd struct {
	route, model, worker, outcome string
	status, attempts              int
	prompt, completion            int64
}

// endTrace ends the trace of a request that finished with code.
func (r *requestActor) endTrace(code int) {
	if !r.tr.recording() {
		return // off, or unsampled: the request span records nothing, its End does nothing
	}
	r.tr.end(r.traceEnd(code, r.outcomeWord(code)))
}

// traceEnd is the request span's summary as the actor knows it now.
func (r *requestActor) traceEnd(code int, outcome string) *requestEnd {
	e := &requestEnd{route: r.route, model: r.served, outcome: outcome, status: code, prompt: -1, completion: -1}
	if a := r.acc; a != nil {
		e.worker, e.attempts = a.lastWorker, a.tries
		e.prompt, e.completion = a.usage.prompt, a.usage.completion
	}
	return e
}
