package httpapi

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/internal/config"
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
	r := httptest.NewRequest("POST", "/v1/completions", nil)
	r.Header.Add("traceparent", "00-"+id+"-00f067aa0ba902b7-01")
	if got := accessTraceID(r); got != id {
		t.Errorf("accessTraceID = %q", got)
	}
	r.Header.Add("traceparent", "00-"+id+"-00f067aa0ba902b7-01")
	if got := accessTraceID(r); got != "" {
		t.Errorf("two traceparent headers: %q, want none", got)
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

// TestKeyNameForTheAccessLog: with the access log on, an exchange carries its key's name (the
// configured one, else key-<index>) and trace id; never the secret. Off, it carries neither.
func TestKeyNameForTheAccessLog(t *testing.T) {
	keys := []config.Key{{Key: "sk-one", Name: "ops", Scopes: []string{"inference"}}, {Key: "sk-two", Scopes: []string{"inference"}}}
	for _, on := range []bool{true, false} {
		s := New(Options{Keys: keys, AccessLog: on, Logger: quiet})
		for secret, want := range map[string]string{"sk-one": "ops", "sk-two": "key-1"} {
			r := httptest.NewRequest("POST", "/v1/completions", nil)
			r.Header.Set("Authorization", "Bearer "+secret)
			r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			km, err := s.keys.authorize(r, scopeInference)
			if err != nil {
				t.Fatal(err)
			}
			x := &request.Exchange{}
			s.forAccessLog(x, r, km)
			switch {
			case on && (x.KeyName != want || x.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736"):
				t.Errorf("%s: key %q, trace %q; want %q", secret, x.KeyName, x.TraceID, want)
			case !on && (x.KeyName != "" || x.TraceID != ""):
				t.Errorf("log off: %+v", x)
			}
		}
	}
	open := New(Options{AccessLog: true, Logger: quiet})
	km, err := open.keys.authorize(httptest.NewRequest("POST", "/v1/completions", nil), scopeInference)
	if err != nil || km.name != "" {
		t.Errorf("open mode: %+v, %v", km, err)
	}
}
