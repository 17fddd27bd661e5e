package request

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tlgw/tlgw/internal/accesslog"
	"github.com/tlgw/tlgw/internal/cascade"
)

// lockedBuffer is the access log's output, read once the log is closed.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// withAccessLog gives the rig's actors an access log; lines closes it and returns what it
// wrote, one decoded line each.
func withAccessLog(m *mrig) (lines func() []map[string]any) {
	out := &lockedBuffer{}
	l := accesslog.New(out, nil, accesslog.Options{Clock: m.clk})
	m.d.AccessLog = l
	m.t.Cleanup(func() { _ = l.Close() })
	return func() []map[string]any {
		m.t.Helper()
		if err := l.Close(); err != nil {
			m.t.Fatal(err)
		}
		var got []map[string]any
		for _, line := range strings.Split(strings.TrimSuffix(out.b.String(), "\n"), "\n") {
			if line == "" {
				continue
			}
			var v map[string]any
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				m.t.Fatalf("%v: %s", err, line)
			}
			got = append(got, v)
		}
		return got
	}
}

// oneLine is the only line written, with its measured fields checked and taken out: time (the
// rig's fake clock when the request ended), duration_ms (positive), ttft_ms (positive and at
// most the duration, then "present").
func oneLine(t *testing.T, m *mrig, lines []map[string]any) map[string]any {
	t.Helper()
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(lines), lines)
	}
	l := lines[0]
	if want := m.clk.Now().UTC().Format("2006-01-02T15:04:05.000Z"); l["time"] != want {
		t.Errorf("time %v, want the fake clock's %s", l["time"], want)
	}
	d, _ := l["duration_ms"].(float64)
	if d <= 0 {
		t.Errorf("duration_ms %v", l["duration_ms"])
	}
	if v, ok := l["ttft_ms"]; ok {
		if f, _ := v.(float64); f <= 0 || f > d {
			t.Errorf("ttft_ms %v, duration_ms %v", v, d)
		}
		l["ttft_ms"] = "present"
	}
	delete(l, "time")
	delete(l, "duration_ms")
	return l
}

// recWant is the line's fields but the measured ones, for a completions request "req" of route
// "r" served as "served" (the rig's router).
func recWant(worker string, status, attempts int, ttft bool, stream bool, outcome string, tokens ...float64) map[string]any {
	w := map[string]any{"request_id": "req", "trace_id": "", "key": "", "route": "r", "model": "served",
		"endpoint": "completions", "worker": worker, "status": float64(status), "attempts": float64(attempts),
		"stream": stream, "outcome": outcome}
	if ttft {
		w["ttft_ms"] = "present"
	}
	if len(tokens) == 2 {
		w["prompt_tokens"], w["completion_tokens"] = tokens[0], tokens[1]
	}
	return w
}

const usageJSON = `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3}}`

