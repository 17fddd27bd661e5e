package request

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/oai"
)

// warmResults is tlgw_prefix_warmups_sent_total by result.
func warmResults(m *Metrics) [numWarmResults]float64 {
	var out [numWarmResults]float64
	for i := range out {
		out[i] = testutil.ToFloat64(m.warmups[i])
	}
	return out
}

// TestWarmupSentOffTheClientsPath: a pick's warm-up goes to its worker as a one-token request
// of the prompt's first bytes, for the served model; the client's answer does not wait for it,
// and its ticket is released, with no verdict, when it has ended.
func TestWarmupSentOffTheClientsPath(t *testing.T) {
	m := newMRig(t)
	m.pool, m.warm, m.warmBytes = []string{"w1"}, "w2", 4
	m.d.Warmups = NewWarmups(1)
	gate := make(chan struct{})
	var warmReq *http.Request
	m.upstream = func(worker string, req *http.Request, _ string) (*http.Response, error) {
		if worker == "w2" {
			warmReq = req
			<-gate
		}
		return reply(200, "application/json", okJSON), nil
	}
	if w := m.do(`{"model":"m","prompt":"hello world","max_tokens":50}`); w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if got := m.expectReleases(1); len(got["w1"]) != 1 {
		t.Fatalf("released %v, want w1's attempt only while the warm-up runs", got)
	}
	if got := m.d.Warmups.Running(); got != 1 {
		t.Fatalf("%d warm-ups running, want 1", got)
	}
	close(gate)
	if got := m.expectReleases(1); len(got["w2"]) != 1 || got["w2"][0] != router.OutcomeNone {
		t.Fatalf("released %v, want w2's warm-up with no verdict", got)
	}
	if got := m.bodiesOf("w2"); len(got) != 1 || got[0] != `{"model":"served","prompt":"hell","max_tokens":1}` {
		t.Fatalf("w2 got %q", got)
	}
	if warmReq.Method != http.MethodPost || warmReq.URL.String() != "http://w2.http/v1/completions" ||
		warmReq.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("the warm-up was %s %s, Content-Type %q", warmReq.Method, warmReq.URL, warmReq.Header.Get("Content-Type"))
	}
	// Counted before the Release was sent.
	if m.d.Warmups.Running() != 0 || warmResults(m.d.Metrics) != [numWarmResults]float64{warmOK: 1} {
		t.Fatalf("running %d, results %v", m.d.Warmups.Running(), warmResults(m.d.Metrics))
	}
}

// TestWarmupFailedOrSkipped: a warm-up the engine refuses counts as failed; one with no text
// prompt, with none allowed to run, or beyond the running limit is not sent; every one of them
// releases its ticket with no verdict.
func TestWarmupFailedOrSkipped(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		warmups *Warmups
		result  int
		sent    int
	}{
		{"refused", `{"model":"m","prompt":"hello world"}`, NewWarmups(4), warmFailed, 1},
		{"token ids", `{"model":"m","prompt":[1,2,3]}`, NewWarmups(4), warmSkipped, 0},
		{"off", `{"model":"m","prompt":"hello world"}`, nil, warmSkipped, 0},
		{"limit", `{"model":"m","prompt":"hello world"}`, NewWarmups(0), warmSkipped, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMRig(t)
			m.pool, m.warm, m.warmBytes = []string{"w1"}, "w2", 8
			m.d.Warmups = tc.warmups
			m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
				if worker == "w2" {
					return reply(503, "application/json", `{"error":"busy"}`), nil
				}
				return reply(200, "application/json", okJSON), nil
			}
			if w := m.do(tc.body); w.Code != 200 {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			got := m.expectReleases(2)
			if len(got["w2"]) != 1 || got["w2"][0] != router.OutcomeNone || len(got["w1"]) != 1 {
				t.Fatalf("released %v", got)
			}
			if n := len(m.bodiesOf("w2")); n != tc.sent {
				t.Fatalf("%d warm-ups sent, want %d", n, tc.sent)
			}
			var want [numWarmResults]float64
			want[tc.result] = 1
			if got := warmResults(m.d.Metrics); got != want || m.d.Warmups.Running() != 0 {
				t.Fatalf("results %v, want one %s; %d running", got, warmResultNames[tc.result], m.d.Warmups.Running())
			}
		})
	}
}

