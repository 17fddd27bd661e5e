package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/otlptest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// pendingMetrics are series the dashboard and the rules use that other work is adding to the
// gateway (R17.3's stage histogram; routable workers per route). Until the gateway exports them
// the live test logs their absence instead of failing; once exported, they are checked like
// every other series.
var pendingMetrics = []string{"tlgw_stage_seconds", "tlgw_route_routable_workers"}

// pending reports whether name is (a series of) a pending metric.
func pending(name string) bool {
	for _, p := range pendingMetrics {
		if name == p || name == p+"_bucket" || name == p+"_sum" || name == p+"_count" {
			return true
		}
	}
	return false
}

// scrapeInterval is the test Prometheus's scrape and rule evaluation interval.
const scrapeInterval = 250 * time.Millisecond

// gatewayTOML turns on what the dashboard shows: routes with 503 engines (failover, ejection,
// retry budget), a stalling stream (interrupted, stream_idle timeout), a cascade, admission with
// a short-wait class (queued requests, queue_timeout), a route served only by a static worker
// whose scrapes fail (scrape errors, a route with no routable worker), [cluster] against
// etcd (config store up, replicas) and [tracing] to a loopback OTLP receiver (the trace span
// counters).
func gatewayTOML(etcd, ghost, otlp string) string {
	return fmt.Sprintf(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3
route_policy = "affinity"
shutdown_grace = "2s"
stream_idle_timeout = "300ms"
max_attempts = 3

[gateway.outlier]
consecutive_failures = 3
base_ejection = "30s"
max_ejection = "60s"
max_ejected_percent = 50

[[gateway.routes]]
model = "chat"
backends = [{ model = "smol", weight = 1 }]

[[gateway.routes]]
model = "slow"

[[gateway.routes]]
model = "stally"

[[gateway.routes]]
model = "flaky"

[[gateway.routes]]
model = "auto"
cascade = [{ model = "smol", accept_if = "mean_logprob > 100" }, { model = "slow" }]

[[gateway.routes]]
model = "ghost"

[[gateway.routes]]
model = "rolled"
rollout = { canary = "smol-next", baseline = "smol", step_interval = "1s", min_requests = 1 }

[[gateway.static_workers]]
id = "ghost-0"
model = "ghost"
http_address = %q
metrics = "tlengine"
scrape_interval = "200ms"

[admission]
busy_threshold = 4
default_class = "interactive"
classes = [
  { name = "interactive", quantum = 1, queue_limit = 100, max_wait = "30s", allow_header = true },
  { name = "brief", quantum = 1, queue_limit = 10, max_wait = "100ms" },
]

[cluster]
etcd_endpoints = [%q]
prefix = "/ops/"
replica_id = "gw-ops"
lease_ttl = "2s"

[tracing]
otlp_endpoint = %q
insecure = true
sample_ratio = 1
`, ghost, etcd, otlp)
}

// TestDashboardAndRulesOnALiveGateway runs a gateway (with tlengine workers and an embedded etcd)
// and a real Prometheus scraping it, drives traffic that produces every series the dashboard
// shows, and then checks through Prometheus's HTTP API that
//   - every PromQL expression of the dashboard parses and returns data,
//   - every series name and label the dashboard and the rules use is one the gateway exports,
//   - every rule of rules.yml evaluates without error on the live series.
func TestDashboardAndRulesOnALiveGateway(t *testing.T) {
	promBin := tool(t, "prometheus")
	d := loadDashboard(t)
	rulesFile, err := filepath.Abs(deployPath("prometheus", "rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	readDeploy(t, "prometheus", "rules.yml")

	binDir := t.TempDir()
	tlgwBin, err := proctest.Build(binDir, "github.com/tlgw/tlgw/cmd/tlgw")
	if err != nil {
		t.Fatal(err)
	}
	tlengineBin, err := proctest.Build(binDir, "github.com/tlgw/tlgw/cmd/tlengine")
	if err != nil {
		t.Fatal(err)
	}

	etcd := etcdtest.Start(t)
	otlp := otlptest.Start(t)
	gw := proctest.StartTLGW(t, tlgwBin, gatewayTOML(etcd.Endpoint(), closedAddr(t), otlp.Addr()))
	g := &gateway{base: "http://" + gw.HTTPAddr}
	prom := startPrometheus(t, promBin, gw.HTTPAddr, rulesFile)

	engines := [][]string{
		{"s-ok", "--model", "smol"},
		{"s-503", "--model", "smol", "--fault", "503"},
		{"slow-1", "--model", "slow", "--decode-per-token", "50ms"},
		{"stall-1", "--model", "stally", "--fault", "stall-after=2"},
		{"f-503a", "--model", "flaky", "--fault", "503"},
		{"f-503b", "--model", "flaky", "--fault", "503"},
		{"f-slow", "--model", "flaky", "--decode-per-token", "100ms"},
	}
	for _, e := range engines {
		proctest.StartEngine(t, tlengineBin, append([]string{"--id", e[0], "--gateway", gw.GRPCAddr}, e[1:]...)...)
	}
	// The static worker is never scraped successfully, so it is never listed.
	eventually(t, "the gateway lists every engine", 15*time.Second, func() bool {
		return g.workerCount(t) == len(engines)
	})

	g.drive(t)
	stopTrickle := g.trickle(t)
	t.Cleanup(stopTrickle)

	// Two scrapes that started after the traffic, so every series has two samples to rate.
	trafficDone := time.Now()
	last := prom.waitScrapeAfter(t, trafficDone)
	prom.waitScrapeAfter(t, last)

	names := prom.metricNames(t)
	t.Logf("the gateway exports %d series names", len(names))
	for _, p := range pendingMetrics {
		if slices.Contains(names, p) || slices.Contains(names, p+"_bucket") {
			t.Logf("pending metric %s: exported, checked like every other series", p)
		} else {
			t.Logf("pending metric %s: NOT exported yet by this gateway; its panels and rules are not checked for data", p)
		}
	}

	t.Run("every dashboard query returns data", func(t *testing.T) {
		qs := d.queries()
		if len(qs) == 0 {
			t.Fatal("the dashboard has no query")
		}
		for _, q := range qs {
			expr, err := expand(q.expr)
			if err != nil {
				t.Errorf("%s: %v", q.where, err)
				continue
			}
			n, err := prom.queryUntilData(t, expr, 5*time.Second)
			switch {
			case err != nil:
				t.Errorf("%s: %v\n  %s", q.where, err, expr)
			case n == 0 && readsPending(expr, names):
				t.Logf("%s: no data yet (reads a pending metric the gateway does not export): %s", q.where, expr)
			case n == 0:
				t.Errorf("%s: no data\n  %s", q.where, expr)
			}
		}
		t.Logf("%d dashboard queries run", len(qs))
	})

	t.Run("every series and label the dashboard and the rules use exists", func(t *testing.T) {
		type use struct{ where, expr string }
		var uses []use
		for _, q := range d.queries() {
			e, _ := expand(q.expr)
			uses = append(uses, use{q.where, e})
		}
		for _, v := range d.Templating.List {
			if v.Type == "query" {
				e, _ := expand(v.variableQuery())
				uses = append(uses, use{"variable " + v.Name, e})
			}
		}
		for _, r := range prom.rules(t) {
			uses = append(uses, use{"rule " + r.Name, r.Query})
		}
		checked := map[string]bool{}
		for _, u := range uses {
			for _, m := range metricNames(u.expr) {
				if !slices.Contains(names, m) && !pending(m) {
					t.Errorf("%s reads %s, which the gateway does not export", u.where, m)
				}
			}
			for _, l := range labelUses(u.expr) {
				var present []string
				for _, m := range l.metrics {
					if slices.Contains(names, m) {
						present = append(present, m)
					}
				}
				if len(present) == 0 {
					continue // a missing series is reported above
				}
				key := strings.Join(present, "|") + "/" + l.label
				if checked[key] {
					continue
				}
				checked[key] = true
				sel := fmt.Sprintf(`count({__name__=~%q,%s!=""})`, strings.Join(present, "|"), l.label)
				if n, err := prom.query(t, sel); err != nil || n == 0 {
					t.Errorf("%s uses label %s, which no series of %v has (%v)", u.where, l.label, present, err)
				}
			}
		}
		t.Logf("%d label uses checked", len(checked))
	})

	t.Run("every rule evaluates without error", func(t *testing.T) {
		rules := prom.rulesEvaluated(t, 10*time.Second)
		if len(rules) == 0 {
			t.Fatal("Prometheus loaded no rule from rules.yml")
		}
		var empty []string
		for _, r := range rules {
			if r.Health != "ok" {
				t.Errorf("rule %s: health %q: %s", r.Name, r.Health, r.LastError)
			}
			if r.Type == "recording" {
				if n, err := prom.query(t, r.Name); err == nil && n == 0 {
					empty = append(empty, r.Name)
				}
			}
		}
		t.Logf("%d rules evaluated; recording rules without data on this run: %v", len(rules), empty)
	})
}

// readsPending reports whether expr reads a pending metric that the gateway does not export.
func readsPending(expr string, names []string) bool {
	for _, m := range metricNames(expr) {
		if pending(m) && !slices.Contains(names, m) {
			return true
		}
	}
	return false
}

// closedAddr is a loopback address nothing listens on: the static worker's scrapes fail there.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// eventually polls cond every 20 ms until it holds, failing the test after within.
func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", within, what)
		}
		<-tick.C
	}
}

// gateway is the running tlgw and the traffic the test sends it.
type gateway struct {
	base string
}

var client = &http.Client{Timeout: 20 * time.Second}

func (g *gateway) workerCount(t *testing.T) int {
	t.Helper()
	resp, err := client.Get(g.base + "/admin/v1/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Workers []json.RawMessage `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("/admin/v1/workers: %v", err)
	}
	return len(out.Workers)
}

