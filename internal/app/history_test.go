package app_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/history"
)

// TestHistoryEndpoint (R24): every 5 s on the gateway's clock a sample; GET /admin/v1/history
// answers requests/s and errors/s per route from the requests served (here 4 answered 503: no
// worker serves the route's model), and the sampler stops with the gateway (goleak in TestMain).
func TestHistoryEndpoint(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.Routes = config.NormalizeRoutes([]config.Route{{Model: "chat", Backends: []config.Backend{{Model: "smol", Weight: 1}}}})
	a, err := app.Start(cfg, app.Options{Logger: quiet(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(t.Context())
	get := func() history.Snapshot {
		resp, err := http.Get("http://" + a.HTTPAddr + "/admin/v1/history")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s history.Snapshot
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&s) != nil {
			t.Fatalf("history: %d", resp.StatusCode)
		}
		return s
	}
	sample := func(n int) {
		clk.Advance(history.Resolution)
		gwtest.Eventually(t, "a sample", func() bool { return get().Points == n })
	}
	sample(1)
	for range 4 {
		resp, err := http.Post("http://"+a.HTTPAddr+"/v1/completions", "application/json", strings.NewReader(`{"model":"chat","prompt":"x","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	sample(2)
	s := get()
	want := map[history.Key]float64{
		{Metric: history.RequestsPerS, Route: "chat"}: 0.8, // 4 in 5 s
		{Metric: history.ErrorsPerS, Route: "chat"}:   0.8,
		{Metric: history.QueueDepth}:                  0,
	}
	for _, x := range s.Series {
		if w, ok := want[x.Key]; ok {
			if len(x.Values) != 2 || x.Values[1] == nil || *x.Values[1] != w {
				t.Fatalf("%+v: %v, want %v last", x.Key, x.Values, w)
			}
			delete(want, x.Key)
		}
	}
	if len(want) > 0 {
		t.Fatalf("missing series %v in %+v", want, s)
	}
	if s.ResolutionS != 5 || !s.End.Equal(clk.Now()) {
		t.Fatalf("header %+v", s)
	}
}
