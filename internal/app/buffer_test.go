package app_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestMaxBufferedBytesReachesTheRequests (R20): gateway.max_buffered_bytes is the request
// actors' budget — with room for no answer, a non-streamed answer is 503 overloaded while a
// stream (never buffered) is served; with the default the same answer is served, and a
// configuration built in code that leaves it 0 has no bound rather than no room.
func TestMaxBufferedBytesReachesTheRequests(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"text\":\"s\"}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer engine.Close()
	for _, c := range []struct {
		budget     int64
		json, sse  int
		whatBudget string
	}{
		{100, 503, 200, "100 bytes, under the smallest buffer"},
		{config.DefaultMaxBufferedBytes, 200, 200, "the default"},
		{0, 200, 200, "0 (a configuration built in code without it: no bound)"},
	} {
		cfg := config.Default()
		cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Gateway.MaxBufferedBytes = c.budget
		a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		w := gwtest.Worker("w1", "smol", 0)
		w.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
		if _, err := a.Gateway.Heartbeat(w); err != nil {
			t.Fatal(err)
		}
		gwtest.Eventually(t, "w1 routable", func() bool { n, _ := a.Gateway.Routable(); return n == 1 })
		client := &http.Client{Transport: &http.Transport{}}
		for body, want := range map[string]int{
			`{"model":"smol","prompt":"x"}`:               c.json,
			`{"model":"smol","prompt":"x","stream":true}`: c.sse,
		} {
			resp, err := client.Post("http://"+a.HTTPAddr+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want || (want == 503 && !strings.Contains(string(b), "overloaded")) {
				t.Errorf("budget %s, %s: %d %s, want %d", c.whatBudget, body, resp.StatusCode, b, want)
			}
		}
		client.CloseIdleConnections()
		if err := a.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}