// TestAccessRecords (R24): each way a request ends gives its line — the outcome word, the
// status the client got, the attempts made and the last one's worker, the time to the first
// byte relayed (absent when nothing was), and the usage the answer reported.
func TestAccessRecords(t *testing.T) {
	blockUntilDone := func(at chan<- string) func(string, *http.Request, string) (*http.Response, error) {
		return func(worker string, req *http.Request, _ string) (*http.Response, error) {
			at <- worker
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
	}
	for _, c := range []struct {
		name     string
		pool     []string
		steps    []string
		attempts int // max_attempts (0: the rig's 3)
		body     string
		upstream func(worker string, req *http.Request, body string) (*http.Response, error)
		during   func(t *testing.T, m *mrig, r *run, at <-chan string) // what happens while it runs
		want     map[string]any
	}{
		{name: "ok with usage", pool: []string{"a"}, body: `{"model":"m","prompt":"hi"}`,
			upstream: func(string, *http.Request, string) (*http.Response, error) {
				return reply(200, "application/json", usageJSON), nil
			},
			want: recWant("a", 200, 1, true, false, OutcomeOK, 7, 3)},
		{name: "failover then ok", pool: []string{"a", "b"}, body: `{"model":"m","prompt":"hi"}`,
			upstream: func(w string, _ *http.Request, _ string) (*http.Response, error) {
				if w == "a" {
					return nil, errRefused
				}
				return reply(200, "application/json", okJSON), nil
			},
			want: recWant("b", 200, 2, true, false, OutcomeOK)},
		{name: "max_attempts failed", pool: []string{"a", "b", "c"}, attempts: 2, body: `{"model":"m","prompt":"hi"}`,
			upstream: func(string, *http.Request, string) (*http.Response, error) {
				return reply(503, "text/plain", "busy"), nil
			},
			want: recWant("b", 503, 2, false, false, OutcomeFailoverExhausted)},
		{name: "every worker failed", pool: []string{"a"}, body: `{"model":"m","prompt":"hi"}`,
			upstream: func(string, *http.Request, string) (*http.Response, error) { return nil, errRefused },
			want:     recWant("a", 503, 1, false, false, OutcomeFailoverExhausted)},
		{name: "nothing routable", body: `{"model":"m","prompt":"hi"}`,
			want: recWant("", 503, 0, false, false, OutcomeNoCapacity)},
		{name: "stream interrupted", pool: []string{"a"}, body: `{"model":"m","prompt":"hi","stream":true}`,
			upstream: func(string, *http.Request, string) (*http.Response, error) {
				return reply(200, "text/event-stream", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"), nil
			},
			want: recWant("a", 200, 1, true, true, OutcomeInterrupted)},
		{name: "stream with usage", pool: []string{"a"}, body: `{"model":"m","prompt":"hi","stream":true}`,
			upstream: func(string, *http.Request, string) (*http.Response, error) {
				return reply(200, "text/event-stream", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: "+usageJSON+"\n\ndata: [DONE]\n\n"), nil
			},
			want: recWant("a", 200, 1, true, true, OutcomeOK, 7, 3)},
		{name: "engine's error", pool: []string{"a"}, body: `{"model":"m","prompt":"hi"}`,
			upstream: func(string, *http.Request, string) (*http.Response, error) {
				return reply(400, "application/json", `{"error":{"message":"no"}}`), nil
			},
			want: recWant("a", 400, 1, true, false, OutcomeEngineError)},
		{name: "client gone", pool: []string{"a"}, body: `{"model":"m","prompt":"hi"}`,
			during: func(t *testing.T, _ *mrig, r *run, at <-chan string) { waitAt(t, at, "a"); r.cancel() },
			want:   recWant("a", statusClientGone, 1, false, false, OutcomeClientGone)},
		{name: "request timeout", pool: []string{"a"}, body: `{"model":"m","prompt":"hi"}`,
			during: func(t *testing.T, m *mrig, _ *run, at <-chan string) { waitAt(t, at, "a"); m.clk.Advance(time.Second) },
			want:   recWant("a", 504, 1, false, false, OutcomeTimeout)},
		{name: "cascade escalated", steps: []string{"s0", "s1"}, body: `{"model":"m","prompt":"hi"}`,
			upstream: func(w string, _ *http.Request, _ string) (*http.Response, error) {
				if w == "s0" {
					return reply(200, "application/json", cascadeAnswer(-5, -5)), nil
				}
				return reply(200, "application/json", usageJSON), nil
			},
			want: recWant("s1", 200, 2, true, false, OutcomeOK, 7, 3)},
		{name: "cascade accepted", steps: []string{"s0", "s1"}, body: `{"model":"m","prompt":"hi"}`,
			upstream: func(string, *http.Request, string) (*http.Response, error) {
				return reply(200, "application/json", strings.TrimSuffix(cascadeAnswer(-0.1), "}")+`,"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`), nil
			},
			want: recWant("s0", 200, 1, true, false, OutcomeOK, 2, 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMRig(t)
			lines := withAccessLog(m)
			m.pool, m.steps = c.pool, c.steps
			if c.steps != nil {
				acc, err := cascade.ParseAcceptIf("mean_logprob > -1")
				if err != nil {
					t.Fatal(err)
				}
				m.accept = &acc
			}
			if c.attempts > 0 {
				m.d.MaxAttempts = c.attempts
			}
			m.d.RequestTimeout = time.Second
			at := make(chan string, 8)
			m.upstream = c.upstream
			if c.upstream == nil {
				m.upstream = blockUntilDone(at)
			}
			r := m.start(c.body)
			if c.during != nil {
				c.during(t, m, r, at)
			}
			r.wait(t)
			if diff := cmp.Diff(c.want, oneLine(t, m, lines())); diff != "" {
				t.Errorf("the line (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAccessRecordOfACrash: an actor that panics still logs its request, with the status its
// client got and the outcome crashed.
func TestAccessRecordOfACrash(t *testing.T) {
	m := newMRig(t)
	lines := withAccessLog(m)
	m.pool = []string{"a"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		return reply(200, "application/json", okJSON), nil
	}
	m.d.KeyNames = []string{"key-0", "ops"}
	m.runCrashing(t, withClient(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
		func(x *Exchange) { x.Owner = 1 })
	want := recWant("a", 502, 1, false, false, OutcomeCrashed)
	want["key"], want["trace_id"] = "ops", "4bf92f3577b34da6a3ce929d0e0e4736"
	if diff := cmp.Diff(want, oneLine(t, m, lines())); diff != "" {
		t.Errorf("the line (-want +got):\n%s", diff)
	}
}

// TestOutcomeWord: the outcome of each way finish can be reached, from the actor's state.
func TestOutcomeWord(t *testing.T) {
	for _, c := range []struct {
		r    requestActor
		code int
		want string
	}{
		{requestActor{}, 200, OutcomeOK},
		{requestActor{}, 404, OutcomeEngineError},
		{requestActor{acc: &access{failed: OutcomeRetryBudget}}, 503, OutcomeRetryBudget},
		{requestActor{acc: &access{failed: OutcomeRetryBudget}}, statusClientGone, OutcomeClientGone},
		{requestActor{relayOut: &relayResult{ended: true, finished: true}}, 200, OutcomeOK},
		{requestActor{relayOut: &relayResult{ended: true, finished: true}, timedOut: true}, 200, OutcomeOK},
		{requestActor{relayOut: &relayResult{ended: true}}, 502, OutcomeInterrupted},
		{requestActor{relayOut: &relayResult{ended: true, shed: true}}, 503, OutcomeOverloaded},
		{requestActor{relayOut: &relayResult{}, timedOut: true}, 504, OutcomeTimeout},
		{requestActor{timedOut: true}, 504, OutcomeTimeout},
	} {
		if got := c.r.outcomeWord(c.code); got != c.want {
			t.Errorf("%+v, %d: %s, want %s", c.r, c.code, got, c.want)
		}
	}
}

// TestUsageNear: the prompt and completion tokens are read from the usage object that holds
// the total_tokens found, in any key order and either API's names, within a bounded window.
func TestUsageNear(t *testing.T) {
	for _, c := range []struct {
		body               string
		prompt, completion int64
	}{
		{`{"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}`, 5, 3},
		{`{"usage":{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}`, 5, 3},
		{`{"usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":0},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":15}}`, 11, 4},
		{`{"usage":{"prompt_tokens":5,"total_tokens":5,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":2}}}`, 5, 0},
		// Two events' usages in one read: the last one's.
		{"data: {\"usage\":{\"prompt_tokens\":5,\"total_tokens\":6,\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":5,\"total_tokens\":7,\"completion_tokens\":2}}\n\n", 5, 2},
		{`{"usage":{"total_tokens":8}}`, -1, -1},
		{`{"usage":{"prompt_tokens":"x","total_tokens":8,"completion_tokens":null}}`, -1, -1},
		{`{"usage":{"prompt_tokens":5,"pad":"` + strings.Repeat("x", usageWindow) + `","total_tokens":8}}`, -1, -1},
	} {
		tc := tokenCounter{usage: -1, detail: true, prompt: -1, completion: -1}
		tc.observe([]byte(c.body))
		if tc.prompt != c.prompt || tc.completion != c.completion || tc.usage <= 0 {
			t.Errorf("%s: usage %d, prompt %d, completion %d; want %d, %d", c.body, tc.usage, tc.prompt, tc.completion, c.prompt, c.completion)
		}
	}
	// Without the access log nothing beyond the total is read.
	tc := tokenCounter{usage: -1, prompt: -1, completion: -1}
	tc.observe([]byte(usageJSON))
	if tc.usage != 10 || tc.prompt != -1 || tc.completion != -1 {
		t.Errorf("without detail: %+v", tc)
	}
}

// clientTrace is a context carrying the client's trace context traceparent, as the HTTP
// adapter's extraction leaves it.
func clientTrace(t testing.TB, traceparent string) context.Context {
	t.Helper()
	ctx := w3c.Extract(context.Background(), propagation.HeaderCarrier{"Traceparent": {traceparent}})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatalf("%q is no valid traceparent", traceparent)
	}
	return ctx
}
