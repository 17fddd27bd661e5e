package httpapi_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/config"
)

// fakeNow is a settable clock for the rate limits.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
}

// TestRateLimitRPM (R13.5): rpm = 3 → the 4th request within a minute is 429 rate_limited
// with Retry-After; every answer to the limited key carries OpenAI's rate-limit headers; an
// unlimited key is untouched; a minute later the key may send again.
func TestRateLimitRPM(t *testing.T) {
	clk := &fakeNow{t: time.Unix(2_000_000, 0)}
	s := newStack(t, stackOpt{now: clk.now, keys: []config.Key{
		{Key: "sk-limited", Scopes: []string{"inference"}, RPM: 3},
		{Key: "sk-free", Scopes: []string{"inference"}},
	}})
	s.beat("w1", "smol", jsonEngine(t, "w1"))
	body := `{"model":"smol","prompt":"hi"}`
	for i, remaining := range []string{"2", "1", "0"} {
		resp, b := s.do(t, "POST", "/v1/completions", "sk-limited", body)
		if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "3" ||
			resp.Header.Get("x-ratelimit-remaining-requests") != remaining {
			t.Fatalf("request %d: %d %s, headers %v", i, resp.StatusCode, b, resp.Header)
		}
		clk.advance(10 * time.Second)
	}
	resp, b := s.do(t, "POST", "/v1/completions", "sk-limited", body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" || !strings.Contains(string(b), "rate_limited") ||
		resp.Header.Get("x-ratelimit-remaining-requests") != "0" {
		t.Fatalf("4th: %d %s, Retry-After %q", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	if resp, _ := s.do(t, "POST", "/v1/completions", "sk-free", body); resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("unlimited key: %d %v", resp.StatusCode, resp.Header)
	}
	clk.advance(30 * time.Second)
	if resp, b := s.do(t, "POST", "/v1/completions", "sk-limited", body); resp.StatusCode != 200 {
		t.Fatalf("after the first left the window: %d %s", resp.StatusCode, b)
	}
}

// TestRateLimitTPM (R13.5, R20): tokens are the answer's usage.total_tokens; once the window
// holds tpm of them the key is refused until they leave it. While a request is served it holds
// its most tokens (here the prompt's 1 and the completions default of 16), which the remaining
// count shows.
func TestRateLimitTPM(t *testing.T) {
	clk := &fakeNow{t: time.Unix(2_000_000, 0)}
	s := newStack(t, stackOpt{now: clk.now, keys: []config.Key{{Key: "sk-t", Scopes: []string{"inference"}, TPM: 100}}})
	e := newEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"index":0,"text":"x","finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`)
	})
	s.beat("w1", "smol", e)
	body := `{"model":"smol","prompt":"hi"}`
	resp, _ := s.do(t, "POST", "/v1/completions", "sk-t", body)
	if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-remaining-tokens") != "83" {
		t.Fatalf("first: %d %v", resp.StatusCode, resp.Header)
	}
	clk.advance(time.Second)
	resp, _ = s.do(t, "POST", "/v1/completions", "sk-t", body) // 60 used: allowed
	if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-remaining-tokens") != "23" {
		t.Fatalf("second: %d remaining %q", resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-tokens"))
	}
	clk.advance(time.Second)
	resp, b := s.do(t, "POST", "/v1/completions", "sk-t", body) // 120 used: refused
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "58" {
		t.Fatalf("third: %d %s Retry-After %q", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
}

// TestRateLimitPerReplica (R16): with 3 live replicas each enforces ⌈rpm / 3⌉, and the
// headers say the share; back to one replica, the whole limit.
func TestRateLimitPerReplica(t *testing.T) {
	clk := &fakeNow{t: time.Unix(2_000_000, 0)}
	s := newStack(t, stackOpt{now: clk.now, keys: []config.Key{{Key: "sk-limited", Scopes: []string{"inference"}, RPM: 7}}})
	s.beat("w1", "smol", jsonEngine(t, "w1"))
	s.api.SetReplicas(3)
	body := `{"model":"smol","prompt":"hi"}`
	for i := range 3 {
		resp, b := s.do(t, "POST", "/v1/completions", "sk-limited", body)
		if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "3" {
			t.Fatalf("request %d: %d %s, limit header %q", i, resp.StatusCode, b, resp.Header.Get("x-ratelimit-limit-requests"))
		}
	}
	if resp, _ := s.do(t, "POST", "/v1/completions", "sk-limited", body); resp.StatusCode != 429 {
		t.Fatalf("4th of ⌈7/3⌉ = 3: %d", resp.StatusCode)
	}
	s.api.SetReplicas(0) // counts as one
	for i := range 4 {
		if resp, b := s.do(t, "POST", "/v1/completions", "sk-limited", body); resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "7" {
			t.Fatalf("one replica, request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if resp, _ := s.do(t, "POST", "/v1/completions", "sk-limited", body); resp.StatusCode != 429 {
		t.Fatalf("8th of 7: %d", resp.StatusCode)
	}
}