// TestWarmupTimesOut: a warm-up whose engine never answers is cut at the request timeout, on
// the injected clock, counted as failed, and its ticket released.
func TestWarmupTimesOut(t *testing.T) {
	m := newMRig(t)
	m.pool, m.warm, m.warmBytes = []string{"w1"}, "w2", 4
	m.d.Warmups, m.d.RequestTimeout = NewWarmups(1), time.Minute
	sent := make(chan struct{})
	m.upstream = func(worker string, req *http.Request, _ string) (*http.Response, error) {
		if worker == "w2" {
			close(sent)
			<-req.Context().Done() // an engine that never answers
			return nil, req.Context().Err()
		}
		return reply(200, "application/json", okJSON), nil
	}
	if w := m.do(`{"model":"m","prompt":"hello world"}`); w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if got := m.expectReleases(1); len(got["w1"]) != 1 {
		t.Fatalf("released %v", got)
	}
	<-sent
	m.clk.Advance(time.Minute - time.Nanosecond)
	select {
	case r := <-m.releases:
		t.Fatalf("released %v before the timeout", r)
	default:
	}
	m.clk.Advance(time.Nanosecond)
	if got := m.expectReleases(1); len(got["w2"]) != 1 || got["w2"][0] != router.OutcomeNone {
		t.Fatalf("released %v, want w2's warm-up", got)
	}
	if got := warmResults(m.d.Metrics); got != [numWarmResults]float64{warmFailed: 1} {
		t.Fatalf("results %v", got)
	}
}

// routerSpy puts a spy between m's request actors and its router: every message goes on to the
// router (picks keep their sender, so the answers still reach the requester), and the
// WarmupSent ones are recorded. sent returns them once the spy has handled all sent so far.
func routerSpy(t *testing.T, m *mrig) (sent func() []*router.WarmupSent) {
	t.Helper()
	var mu sync.Mutex
	var got []*router.WarmupSent // bounded by the test's requests
	real := m.d.Router
	spy := m.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch msg := c.Message().(type) {
		case *router.WarmupSent:
			mu.Lock()
			got = append(got, msg)
			mu.Unlock()
			return
		case *router.Pick:
			c.Forward(real)
		}
	}))
	m.d.Router = spy
	return func() []*router.WarmupSent {
		t.Helper()
		if err := m.sys.Root.RequestFuture(spy, &actor.Touch{}, 5*time.Second).Wait(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// TestWarmupSentTellsTheRouter: the router hears of a warm-up (router.WarmupSent, with the
// Warmup's worker and hashes) when it is sent, failed or not, and never of one skipped: the
// approximate prefix index learns a copy only from it.
func TestWarmupSentTellsTheRouter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		warmups *Warmups
		told    bool
	}{
		{"sent", `{"model":"m","prompt":"hello world"}`, NewWarmups(4), true},
		{"token ids", `{"model":"m","prompt":[1,2,3]}`, NewWarmups(4), false},
		{"off", `{"model":"m","prompt":"hello world"}`, nil, false},
		{"limit", `{"model":"m","prompt":"hello world"}`, NewWarmups(0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMRig(t)
			m.pool, m.warm, m.warmBytes = []string{"w1"}, "w2", 8
			m.d.Warmups = tc.warmups
			sent := routerSpy(t, m)
			m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
				if worker == "w2" {
					return reply(503, "application/json", `{"error":"busy"}`), nil
				}
				return reply(200, "application/json", okJSON), nil
			}
			if w := m.do(tc.body); w.Code != 200 {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			m.expectReleases(2) // the attempt's and the warm-up's: whatever it sent, it has
			got := sent()
			if !tc.told {
				if len(got) != 0 {
					t.Fatalf("the router was told of a warm-up that was not sent: %+v", got[0])
				}
				return
			}
			if len(got) != 1 || got[0].WorkerID != "w2" || got[0].Reg != regOf("w2") {
				t.Fatalf("told the router %+v, want one WarmupSent for w2", got)
			}
		})
	}
}

