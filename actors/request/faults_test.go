package request_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// requestClock is a fake clock for the request actors alone (the harness's own drives the
// registry, whose workers would be evicted by the minutes these tests advance).
func requestClock() *clock.Fake { return clock.NewFake(time.Unix(1_000_000, 0)) }

// onClock puts the request actors on clk with the SPEC's default timeouts.
func onClock(clk *clock.Fake) func(*request.Deps, *gwtest.Harness) {
	return func(d *request.Deps, _ *gwtest.Harness) { d.Clock = clk }
}

// reached is a channel an engine signals on each request it got.
func reached() chan struct{} { return make(chan struct{}, 16) }

func waitReached(t *testing.T, c chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// postAsync sends a request on a goroutine; the channel gets its status and body.
func (r *rig) postAsync(t *testing.T, body string) chan [2]string {
	out := make(chan [2]string, 1)
	go func() {
		resp, err := r.srv.Client().Post(r.srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			out <- [2]string{"error", err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- [2]string{fmt.Sprint(resp.StatusCode), string(b)}
	}()
	return out
}

func waitAnswer(t *testing.T, c chan [2]string) (string, string) {
	t.Helper()
	select {
	case a := <-c:
		return a[0], a[1]
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for the client's answer")
	}
	return "", ""
}

// TestStreamFirstByteTimeoutFailsOver (R14.1): a worker that never sends headers and one that
// sends headers but no event each count as a failure before the first byte once
// stream_first_byte_timeout has passed; the client gets the stream of the third worker, whole.
func TestStreamFirstByteTimeoutFailsOver(t *testing.T) {
	clk := requestClock()
	r := newRig(t, rigOpt{deps: onClock(clk)})
	atA, atB := reached(), reached()
	stall := r.engine(t, "a-stall", func(w http.ResponseWriter, req *http.Request, _ string) {
		r.tr.add("engine a-stall: never answers")
		atA <- struct{}{}
		<-req.Context().Done()
	})
	headersOnly := r.engine(t, "b-headers", func(w http.ResponseWriter, req *http.Request, _ string) {
		r.tr.add("engine b-headers: sends headers, then no event")
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		http.NewResponseController(w).Flush()
		atB <- struct{}{}
		<-req.Context().Done()
	})
	good := r.engine(t, "c-good", func(w http.ResponseWriter, _ *http.Request, _ string) {
		r.tr.add("engine c-good: streams")
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"ok\"}]}\n\ndata: [DONE]\n\n")
	})
	r.beat("a-stall", "smol", stall.URL, 0)
	r.beat("b-headers", "smol", headersOnly.URL, 1)
	r.beat("c-good", "smol", good.URL, 2)
	ans := r.postAsync(t, `{"model":"smol","prompt":"hi","stream":true}`)
	waitReached(t, atA, "a-stall")
	clk.Advance(request.DefaultStreamFirstByteTimeout - time.Millisecond)
	select {
	case a := <-ans:
		t.Fatalf("answered before the timeout: %v", a)
	case <-time.After(20 * time.Millisecond):
	}
	clk.Advance(time.Millisecond)
	waitReached(t, atB, "b-headers")
	clk.Advance(request.DefaultStreamFirstByteTimeout)
	code, body := waitAnswer(t, ans)
	r.tr.add("client: %s, body:\n%s", code, body)
	if code != "200" || !strings.Contains(body, `"ok"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("%s %q", code, body)
	}
	for _, id := range []string{"a-stall", "b-headers", "c-good"} {
		r.InFlight(id, 0)
	}
	r.tr.golden(t, "first_byte_timeout_failover")
}

// TestStreamIdleTimeout (R14.1): after the first event nothing is retried; a stream with no
// event for stream_idle_timeout ends with the R6 error event and no [DONE].
func TestStreamIdleTimeout(t *testing.T) {
	clk := requestClock()
	r := newRig(t, rigOpt{deps: func(d *request.Deps, h *gwtest.Harness) {
		d.Clock, d.StreamIdleTimeout = clk, 5*time.Second
	}})
	var calls atomic.Int32
	stalls := r.engine(t, "a-stalls", func(w http.ResponseWriter, req *http.Request, _ string) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"one\"}]}\n\n")
		http.NewResponseController(w).Flush()
		<-req.Context().Done()
	})
	other := r.engine(t, "b-other", func(w http.ResponseWriter, _ *http.Request, _ string) {
		calls.Add(100)
	})
	r.beat("a-stalls", "smol", stalls.URL, 0)
	r.beat("b-other", "smol", other.URL, 5)
	resp, err := r.srv.Client().Post(r.srv.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"smol","prompt":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, `"one"`) {
		t.Fatalf("first line %q %v", first, err)
	}
	clk.Advance(5*time.Second - time.Millisecond)
	clk.Advance(time.Millisecond)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "event: error\ndata: ") || !strings.Contains(string(rest), `"code":"stream_interrupted"`) ||
		strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("rest %q", rest)
	}
	if calls.Load() != 1 {
		t.Fatalf("engine calls %d: a stream is never retried after its first event", calls.Load())
	}
	r.InFlight("a-stalls", 0)
}

// TestStreamIdleTimerResetsOnEvents: events that keep coming keep the stream alive however
// long it runs in total.
func TestStreamIdleTimerResetsOnEvents(t *testing.T) {
	clk := requestClock()
	r := newRig(t, rigOpt{deps: func(d *request.Deps, h *gwtest.Harness) {
		d.Clock, d.StreamIdleTimeout = clk, 5*time.Second
	}})
	next := make(chan struct{})
	slow := r.engine(t, "a-slow", func(w http.ResponseWriter, req *http.Request, _ string) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			http.NewResponseController(w).Flush()
			select {
			case <-next:
			case <-req.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	r.beat("a-slow", "smol", slow.URL, 0)
	resp, err := r.srv.Client().Post(r.srv.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"smol","prompt":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		if err != nil || !strings.Contains(line, fmt.Sprintf(`"i":%d`, i)) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		_, _ = br.ReadString('\n')
		clk.Advance(4 * time.Second) // 12 s in all, never 5 s without an event
		next <- struct{}{}
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("rest %q", rest)
	}
}

// TestRequestTimeout (R14.1): a non-streamed request with no answer within request_timeout is
// answered 504 upstream_timeout and not retried on another worker.
func TestRequestTimeout(t *testing.T) {
	clk := requestClock()
	r := newRig(t, rigOpt{deps: onClock(clk)})
	at := reached()
	var others atomic.Int32
	stall := r.engine(t, "a-stall", func(w http.ResponseWriter, req *http.Request, _ string) {
		at <- struct{}{}
		<-req.Context().Done()
	})
	other := r.engine(t, "b-other", func(w http.ResponseWriter, _ *http.Request, _ string) {
		others.Add(1)
		completion(w, []string{"x"}, []float64{-1})
	})
	r.beat("a-stall", "smol", stall.URL, 0)
	r.beat("b-other", "smol", other.URL, 5)
	ans := r.postAsync(t, `{"model":"smol","prompt":"hi"}`)
	waitReached(t, at, "a-stall")
	clk.Advance(request.DefaultStreamFirstByteTimeout) // not a stream: no first-byte rule
	clk.Advance(request.DefaultRequestTimeout - request.DefaultStreamFirstByteTimeout)
	code, body := waitAnswer(t, ans)
	if code != "504" || !strings.Contains(body, `"code":"upstream_timeout"`) {
		t.Fatalf("%s %s", code, body)
	}
	if others.Load() != 0 {
		t.Fatal("a timed-out request was retried")
	}
	r.InFlight("a-stall", 0)
}

// TestRequestTimeoutWhileReadingTheAnswer: headers arrived but the JSON body stalls; the
// client still gets a clean 504, not a truncated 200.
func TestRequestTimeoutWhileReadingTheAnswer(t *testing.T) {
	clk := requestClock()
	r := newRig(t, rigOpt{deps: func(d *request.Deps, h *gwtest.Harness) { d.Clock, d.RequestTimeout = clk, time.Second }})
	at := reached()
	half := r.engine(t, "a-half", func(w http.ResponseWriter, req *http.Request, _ string) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "engine=1")
		fmt.Fprint(w, `{"choices":[`)
		http.NewResponseController(w).Flush()
		at <- struct{}{}
		<-req.Context().Done()
	})
	r.beat("a-half", "smol", half.URL, 0)
	ans := r.postAsync(t, `{"model":"smol","prompt":"hi"}`)
	waitReached(t, at, "a-half")
	clk.Advance(time.Second)
	code, body := waitAnswer(t, ans)
	if code != "504" || !strings.Contains(body, `"code":"upstream_timeout"`) {
		t.Fatalf("%s %s", code, body)
	}
	r.InFlight("a-half", 0)
}

// TestControlTimeout (R14.1): a tokenize call that never answers fails over after
// control_timeout (here to nobody: 503 no_capacity), and the stalled call is cancelled.
func TestControlTimeout(t *testing.T) {
	clk := requestClock()
	r := newRig(t, rigOpt{deps: onClock(clk), routes: []config.Route{
		{Model: "pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	}})
	at, cancelled := reached(), reached()
	p := r.engine(t, "p", func(w http.ResponseWriter, req *http.Request, _ string) {
		at <- struct{}{}
		<-req.Context().Done()
		cancelled <- struct{}{}
	})
	d := r.engine(t, "d", func(w http.ResponseWriter, req *http.Request, _ string) {
		t.Error("the decode worker was called")
	})
	r.beatRole("p", "smol", router.RolePrefill, strings.TrimPrefix(p.URL, "http://"), "127.0.0.1:1", "127.0.0.1:1")
	r.beatRole("d", "smol", router.RoleDecode, strings.TrimPrefix(d.URL, "http://"), "127.0.0.1:1", "127.0.0.1:1")
	ans := r.postAsync(t, `{"model":"pd","prompt":"hi","stream":true}`)
	waitReached(t, at, "tokenize")
	clk.Advance(request.DefaultControlTimeout - time.Millisecond)
	select {
	case a := <-ans:
		t.Fatalf("answered before control_timeout: %v", a)
	case <-time.After(20 * time.Millisecond):
	}
	clk.Advance(time.Millisecond)
	waitReached(t, cancelled, "the tokenize call cancelled")
	code, body := waitAnswer(t, ans)
	if code != "503" || !strings.Contains(body, "no_capacity") {
		t.Fatalf("%s %s", code, body)
	}
	r.InFlight("p", 0)
	r.InFlight("d", 0)
}

// TestRetryBudget (R14.3): with a budget of 3 (max(3, 0% of in-flight)) and a burst of
// requests whose first attempt fails, at most 3 failovers run at once; the others are
// answered 503 no_capacity instead of retried.
func TestRetryBudget(t *testing.T) {
	budget := request.NewRetryBudget(0)
	clk := requestClock()
	r := newRig(t, rigOpt{deps: func(d *request.Deps, h *gwtest.Harness) { d.Clock, d.RetryBudget = clk, budget }})
	bad := r.engine(t, "a-bad", func(w http.ResponseWriter, _ *http.Request, _ string) {
		http.Error(w, "full", http.StatusServiceUnavailable)
	})
	release := make(chan struct{})
	var mu sync.Mutex
	running, most := 0, 0
	slow := r.engine(t, "b-slow", func(w http.ResponseWriter, _ *http.Request, _ string) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		<-release
		mu.Lock()
		running--
		mu.Unlock()
		completion(w, []string{"late"}, []float64{-1})
	})
	r.beat("a-bad", "smol", bad.URL, 0)
	r.beat("b-slow", "smol", slow.URL, 1000) // every first attempt goes to a-bad
	const n = 10
	all := make(chan [2]string, n)
	for range n {
		ans := r.postAsync(t, `{"model":"smol","prompt":"hi"}`)
		go func() { all <- <-ans }()
	}
	for range n - 3 {
		code, body := waitAnswer(t, all)
		if code != "503" || !strings.Contains(body, "no_capacity") {
			t.Fatalf("over the budget: %s %s", code, body)
		}
	}
	gwtest.Eventually(t, "3 failovers at b-slow", func() bool { mu.Lock(); defer mu.Unlock(); return running == 3 })
	if budget.Retries() != 3 {
		t.Fatalf("retries held %d, want 3", budget.Retries())
	}
	close(release)
	for range 3 {
		if code, body := waitAnswer(t, all); code != "200" {
			t.Fatalf("a failover within the budget: %s %s", code, body)
		}
	}
	if most != 3 {
		t.Fatalf("at most %d failovers ran at once, want 3", most)
	}
	gwtest.Eventually(t, "the budget empty", func() bool { return budget.Retries() == 0 && budget.InFlight() == 0 })
	r.InFlight("a-bad", 0)
	r.InFlight("b-slow", 0)
}

// stallPrefill is an Engines whose Prefill never answers until its context ends.
type stallPrefill struct{ at chan struct{} }

func (s stallPrefill) Prefill(ctx context.Context, _ request.Endpoint, _ request.PrefillCall) (request.PrefillResult, error) {
	s.at <- struct{}{}
	<-ctx.Done()
	return request.PrefillResult{}, context.Cause(ctx)
}
func (stallPrefill) Release(context.Context, request.Endpoint, string) error { return nil }

// TestControlTimeoutPrefill (R14.1): a Prefill that never answers is given up after
// control_timeout, like tokenize, and the request fails over.
func TestControlTimeoutPrefill(t *testing.T) {
	clk := requestClock()
	at := reached()
	r := newRig(t, rigOpt{deps: onClock(clk), engines: stallPrefill{at: at}, routes: []config.Route{
		{Model: "pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	}})
	p := r.engine(t, "p", func(w http.ResponseWriter, _ *http.Request, _ string) {
		fmt.Fprint(w, `{"tokens":[1,2,3]}`)
	})
	d := r.engine(t, "d", func(w http.ResponseWriter, _ *http.Request, _ string) {
		t.Error("the decode worker was called")
	})
	r.beatRole("p", "smol", router.RolePrefill, strings.TrimPrefix(p.URL, "http://"), "127.0.0.1:1", "127.0.0.1:1")
	r.beatRole("d", "smol", router.RoleDecode, strings.TrimPrefix(d.URL, "http://"), "127.0.0.1:1", "127.0.0.1:1")
	ans := r.postAsync(t, `{"model":"pd","prompt":"hi"}`)
	waitReached(t, at, "Prefill")
	clk.Advance(request.DefaultControlTimeout)
	code, body := waitAnswer(t, ans)
	if code != "503" || !strings.Contains(body, "no_capacity") {
		t.Fatalf("%s %s", code, body)
	}
	r.InFlight("p", 0)
	r.InFlight("d", 0)
}
