package request

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
)

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}

// TestFailoverOutcomesWithoutSockets (R6, R14.2): a refused worker, one whose connection
// resets, one that answers 503 — each is released with its own verdict and excluded — and the
// fourth answers; the machine runs on an in-memory upstream, no listener anywhere.
func TestFailoverOutcomesWithoutSockets(t *testing.T) {
	m := newMRig(t)
	m.d.MaxAttempts = 4
	m.pool = []string{"a", "b", "c", "d"}
	m.upstream = func(worker string, _ *http.Request, body string) (*http.Response, error) {
		switch worker {
		case "a":
			return nil, errRefused
		case "b":
			return nil, io.EOF
		case "c":
			return reply(503, "text/plain", "full"), nil
		}
		if modelOf(body) != "served" {
			t.Errorf("the body's model is %q, want the served id", modelOf(body))
		}
		return reply(200, "application/json", okJSON), nil
	}
	w := m.do(`{"model":"m","prompt":"hi"}`)
	if w.Code != 200 || w.Body.String() != okJSON {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	got := m.expectReleases(4)
	want := map[string][]router.Outcome{"a": {router.OutcomeRefused}, "b": {router.OutcomeReset},
		"c": {router.Outcome5xx}, "d": {router.OutcomeSuccess}}
	if !equalOutcomes(got, want) {
		t.Fatalf("releases %v, want %v", got, want)
	}
	m.noMoreReleases()
	var last *router.Pick
	for range 4 {
		last = <-m.picks
	}
	if !slices.Equal(last.Exclude, []string{"a", "b", "c"}) {
		t.Fatalf("the fourth pick excludes %v", last.Exclude)
	}
	if n := m.code("r", "served", 200); n != 1 {
		t.Fatalf("200s counted %v", n)
	}
}

// TestFailoverEndsAtMaxAttempts: max_attempts workers fail, the client gets 503 no_capacity
// and the router is asked no more.
func TestFailoverEndsAtMaxAttempts(t *testing.T) {
	m := newMRig(t)
	m.pool = []string{"a", "b", "c", "d"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) { return nil, errRefused }
	w := m.do(`{"model":"m","prompt":"hi"}`)
	if w.Code != 503 || !strings.Contains(w.Body.String(), "3 workers tried") {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	if n := len(m.picks); n != 3 {
		t.Fatalf("%d picks for max_attempts 3", n)
	}
	got := m.expectReleases(3)
	if !equalOutcomes(got, map[string][]router.Outcome{"a": {router.OutcomeRefused}, "b": {router.OutcomeRefused}, "c": {router.OutcomeRefused}}) {
		t.Fatalf("releases %v", got)
	}
}

// TestNoCapacityAfterFailover: the router finds nobody after a failover; the client's message
// counts the workers tried and names none of them (R13.4).
func TestNoCapacityAfterFailover(t *testing.T) {
	m := newMRig(t)
	m.pool = []string{"a"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) { return nil, errRefused }
	w := m.do(`{"model":"m","prompt":"hi"}`)
	if w.Code != 503 || !strings.Contains(w.Body.String(), "1 workers tried, none answered") || strings.Contains(w.Body.String(), "a.http") {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	// With nobody to try, the router's own error is the answer.
	m2 := newMRig(t)
	w = m2.do(`{"model":"m","prompt":"hi"}`)
	if w.Code != 503 || strings.Contains(w.Body.String(), "workers tried") {
		t.Fatalf("no worker at all: %d %q", w.Code, w.Body.String())
	}
}

// TestRelayedOutcomes (R14.2): a committed answer that ended normally is a success, whatever
// its status below 500; a relayed 5xx counts as 5xx; a cut answer is interrupted; a stream
// that ends before its first event is a reset before the first byte.
func TestRelayedOutcomes(t *testing.T) {
	for _, c := range []struct {
		name       string
		stream     bool
		answer     func() (*http.Response, error)
		wantCode   int
		wantBody   string
		wantResult router.Outcome
	}{
		{"200 JSON", false, func() (*http.Response, error) { return reply(200, "application/json", okJSON), nil }, 200, okJSON, router.OutcomeSuccess},
		{"400 JSON", false, func() (*http.Response, error) { return reply(400, "application/json", `{"error":{}}`), nil }, 400, `{"error":{}}`, router.OutcomeSuccess},
		{"500 JSON", false, func() (*http.Response, error) { return reply(500, "application/json", `{"error":"x"}`), nil }, 500, `{"error":"x"}`, router.Outcome5xx},
		{"a JSON answer cut", false, func() (*http.Response, error) {
			r := reply(200, "application/json", "")
			r.Body, r.ContentLength = io.NopCloser(io.MultiReader(strings.NewReader(`{"cho`), errReader{io.ErrUnexpectedEOF})), -1
			return r, nil
		}, 502, "broke off", router.OutcomeInterrupted},
		{"a whole stream", true, func() (*http.Response, error) {
			return reply(200, "text/event-stream", "data: {\"t\":1}\n\ndata: [DONE]\n\n"), nil
		}, 200, "data: [DONE]", router.OutcomeSuccess},
		{"a stream without [DONE]", true, func() (*http.Response, error) {
			return reply(200, "text/event-stream", "data: {\"t\":1}\n\n"), nil
		}, 200, "event: error", router.OutcomeInterrupted},
		{"a stream whose first event is not whole", true, func() (*http.Response, error) {
			return reply(200, "text/event-stream", "data: {\"t\""), nil
		}, 503, "1 workers tried", router.OutcomeReset},
		{"a 500 to a stream", true, func() (*http.Response, error) {
			return reply(500, "application/json", `{"error":"x"}`), nil
		}, 500, `{"error":"x"}`, router.Outcome5xx},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMRig(t)
			m.pool = []string{"a"}
			m.upstream = func(string, *http.Request, string) (*http.Response, error) { return c.answer() }
			body := `{"model":"m","prompt":"hi"}`
			if c.stream {
				body = `{"model":"m","prompt":"hi","stream":true}`
			}
			w := m.do(body)
			if w.Code != c.wantCode || !strings.Contains(w.Body.String(), c.wantBody) {
				t.Fatalf("client got %d %q", w.Code, w.Body.String())
			}
			if got := m.expectReleases(1); !equalOutcomes(got, map[string][]router.Outcome{"a": {c.wantResult}}) {
				t.Fatalf("releases %v, want a: %s", got, c.wantResult)
			}
			m.noMoreReleases()
		})
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// blockUntilDone is an upstream that signals at and then waits for its request's context.
func blockUntilDone(at chan<- string) func(string, *http.Request, string) (*http.Response, error) {
	return func(worker string, req *http.Request, _ string) (*http.Response, error) {
		at <- worker
		<-req.Context().Done()
		return nil, context.Cause(req.Context())
	}
}

func waitAt(t *testing.T, at <-chan string, want string) {
	t.Helper()
	select {
	case got := <-at:
		if got != want {
			t.Fatalf("reached %s, want %s", got, want)
		}
	case <-time.After(waitFor):
		t.Fatalf("%s was never reached", want)
	}
}

// TestTimeoutOutcomes (R14.1, R14.2): a stream with no headers within
// stream_first_byte_timeout fails over with Timeout on that worker; a non-streamed request
// with no answer within request_timeout is answered 504 with Timeout on its worker.
func TestTimeoutOutcomes(t *testing.T) {
	t.Run("first byte", func(t *testing.T) {
		m := newMRig(t)
		m.pool = []string{"a", "b"}
		at := make(chan string, 4)
		stall := blockUntilDone(at)
		m.upstream = func(worker string, req *http.Request, body string) (*http.Response, error) {
			if worker == "a" {
				return stall(worker, req, body)
			}
			return reply(200, "text/event-stream", "data: {}\n\ndata: [DONE]\n\n"), nil
		}
		run := m.start(`{"model":"m","prompt":"hi","stream":true}`)
		waitAt(t, at, "a")
		m.clk.Advance(DefaultStreamFirstByteTimeout - time.Nanosecond)
		select {
		case r := <-m.releases:
			t.Fatalf("released before the timeout: %+v", r)
		default:
		}
		m.clk.Advance(time.Nanosecond)
		if w := run.wait(t); w.Code != 200 || !strings.HasSuffix(w.Body.String(), "data: [DONE]\n\n") {
			t.Fatalf("client got %d %q", w.Code, w.Body.String())
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"a": {router.OutcomeTimeout}, "b": {router.OutcomeSuccess}}) {
			t.Fatalf("releases %v", got)
		}
	})
	t.Run("request", func(t *testing.T) {
		m := newMRig(t)
		m.d.RequestTimeout = time.Minute
		m.pool = []string{"a", "b"}
		at := make(chan string, 4)
		m.upstream = blockUntilDone(at)
		run := m.start(`{"model":"m","prompt":"hi"}`)
		waitAt(t, at, "a")
		m.clk.Advance(time.Minute)
		if w := run.wait(t); w.Code != 504 {
			t.Fatalf("client got %d %q", w.Code, w.Body.String())
		}
		if got := m.expectReleases(1); !equalOutcomes(got, map[string][]router.Outcome{"a": {router.OutcomeTimeout}}) {
			t.Fatalf("releases %v", got)
		}
		m.noMoreReleases()
		if len(m.picks) != 1 {
			t.Fatal("a request that timed out was retried")
		}
	})
	t.Run("request while routing", func(t *testing.T) {
		m := newMRig(t)
		m.d.RequestTimeout, m.d.PickTimeout = time.Minute, time.Hour
		m.silent = true
		run := m.start(`{"model":"m","prompt":"hi"}`)
		<-m.picks
		m.clk.Advance(time.Minute)
		select {
		case <-run.x.Done():
			t.Fatal("request_timeout runs from the first pick's answer, not while routing")
		default:
		}
		run.cancel()
		run.wait(t)
	})
}

// TestClientLeaves: a client that leaves ends the request in every state through one path; its
// workers are released with no verdict (R14.2) and 499 is counted.
func TestClientLeaves(t *testing.T) {
	t.Run("routing, without admission", func(t *testing.T) {
		m := newMRig(t)
		m.silent = true
		run := m.start(`{"model":"m","prompt":"hi"}`)
		<-m.picks
		run.cancel()
		run.wait(t)
		if n := m.code(UnknownLabel, UnknownLabel, statusClientGone); n != 1 {
			t.Fatalf("499s counted %v", n)
		}
		if m.clk.Pending() != 0 {
			t.Fatalf("%d timers left armed", m.clk.Pending())
		}
	})
	t.Run("attempting", func(t *testing.T) {
		m := newMRig(t)
		m.pool = []string{"a", "b"}
		at := make(chan string, 4)
		m.upstream = blockUntilDone(at)
		run := m.start(`{"model":"m","prompt":"hi","stream":true}`)
		waitAt(t, at, "a")
		run.cancel()
		run.wait(t)
		if got := m.expectReleases(1); !equalOutcomes(got, map[string][]router.Outcome{"a": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
		m.noMoreReleases()
		if n := m.code("r", "served", statusClientGone); n != 1 {
			t.Fatalf("499s counted %v", n)
		}
		if len(m.picks) != 1 || m.clk.Pending() != 0 {
			t.Fatalf("%d picks, %d timers armed: a client that left is not failed over", len(m.picks), m.clk.Pending())
		}
	})
	t.Run("relaying", func(t *testing.T) {
		m := newMRig(t)
		m.pool = []string{"a"}
		pr, pw := io.Pipe()
		m.upstream = func(_ string, req *http.Request, _ string) (*http.Response, error) {
			go func() {
				_, _ = pw.Write([]byte("data: {\"t\":1}\n\n"))
				<-req.Context().Done()
				pw.CloseWithError(req.Context().Err())
			}()
			r := reply(200, "text/event-stream", "")
			r.Body = pr
			return r, nil
		}
		run := m.start(`{"model":"m","prompt":"hi","stream":true}`)
		gwait(t, "the first event relayed", func() bool { return m.transitions(Attempting, Relaying) == 1 })
		run.cancel()
		run.wait(t)
		if got := m.expectReleases(1); !equalOutcomes(got, map[string][]router.Outcome{"a": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
	})
	t.Run("cascade step", func(t *testing.T) {
		m := newMRig(t)
		m.steps = []string{"s0", "s1"}
		acc, _ := cascade.ParseAcceptIf("mean_logprob > -1")
		m.accept = &acc
		pr, _ := io.Pipe()
		at := make(chan string, 1)
		m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
			at <- worker
			r := reply(200, "application/json", "")
			r.Body = pr // headers came, the body stalls
			return r, nil
		}
		run := m.start(`{"model":"m","prompt":"hi"}`)
		waitAt(t, at, "s0")
		gwait(t, "the cascade step", func() bool { return m.transitions(Attempting, CascadeStep) == 1 })
		run.cancel()
		run.wait(t)
		if got := m.expectReleases(1); !equalOutcomes(got, map[string][]router.Outcome{"s0": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
	})
	t.Run("tokenizing", func(t *testing.T) {
		m := newMRig(t)
		m.pool, m.prefill = []string{"d"}, "p"
		at := make(chan string, 1)
		m.upstream = blockUntilDone(at)
		run := m.start(`{"model":"m","prompt":"hi"}`)
		waitAt(t, at, "p")
		run.cancel()
		run.wait(t)
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"d": {router.OutcomeNone}, "p": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
		if prefills, _ := m.engines.calls(); len(prefills) != 0 {
			t.Fatal("a request whose client left went on to Prefill")
		}
	})
	t.Run("prefilling, the KV pushed anyway", func(t *testing.T) {
		m := newMRig(t)
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = tokenizer
		at := make(chan struct{}, 1)
		m.engines.prefill = func(ctx context.Context, _ PrefillCall) (PrefillResult, error) {
			at <- struct{}{}
			<-ctx.Done()
			return PrefillResult{HandleID: "pushed"}, nil // the push finished as the call was cancelled
		}
		run := m.start(`{"model":"m","prompt":"hi"}`)
		select {
		case <-at:
		case <-time.After(waitFor):
			t.Fatal("no Prefill")
		}
		run.cancel()
		run.wait(t)
		if _, rel := m.engines.calls(); !slices.Equal(rel, [][2]string{{"d.kv", "pushed"}}) {
			t.Fatalf("releases %v, want the pushed handle at d's KV address", rel)
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"d": {router.OutcomeNone}, "p": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
		if n := m.code("r", "served", statusClientGone); n != 1 {
			t.Fatalf("499s counted %v", n)
		}
	})
	t.Run("decoding, the KV released", func(t *testing.T) {
		m := newMRig(t)
		m.pool, m.prefill = []string{"d"}, "p"
		at := make(chan string, 2)
		stall := blockUntilDone(at)
		m.upstream = func(worker string, req *http.Request, body string) (*http.Response, error) {
			if worker == "p" {
				return tokenizer(worker, req, body)
			}
			return stall(worker, req, body)
		}
		run := m.start(`{"model":"m","prompt":"hi"}`)
		waitAt(t, at, "d")
		run.cancel()
		run.wait(t)
		if _, rel := m.engines.calls(); !slices.Equal(rel, [][2]string{{"d.kv", "h1"}}) {
			t.Fatalf("releases %v", rel)
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"d": {router.OutcomeNone}, "p": {router.OutcomeSuccess}}) {
			t.Fatalf("releases %v", got)
		}
	})
}

// TestLatePickIsGivenBack: a pick the router did not answer in time is asked again; the late
// answer to the first is given back with no verdict, the current one is used.
func TestLatePickIsGivenBack(t *testing.T) {
	m := newMRig(t)
	m.silent = true
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		return reply(200, "application/json", okJSON), nil
	}
	run := m.start(`{"model":"m","prompt":"hi"}`)
	first := <-m.picks
	m.clk.Advance(time.Second - time.Nanosecond)
	select {
	case <-m.picks:
		t.Fatal("asked again before the pick timeout")
	default:
	}
	m.clk.Advance(time.Nanosecond)
	var second *router.Pick
	select {
	case second = <-m.picks:
	case <-time.After(waitFor):
		t.Fatal("not asked again after the pick timeout")
	}
	if first.Tag == second.Tag || first.Key != second.Key {
		t.Fatalf("tags %d %d, keys %d %d", first.Tag, second.Tag, first.Key, second.Key)
	}
	m.mu.Lock()
	sender := m.held[0].sender
	m.mu.Unlock()
	late := &router.Picked{Tag: first.Tag, Ticket: 7, Worker: m.worker("late"), WorkerID: "late", HTTPAddress: "late.http",
		Prefill: &router.PickedWorker{Ticket: 8, Worker: m.worker("late-p"), WorkerID: "late-p"}, Steps: 1,
		Warm: &router.Warmup{PickedWorker: router.PickedWorker{Ticket: 10, Worker: m.worker("late-w"), WorkerID: "late-w",
			HTTPAddress: "late-w.http"}, Bytes: 2}}
	cur := &router.Picked{Tag: second.Tag, Ticket: 9, Worker: m.worker("a"), WorkerID: "a", HTTPAddress: "a.http", Steps: 1}
	m.sys.Root.Send(sender, late)
	m.sys.Root.Send(sender, cur)
	if w := run.wait(t); w.Code != 200 {
		t.Fatalf("client got %d", w.Code)
	}
	got := m.expectReleases(4)
	want := map[string][]router.Outcome{"late": {router.OutcomeNone}, "late-p": {router.OutcomeNone},
		"late-w": {router.OutcomeNone}, "a": {router.OutcomeSuccess}}
	if !equalOutcomes(got, want) {
		t.Fatalf("releases %v, want %v", got, want)
	}
	if len(m.bodiesOf("late")) != 0 || len(m.bodiesOf("late-w")) != 0 {
		t.Fatal("the late pick's workers were asked")
	}
}

// TestSilentRouter: a router that answers none of four picks ends the request with 500.
func TestSilentRouter(t *testing.T) {
	m := newMRig(t)
	m.silent = true
	run := m.start(`{"model":"m","prompt":"hi"}`)
	for i := range 4 {
		select {
		case <-m.picks:
		case <-time.After(waitFor):
			t.Fatalf("pick %d never came", i+1)
		}
		select {
		case <-run.x.Done():
			t.Fatalf("gave up after %d picks", i+1)
		default:
		}
		m.clk.Advance(time.Second)
	}
	if w := run.wait(t); w.Code != 500 {
		t.Fatalf("client got %d", w.Code)
	}
	if len(m.picks) != 0 {
		t.Fatal("a fifth pick")
	}
}

// cascadeAnswer is a completions answer whose tokens carry logprobs.
func cascadeAnswer(logprobs ...float64) string {
	toks := make([]string, len(logprobs))
	for i := range toks {
		toks[i] = "w"
	}
	b, _ := json.Marshal(map[string]any{"choices": []map[string]any{{"text": strings.Join(toks, ""),
		"logprobs": map[string]any{"tokens": toks, "token_logprobs": logprobs}}}})
	return string(b)
}

// TestCascadeOutcomes (R7, R14.2): a step that answered 200 did its part, kept or escalated; a
// step that answered 5xx escalates with 5xx on its worker.
func TestCascadeOutcomes(t *testing.T) {
	for _, c := range []struct {
		name     string
		s0       func() (*http.Response, error)
		wantBody string
		want     map[string][]router.Outcome
	}{
		{"kept", func() (*http.Response, error) { return reply(200, "application/json", cascadeAnswer(-0.1, -0.2)), nil },
			`"text":"ww"`, map[string][]router.Outcome{"s0": {router.OutcomeSuccess}}},
		{"escalated", func() (*http.Response, error) { return reply(200, "application/json", cascadeAnswer(-3)), nil },
			"big", map[string][]router.Outcome{"s0": {router.OutcomeSuccess}, "s1": {router.OutcomeSuccess}}},
		{"no tokens", func() (*http.Response, error) { return reply(200, "application/json", cascadeAnswer()), nil },
			"big", map[string][]router.Outcome{"s0": {router.OutcomeSuccess}, "s1": {router.OutcomeSuccess}}},
		{"5xx", func() (*http.Response, error) { return reply(500, "application/json", `{}`), nil },
			"big", map[string][]router.Outcome{"s0": {router.Outcome5xx}, "s1": {router.OutcomeSuccess}}},
		{"refused", func() (*http.Response, error) { return nil, errRefused },
			"big", map[string][]router.Outcome{"s0": {router.OutcomeRefused}, "s1": {router.OutcomeSuccess}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMRig(t)
			m.d.MaxAttempts = 1
			m.steps = []string{"s0", "s1"}
			acc, err := cascade.ParseAcceptIf("mean_logprob > -1")
			if err != nil {
				t.Fatal(err)
			}
			m.accept = &acc
			m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
				if worker == "s0" {
					return c.s0()
				}
				return reply(200, "application/json", `{"choices":[{"text":"big"}]}`), nil
			}
			w := m.do(`{"model":"m","prompt":"hi"}`)
			if w.Code != 200 || !strings.Contains(w.Body.String(), c.wantBody) {
				t.Fatalf("client got %d %q", w.Code, w.Body.String())
			}
			n := 0
			for _, outs := range c.want {
				n += len(outs)
			}
			if got := m.expectReleases(n); !equalOutcomes(got, c.want) {
				t.Fatalf("releases %v, want %v", got, c.want)
			}
			m.noMoreReleases()
			if b := m.bodiesOf("s0"); len(b) != 1 || !strings.Contains(b[0], `"logprobs":1`) {
				t.Fatalf("s0 was asked %q", b)
			}
			if b := m.bodiesOf("s1"); len(b) == 1 && strings.Contains(b[0], "logprobs") {
				t.Fatalf("the last step was asked for logprobs: %q", b)
			}
		})
	}
}

// tokenizer answers tokenize calls on the prefill worker and 200 JSON elsewhere.
func tokenizer(worker string, req *http.Request, _ string) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, "/v1/tokenize") {
		return reply(200, "application/json", `{"tokens":[1,2,3]}`), nil
	}
	return reply(200, "application/json", okJSON), nil
}

// TestDisaggregatedOutcomes (R8, R14.2): a tokenize or Prefill failure is the prefill worker's
// (the decode worker's hold gets no verdict); a decode failure is the decode worker's, and the
// KV handle pushed for it is released at its KV address before the request routes again.
func TestDisaggregatedOutcomes(t *testing.T) {
	t.Run("success", func(t *testing.T) {
		m := newMRig(t)
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = tokenizer
		if w := m.do(`{"model":"m","prompt":"hi","seed":4}`); w.Code != 200 || w.Body.String() != okJSON {
			t.Fatalf("client got %d %q", w.Code, w.Body.String())
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeSuccess}, "d": {router.OutcomeSuccess}}) {
			t.Fatalf("releases %v", got)
		}
		prefills, rel := m.engines.calls()
		if len(prefills) != 1 || len(rel) != 0 {
			t.Fatalf("prefills %v, releases %v: a consumed handle is not released", prefills, rel)
		}
		c := prefills[0]
		if c.DecodeTarget != "d.kv" || !slices.Equal(c.PromptIDs, []uint32{1, 2, 3}) || c.Sampling.Seed != 4 || c.Model != "served" {
			t.Fatalf("prefill call %+v", c)
		}
		d := m.bodiesOf("d")
		if len(d) != 1 || seedOf(t, d[0]) != 4 {
			t.Fatalf("D was asked %q", d)
		}
	})
	t.Run("tokenize answers 500", func(t *testing.T) {
		m := newMRig(t)
		m.d.MaxAttempts = 1
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = func(string, *http.Request, string) (*http.Response, error) {
			return reply(500, "application/json", "oops"), nil
		}
		if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 503 {
			t.Fatalf("client got %d", w.Code)
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.Outcome5xx}, "d": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
	})
	t.Run("tokenize answers garbage", func(t *testing.T) {
		m := newMRig(t)
		m.d.MaxAttempts = 1
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = func(string, *http.Request, string) (*http.Response, error) {
			return reply(200, "application/json", "{"), nil
		}
		if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 503 {
			t.Fatalf("client got %d", w.Code)
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeReset}, "d": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
	})
	t.Run("Prefill fails", func(t *testing.T) {
		m := newMRig(t)
		m.d.MaxAttempts = 1
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = tokenizer
		m.engines.prefill = func(context.Context, PrefillCall) (PrefillResult, error) {
			return PrefillResult{}, errors.New("rpc error: code = Unavailable")
		}
		if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 503 {
			t.Fatalf("client got %d", w.Code)
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeReset}, "d": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
		if _, rel := m.engines.calls(); len(rel) != 0 {
			t.Fatalf("released %v with no handle", rel)
		}
	})
	t.Run("decode refused", func(t *testing.T) {
		m := newMRig(t)
		m.pool, m.prefill = []string{"d", "e"}, "p"
		m.upstream = func(worker string, req *http.Request, body string) (*http.Response, error) {
			if worker == "d" {
				return nil, errRefused
			}
			return tokenizer(worker, req, body)
		}
		if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 {
			t.Fatalf("client got %d", w.Code)
		}
		if _, rel := m.engines.calls(); !slices.Equal(rel, [][2]string{{"d.kv", "h1"}}) {
			t.Fatalf("releases %v, want d's handle at d's KV address", rel)
		}
		got := m.expectReleases(4)
		want := map[string][]router.Outcome{"p": {router.OutcomeSuccess, router.OutcomeSuccess},
			"d": {router.OutcomeRefused}, "e": {router.OutcomeSuccess}}
		if !equalOutcomes(got, want) {
			t.Fatalf("releases %v, want %v", got, want)
		}
		if n := m.transitions(Attempting, Releasing); n != 1 {
			t.Fatalf("attempting → releasing %v times", n)
		}
		if n := m.transitions(Releasing, Routing); n != 1 {
			t.Fatalf("releasing → routing %v times: the failover did not wait for the Release", n)
		}
	})
	t.Run("decode cut", func(t *testing.T) {
		m := newMRig(t)
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = func(worker string, req *http.Request, body string) (*http.Response, error) {
			if worker == "d" {
				return reply(200, "text/event-stream", "data: {}\n\n"), nil
			}
			return tokenizer(worker, req, body)
		}
		if w := m.do(`{"model":"m","prompt":"hi","stream":true}`); w.Code != 200 || !strings.Contains(w.Body.String(), "event: error") {
			t.Fatalf("client got %d %q", w.Code, w.Body.String())
		}
		if _, rel := m.engines.calls(); !slices.Equal(rel, [][2]string{{"d.kv", "h1"}}) {
			t.Fatalf("releases %v", rel)
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeSuccess}, "d": {router.OutcomeInterrupted}}) {
			t.Fatalf("releases %v", got)
		}
	})
	t.Run("request_timeout while prefilling", func(t *testing.T) {
		m := newMRig(t)
		m.d.RequestTimeout = 10 * time.Second // before control_timeout
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = tokenizer
		at := make(chan struct{}, 1)
		m.engines.prefill = func(ctx context.Context, _ PrefillCall) (PrefillResult, error) {
			at <- struct{}{}
			<-ctx.Done()
			return PrefillResult{HandleID: "pushed"}, nil
		}
		run := m.start(`{"model":"m","prompt":"hi"}`)
		select {
		case <-at:
		case <-time.After(waitFor):
			t.Fatal("no Prefill")
		}
		m.clk.Advance(10 * time.Second)
		if w := run.wait(t); w.Code != 504 {
			t.Fatalf("client got %d", w.Code)
		}
		if _, rel := m.engines.calls(); !slices.Equal(rel, [][2]string{{"d.kv", "pushed"}}) {
			t.Fatalf("releases %v", rel)
		}
		if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeTimeout}, "d": {router.OutcomeNone}}) {
			t.Fatalf("releases %v", got)
		}
	})
}

