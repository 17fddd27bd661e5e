package httpapi

import (
	"context"
	"net/http"

	"github.com/tlgw/tlgw/internal/accesslog"
)

// requestContext is the context an exchange runs under: the request's, carrying the trace id
// of a valid traceparent header when the access log is on (R24; accesslog.TraceID reads it).
// No client address goes to the access log: the gateway's own logs carry none either, and a
// proxy in front of it knows the real one.
func (s *Server) requestContext(r *http.Request) context.Context {
	if !s.accessLog {
		return r.Context()
	}
	v := r.Header["Traceparent"] // canonical: no allocation
	if len(v) != 1 {
		return r.Context() // absent, or sent twice: W3C Trace Context says to ignore it
	}
	if id := traceparentID(v[0]); id != "" {
		return accesslog.WithTraceID(r.Context(), id)
	}
	return r.Context()
}

// traceparentID is the trace id of a W3C traceparent value, "version-traceid-parentid-flags"
// (00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01), or "" when it is not valid:
// version two lowercase hex digits, not "ff"; trace id 32 and parent id 16 lowercase hex
// digits, neither all zeros; flags two hex digits. Version 00 is exactly 55 characters; a
// later version may carry more after a "-".
func traceparentID(v string) string {
	const size = 55
	if len(v) < size || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return ""
	}
	version, trace, parent, flags := v[0:2], v[3:35], v[36:52], v[53:55]
	switch {
	case !lowerHex(version) || version == "ff",
		version == "00" && len(v) != size,
		len(v) > size && v[size] != '-',
		!lowerHex(trace) || allZeros(trace),
		!lowerHex(parent) || allZeros(parent),
		!lowerHex(flags):
		return ""
	}
	return trace
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZeros(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}
