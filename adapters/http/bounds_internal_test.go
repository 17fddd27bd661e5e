package httpapi

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestPerKeyTablesBoundedByConfiguredKeys (R19): the HTTP surface keeps state per API key only
// for the configured keys: after n requests with limited, unlimited, unknown and missing keys,
// and with client-chosen session ids, the rate limiter holds a window for each limited key
// that was used and nothing else, the keyring is the configuration's and nothing is in flight.
func TestPerKeyTablesBoundedByConfiguredKeys(t *testing.T) {
	h := gwtest.New(t)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"total_tokens":3}}`)
	}))
	defer engine.Close()
	wk := gwtest.Worker("w1", "smol", 0)
	wk.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
	h.Beat(wk)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	deps := &request.Deps{Router: h.GW.Router, Transport: NewTransport(), MaxAttempts: 2,
		Metrics: request.NewMetrics(nil), Logger: log, Errors: ErrorWriter{}}
	keys := []config.Key{
		{Key: "sk-a", Scopes: []string{"inference"}, RPM: 100000},
		{Key: "sk-b", Scopes: []string{"inference"}, TPM: 1000000},
		{Key: "sk-free", Scopes: []string{"inference"}},
		{Key: "sk-unused", Scopes: []string{"inference"}, RPM: 5},
	}
	start := time.Unix(3_000_000, 0)
	api := New(Options{Core: h.GW, Keys: keys, Logger: log, Now: func() time.Time { return start }, MaxInFlight: 64,
		Serve: func(x *request.Exchange) { request.Spawn(h.GW.System, deps, x) }})
	srv := httptest.NewServer(api)
	defer srv.Close()
	const n = 200
	for i := range n {
		key := []string{"sk-a", "sk-b", "sk-free", fmt.Sprint("sk-nobody-", i), ""}[i%5]
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"smol","prompt":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-ID", fmt.Sprint("session-", i))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if want := map[bool]int{true: 200, false: 401}[i%5 < 3]; resp.StatusCode != want {
			t.Fatalf("request %d with key %q: %d, want %d", i, key, resp.StatusCode, want)
		}
	}
	if got := api.limiter.Len(); got != 2 {
		t.Fatalf("after %d requests the rate limiter holds %d windows, want 2 (the limited keys used)", n, got)
	}
	if len(api.keys.keys) != len(keys) || api.inFlight.Load() != 0 {
		t.Fatalf("keyring %d keys (configured %d), %d in flight", len(api.keys.keys), len(keys), api.inFlight.Load())
	}
}