// TestUnseededDisaggregatedSeeds (R8.2): the gateway draws a seed for each request that sent
// none — two requests, two seeds — and the decode worker's body carries the seed the Prefill
// call had.
func TestUnseededDisaggregatedSeeds(t *testing.T) {
	m := newMRig(t)
	m.pool, m.prefill = []string{"d"}, "p"
	m.upstream = tokenizer
	for range 2 {
		if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 {
			t.Fatalf("client got %d", w.Code)
		}
	}
	prefills, _ := m.engines.calls()
	d := m.bodiesOf("d")
	if len(prefills) != 2 || len(d) != 2 {
		t.Fatalf("%d prefills, %d decode bodies", len(prefills), len(d))
	}
	if prefills[0].Sampling.Seed == prefills[1].Sampling.Seed {
		t.Fatalf("two unseeded requests got the same seed %d", prefills[0].Sampling.Seed)
	}
	for i := range 2 {
		if got := seedOf(t, d[i]); got != prefills[i].Sampling.Seed {
			t.Fatalf("request %d: D's body has seed %d, the Prefill call %d", i, got, prefills[i].Sampling.Seed)
		}
	}
}

// TestCrashReleasesTheKVHandle: an actor that panics while it holds a KV handle answers 502
// and releases the handle with the same call Releasing makes; its holds go back with no
// verdict.
func TestCrashReleasesTheKVHandle(t *testing.T) {
	m := newMRig(t)
	m.pool, m.prefill = []string{"d"}, "p"
	m.upstream = tokenizer
	m.runCrashing(t)
	if _, rel := m.engines.calls(); !slices.Equal(rel, [][2]string{{"d.kv", "h1"}}) {
		t.Fatalf("releases %v", rel)
	}
	if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeSuccess}, "d": {router.OutcomeNone}}) {
		t.Fatalf("releases %v", got)
	}
}

