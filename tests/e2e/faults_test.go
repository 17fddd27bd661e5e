package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricSum adds up the samples of the Prometheus series name whose labels contain every
// one of labels, read from base's /metrics.
func metricSum(t *testing.T, base, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// sseEvent is one event of a streamed answer and when its blank line arrived.
type sseEvent struct {
	name, data string
	at         time.Time
}

// readSSE reads a streamed answer event by event until it ends (or hc's timeout cuts it).
func readSSE(body io.Reader) ([]sseEvent, error) {
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" || cur.name != "" {
				cur.at = time.Now()
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		}
	}
	return out, sc.Err()
}

// TestFaultStalledEnginesFailOver (R14.1): a `stall` engine and a `slow-headers=5s` engine next
// to a healthy one, stream_first_byte_timeout = 1s. Every streamed request gets 200 and a
// complete stream from the healthy worker, each failover costing about the timeout. Under
// affinity, prompts that differ hash to different owners, so requests go on (bounded) until
// both faulty engines have been tried.
func TestFaultStalledEnginesFailOver(t *testing.T) {
	f := startFleetWithKey(t, "sk-ops", fastHeartbeats+`
stream_first_byte_timeout = "1s"
route_policy = "affinity"

[[auth.keys]]
key = "sk-ops"
scopes = ["inference", "admin", "debug"]
`,
		[]string{"f-stall", "--model", "smol", "--fault", "stall"},
		[]string{"f-slow", "--model", "smol", "--fault", "slow-headers=5s"},
		[]string{"f-ok", "--model", "smol"})
	hc := &http.Client{Timeout: 15 * time.Second}
	tried := func(id string) bool {
		return metricSum(t, "http://"+f.engines[id].HTTPAddr, "tlengine_requests_total", `code="499"`) > 0
	}
	const maxRequests = 30
	failedOver := 0
	for i := 0; i < maxRequests && !(tried("f-stall") && tried("f-slow")); i++ {
		before := metricSum(t, f.base, "tlgw_failovers_total")
		start := time.Now()
		req, _ := http.NewRequest("POST", f.base+"/v1/completions", strings.NewReader(
			fmt.Sprintf(`{"model":"smol","prompt":"failover %d","max_tokens":8,"stream":true}`, i)))
		req.Header.Set("Authorization", "Bearer sk-ops")
		req.Header.Set("X-Request-ID", fmt.Sprintf("fault-failover-%d", i))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if err != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("request %d: %d %v %q", i, resp.StatusCode, err, b)
		}
		if w := resp.Header.Get("X-TL-Route"); w != "f-ok" {
			t.Fatalf("request %d served by %q, want f-ok", i, w)
		}
		failovers := int(metricSum(t, f.base, "tlgw_failovers_total") - before)
		if failovers > 0 {
			failedOver++
		}
		limit := time.Duration(failovers)*time.Second + 1500*time.Millisecond
		t.Logf("request %d: %d failover(s), %v", i, failovers, took.Round(time.Millisecond))
		if took > limit {
			t.Fatalf("request %d took %v after %d failover(s), want ≤ %v", i, took, failovers, limit)
		}
		if failovers > 0 && took < time.Duration(failovers)*time.Second {
			t.Fatalf("request %d took %v after %d failover(s): each waits stream_first_byte_timeout (1s)", i, took, failovers)
		}
	}
	eventually(t, "both faulty engines tried and left by the gateway", 5*time.Second, func() bool {
		return tried("f-stall") && tried("f-slow")
	})
	if failedOver == 0 {
		t.Fatal("no request failed over")
	}
	if n := metricSum(t, f.base, "tlgw_upstream_timeouts_total", `timeout="stream_first_byte"`); n < 2 {
		t.Fatalf("tlgw_upstream_timeouts_total{timeout=\"stream_first_byte\"} = %v, want ≥ 2", n)
	}
}

