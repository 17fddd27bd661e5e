package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// Bounds on what Extract reads from a client. A version-00 traceparent is 55 bytes; a later
// version may append fields, so up to MaxTraceparentLen is parsed. W3C Trace Context asks
// vendors to propagate at least 512 characters of tracestate (and lets them cut beyond): a
// combined tracestate (every tracestate header joined by ",") longer than MaxTracestateLen is
// ignored whole — the traceparent still counts.
const (
	MaxTraceparentLen = 256
	MaxTracestateLen  = 512
)

// The header names, in http.Header's canonical form and in gRPC metadata's lowercase one.
const (
	traceparentHeader = "Traceparent"
	tracestateHeader  = "Tracestate"
	traceparentKey    = "traceparent"
	tracestateKey     = "tracestate"
)

// w3c is OpenTelemetry's W3C Trace Context propagator.
var w3c propagation.TraceContext

// Extract returns ctx carrying the remote span context of h's traceparent (and tracestate) when
// the traceparent is valid, else ctx unchanged. Bounded and strict, as W3C Trace Context
// asks: a traceparent longer than MaxTraceparentLen, or more than one traceparent header, is
// ignored (the request starts a new trace, as W3C's test suite expects); tracestate headers
// are joined, as HTTP combines repeated headers, and ignored when longer than MaxTracestateLen
// together, or when OpenTelemetry's parser refuses them (more than 32 members, a bad key or
// value). (OpenTelemetry's own HeaderCarrier reads the first of each header only.)
func Extract(ctx context.Context, h http.Header) context.Context {
	tp := h[traceparentHeader]
	if len(tp) != 1 || tp[0] == "" || len(tp[0]) > MaxTraceparentLen {
		return ctx
	}
	c := headerPair{traceparent: tp[0]}
	if ts := h[tracestateHeader]; len(ts) == 1 {
		if len(ts[0]) <= MaxTracestateLen {
			c.tracestate = ts[0]
		}
	} else if len(ts) > 1 {
		c.tracestate = joinBounded(ts, MaxTracestateLen)
	}
	return w3c.Extract(ctx, &c)
}

// joinBounded joins vs with "," when the result is at most limit bytes, else returns "".
func joinBounded(vs []string, limit int) string {
	n := len(vs) - 1
	for _, v := range vs { // stops at the bound: the values are the client's
		if n += len(v); n > limit {
			return ""
		}
	}
	b := make([]byte, 0, n)
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, v...)
	}
	return string(b)
}

// InjectHTTP sets h's traceparent (and tracestate, or removes a tracestate h held) from ctx's
// span context when it is valid; otherwise h is left as it is.
func InjectHTTP(ctx context.Context, h http.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	delete(h, tracestateHeader)
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}

// OutgoingGRPC returns ctx with traceparent (and tracestate) appended to its outgoing gRPC
// metadata when ctx's span context is valid, else ctx unchanged: for control calls (Prefill,
// Release).
func OutgoingGRPC(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	var c headerPair
	w3c.Inject(ctx, &c)
	if c.tracestate == "" {
		return metadata.AppendToOutgoingContext(ctx, traceparentKey, c.traceparent)
	}
	return metadata.AppendToOutgoingContext(ctx, traceparentKey, c.traceparent, tracestateKey, c.tracestate)
}

// TraceID is the trace id of ctx's span context (local or remote) as 32 lowercase hex digits,
// or "" when it has none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// headerPair carries the two W3C fields between the propagator and a header or metadata.
type headerPair struct{ traceparent, tracestate string }

var _ propagation.TextMapCarrier = (*headerPair)(nil)

func (c *headerPair) Get(key string) string {
	switch key {
	case traceparentKey:
		return c.traceparent
	case tracestateKey:
		return c.tracestate
	}
	return ""
}

func (c *headerPair) Set(key, value string) {
	switch key {
	case traceparentKey:
		c.traceparent = value
	case tracestateKey:
		c.tracestate = value
	}
}

func (c *headerPair) Keys() []string { return []string{traceparentKey, tracestateKey} }