// TestWarmupInTokens (R22): a warm-up cut in tokens goes to its worker as a one-token
// completions request, for the served model, whose prompt is exactly the pick's first
// Warmup.Tokens token ids — for a chat request too, whose ids hold its template's render.
// A length beyond the ids the pick carried, or a pick without ids, sends nothing: the ticket
// is released with no verdict and the warm-up counted as skipped.
func TestWarmupInTokens(t *testing.T) {
	ids := make([]uint32, 70)
	for i := range ids {
		ids[i] = uint32(3000 + 7*i)
	}
	chat := `{"model":"m","messages":[{"role":"user","content":"hello world"}],"max_tokens":50}`
	for _, tc := range []struct {
		name   string
		chat   bool
		ids    []uint32
		tokens int
		sent   bool
	}{
		{"completions", false, ids, 64, true},
		{"chat", true, ids, 32, true},
		{"all the ids", false, ids, 70, true},
		{"beyond the ids", false, ids, 71, false},
		{"no ids", false, nil, 16, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMRig(t)
			m.pool, m.warm, m.warmTokens = []string{"w1"}, "w2", tc.tokens
			m.d.Warmups = NewWarmups(1)
			var mu sync.Mutex
			var url string
			m.upstream = func(worker string, req *http.Request, _ string) (*http.Response, error) {
				if worker == "w2" {
					mu.Lock()
					url = req.URL.String()
					mu.Unlock()
				}
				return reply(200, "application/json", okJSON), nil
			}
			r := m.start(`{"model":"m","prompt":"hello world","max_tokens":50}`, func(x *Exchange) {
				x.TokenIDs = tc.ids
				if tc.chat {
					req, err := oai.Parse(oai.Chat, []byte(chat))
					if err != nil {
						t.Fatal(err)
					}
					x.Kind, x.Path, x.Body, x.Req = oai.Chat, "/v1/chat/completions", []byte(chat), req
				}
			})
			if w := r.wait(t); w.Code != 200 {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			if got := m.expectReleases(2); len(got["w2"]) != 1 || got["w2"][0] != router.OutcomeNone || len(got["w1"]) != 1 {
				t.Fatalf("released %v", got)
			}
			bodies := m.bodiesOf("w2")
			if !tc.sent {
				if len(bodies) != 0 || warmResults(m.d.Metrics) != [numWarmResults]float64{warmSkipped: 1} {
					t.Fatalf("sent %q, results %v; want a skipped warm-up", bodies, warmResults(m.d.Metrics))
				}
				return
			}
			if len(bodies) != 1 {
				t.Fatalf("w2 got %q", bodies)
			}
			var got struct {
				Model     string   `json:"model"`
				Prompt    []uint32 `json:"prompt"`
				MaxTokens int      `json:"max_tokens"`
				Stream    bool     `json:"stream"`
			}
			if err := json.Unmarshal([]byte(bodies[0]), &got); err != nil {
				t.Fatalf("w2 got %s: %v", bodies[0], err)
			}
			if got.Model != "served" || got.MaxTokens != 1 || got.Stream || len(got.Prompt) != tc.tokens || !slices.Equal(got.Prompt, ids[:tc.tokens]) {
				t.Fatalf("w2 got %s, want the first %d ids for the served model", bodies[0], tc.tokens)
			}
			mu.Lock()
			defer mu.Unlock()
			if url != "http://w2.http/v1/completions" {
				t.Fatalf("the warm-up went to %s", url)
			}
			if warmResults(m.d.Metrics) != [numWarmResults]float64{warmOK: 1} {
				t.Fatalf("results %v", warmResults(m.d.Metrics))
			}
		})
	}
}
