package bench

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// The proxy benchmark measures what a deployment feels: the gateway (or the baseline), and the
// two engines behind it, run as separate processes pinned to one core (serverCore), and the load
// generator, wrk, runs pinned to the other (loadCore), so every microsecond of CPU the gateway
// spends is a microsecond the engines do not get. The baseline is tests/bench/bareproxy: the
// standard library's httputil.ReverseProxy buffering the request body, over the same engines.
const (
	serverCore = "1"
	loadCore   = "0"
	benchConns = 64
)

// benchGatewayTOML turns every feature of the request path on: API keys with per-key rate
// limits, registry tokens, a route with a model rewrite, the prefix_aware policy with its
// prefix index, the admission queue with a class, outlier ejection, the R14 timeouts and retry
// budget (defaults), request ids and the metrics.
const benchGatewayTOML = `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
route_policy = "prefix_aware"

[[gateway.routes]]
model = "bench"
backends = [{ model = "smol", weight = 1 }]

[[auth.keys]]
key = "sk-bench"
scopes = ["inference", "debug"]
rpm = 1000000000
tpm = 1000000000000

[registry]
tokens = [{ token = "engine-secret" }]

[admission]
busy_threshold = 100000
default_class = "interactive"

[[admission.classes]]
name = "interactive"
queue_limit = 100000
`

// wrkScript is the load generator's Lua: a POST of body, and for streams a check of every
// answer (events counted; a stream whose body lacks "data: [DONE]" is truncated). done prints one
// line the benchmark parses.
func wrkScript(body, key string, stream bool) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = %q\n", body)
	if key != "" {
		fmt.Fprintf(&sb, "wrk.headers[\"Authorization\"] = \"Bearer %s\"\n", key)
	}
	sb.WriteString(`
local threads = {}
function setup(t) table.insert(threads, t) end
function init(args) events = 0; streams = 0; truncated = 0 end
`)
	if stream {
		sb.WriteString(`
function response(status, headers, body)
  if status ~= 200 then return end
  streams = streams + 1
  local n = 0
  for _ in string.gmatch(body, "data: ") do n = n + 1 end
  if string.find(body, "data: [DONE]", 1, true) then n = n - 1 else truncated = truncated + 1 end
  events = events + n
end
`)
	}
	sb.WriteString(`
function done(summary, latency, requests)
  local ev, st, tr = 0, 0, 0
  for _, t in ipairs(threads) do
    ev = ev + t:get("events"); st = st + t:get("streams"); tr = tr + t:get("truncated")
  end
  local e = summary.errors
  io.write(string.format("WRK requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d events=%d streams=%d truncated=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout, ev, st, tr))
end
`)
	return sb.String()
}

// phase is what one wrk run measured, with the CPU the server under test used meanwhile.
type phase struct {
	requests, errors, events, streams, truncated int
	seconds                                      float64
	p50, p99                                     time.Duration
	cpu                                          time.Duration // the proxy process (gateway or baseline)
	enginesCPU                                   time.Duration
	mallocs                                      uint64 // the proxy process's heap allocations
}

func (p phase) perSecond(n int) float64 { return float64(n) / p.seconds }

// cpuPer is the proxy process's CPU per unit in µs.
func (p phase) cpuPer(n int) float64 { return float64(p.cpu.Nanoseconds()) / 1000 / float64(n) }

func (p phase) add(o phase) phase {
	return phase{requests: p.requests + o.requests, errors: p.errors + o.errors, events: p.events + o.events,
		streams: p.streams + o.streams, truncated: p.truncated + o.truncated, seconds: p.seconds + o.seconds,
		p50: max(p.p50, o.p50), p99: max(p.p99, o.p99), cpu: p.cpu + o.cpu, enginesCPU: p.enginesCPU + o.enginesCPU,
		mallocs: p.mallocs + o.mallocs}
}

// target is one proxy under test: its address, its process and how to read its allocations.
type target struct {
	name, base, key, model string
	proc                   *proctest.Proc
	mallocs                func() (uint64, error)
}

