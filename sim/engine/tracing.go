package engine

// Trace context (SPEC R24). The gateway sends a W3C traceparent on every call to an engine: an
// HTTP header on the serving endpoints, gRPC metadata on EngineControl/Prefill and
// KvTransferService/Release. The engine keeps the latest ones it received, with the path or
// gRPC method and the request id, and serves them at GET /tlengine/traceparents, so that a
// test sees which span of the gateway each call hung under. With --otlp-endpoint (or an
// injected SpanExporter) it also exports one tlengine.request span per served HTTP request,
// the child of the received traceparent, through the OpenTelemetry SDK the gateway uses.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tlgw/tlgw/internal/oai"
)

// TraceparentsPath serves the received traceparents, oldest first.
const TraceparentsPath = "/tlengine/traceparents"

// SpanName is the name of the span exported per served HTTP request.
const SpanName = "tlengine.request"

const (
	// MaxTraceparents bounds the ring of received traceparents: the latest ones are kept, a new
	// one overwrites the oldest.
	MaxTraceparents = 256
	// traceparentLen is a version-00 traceparent's length: "00-" 32 hex "-" 16 hex "-" 2 hex.
	// Nothing longer is recorded, whatever its version.
	traceparentLen = 55
	// spanFlushTimeout bounds Close's flush of the spans not yet exported.
	spanFlushTimeout = 2 * time.Second
)

// traceContext is W3C Trace Context, the propagator the gateway speaks.
var traceContext = propagation.TraceContext{}

// Traceparent is one received traceparent, as GET /tlengine/traceparents lists it.
type Traceparent struct {
	Traceparent string `json:"traceparent"` // the raw value, a valid W3C traceparent of 55 bytes
	// Path is the route's path ("/v1/chat/completions", "/v1/responses/{id}"), or the gRPC
	// method ("/tl.engine.v1.EngineControl/Prefill").
	Path string `json:"path"`
	// RequestID is the X-Request-ID header (x-request-id metadata, else the gRPC request's
	// request_id) when it is 1 to 128 printable ASCII bytes, else "".
	RequestID string `json:"request_id"`
}

// traceparents is the ring of the latest received traceparents.
type traceparents struct {
	mu   sync.Mutex
	ring [MaxTraceparents]Traceparent // bounded: the latest MaxTraceparents, next overwrites the oldest
	next int                          // where the next one goes
	n    int                          // how many are held, at most MaxTraceparents
}

func (t *traceparents) add(tp Traceparent) {
	t.mu.Lock()
	t.ring[t.next] = tp
	t.next = (t.next + 1) % MaxTraceparents
	t.n = min(t.n+1, MaxTraceparents)
	t.mu.Unlock()
}

// list returns the held traceparents, oldest first (never nil).
func (t *traceparents) list() []Traceparent {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Traceparent, 0, t.n)
	for i := range t.n {
		out = append(out, t.ring[(t.next-t.n+i+MaxTraceparents)%MaxTraceparents])
	}
	return out
}

// Traceparents returns the latest received traceparents (at most MaxTraceparents), oldest first.
func (e *Engine) Traceparents() []Traceparent { return e.tps.list() }

// extractTraceparent reads the carrier's traceparent (and tracestate) with the W3C propagator:
// a valid one is returned raw, with ctx carrying its span context as the remote parent; an
// absent, invalid or longer-than-55-byte one gives ctx unchanged and "". The propagator refuses
// version ff, all-zero ids, upper-case hex, wrong field lengths, and for version 00 any extra
// field or reserved flag bit.
func extractTraceparent(ctx context.Context, carrier propagation.TextMapCarrier) (context.Context, string) {
	tp := carrier.Get("traceparent")
	if len(tp) != traceparentLen {
		return ctx, ""
	}
	sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		return ctx, ""
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), tp
}

// requestID is id when it is a valid request id (B2's rule), else "".
func requestID(id string) string {
	if !oai.ValidRequestID(id) {
		return ""
	}
	return id
}

