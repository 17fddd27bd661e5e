package httpapi

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/accesslog"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestTraceparentID: the trace id of a valid W3C traceparent, "" for anything else.
func TestTraceparentID(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	for v, want := range map[string]string{
		"00-" + id + "-00f067aa0ba902b7-01":                       id,
		"00-" + id + "-00f067aa0ba902b7-00":                       id,
		"01-" + id + "-00f067aa0ba902b7-01":                       id, // a later version
		"01-" + id + "-00f067aa0ba902b7-01-more":                  id, // a later version may say more
		"00-" + id + "-00f067aa0ba902b7-01-more":                  "", // version 00 is exactly 55 characters
		"01-" + id + "-00f067aa0ba902b7-01x":                      "",
		"ff-" + id + "-00f067aa0ba902b7-01":                       "", // version ff is invalid
		"00-" + strings.ToUpper(id) + "-00f067aa0ba902b7-01":      "",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": "",
		"00-" + id + "-0000000000000000-01":                       "",
		"00-" + id + "-00f067aa0ba902b7-0g":                       "",
		"0-" + id + "-00f067aa0ba902b7-01":                        "",
		"00_" + id + "_00f067aa0ba902b7_01":                       "",
		"00-" + id[:31] + "-00f067aa0ba902b7-01":                  "",
		"":                                                        "",
		"00-" + id + "-00f067aa0ba902b7-01\"\n":                   "",
	} {
		if got := traceparentID(v); got != want {
			t.Errorf("traceparentID(%q) = %q, want %q", v, got, want)
		}
	}
}

// FuzzTraceparentID: whatever the header, the trace id is 32 lowercase hex digits taken from
// it, or "".
func FuzzTraceparentID(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-x")
	f.Fuzz(func(t *testing.T, v string) {
		got := traceparentID(v)
		if got == "" {
			return
		}
		if len(got) != 32 || !lowerHex(got) || allZeros(got) || v[3:35] != got {
			t.Fatalf("traceparentID(%q) = %q", v, got)
		}
	})
}

// TestRequestContext: with the access log on, an exchange's context carries the trace id of
// the one valid traceparent header the client sent; off, or with none, two or an invalid
// one, it is the request's own context.
func TestRequestContext(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	valid := "00-" + id + "-00f067aa0ba902b7-01"
	for _, c := range []struct {
		on      bool
		headers []string
		want    string
	}{
		{true, []string{valid}, id},
		{true, nil, ""},
		{true, []string{valid, valid}, ""},
		{true, []string{"00-" + id + "-00f067aa0ba902b7"}, ""},
		{false, []string{valid}, ""},
	} {
		s := New(Options{AccessLog: c.on, Logger: quiet})
		r := httptest.NewRequest("POST", "/v1/completions", nil)
		for _, h := range c.headers {
			r.Header.Add("traceparent", h)
		}
		ctx := s.requestContext(r)
		if got := accesslog.TraceID(ctx); got != c.want {
			t.Errorf("log on %v, traceparent %q: trace id %q, want %q", c.on, c.headers, got, c.want)
		}
		if c.want == "" && ctx != r.Context() {
			t.Errorf("log on %v, traceparent %q: a new context for no trace id", c.on, c.headers)
		}
	}
}