// TestStallAfterEndsInErrorEvent (R14.1): a `stall-after=3` engine alone, stream_idle_timeout =
// 1s: the client gets 3 token events, then the error event (stream_interrupted) about a second
// after the last one, and no [DONE].
func TestStallAfterEndsInErrorEvent(t *testing.T) {
	f := startFleet(t, fastHeartbeats+`
stream_idle_timeout = "1s"
`, []string{"s1", "--model", "smol", "--fault", "stall-after=3"})
	hc := &http.Client{Timeout: 10 * time.Second}
	for i := 0; i < 3; i++ {
		resp, err := hc.Post(f.base+"/v1/completions", "application/json", strings.NewReader(
			fmt.Sprintf(`{"model":"smol","prompt":"stall %d","max_tokens":64,"seed":%d,"stream":true}`, i, 11+i)))
		if err != nil {
			t.Fatal(err)
		}
		events, err := readSSE(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d %v", i, resp.StatusCode, err)
		}
		if len(events) != 4 {
			t.Fatalf("stream %d: %d events %+v, want 3 tokens and the error event", i, len(events), events)
		}
		for _, ev := range events[:3] {
			if ev.name != "" || !strings.HasPrefix(ev.data, `{`) || !strings.Contains(ev.data, `"text"`) {
				t.Fatalf("stream %d: token event %+v", i, ev)
			}
		}
		last := events[3]
		if last.name != "error" || !strings.Contains(last.data, `"code":"stream_interrupted"`) {
			t.Fatalf("stream %d: last event %+v, want event: error with stream_interrupted", i, last)
		}
		gap := last.at.Sub(events[2].at)
		t.Logf("stream %d: error event %v after the third token", i, gap.Round(time.Millisecond))
		if gap < 900*time.Millisecond || gap > 2500*time.Millisecond {
			t.Fatalf("stream %d: error event %v after the last token, want about stream_idle_timeout (1s)", i, gap)
		}
	}
	if n := metricSum(t, f.base, "tlgw_upstream_timeouts_total", `timeout="stream_idle"`); n != 3 {
		t.Fatalf("tlgw_upstream_timeouts_total{timeout=\"stream_idle\"} = %v, want 3", n)
	}
}

// vmRSS reads a process's resident set size from /proc/<pid>/status (Linux).
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// TestEndlessEventBoundedMemory (R14.4): an `endless-event` engine alone. 100 streamed requests
// (a few at a time) each end in the error event, and the gateway's RSS grows by less than 50 MiB.
func TestEndlessEventBoundedMemory(t *testing.T) {
	f := startFleet(t, fastHeartbeats, []string{"e1", "--model", "smol", "--fault", "endless-event", "--max-running", "64"})
	hc := &http.Client{Timeout: 20 * time.Second}
	stream := func(i int) error {
		resp, err := hc.Post(f.base+"/v1/chat/completions", "application/json", strings.NewReader(fmt.Sprintf(
			`{"model":"smol","messages":[{"role":"user","content":"endless %d"}],"stream":true}`, i)))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		events, err := readSSE(resp.Body)
		if err != nil || resp.StatusCode != 200 || len(events) == 0 {
			return fmt.Errorf("%d %v %d events", resp.StatusCode, err, len(events))
		}
		last := events[len(events)-1]
		if last.name != "error" || !strings.Contains(last.data, `"code":"stream_interrupted"`) {
			return fmt.Errorf("last event %+v, want event: error with stream_interrupted", last)
		}
		for _, ev := range events {
			if ev.data == "[DONE]" {
				return fmt.Errorf("[DONE] in an interrupted stream")
			}
		}
		return nil
	}
	pid := f.gw.Cmd.Process.Pid
	if err := stream(-1); err != nil { // warm up: connections, buffers, code paths
		t.Fatal(err)
	}
	before := vmRSS(t, pid)
	const total, parallel = 100, 4
	start := time.Now()
	errc := make(chan error, total)
	sem := make(chan struct{}, parallel)
	for i := 0; i < total; i++ {
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem }()
			if err := stream(i); err != nil {
				errc <- fmt.Errorf("stream %d: %w", i, err)
				return
			}
			errc <- nil
		}(i)
	}
	for i := 0; i < total; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	after := vmRSS(t, pid)
	t.Logf("%d endless streams in %v; gateway VmRSS %d MiB → %d MiB", total, time.Since(start).Round(time.Millisecond), before>>20, after>>20)
	if growth := after - before; growth >= 50<<20 {
		t.Fatalf("gateway RSS grew by %d MiB over %d endless streams, want < 50 MiB", growth>>20, total)
	}
	// Each ended on the 1 MiB event bound (R14.4), not on a timeout.
	if n := metricSum(t, f.base, "tlgw_streams_interrupted_total"); n != total+1 {
		t.Fatalf("tlgw_streams_interrupted_total = %v, want %d", n, total+1)
	}
	if n := metricSum(t, f.base, "tlgw_upstream_timeouts_total"); n != 0 {
		t.Fatalf("tlgw_upstream_timeouts_total = %v, want 0", n)
	}
}
