package httpapi

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/tracing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestRequestContext (R24): an exchange's context carries the client's trace context when it
// sent one valid traceparent header (whatever the gateway's tracing and access log), and is the
// request's own context, marked untraced, when it sent none, two, or an invalid one.
func TestRequestContext(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	valid := "00-" + id + "-00f067aa0ba902b7-01"
	for _, c := range []struct {
		headers []string
		want    string
	}{
		{[]string{valid}, id},
		{[]string{"00-" + id + "-00f067aa0ba902b7-00"}, id}, // unsampled: still the client's trace
		{nil, ""},
		{[]string{valid, valid}, ""},
		{[]string{"00-" + id + "-00f067aa0ba902b7"}, ""},
		{[]string{"00-" + strings.ToUpper(id) + "-00f067aa0ba902b7-01"}, ""},
		{[]string{"ff-" + id + "-00f067aa0ba902b7-01"}, ""},
		{[]string{"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, ""},
		{[]string{valid + strings.Repeat("-x", 4096)}, ""},
	} {
		s := New(Options{Logger: quiet})
		r := httptest.NewRequest("POST", "/v1/completions", nil)
		for _, h := range c.headers {
			r.Header.Add("traceparent", h)
		}
		ctx, traced := s.requestContext(r)
		if got := tracing.TraceID(ctx); got != c.want || traced != (c.want != "") {
			t.Errorf("traceparent %q: trace id %q traced %v, want %q", c.headers, got, traced, c.want)
		}
		if c.want == "" && ctx != r.Context() {
			t.Errorf("traceparent %q: a new context for no trace context", c.headers)
		}
	}
}