type rig struct {
	b       *testing.B
	dir     string
	engines []*proctest.Proc
}

func cpuOf(b *testing.B, procs ...*proctest.Proc) time.Duration {
	var sum time.Duration
	for _, p := range procs {
		c, err := p.CPUTime()
		if err != nil {
			b.Fatal(err)
		}
		sum += c
	}
	return sum
}

// run drives t with wrk for d at conns connections and returns what it measured.
func (g *rig) run(t target, body string, stream bool, conns int, d time.Duration) phase {
	b := g.b
	script := filepath.Join(g.dir, fmt.Sprintf("%s-%v.lua", t.name, stream))
	if err := os.WriteFile(script, []byte(wrkScript(fmt.Sprintf(body, t.model), t.key, stream)), 0o600); err != nil {
		b.Fatal(err)
	}
	return g.runScript(t, script, "/v1/completions", conns, d)
}

// runScript drives t's path with wrk and the Lua script at script (which prints the WRK line
// of wrkScript's done) for d at conns connections.
func (g *rig) runScript(t target, script, path string, conns int, d time.Duration) phase {
	b := g.b
	threads := min(2, conns)
	m0, err := t.mallocs()
	if err != nil {
		b.Fatal(err)
	}
	c0, e0 := cpuOf(b, t.proc), cpuOf(b, g.engines...)
	out, err := exec.Command("taskset", "-c", loadCore, "wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", fmt.Sprintf("%ds", max(1, int(d.Seconds()))), "--timeout", "10s", "-s", script, t.base+path).CombinedOutput()
	if err != nil {
		b.Fatalf("wrk: %v\n%s", err, out)
	}
	c1, e1 := cpuOf(b, t.proc), cpuOf(b, g.engines...)
	m1, err := t.mallocs()
	if err != nil {
		b.Fatal(err)
	}
	var p phase
	var durUS, p50, p99 int64
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "WRK ") {
			continue
		}
		if _, err := fmt.Sscanf(line, "WRK requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d events=%d streams=%d truncated=%d",
			&p.requests, &durUS, &p50, &p99, &p.errors, &p.events, &p.streams, &p.truncated); err != nil {
			b.Fatalf("parsing %q: %v", line, err)
		}
	}
	if durUS == 0 || p.requests == 0 {
		b.Fatalf("wrk measured nothing against %s:\n%s", t.name, out)
	}
	p.seconds = float64(durUS) / 1e6
	p.p50, p.p99 = time.Duration(p50)*time.Microsecond, time.Duration(p99)*time.Microsecond
	p.cpu, p.enginesCPU, p.mallocs = c1-c0, e1-e0, m1-m0
	return p
}

// scrapeCounter reads one un-labelled counter from a Prometheus text exposition.
func scrapeCounter(url, name string) (uint64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return uint64(f), err
		}
	}
	return 0, fmt.Errorf("%s has no %s", url, name)
}

// plainNumber reads a body that is one decimal number (bareproxy's /__mallocs).
func plainNumber(url string) (uint64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var n uint64
	_, err = fmt.Fscan(resp.Body, &n)
	return n, err
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		return d
	}
	return def
}

func needTools(b *testing.B) {
	for _, tool := range []string{"wrk", "taskset"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Fatalf("the proxy benchmark needs %s (Debian: apt-get install %s): %v", tool, map[string]string{"wrk": "wrk", "taskset": "util-linux"}[tool], err)
		}
	}
}