// observed wraps a route's handler (path: the route's, never the client's): a valid
// traceparent is recorded and becomes the request context's remote parent, so the engine's own
// calls (the PD side channel) carry it on; with spans on, the request runs under a
// tlengine.request span, the traceparent's child.
func (e *Engine) observed(path string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if ctx, tp := extractTraceparent(r.Context(), propagation.HeaderCarrier(r.Header)); tp != "" {
			e.tps.add(Traceparent{Traceparent: tp, Path: path, RequestID: requestID(r.Header.Get("X-Request-ID"))})
			r = r.WithContext(ctx)
		}
		if e.tracer == nil {
			h(w, r)
			return
		}
		ctx, span := e.tracer.Start(r.Context(), SpanName, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRoute(path), semconv.HTTPRequestMethodKey.String(r.Method)))
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			code := sw.status
			if code == 0 {
				code = http.StatusOK // net/http's answer to a handler that wrote nothing
			}
			span.SetAttributes(semconv.HTTPResponseStatusCode(code))
			if code >= 500 {
				span.SetStatus(codes.Error, strconv.Itoa(code))
			}
			span.End()
		}()
		h(sw, r.WithContext(ctx))
	}
}

// statusWriter notes the status a handler answers. Unwrap keeps http.ResponseController's
// Flush and Hijack working through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serveTraceparents is GET /tlengine/traceparents:
// {"traceparents":[{"traceparent":"00-…-…-01","path":"/v1/chat/completions","request_id":"…"}, …]},
// oldest first.
func (e *Engine) serveTraceparents(w http.ResponseWriter, _ *http.Request) {
	b, err := json.Marshal(struct {
		Traceparents []Traceparent `json:"traceparents"`
	}{e.tps.list()})
	if err != nil {
		writeAPIError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// mdCarrier reads gRPC metadata as a propagation carrier (keys are lower case there).
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }
func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// recordUnary is both gRPC servers' unary interceptor: a call's valid traceparent metadata is
// recorded under its method (one of the registered services' methods: gRPC answers unknown
// ones before interceptors run), with x-request-id metadata, else the request's request_id.
func (e *Engine) recordUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if _, tp := extractTraceparent(ctx, mdCarrier(md)); tp != "" {
			id := requestID(mdCarrier(md).Get("x-request-id"))
			if r, ok := req.(interface{ GetRequestId() string }); ok && id == "" {
				id = requestID(r.GetRequestId())
			}
			e.tps.add(Traceparent{Traceparent: tp, Path: info.FullMethod, RequestID: id})
		}
	}
	return handler(ctx, req)
}

// checkOTLPEndpoint validates --otlp-endpoint: host:port with a port of 1 to 65535.
func (c *Config) checkOTLPEndpoint() error {
	if c.OTLPEndpoint == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(c.OTLPEndpoint)
	if err == nil && (host == "" || len(host) > maxHostLen) {
		err = fmt.Errorf("want a host of 1 to %d bytes", maxHostLen)
	}
	if n, perr := strconv.Atoi(port); err == nil && (perr != nil || n < 1 || n > 65535) {
		err = fmt.Errorf("port %q: want 1 to 65535", port)
	}
	if err != nil {
		return fmt.Errorf("engine: --otlp-endpoint %q: want host:port: %v", c.OTLPEndpoint, err)
	}
	return nil
}

// newTracerProvider builds the span pipeline: cfg.SpanExporter, else an OTLP/gRPC exporter to
// cfg.OTLPEndpoint (plaintext); nil when neither is set (spans off: nothing is started). The
// sampler follows the gateway's sampling decision in the traceparent (ParentBased), and samples
// a request without one. The batch processor runs one goroutine with a queue of at most 2048
// spans (the SDK's default; a full queue drops); Close flushes and stops it.
func newTracerProvider(cfg *Config) (*sdktrace.TracerProvider, error) {
	exp := cfg.SpanExporter
	if exp == nil {
		if cfg.OTLPEndpoint == "" {
			return nil, nil
		}
		var err error
		exp, err = otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint), otlptracegrpc.WithInsecure())
		if err != nil {
			return nil, fmt.Errorf("engine: --otlp-endpoint %s: %w", cfg.OTLPEndpoint, err)
		}
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL,
			semconv.ServiceName("tlengine"), semconv.ServiceInstanceID(cfg.ID))),
	), nil
}

// flushSpans exports the spans not yet exported and stops the span pipeline (bounded by
// spanFlushTimeout: an unreachable collector does not hold Close up).
func (e *Engine) flushSpans() {
	if e.tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), spanFlushTimeout)
	defer cancel()
	if err := e.tp.Shutdown(ctx); err != nil {
		e.log.Warn("flushing spans", "err", err)
	}
}
