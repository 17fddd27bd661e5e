package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// programsJSON is the body of GET /admin/v1/programs.
type programsJSON struct {
	Classifier     *string `json:"classifier"`
	TracksPrograms bool    `json:"tracks_programs"`
	Programs       []struct {
		Session     string  `json:"session"`
		State       string  `json:"state"`
		Worker      string  `json:"worker"`
		Tokens      int     `json:"tokens"`
		PausedSince *string `json:"paused_since"`
	} `json:"programs"`
}

// TestAdminPrograms (R15.1): GET /admin/v1/programs lists the thunderagent classifier's
// programs: after a session's turn, its program is acting on the worker that answered, with
// the answer's usage as its tokens, under a hash of the session id. It needs the admin scope
// (401 without a key, 403 with an inference key) and is GET only.
func TestAdminPrograms(t *testing.T) {
	var s *stack
	pol := thunderagent.New(thunderagent.DefaultConfig(), func() time.Time { return s.Clock.Now() })
	s = newStack(t, stackOpt{keys: testKeys,
		admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		routerAdmission: &router.AdmissionConfig{
			Queue: admission.Config{
				Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10, MaxWait: time.Minute}},
				DefaultClass: "default", Policy: pol, Recheck: time.Second,
			},
			PolicyName: "thunderagent",
		}})
	e := newEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":12,"total_tokens":42}}`))
	})
	w1 := gwWorker("w1", e.addr(), 0)
	w1.BlockSize = 16
	s.Beat(w1)

	resp, b := s.do(t, "GET", "/admin/v1/programs", "sk-admin", "")
	if resp.StatusCode != 200 || string(b) != `{"classifier":"thunderagent","programs":[],"tracks_programs":true}`+"\n" {
		t.Fatalf("no program yet: %d %q", resp.StatusCode, b)
	}
	if resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"hi"}`, "X-Session-ID", "alice"); resp.StatusCode != 200 {
		t.Fatalf("turn: %d %s", resp.StatusCode, b)
	}
	var got programsJSON
	s.Eventually("the turn's end reaches the classifier", func() bool {
		resp, b = s.do(t, "GET", "/admin/v1/programs", "sk-admin", "")
		got = programsJSON{}
		if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != 200 {
			t.Fatalf("programs: %d %v %s", resp.StatusCode, err, b)
		}
		return len(got.Programs) == 1 && got.Programs[0].State == "acting"
	})
	p := got.Programs[0]
	if got.Classifier == nil || *got.Classifier != "thunderagent" || !got.TracksPrograms ||
		p.Worker != "w1" || p.Tokens != 42 || p.PausedSince != nil || p.Session == "" ||
		strings.Contains(p.Session, "alice") || strings.Contains(string(b), "paused_since") {
		t.Fatalf("programs = %s", b)
	}

	if resp, b := s.do(t, "GET", "/admin/v1/programs", "sk-inference", ""); resp.StatusCode != 403 || errCode(t, b) != "insufficient_scope" {
		t.Fatalf("inference key: %d %s, want 403 insufficient_scope", resp.StatusCode, b)
	}
	if resp, b := s.do(t, "GET", "/admin/v1/programs", "", ""); resp.StatusCode != 401 || errCode(t, b) != "invalid_api_key" {
		t.Fatalf("no key: %d %s, want 401 invalid_api_key", resp.StatusCode, b)
	}
	if resp, _ := s.do(t, "POST", "/admin/v1/programs", "sk-admin", ""); resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET" {
		t.Fatalf("POST: %d (Allow %q), want 405", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// TestAdminProgramsWithoutAdmission: with no admission queue the list is empty, not an error,
// and names no classifier.
func TestAdminProgramsWithoutAdmission(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	s.Beat(gwtest.Worker("w1", "smol", 0))
	resp, b := s.do(t, "GET", "/admin/v1/programs", "sk-admin", "")
	if resp.StatusCode != 200 || string(b) != `{"classifier":null,"programs":[],"tracks_programs":false}`+"\n" {
		t.Fatalf("no admission: %d %q", resp.StatusCode, b)
	}
}
