package request_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/coldpool"
	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestCrashedTurnDoesNotBlockItsSession: with one turn per session, a request actor that
// panics on its admitted pick's answer still ends its turn, so the session's next turn runs.
func TestCrashedTurnDoesNotBlockItsSession(t *testing.T) {
	h := gwtest.New(t, gwtest.WithAdmission(&router.AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10, MaxWait: time.Minute}},
			DefaultClass: "default", Policy: sessionserial.New(), Recheck: time.Second,
		},
		PolicyName: "session_serial",
	}))
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer engine.Close()
	w := gwtest.Worker("w1", "smol", 0)
	w.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
	h.Beat(w)

	var crashes atomic.Int32
	crashFirst := func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			if _, ok := env.Message.(*router.Picked); ok && crashes.Add(1) == 1 {
				panic("injected: the first turn's actor dies on its pick")
			}
			next(c, env)
		}
	}
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), MaxAttempts: 3, Admission: true,
		Metrics: request.NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Errors: httpapi.ErrorWriter{},
	}
	api := httpapi.New(httpapi.Options{
		Core: h.GW, Logger: deps.Logger,
		Admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		Serve: func(x *request.Exchange) {
			request.Spawn(h.GW.System, deps, x, actor.WithReceiverMiddleware(crashFirst))
		},
	})
	srv := httptest.NewServer(api)
	defer srv.Close()
	turn := func() int {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"model":"smol","prompt":"hi"}`))
		req.Header.Set("X-Session-ID", "alice")
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("turn: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := turn(); code != 502 {
		t.Fatalf("the crashed turn answered %d, want 502", code)
	}
	if code := turn(); code != 200 {
		t.Fatalf("the next turn of the session answered %d, want 200", code)
	}
	h.InFlight("w1", 0)
}

// tagRecorder is a Cold Pool policy that records the tag of each request it sees dispatched.
type tagRecorder struct {
	*coldpool.Policy
	tags chan string
}

func (p *tagRecorder) Gate() admission.Gate { return p }
func (p *tagRecorder) Dispatched(r *admission.Request, w string) {
	p.tags <- r.Tag
	p.Policy.Dispatched(r, w)
}

// TestLongPromptSentTwiceIsNotColdAgain (issue 9 item 5): the prompt-size estimate and the
// cached-prefix estimate cover the same bytes, so a 64 KB prompt is Cold the first time and,
// sent again once the prefix index has seen it, mostly cached (not Cold) the second time.
func TestLongPromptSentTwiceIsNotColdAgain(t *testing.T) {
	pol := &tagRecorder{Policy: coldpool.New(coldpool.Config{ColdThresholdTokens: 2048, Workers: 1,
		SteerWarm: true, QueueLimit: 10, MaxWait: time.Minute}, nil), tags: make(chan string, 4)}
	h := gwtest.New(t, gwtest.WithPrefixIndex(4096), gwtest.WithAdmission(&router.AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10, MaxWait: time.Minute}},
			DefaultClass: "default", Policy: pol, Recheck: time.Second,
		},
		PolicyName: "cold_pool",
	}))
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer engine.Close()
	for _, id := range []string{"w1", "w2", "w3"} {
		w := gwtest.Worker(id, "smol", 0)
		w.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
		h.Beat(w)
	}
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), MaxAttempts: 3, Admission: true, PrefixHashes: true,
		Metrics: request.NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Errors: httpapi.ErrorWriter{},
	}
	api := httpapi.New(httpapi.Options{
		Core: h.GW, Logger: deps.Logger,
		Admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		Serve:     func(x *request.Exchange) { request.Spawn(h.GW.System, deps, x) },
	})
	srv := httptest.NewServer(api)
	defer srv.Close()
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 1500) // 67.5 KB
	body := `{"model":"smol","prompt":"` + prompt + `"}`
	for i, want := range []string{coldpool.TagCold, ""} {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		select {
		case got := <-pol.tags:
			if got != want {
				t.Fatalf("request %d was tagged %q, want %q", i, got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d was never dispatched", i)
		}
	}
}

// completions is a session_serial policy that records what each completed request told the
// gate.
type completions struct {
	*sessionserial.Policy
	done chan admission.Request
}

func (p *completions) Gate() admission.Gate { return p }
func (p *completions) Completed(r *admission.Request, w string) {
	p.done <- *r
	p.Policy.Completed(r, w)
}

// TestFinishedCarriesCostAndOutcome (R15): an admitted request's end reaches the gate once,
// with what its answer cost (the engine's usage.total_tokens) and whether it was a whole
// successful answer; an engine's 400 is an aborted turn. X-TL-Session-Final: true reaches the
// policy as the request's Final (R15.1), from the HTTP header through the pick's AdmitInfo.
func TestFinishedCarriesCostAndOutcome(t *testing.T) {
	pol := &completions{Policy: sessionserial.New(), done: make(chan admission.Request, 4)}
	h := gwtest.New(t, gwtest.WithAdmission(&router.AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10, MaxWait: time.Minute}},
			DefaultClass: "default", Policy: pol, Recheck: time.Second,
		},
		PolicyName: "session_serial",
	}))
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(b), "refuse") {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"no"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":100,"completion_tokens":23,"total_tokens":123}}`)
	}))
	defer engine.Close()
	w := gwtest.Worker("w1", "smol", 0)
	w.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
	h.Beat(w)
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), MaxAttempts: 3, Admission: true,
		Metrics: request.NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Errors: httpapi.ErrorWriter{},
	}
	api := httpapi.New(httpapi.Options{
		Core: h.GW, Logger: deps.Logger,
		Admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		Serve:     func(x *request.Exchange) { request.Spawn(h.GW.System, deps, x) },
	})
	srv := httptest.NewServer(api)
	defer srv.Close()
	for _, c := range []struct {
		prompt  string
		code    int
		tokens  int
		aborted bool
		final   bool
	}{
		{"hello", 200, 123, false, false},
		{"refuse", 400, len(`{"model":"smol","prompt":"refuse"}`) / 4, true, false},
		{"goodbye", 200, 123, false, true},
	} {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"model":"smol","prompt":"`+c.prompt+`"}`))
		req.Header.Set("X-Session-ID", "alice")
		if c.final {
			req.Header.Set("X-TL-Session-Final", "true")
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Fatalf("%s: %d, want %d", c.prompt, resp.StatusCode, c.code)
		}
		select {
		case got := <-pol.done:
			if got.ContextTokens != c.tokens || got.Aborted != c.aborted || got.SessionID != "alice" || got.Final != c.final {
				t.Fatalf("%s: the gate saw tokens %d, aborted %v, final %v (session %q); want %d, %v, %v",
					c.prompt, got.ContextTokens, got.Aborted, got.Final, got.SessionID, c.tokens, c.aborted, c.final)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the gate never saw the request complete", c.prompt)
		}
	}
	select {
	case extra := <-pol.done:
		t.Fatalf("a request completed twice: %+v", extra)
	default:
	}
	h.InFlight("w1", 0)
}

// TestAdmittedPickSizesTheWholeRequest (R20, issue 35 item 7): the admission queue sizes a
// request by every prompt of its body and the most it may generate — a batch whose first
// prompt is short is not a short request, nor is one that asks for many long answers — and
// learns which API key it came with. The router here only records the first pick.
func TestAdmittedPickSizesTheWholeRequest(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	defer sys.Shutdown()
	picks := make(chan router.AdmitInfo, 8)
	routerPID := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if p, ok := c.Message().(*router.Pick); ok {
			picks <- *p.Admit
			c.Respond(&router.Picked{Tag: p.Tag, Err: errs.ErrNoCapacity})
		}
	}))
	deps := &request.Deps{
		Router: routerPID, Transport: httpapi.NewTransport(), MaxAttempts: 1, Admission: true,
		Metrics: request.NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Errors: httpapi.ErrorWriter{},
	}
	api := httpapi.New(httpapi.Options{
		Logger:    deps.Logger,
		Keys:      []config.Key{{Key: "sk-a", Scopes: []string{"inference"}}, {Key: "sk-b", Scopes: []string{"inference"}}},
		Admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		Serve:     func(x *request.Exchange) { request.Spawn(sys, deps, x) },
	})
	srv := httptest.NewServer(api)
	defer srv.Close()
	for _, c := range []struct {
		name, path, key, body string
		want                  router.AdmitInfo
	}{
		{"a batch: every prompt, and n answers of max_tokens for each", "/v1/completions", "sk-b",
			`{"model":"smol","prompt":["a","` + strings.Repeat("x", 398) + `","b"],"n":2,"max_tokens":10}`,
			router.AdmitInfo{APIKey: 1, PromptTokens: 100, OutputTokens: 3 * 2 * 10}},
		{"chat: max_completion_tokens", "/v1/chat/completions", "sk-a",
			`{"model":"smol","messages":[{"role":"user","content":"12345678"}],"max_completion_tokens":50}`,
			router.AdmitInfo{APIKey: 0, PromptTokens: 4, OutputTokens: 50}},
	} {
		req, _ := http.NewRequest("POST", srv.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+c.key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got := <-picks
		got.Class, got.SessionID = "", ""
		if got != c.want {
			t.Errorf("%s: admitted as %+v, want %+v", c.name, got, c.want)
		}
	}
}