func seedOf(t *testing.T, body string) uint64 {
	t.Helper()
	var b struct {
		Seed *uint64 `json:"seed"`
	}
	if err := json.Unmarshal([]byte(body), &b); err != nil || b.Seed == nil {
		t.Fatalf("no seed in %q (%v)", body, err)
	}
	return *b.Seed
}

func modelOf(body string) string {
	var b struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal([]byte(body), &b)
	return b.Model
}

func equalOutcomes(got, want map[string][]router.Outcome) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			return false
		}
	}
	return true
}

// transitions is how often the machine went from → to.
func (m *mrig) transitions(from, to State) float64 {
	return testutil.ToFloat64(m.d.Metrics.transitions.WithLabelValues(from.String(), to.String()))
}

// gwait polls cond until it holds, failing after 5 s.
func gwait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	gwtest.Eventually(t, what, cond)
}

// TestCascadeStepNobodyServes (R7): a non-final step nobody serves escalates at once; a last
// step nobody serves is the client's 503.
func TestCascadeStepNobodyServes(t *testing.T) {
	m := newMRig(t)
	m.steps = []string{"", "s1"}
	m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
		return reply(200, "application/json", `{"choices":[{"text":"big"}]}`), nil
	}
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 || !strings.Contains(w.Body.String(), "big") {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	if p := []*router.Pick{<-m.picks, <-m.picks}; p[0].Step != 0 || p[1].Step != 1 {
		t.Fatalf("picked steps %d, %d", p[0].Step, p[1].Step)
	}
	if n := testutil.ToFloat64(m.d.Metrics.cascade.WithLabelValues("r", "escalated")); n != 1 {
		t.Fatalf("escalations counted %v", n)
	}

	m = newMRig(t)
	m.steps = []string{"s0", ""}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		return reply(200, "application/json", cascadeAnswer(-5)), nil
	}
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 503 {
		t.Fatalf("nobody at the last step: client got %d %q", w.Code, w.Body.String())
	}
	if len(m.picks) != 2 {
		t.Fatalf("%d picks", len(m.picks))
	}
	// A stream goes straight to the last step.
	m = newMRig(t)
	m.steps = []string{"s0", "s1"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		return reply(200, "text/event-stream", "data: {}\n\ndata: [DONE]\n\n"), nil
	}
	if w := m.do(`{"model":"m","prompt":"hi","stream":true}`); w.Code != 200 || len(m.bodiesOf("s0")) != 0 {
		t.Fatalf("stream: %d, s0 asked %d times", w.Code, len(m.bodiesOf("s0")))
	}
	if p := <-m.picks; p.Step != router.LastStep {
		t.Fatalf("a stream picked step %d", p.Step)
	}
}

// crashOnAnswer is receiver middleware that makes a request actor panic on its engine's answer
// (the attempt's result), the answer's body closed first.
func crashOnAnswer(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		if r, ok := env.Message.(attemptResult); ok {
			r.resp.Body.Close()
			panic("injected: the actor dies on the engine's answer")
		}
		next(c, env)
	}
}

// runCrashing runs a completions request whose actor panics on its engine's answer
// (crashOnAnswer), its exchange changed by adjust first, and checks the client got 502.
func (m *mrig) runCrashing(t *testing.T, adjust ...func(*Exchange)) {
	t.Helper()
	body := `{"model":"m","prompt":"hi"}`
	parsed, _ := oai.Parse(oai.Completions, []byte(body))
	r := &run{w: httptest.NewRecorder()}
	r.x = NewExchange(context.Background(), r.w, "/v1/completions", oai.Completions, "req", false, []byte(body), parsed, time.Now())
	for _, f := range adjust {
		f(r.x)
	}
	Spawn(m.sys, m.d, r.x, actor.WithReceiverMiddleware(crashOnAnswer))
	if w := r.wait(t); w.Code != 502 {
		t.Fatalf("client got %d", w.Code)
	}
}