// BenchmarkProxyVsBare measures routed non-streamed requests and the SSE relay through tlgw
// (every feature of the path on: benchGatewayTOML) against the bare ReverseProxy over the same
// two tlengine processes, in one run, on the pinned set-up described above. Rounds alternate
// the two proxies in short phases, each round starting with the other one, so that the
// machine's drift hits both alike: this VM's speed changes by up to 2× within seconds, which
// 5 s phases let fall on one proxy's phase. A ratio is the median of the rounds' ratios. Run
// with -benchtime 1x; tests/bench/proxy.sh prints the figures. TLGW_BENCH_PHASE sets a phase's
// length (default 2s), TLGW_BENCH_ROUNDS the rounds (default 20), TLGW_BENCH_CPU_PROFILE a file
// for the gateway's CPU profile of the whole run (tests/bench/pgo.sh).
func BenchmarkProxyVsBare(b *testing.B) {
	needTools(b)
	phaseLen := envDuration(b, "TLGW_BENCH_PHASE", 2*time.Second)
	rounds := 20
	if v := os.Getenv("TLGW_BENCH_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			b.Fatalf("TLGW_BENCH_ROUNDS=%q", v)
		}
	}
	dir := b.TempDir()
	var bins [3]string
	for i, pkg := range []string{"cmd/tlgw", "cmd/tlengine", "tests/bench/bareproxy"} {
		bin, err := proctest.Build(dir, "github.com/tlgw/tlgw/"+pkg)
		if err != nil {
			b.Fatal(err)
		}
		bins[i] = bin
	}
	cfg := filepath.Join(dir, "tlgw.toml")
	if err := os.WriteFile(cfg, []byte(benchGatewayTOML), 0o600); err != nil {
		b.Fatal(err)
	}
	gwArgs := []string{"-c", serverCore, bins[0], "serve", "--config", cfg}
	if prof := os.Getenv("TLGW_BENCH_CPU_PROFILE"); prof != "" {
		gwArgs = append(gwArgs, "--cpu-profile", prof) // written when the gateway stops (pgo.sh)
	}
	gw := proctest.Start(b, "taskset", gwArgs)
	g := &rig{b: b, dir: dir}
	var upstreams []string
	for i := 0; i < 2; i++ {
		p := proctest.Start(b, "taskset", []string{"-c", serverCore, bins[1], "--id", fmt.Sprint("bench-", i), "--model", "smol",
			"--gateway", gw.GRPCAddr, "--token", "engine-secret", "--max-running", "1024", "--kv-blocks", "65536", "--log-level", "warn"})
		g.engines = append(g.engines, p)
		upstreams = append(upstreams, p.HTTPAddr)
	}
	bareProc := proctest.Start(b, "taskset", append([]string{"-c", serverCore, bins[2]}, upstreams...))
	gwBase, bareBase := "http://"+gw.HTTPAddr, "http://"+bareProc.HTTPAddr
	gwtest.Eventually(b, "engines registered", func() bool {
		resp, err := http.Get(gwBase + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	tlgw := target{name: "tlgw", base: gwBase, key: "sk-bench", model: "bench", proc: gw,
		mallocs: func() (uint64, error) { return scrapeCounter(gwBase+"/metrics", "go_memstats_mallocs_total") }}
	bare := target{name: "bare", base: bareBase, model: "smol", proc: bareProc,
		mallocs: func() (uint64, error) { return plainNumber(bareBase + "/__mallocs") }}

	// A ~400-byte completions body, answered in 8 tokens; the stream answers 64 events.
	prompt := "Benchmark prompt: " + strings.Repeat("tell me about routing requests across engines. ", 7)
	jsonBody := `{"model":"%s","prompt":"` + prompt + `","max_tokens":8,"seed":1}`
	sseBody := `{"model":"%s","prompt":"` + prompt + `","max_tokens":64,"seed":1,"stream":true}`
	// Warm both paths' connection pools.
	g.run(bare, jsonBody, false, benchConns, time.Second)
	g.run(tlgw, jsonBody, false, benchConns, time.Second)

	b.ResetTimer()
	var bj, gj, bs, gs phase
	var jsonRatios, sseRatios []float64
	for i := 0; i < rounds; i++ {
		var b1, g1, b2, g2 phase
		if i%2 == 0 {
			b1 = g.run(bare, jsonBody, false, benchConns, phaseLen)
			g1 = g.run(tlgw, jsonBody, false, benchConns, phaseLen)
			b2 = g.run(bare, sseBody, true, benchConns, phaseLen)
			g2 = g.run(tlgw, sseBody, true, benchConns, phaseLen)
		} else {
			g1 = g.run(tlgw, jsonBody, false, benchConns, phaseLen)
			b1 = g.run(bare, jsonBody, false, benchConns, phaseLen)
			g2 = g.run(tlgw, sseBody, true, benchConns, phaseLen)
			b2 = g.run(bare, sseBody, true, benchConns, phaseLen)
		}
		jsonRatios = append(jsonRatios, g1.perSecond(g1.requests)/b1.perSecond(b1.requests))
		sseRatios = append(sseRatios, g2.perSecond(g2.events)/b2.perSecond(b2.events))
		bj, gj, bs, gs = bj.add(b1), gj.add(g1), bs.add(b2), gs.add(g2)
	}
	// Added latency at one connection: the median of the rounds' p50 differences.
	var added []float64
	var bj1, gj1 phase
	for i := 0; i < min(rounds, 5); i++ {
		b1 := g.run(bare, jsonBody, false, 1, phaseLen)
		g1 := g.run(tlgw, jsonBody, false, 1, phaseLen)
		added = append(added, float64((g1.p50 - b1.p50).Microseconds()))
		bj1, gj1 = bj1.add(b1), gj1.add(g1)
	}
	b.StopTimer()

	for _, p := range []phase{gj, gs, gj1, bj, bj1} {
		if p.errors > 0 {
			b.Errorf("a phase had %d errors in %d requests", p.errors, p.requests)
		}
	}
	if gs.truncated != 0 || gs.streams != gs.requests {
		b.Errorf("tlgw: %d of %d streams truncated, %d answered 200", gs.truncated, gs.requests, gs.streams)
	}
	slices.Sort(jsonRatios)
	slices.Sort(sseRatios)
	slices.Sort(added)
	b.ReportMetric(jsonRatios[len(jsonRatios)/2], "json-req/s-ratio")
	b.ReportMetric(sseRatios[len(sseRatios)/2], "sse-events/s-ratio")
	b.ReportMetric(gj.perSecond(gj.requests), "tlgw-json-req/s")
	b.ReportMetric(bj.perSecond(bj.requests), "bare-json-req/s")
	b.ReportMetric(gj.cpuPer(gj.requests), "tlgw-cpu-µs/req")
	b.ReportMetric(bj.cpuPer(bj.requests), "bare-cpu-µs/req")
	b.ReportMetric(float64(gj.enginesCPU.Nanoseconds())/1000/float64(gj.requests), "engines-cpu-µs/req")
	b.ReportMetric(float64(gj.mallocs)/float64(gj.requests), "tlgw-allocs/req")
	b.ReportMetric(float64(bj.mallocs)/float64(bj.requests), "bare-allocs/req")
	b.ReportMetric(float64(gj.p50.Microseconds())/1000, "tlgw-json-p50-ms")
	b.ReportMetric(float64(bj.p50.Microseconds())/1000, "bare-json-p50-ms")
	b.ReportMetric(gs.perSecond(gs.events), "tlgw-sse-events/s")
	b.ReportMetric(bs.perSecond(bs.events), "bare-sse-events/s")
	b.ReportMetric(gs.cpuPer(gs.events), "tlgw-cpu-µs/event")
	b.ReportMetric(bs.cpuPer(bs.events), "bare-cpu-µs/event")
	b.ReportMetric(float64(gs.truncated), "tlgw-truncated-streams")
	b.ReportMetric(float64(bs.truncated+bs.requests-bs.streams), "bare-truncated-streams")
	b.ReportMetric(float64(gj1.p50.Microseconds()), "tlgw-p50-µs@1conn")
	b.ReportMetric(float64(bj1.p50.Microseconds()), "bare-p50-µs@1conn")
	b.ReportMetric(added[len(added)/2], "added-p50-µs@1conn")
}
