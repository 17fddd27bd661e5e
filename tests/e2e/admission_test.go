package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdmissionBurst: two tlengine workers with a decode cost, a burst larger than their
// capacity from two classes. No request is lost; only the class with a small queue limit gets
// 429; the queue drains to 0 and every in-flight count returns to 0.
func TestAdmissionBurst(t *testing.T) {
	f := startFleetWithKey(t, "sk-interactive", fastHeartbeats+`
[admission]
busy_threshold = 2
default_class = "interactive"
classes = [
  { name = "interactive", quantum = 3, queue_limit = 200, max_wait = "30s" },
  { name = "batch", quantum = 1, queue_limit = 4, max_wait = "30s" },
]

[[auth.keys]]
key = "sk-interactive"
scopes = ["inference", "admin"]

[[auth.keys]]
key = "sk-batch"
scopes = ["inference"]
class = "batch"
`,
		[]string{"q1", "--model", "smol", "--decode-per-token", "5ms"},
		[]string{"q2", "--model", "smol", "--decode-per-token", "5ms"})
	const interactive, batch = 40, 24
	type result struct {
		class string
		code  int
	}
	results := make(chan result, interactive+batch)
	hc := &http.Client{Timeout: 60 * time.Second}
	var wg sync.WaitGroup
	send := func(key, class string, i int) {
		defer wg.Done()
		req, _ := http.NewRequest("POST", f.base+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"smol","prompt":"burst %s %d","max_tokens":8}`, class, i)))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			t.Errorf("%s %d: %v", class, i, err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 && resp.StatusCode != 429 {
			t.Errorf("%s %d: %d %s", class, i, resp.StatusCode, b)
		}
		if resp.StatusCode == 429 && !strings.Contains(string(b), "queue_full") {
			t.Errorf("429 without queue_full: %s", b)
		}
		results <- result{class, resp.StatusCode}
	}
	for i := 0; i < interactive; i++ {
		wg.Add(1)
		go send("sk-interactive", "interactive", i)
	}
	for i := 0; i < batch; i++ {
		wg.Add(1)
		go send("sk-batch", "batch", i)
	}
	wg.Wait()
	close(results)
	counts := map[string]int{}
	for r := range results {
		counts[fmt.Sprint(r.class, " ", r.code)]++
	}
	t.Logf("outcomes %v", counts)
	if counts["interactive 200"] != interactive {
		t.Fatalf("interactive requests lost or rejected: %v", counts)
	}
	if counts["batch 200"]+counts["batch 429"] != batch || counts["batch 429"] == 0 {
		t.Fatalf("batch outcomes %v: want every request answered and some 429 (queue_limit 4)", counts)
	}
	// R17.3: the burst's queued picks were timed as the queue stage, every answered request
	// through the other stages.
	answered := float64(counts["interactive 200"] + counts["batch 200"])
	for _, st := range []string{"queue", "parse", "pick", "upstream_first_byte", "relay"} {
		n := metricSum(t, f.base, "tlgw_stage_seconds_count", `stage="`+st+`"`)
		if n <= 0 || (st != "queue" && st != "pick" && n < answered) {
			t.Errorf("tlgw_stage_seconds{stage=%q}: %v observations for %v answered requests", st, n, answered)
		}
	}
	if q, p := metricSum(t, f.base, "tlgw_stage_seconds_count", `stage="queue"`), metricSum(t, f.base, "tlgw_stage_seconds_count", `stage="pick"`); q+p < answered {
		t.Errorf("queue %v + pick %v observations < %v answered requests", q, p, answered)
	}
	mresp, err := http.Get(f.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf(`tlgw_queue_rejections_total{class="batch",reason="queue_full"} %d`, counts["batch 429"]),
		`tlgw_queue_length{class="interactive",lane_kind="shared"}`,
		`tlgw_queue_wait_seconds_count{class="interactive"}`,
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The queue drains to 0, in-flight counts to 0.
	eventually(t, "queue empty and nothing in flight", 10*time.Second, func() bool {
		req, _ := http.NewRequest("GET", f.base+"/admin/v1/queue", nil)
		req.Header.Set("Authorization", "Bearer sk-interactive")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var q struct {
			Enabled bool `json:"enabled"`
			Classes []struct {
				Queued int `json:"queued"`
			} `json:"classes"`
		}
		if json.NewDecoder(resp.Body).Decode(&q) != nil || !q.Enabled {
			return false
		}
		for _, c := range q.Classes {
			if c.Queued != 0 {
				return false
			}
		}
		req, _ = http.NewRequest("GET", f.base+"/admin/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer sk-interactive")
		wr, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer wr.Body.Close()
		var ws struct {
			Workers []struct {
				InFlight int `json:"in_flight"`
			} `json:"workers"`
		}
		if json.NewDecoder(wr.Body).Decode(&ws) != nil {
			return false
		}
		for _, w := range ws.Workers {
			if w.InFlight != 0 {
				return false
			}
		}
		return true
	})
}

// TestNoWorkerAnswersAtOnceUnderSessionSerial (issue 9's reproduction): session_serial with no
// busy threshold and a route whose backend has no worker yet. The request is answered 503
// no_capacity within a second and the admin API keeps answering (the router used to loop).
func TestNoWorkerAnswersAtOnceUnderSessionSerial(t *testing.T) {
	f := startFleet(t, fastHeartbeats+`
[[gateway.routes]]
model = "ghost"
backends = [{ model = "nobody-serves-this", weight = 1 }]
targets = ["unified"]

[admission]
classifier = { type = "session_serial" }
`)
	hc := &http.Client{Timeout: 5 * time.Second}
	for i := 0; i < 3; i++ {
		start := time.Now()
		req, _ := http.NewRequest("POST", f.base+"/v1/completions", strings.NewReader(`{"model":"ghost","prompt":"hi"}`))
		req.Header.Set("X-Session-ID", "alice")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if took := time.Since(start); resp.StatusCode != 503 || !strings.Contains(string(b), "no_capacity") || took > time.Second {
			t.Fatalf("request %d: %d %s after %v, want 503 no_capacity within a second", i, resp.StatusCode, b, took)
		}
		if rows := f.workers(t); len(rows) != 0 {
			t.Fatalf("workers %v", rows)
		}
		resp, err = hc.Get(f.base + "/admin/v1/queue")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("admin queue: %v %v", resp, err)
		}
		var q struct {
			Classes []struct {
				Queued int `json:"queued"`
			} `json:"classes"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&q); err != nil || len(q.Classes) == 0 || q.Classes[0].Queued != 0 {
			t.Fatalf("queue view %+v %v", q, err)
		}
		resp.Body.Close()
	}
}
