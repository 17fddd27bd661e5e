package accesslog

import "context"

// traceKey is the context key of a request's trace id.
type traceKey struct{}

// WithTraceID returns ctx carrying the trace id (32 lowercase hex digits) the access log names
// the request by: the one the client's traceparent header named, for as long as the gateway
// does not trace requests itself.
func WithTraceID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, traceKey{}, id)
}

// TraceID is the trace id of the request whose context ctx is, or "": the one place the access
// log learns it. Once requests carry their own span (R24 [tracing]), this returns that span's
// trace id, which continues the client's trace or starts a new one.
func TraceID(ctx context.Context) string {
	id, _ := ctx.Value(traceKey{}).(string)
	return id
}