// failureLoad is worker id's failure load in /admin/v1/workers (R19; 0 when not listed).
func (g *gateway) failureLoad(t *testing.T, id string) int64 {
	t.Helper()
	resp, err := client.Get(g.base + "/admin/v1/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Workers []struct {
			ID          string `json:"id"`
			FailureLoad int64  `json:"failure_load"`
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("/admin/v1/workers: %v", err)
	}
	for _, w := range out.Workers {
		if w.ID == id {
			return w.FailureLoad
		}
	}
	return 0
}

// post sends one inference request and returns its status once the answer is read whole.
func (g *gateway) post(path, body string, header ...string) (int, string, error) {
	req, _ := http.NewRequest("POST", g.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func (g *gateway) complete(t *testing.T, model, prompt string, maxTokens int, header ...string) int {
	t.Helper()
	code, _, err := g.post("/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d}`, model, prompt, maxTokens), header...)
	if err != nil {
		t.Fatalf("%s %q: %v", model, prompt, err)
	}
	return code
}

// metric is the sum of the gateway's own series name whose lines contain every label given.
func (g *gateway) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	resp, err := client.Get(g.base + "/metrics")
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
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); ok && err == nil {
			sum += v
		}
	}
	return sum
}

// drive sends the traffic that makes the gateway export what the dashboard shows. Each step is
// bounded; a step that does not produce its series fails the test, naming it.
func (g *gateway) drive(t *testing.T) {
	t.Helper()
	// Completions and streams that succeed, on a route with a 503 engine: failovers, then the
	// 503 engine's ejection (5xx) after consecutive_failures.
	for i := 0; i < 60 && (g.metric(t, "tlgw_failovers_total") == 0 || g.metric(t, "tlgw_outlier_ejections_total") == 0); i++ {
		// R19: each failure counts as load on s-503 for a second, over the bounded-load cap of
		// an idle pool: wait for it to decay, so s-503 gets the requests it owns again.
		eventually(t, "s-503's failure load decayed", 5*time.Second, func() bool { return g.failureLoad(t, "s-503") == 0 })
		if code := g.complete(t, "chat", fmt.Sprintf("chat prompt %d", i), 4); code != 200 {
			t.Fatalf("chat %d: %d", i, code)
		}
	}
	if g.metric(t, "tlgw_failovers_total") == 0 || g.metric(t, "tlgw_outlier_ejections_total") == 0 {
		t.Fatal("60 chat requests made no failover or no ejection")
	}
	for i := range 3 {
		code, body, err := g.post("/v1/chat/completions", fmt.Sprintf(
			`{"model":"chat","stream":true,"messages":[{"role":"user","content":"stream %d"}],"max_tokens":4}`, i))
		if err != nil || code != 200 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("chat stream %d: %d %v %q", i, code, err, body)
		}
	}
	// A stream the engine stalls after two tokens: interrupted by stream_idle_timeout.
	code, body, err := g.post("/v1/completions", `{"model":"stally","prompt":"stall","max_tokens":16,"stream":true}`)
	if err != nil || code != 200 || !strings.Contains(body, "stream_interrupted") {
		t.Fatalf("stally stream: %d %v %q, want the stream_interrupted error event", code, err, body)
	}
	// A cascade: its first step (smol) is never accepted, so it escalates to slow.
	if code := g.complete(t, "auto", "cascade", 2); code != 200 {
		t.Fatalf("cascade: %d", code)
	}
	// Rejected before routing (400), and an unknown model (404).
	if code, _, _ := g.post("/v1/completions", `{"model":`); code != 400 {
		t.Fatalf("bad JSON: %d, want 400", code)
	}
	if code := g.complete(t, "no-such-model", "x", 1); code != 404 {
		t.Fatalf("unknown model: %d, want 404", code)
	}
	// A route whose only worker (a static one) is never scraped successfully: 503.
	if code := g.complete(t, "ghost", "x", 1); code != 503 {
		t.Fatalf("ghost route: %d, want 503", code)
	}

	var wg sync.WaitGroup
	codes := make(chan int, 64)
	send := func(model, prompt string, maxTokens int, header ...string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, err := g.post("/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d}`, model, prompt, maxTokens), header...)
			if err != nil {
				t.Errorf("%s %q: %v", model, prompt, err)
			}
			codes <- code
		}()
	}
	// The admission queue: six requests for one slow worker (busy at 4) queue two of them;
	// two requests of the brief class (max_wait 100ms) wait in the queue and time out (503).
	for i := range 6 {
		send("slow", fmt.Sprintf("queued %d", i), 8)
	}
	eventually(t, "a request waits in the admission queue", 10*time.Second, func() bool {
		return g.metric(t, "tlgw_queue_length") > 0
	})
	for i := range 2 {
		send("slow", fmt.Sprintf("brief %d", i), 8, "X-TL-Class", "brief")
	}
	wg.Wait()
	// The retry budget: bursts of 12 requests (a budget of max(3, 20% of 12) failovers at once) at
	// a model with two 503 workers and a slow one. Outlier detection may eject only one of the
	// 503 workers (max_ejected_percent), so each burst fails over more requests at once than
	// the budget, and the rest are answered 503.
	for burst := 0; burst < 3 && g.metric(t, "tlgw_retry_budget_exhausted_total") == 0; burst++ {
		for i := range 12 {
			send("flaky", fmt.Sprintf("burst %d.%d", burst, i), 8)
		}
		wg.Wait()
	}
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	t.Logf("queue and burst outcomes by status: %v", got)
	for _, s := range []struct {
		name   string
		labels []string
	}{
		{"tlgw_queue_wait_seconds_count", nil},
		{"tlgw_queue_rejections_total", []string{`reason="queue_timeout"`}},
		{"tlgw_streams_interrupted_total", nil},
		{"tlgw_upstream_timeouts_total", []string{`timeout="stream_idle"`}},
		{"tlgw_cascade_steps_total", nil},
		{"tlgw_requests_rejected_total", nil},
		{"tlgw_retry_budget_exhausted_total", nil},
	} {
		if g.metric(t, s.name, s.labels...) == 0 {
			t.Errorf("the traffic produced no %s%v", s.name, s.labels)
		}
	}
	eventually(t, "the static worker's scrapes fail", 5*time.Second, func() bool {
		return g.metric(t, "tlgw_scrape_errors_total", `worker="ghost-0"`) > 0
	})
	eventually(t, "the replica holds its lease in etcd", 5*time.Second, func() bool {
		return g.metric(t, "tlgw_config_store_up") == 1 && g.metric(t, "tlgw_cluster_replicas") == 1
	})
}

