package app_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/rollout"
)

// modelEngine answers every attempt by the model its body names: 503 for the broken ones.
type modelEngine struct {
	broken string
	served [2]atomic.Int64 // healthy, broken
}

func (e *modelEngine) RoundTrip(r *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(r.Body)
	if bytes.Contains(b, []byte(`"model":"`+e.broken+`"`)) {
		e.served[1].Add(1)
		return &http.Response{StatusCode: 503, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"error":{"message":"down"}}`)), Request: r}, nil
	}
	e.served[0].Add(1)
	body := `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}]}`
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}

// TestRolloutOverTheApp (R25): a route's rollout whose canary answers 503 is rolled back at its
// window's end on the gateway's clock — every canary failure went on on the baseline, so no
// client saw one —; afterwards every request goes to the baseline; GET
// /admin/v1/rollouts shows the decision with its figures, and the actions answer as the state
// allows (an ended rollout refuses them, an unknown route is 404).
func TestRolloutOverTheApp(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.Routes = config.NormalizeRoutes([]config.Route{{Model: "smol", Rollout: &config.Rollout{
		Canary: "v4", Baseline: "v3", Steps: []float64{50, 100}, StepInterval: config.Duration(time.Minute), MinRequests: 10}}})
	eng := &modelEngine{broken: "v4"}
	a, err := app.Start(cfg, app.Options{Logger: quiet(), Clock: clk, Transport: eng})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(t.Context())
	base := "http://" + a.HTTPAddr
	beat := func() {
		for _, w := range [][2]string{{"w3", "v3"}, {"w4", "v4"}} {
			if _, err := a.Gateway.Heartbeat(gwtest.Worker(w[0], w[1], 0)); err != nil {
				t.Fatal(err)
			}
		}
		gwtest.Eventually(t, "both workers routable", func() bool { n, _ := a.Gateway.Routable(); return n == 2 })
	}
	beat()
	send := func(n int, tag string) (ok, failed int) {
		for i := range n {
			req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(`{"model":"smol","prompt":"x","max_tokens":1}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Request-ID", fmt.Sprintf("%s-%d", tag, i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok++
			} else {
				failed++
			}
		}
		return ok, failed
	}
	ok, failed := send(60, "before")
	broken, healthy := eng.served[1].Load(), eng.served[0].Load()
	if failed != 0 || ok != 60 || broken == 0 {
		// Each canary attempt that failed went on on the baseline (R25): no client saw it.
		t.Fatalf("at 50%%: %d ok, %d failed, %d canary attempts; want every request answered", ok, failed, broken)
	}
	get := func() router.RolloutsView {
		resp, err := http.Get(base + "/admin/v1/rollouts")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v router.RolloutsView
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&v) != nil || len(v.Rollouts) != 1 {
			t.Fatalf("rollouts: %d %+v", resp.StatusCode, v)
		}
		return v
	}
	if v := get().Rollouts[0]; v.Status != rollout.Running || v.Percent != 50 {
		t.Fatalf("before the window's end: %+v", v)
	}
	clk.Advance(time.Minute)
	gwtest.Eventually(t, "the rollback", func() bool { return get().Rollouts[0].Status == rollout.RolledBack })
	v := get().Rollouts[0]
	h := v.History
	if v.Percent != 0 || len(h) != 1 || h[0].Decision != rollout.Rollback || h[0].Canary == nil ||
		h[0].Canary.Errors != uint64(broken) || h[0].Canary.Requests != uint64(broken) || h[0].Baseline.Requests != uint64(healthy) ||
		!strings.HasPrefix(h[0].Reason, "error_rate") {
		t.Fatalf("after the window: %+v (%d canary attempts, %d baseline)", v, broken, healthy)
	}
	beat() // the minute passed the workers' heartbeat deadline on the same clock
	if ok, failed := send(40, "after"); failed != 0 || ok != 40 || eng.served[1].Load() != broken {
		t.Fatalf("after the rollback: %d ok, %d failed, %d canary attempts more", ok, failed, eng.served[1].Load()-broken)
	}
	post := func(path, ifMatch string) int {
		req, _ := http.NewRequest("POST", base+path, nil)
		if ifMatch != "" {
			req.Header.Set("If-Match", ifMatch)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	resp, err := http.Get(base + "/admin/v1/rollouts")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tag := resp.Header.Get("ETag")
	for _, c := range []struct {
		path, ifMatch string
		want          int
	}{
		{"/admin/v1/rollouts/smol:promote", "", 428}, // sends the canary traffic: If-Match needed
		{"/admin/v1/rollouts/smol:resume", `"999"`, 412},
		{"/admin/v1/rollouts/smol:abort", `"999"`, 412}, // one given must match
		{"/admin/v1/rollouts/smol:promote", tag, 400},   // ended
		{"/admin/v1/rollouts/smol:abort", "", 400},      // no If-Match needed; ended
		{"/admin/v1/rollouts/big:pause", "", 404},
		{"/admin/v1/rollouts/smol:faster", "", 404},
		{"/admin/v1/rollouts/smol", "", 404},
	} {
		if got := post(c.path, c.ifMatch); got != c.want {
			t.Errorf("POST %s (If-Match %q): %d, want %d", c.path, c.ifMatch, got, c.want)
		}
	}
}
