package request_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// budgetRig is a rig whose request actors share a buffer budget of limit bytes.
func budgetRig(t *testing.T, limit int64, o rigOpt) (*rig, *request.BufferBudget) {
	t.Helper()
	b := request.NewBufferBudget(limit)
	o.deps = func(d *request.Deps, _ *gwtest.Harness) { d.BufferBudget = b }
	return newRig(t, o), b
}

// TestBufferBudgetRefusesAnAnswerWithNoRoom (R20 gateway.max_buffered_bytes): while one
// non-streamed answer holds the budget (its engine announced 64 KiB and sends slowly), another
// is answered 503 overloaded before the gateway reads its body; streams are not buffered and
// pass. When the first answer is written its bytes are given back, and the next answer fits.
func TestBufferBudgetRefusesAnAnswerWithNoRoom(t *testing.T) {
	r, budget := budgetRig(t, 64<<10+256, rigOpt{})
	arrived, release := make(chan struct{}), make(chan struct{})
	e := r.engine(t, "e", func(w http.ResponseWriter, _ *http.Request, body string) {
		switch {
		case strings.Contains(body, `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"s\"}]}\n\ndata: [DONE]\n\n")
		case strings.Contains(body, "slow"):
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(64<<10-1))
			payload := `{"choices":[{"text":"` + strings.Repeat("x", 64<<10-1-len(`{"choices":[{"text":""}]}`)) + `"}]}`
			fmt.Fprint(w, payload[:100])
			w.(http.Flusher).Flush()
			close(arrived)
			<-release
			fmt.Fprint(w, payload[100:])
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"text":"small"}]}`)
		}
	})
	r.beat("w1", "smol", e.URL, 0)
	slow := make(chan string)
	go func() {
		resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"slow"}`)
		slow <- fmt.Sprint(resp.StatusCode, " ", len(body))
	}()
	<-arrived
	gwtest.Eventually(t, "the slow answer holds its 64 KiB", func() bool { return budget.Used() == 64<<10 })
	resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"small"}`)
	if resp.StatusCode != 503 || !strings.Contains(body, `"code":"overloaded"`) {
		t.Fatalf("an answer with no room: %d %s", resp.StatusCode, body)
	}
	if budget.Used() != 64<<10 {
		t.Fatalf("the refused answer holds bytes: %d used", budget.Used())
	}
	resp, body = r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"s","stream":true}`)
	if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("a stream while the budget is full: %d %s", resp.StatusCode, body)
	}
	close(release)
	if got := <-slow; got != fmt.Sprint(200, " ", 64<<10-1) {
		t.Fatalf("the slow answer: %s", got)
	}
	gwtest.Eventually(t, "the budget is empty", func() bool { return budget.Used() == 0 })
	if resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"small"}`); resp.StatusCode != 200 {
		t.Fatalf("once the budget is free: %d %s", resp.StatusCode, body)
	}
	if budget.Used() != 0 {
		t.Fatalf("%d bytes held after every answer was written", budget.Used())
	}
	r.InFlight("w1", 0)
}

// TestBufferBudgetBoundsAGrowingAnswer: an answer with no Content-Length takes the budget as
// its buffer grows; one that grows past what is left is 503 overloaded (not a 502: the engine
// did nothing wrong), every time, and one that fits is answered whole.
func TestBufferBudgetBoundsAGrowingAnswer(t *testing.T) {
	r, budget := budgetRig(t, 8<<10, rigOpt{})
	e := r.engine(t, "e", func(w http.ResponseWriter, _ *http.Request, body string) {
		w.Header().Set("Content-Type", "application/json")
		n := 6 << 10 // 4 KiB, then 8 KiB: fits
		if strings.Contains(body, "big") {
			n = 20 << 10 // 16 KiB does not
		}
		w.(http.Flusher).Flush() // chunked: no length to size the buffer by
		fmt.Fprint(w, `{"choices":[{"text":"`+strings.Repeat("y", n)+`"}]}`)
	})
	r.beat("w1", "smol", e.URL, 0)
	for range 3 {
		resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"big"}`)
		if resp.StatusCode != 503 || !strings.Contains(body, `"code":"overloaded"`) {
			t.Fatalf("an answer outgrowing the budget: %d %.200s", resp.StatusCode, body)
		}
	}
	resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"fits"}`)
	if resp.StatusCode != 200 || len(body) < 6<<10 {
		t.Fatalf("an answer within the budget: %d, %d bytes", resp.StatusCode, len(body))
	}
	gwtest.Eventually(t, "the budget is empty", func() bool { return budget.Used() == 0 })
	r.InFlight("w1", 0)
}

// TestBufferBudgetHoldsACascadeStep: a cascade step's answer is buffered to be judged, so it
// takes the budget too; with no room it is 503 overloaded (not escalated to the next step),
// and the budget is empty once the request ended.
func TestBufferBudgetHoldsACascadeStep(t *testing.T) {
	calls := map[string]int{}
	var mu sync.Mutex
	r, budget := budgetRig(t, 256, rigOpt{routes: []config.Route{{Model: "auto", Cascade: []config.CascadeStep{
		{Model: "smol", AcceptIf: "mean_logprob > -1.0"}, {Model: "big"},
	}}}})
	eng := func(name string) func(w http.ResponseWriter, _ *http.Request, _ string) {
		return func(w http.ResponseWriter, _ *http.Request, _ string) {
			mu.Lock()
			calls[name]++
			mu.Unlock()
			completion(w, []string{"a"}, []float64{-0.1})
		}
	}
	se, be := r.engine(t, "smol", eng("smol")), r.engine(t, "big", eng("big"))
	r.beat("smol-1", "smol", se.URL, 0)
	r.beat("big-1", "big", be.URL, 0)
	resp, body := r.post(t, "/v1/completions", "", `{"model":"auto","prompt":"hi"}`)
	if resp.StatusCode != 503 || !strings.Contains(body, `"code":"overloaded"`) {
		t.Fatalf("a cascade step with no room: %d %s", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["smol"] != 1 || calls["big"] != 0 {
		t.Fatalf("engine calls %v: want the first step only", calls)
	}
	if budget.Used() != 0 {
		t.Fatalf("%d bytes held after the request ended", budget.Used())
	}
	r.InFlight("smol-1", 0)
}
