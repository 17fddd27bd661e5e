package httpapi_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/tlgw/tlgw/actors/request"
	httpapi "github.com/tlgw/tlgw/adapters/http"
)

// TestSessionFinalHeader (R15.1): X-TL-Session-Final: true marks the exchange as its session's
// last turn; "false" or no header does not; any other value is a 400 invalid_request naming
// the header, and reaches no engine. Without a session id the header is accepted (and means
// nothing to the policies).
func TestSessionFinalHeader(t *testing.T) {
	var mu sync.Mutex
	var seen []*request.Exchange
	s := newStack(t, stackOpt{keys: testKeys,
		admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		served: func(x *request.Exchange) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, x)
		}})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	body := `{"model":"smol","prompt":"hi"}`
	for _, c := range []struct {
		name  string
		hdr   []string
		final bool
	}{
		{"final", []string{"X-Session-ID", "alice", "X-TL-Session-Final", "true"}, true},
		{"not final", []string{"X-Session-ID", "alice", "X-TL-Session-Final", "false"}, false},
		{"absent", []string{"X-Session-ID", "alice"}, false},
		{"no session", []string{"X-TL-Session-Final", "true"}, true},
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", body, c.hdr...)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s, want 200", c.name, resp.StatusCode, b)
		}
		mu.Lock()
		if len(seen) != 1 || seen[0].SessionFinal != c.final {
			t.Fatalf("%s: %d exchanges, want one with SessionFinal %v", c.name, len(seen), c.final)
		}
		mu.Unlock()
	}
	calls := len(e.calls())
	for _, v := range []string{"yes", "TRUE", "1", "True"} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", body, "X-Session-ID", "alice", "X-TL-Session-Final", v)
		if resp.StatusCode != 400 || errCode(t, b) != "invalid_request" {
			t.Fatalf("%q: %d %s, want 400 invalid_request", v, resp.StatusCode, b)
		}
		var eb struct {
			Error struct{ Message string } `json:"error"`
		}
		if err := json.Unmarshal(b, &eb); err != nil || !strings.Contains(eb.Error.Message, "X-TL-Session-Final") {
			t.Fatalf("%q: the error %s does not name X-TL-Session-Final", v, b)
		}
		mu.Lock()
		if len(seen) != 0 {
			t.Fatalf("%q: the request was served", v)
		}
		mu.Unlock()
	}
	if n := len(e.calls()); n != calls {
		t.Fatalf("bad headers reached the engine %d times", n-calls)
	}
	s.InFlight("w1", 0)
}

// TestSessionIDBounds: X-Session-ID is a session when it is 1 to 128 printable ASCII bytes,
// else a 400 invalid_request naming it; without it the body's user is the session only when it
// is such an id too (a longer user is no session: nothing follows an unbounded client string).
func TestSessionIDBounds(t *testing.T) {
	var mu sync.Mutex
	var seen []*request.Exchange
	s := newStack(t, stackOpt{keys: testKeys,
		admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		served: func(x *request.Exchange) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, x)
		}})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	long := strings.Repeat("s", 129)
	for _, c := range []struct {
		name, body string
		hdr        []string
		code       int
		session    string
	}{
		// The session is keyed under the caller's key (sk-inference is key 0).
		{"header", `{"model":"smol","prompt":"hi","user":"u"}`, []string{"X-Session-ID", "alice"}, 200, "0\x00alice"},
		{"128 bytes", `{"model":"smol","prompt":"hi"}`, []string{"X-Session-ID", long[:128]}, 200, "0\x00" + long[:128]},
		{"user", `{"model":"smol","prompt":"hi","user":"bob"}`, nil, 200, "0\x00bob"},
		{"long user", `{"model":"smol","prompt":"hi","user":"` + long + `"}`, nil, 200, ""},
		{"long header", `{"model":"smol","prompt":"hi"}`, []string{"X-Session-ID", long}, 400, ""},
		{"control byte", `{"model":"smol","prompt":"hi"}`, []string{"X-Session-ID", "a\tb"}, 400, ""},
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", c.body, c.hdr...)
		if resp.StatusCode != c.code {
			t.Fatalf("%s: %d %s, want %d", c.name, resp.StatusCode, b, c.code)
		}
		mu.Lock()
		if c.code == 400 {
			if len(seen) != 0 || errCode(t, b) != "invalid_request" || !strings.Contains(string(b), "X-Session-ID") {
				t.Fatalf("%s: served %d, answered %s", c.name, len(seen), b)
			}
		} else if len(seen) != 1 || seen[0].SessionID != c.session {
			t.Fatalf("%s: %d exchanges, session %q, want %q", c.name, len(seen), seen[0].SessionID, c.session)
		}
		mu.Unlock()
	}
}

// TestSessionsBelongToTheirKey (R13): two API keys sending the same session id (header or
// user) get two sessions, so neither can join the other's lane or end its program; one key's
// requests share one. Without keys there is one caller, and the id is the session.
func TestSessionsBelongToTheirKey(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	served := func(x *request.Exchange) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, x.SessionID)
	}
	adm := httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}}
	s := newStack(t, stackOpt{keys: testKeys, admission: adm, served: served})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	for _, key := range []string{"sk-inference", "sk-debug", "sk-inference"} {
		if resp, b := s.do(t, "POST", "/v1/completions", key, `{"model":"smol","prompt":"hi"}`, "X-Session-ID", "shared"); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", key, resp.StatusCode, b)
		}
		if resp, b := s.do(t, "POST", "/v1/completions", key, `{"model":"smol","prompt":"hi","user":"shared"}`); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", key, resp.StatusCode, b)
		}
	}
	mu.Lock()
	got := seen
	mu.Unlock()
	// In order: key 0 by header and by user, key 1 likewise, key 0 again.
	if len(got) != 6 || got[0] == got[2] || got[0] != got[1] || got[0] != got[4] || got[0] != got[5] || got[2] != got[3] {
		t.Fatalf("sessions %q: want one per key, the same for header and user", got)
	}

	mu.Lock()
	seen = nil
	mu.Unlock()
	open := newStack(t, stackOpt{admission: adm, served: served})
	e2 := jsonEngine(t, "w2")
	open.beat("w2", "smol", e2)
	if resp, b := open.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"hi"}`, "X-Session-ID", "shared"); resp.StatusCode != 200 {
		t.Fatalf("no keys: %d %s", resp.StatusCode, b)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "shared" {
		t.Fatalf("no keys: sessions %q, want [shared]", seen)
	}
}