// trickle keeps a request or a stream going every 50 ms so that rates over the last minute are
// not zero while the queries run; the returned func stops it and waits.
func (g *gateway) trickle(t *testing.T) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			body := fmt.Sprintf(`{"model":"chat","prompt":"trickle %d","max_tokens":2,"stream":%t}`, i, i%2 == 0)
			req, _ := http.NewRequestWithContext(ctx, "POST", g.base+"/v1/completions", strings.NewReader(body))
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// prometheus is a Prometheus server run for one test.
type prometheus struct {
	api string // http://127.0.0.1:port
	cmd *exec.Cmd
}

// startPrometheus runs Prometheus with a temporary TSDB, scraping target every scrapeInterval
// and evaluating rulesFile, and waits until it is ready. It is stopped when the test ends.
func startPrometheus(t *testing.T, bin, target, rulesFile string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files:
  - %[2]q
scrape_configs:
  - job_name: tlgw
    static_configs:
      - targets: [%[3]q]
`, scrapeInterval, rulesFile, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := closedAddr(t)
	var logs strings.Builder
	var logMu sync.Mutex
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout = writerFunc(func(b []byte) { logMu.Lock(); logs.Write(b); logMu.Unlock() })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	p := &prometheus{api: "http://" + addr, cmd: cmd}
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			logMu.Lock()
			defer logMu.Unlock()
			t.Fatalf("prometheus exited before it was ready:\n%s", logs.String())
		case <-tick.C:
		}
		if resp, err := client.Get(p.api + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			logMu.Lock()
			defer logMu.Unlock()
			t.Fatalf("prometheus not ready after 20 s:\n%s", logs.String())
		}
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// get GETs an API path and decodes its data field into dst.
func (p *prometheus) get(t *testing.T, path string, params url.Values, dst any) error {
	t.Helper()
	u := p.api + path
	if params != nil {
		u += "?" + params.Encode()
	}
	resp, err := client.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("GET %s: %d: %v", path, resp.StatusCode, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", env.ErrorType, env.Error)
	}
	return json.Unmarshal(env.Data, dst)
}

// waitScrapeAfter waits (bounded) until the gateway's target has been scraped successfully by
// a scrape that started after since, and returns that scrape's start.
func (p *prometheus) waitScrapeAfter(t *testing.T, since time.Time) time.Time {
	t.Helper()
	var last time.Time
	eventually(t, "a scrape after "+since.Format(time.RFC3339Nano), 10*time.Second, func() bool {
		var data struct {
			ActiveTargets []struct {
				Health     string    `json:"health"`
				LastScrape time.Time `json:"lastScrape"`
				LastError  string    `json:"lastError"`
			} `json:"activeTargets"`
		}
		if err := p.get(t, "/api/v1/targets", url.Values{"state": {"active"}}, &data); err != nil || len(data.ActiveTargets) != 1 {
			return false
		}
		tg := data.ActiveTargets[0]
		last = tg.LastScrape
		return tg.Health == "up" && tg.LastScrape.After(since)
	})
	return last
}

// query runs an instant query and returns how many samples (or series) it answered.
func (p *prometheus) query(t *testing.T, expr string) (int, error) {
	t.Helper()
	var data struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	if err := p.get(t, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return 0, err
	}
	if data.ResultType == "scalar" {
		return 1, nil
	}
	return len(data.Result), nil
}

// queryUntilData runs expr until it answers data or within passes; an error (a parse error)
// ends it at once.
func (p *prometheus) queryUntilData(t *testing.T, expr string, within time.Duration) (int, error) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(scrapeInterval / 2)
	defer tick.Stop()
	for {
		n, err := p.query(t, expr)
		if err != nil || n > 0 || time.Now().After(deadline) {
			return n, err
		}
		<-tick.C
	}
}

// metricNames are every series name Prometheus holds.
func (p *prometheus) metricNames(t *testing.T) []string {
	t.Helper()
	var names []string
	if err := p.get(t, "/api/v1/label/__name__/values", nil, &names); err != nil {
		t.Fatalf("series names: %v", err)
	}
	return names
}

// rule is one rule as /api/v1/rules lists it.
type rule struct {
	Name           string    `json:"name"`
	Query          string    `json:"query"`
	Type           string    `json:"type"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

func (p *prometheus) rules(t *testing.T) []rule {
	t.Helper()
	var data struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(t, "/api/v1/rules", nil, &data); err != nil {
		t.Fatalf("rules: %v", err)
	}
	var out []rule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// rulesEvaluated waits (bounded) until every rule has been evaluated at least once after the
// traffic, and returns them.
func (p *prometheus) rulesEvaluated(t *testing.T, within time.Duration) []rule {
	t.Helper()
	since := time.Now()
	var rules []rule
	eventually(t, "every rule evaluated", within, func() bool {
		rules = p.rules(t)
		for _, r := range rules {
			if !r.LastEvaluation.After(since) {
				return false
			}
		}
		return len(rules) > 0
	})
	return rules
}
