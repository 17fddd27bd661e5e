package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestOneKeyCannotStarveAnother (R20, issue 35 item 6): one API key sends 1,000 slow requests
// at once (each holds an engine slot for seconds: a long prompt at 10 ms a token of prefill)
// to an engine that runs 16 at a time. Another key's short request is answered within a
// generous multiple of its usual latency, measured in the same test first. Without per-key
// isolation the flood holds every engine slot and queues ahead of the other key for minutes;
// with `max_in_flight = 8` on the flooding key it holds at most 8, and its other requests are
// 429 rate_limited at once.
func TestOneKeyCannotStarveAnother(t *testing.T) {
	const heavyLimit = 8
	f := startFleetWithKey(t, "sk-light", fastHeartbeats+fmt.Sprintf(`
[[auth.keys]]
key = "sk-light"
scopes = ["inference", "admin"]

[[auth.keys]]
key = "sk-heavy"
scopes = ["inference"]
max_in_flight = %d
`, heavyLimit),
		[]string{"e1", "--model", "smol", "--max-running", "16", "--prefill-per-token", "10ms"})

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	send := func(ctx context.Context, key, prompt string, maxTokens int) (int, string, error) {
		body := fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":%d}`, prompt, maxTokens)
		req, err := http.NewRequestWithContext(ctx, "POST", f.base+"/v1/completions", strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return resp.StatusCode, string(b), nil
	}
	light := func(i int, within time.Duration) time.Duration {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		start := time.Now()
		code, body, err := send(ctx, "sk-light", fmt.Sprintf("light %d says hello", i), 4)
		took := time.Since(start)
		if err != nil || code != 200 {
			t.Fatalf("the light key's request %d after %v: %d %s %v", i, took, code, body, err)
		}
		return took
	}

	// The light key's usual latency: the median of 5 on the idle fleet.
	var usual []time.Duration
	for i := range 5 {
		usual = append(usual, light(i, 10*time.Second))
	}
	slices.Sort(usual)
	typical := usual[len(usual)/2]

	// The flood: 1,000 requests of ~300 prompt tokens each (3 s of prefill), all at once.
	floodCtx, stopFlood := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stopFlood(); wg.Wait() }()
	var mu sync.Mutex
	codes := map[int]int{}
	limited := 0
	long := strings.Repeat(" lorem", 300)
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, err := send(floodCtx, "sk-heavy", fmt.Sprintf("heavy %d%s", i, long), 1)
			if err != nil {
				return // the test ended first
			}
			mu.Lock()
			defer mu.Unlock()
			codes[code]++
			if code == 429 && strings.Contains(body, "rate_limited") {
				limited++
			}
		}()
	}
	// The flood holds engine slots: at least the heavy key's limit of them.
	eventually(t, fmt.Sprintf("%d heavy requests in flight", heavyLimit), 20*time.Second, func() bool {
		return f.inFlight(t) >= heavyLimit
	})

	bound := max(5*typical, typical+time.Second)
	took := light(100, bound+10*time.Second)
	t.Logf("light key: usual %v (of %v), under the flood %v (bound %v)", typical, usual, took, bound)
	if took > bound {
		t.Fatalf("the light key waited %v under the other key's flood, over %v (its usual latency is %v)", took, bound, typical)
	}
	if n := f.inFlight(t); n > heavyLimit+1 {
		t.Fatalf("%d requests in flight on the engine: the heavy key holds more than its %d", n, heavyLimit)
	}
	wg.Wait()
	t.Logf("the heavy key's answers: %v", codes)
	if codes[200] < heavyLimit || limited == 0 || codes[200]+limited != 1000 {
		t.Fatalf("the heavy key's answers %v (%d rate_limited): want every one 200 or 429 rate_limited, at least %d served", codes, limited, heavyLimit)
	}
	eventually(t, "nothing in flight", 10*time.Second, func() bool { return f.inFlight(t) == 0 })
}

// inFlight is the gateway's count of requests in flight on every worker.
func (f *fleet) inFlight(t *testing.T) int {
	t.Helper()
	n := 0
	for _, w := range f.workers(t) {
		n += w.InFlight
	}
	return n
}
