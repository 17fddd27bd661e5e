package httpapi

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/trace"

	"github.com/tlgw/tlgw/internal/tracing"
)

// requestContext is the context an exchange runs under, and whether it carries the client's
// trace context (R24): a valid W3C traceparent (and tracestate) the client sent, which the
// request's spans continue, which the engines get unchanged when tracing is off, and whose
// trace id the access log names. Without a traceparent header it is the request's own context
// (one map lookup). No client address goes anywhere: the gateway's own logs carry none either,
// and a proxy in front of it knows the real one.
func (s *Server) requestContext(r *http.Request) (context.Context, bool) {
	if _, ok := r.Header["Traceparent"]; !ok { // canonical: no allocation
		return r.Context(), false
	}
	ctx := tracing.Extract(r.Context(), r.Header)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return r.Context(), false
	}
	return ctx, true
}
