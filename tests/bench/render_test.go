package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// renderGatewayTOML is a precise_prefix gateway over engines that publish their own KV events
// (R22); %s is gateway.tokenizer.
const renderGatewayTOML = `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
route_policy = "precise_prefix"
tokenizer = "%s"

[registry]
tokens = [{ token = "engine-secret" }]
`

// Prompt modes of the render benchmark: each ~1.5 KB.
const (
	modeNew     = "new"     // every prompt new from its first byte: a render on an engine each
	modeExtends = "extends" // one shared text, then a new question: the shared part's ids from the cache
	modeRepeat  = "repeat"  // one prompt again and again: rendered once, then the cache
)

var renderModes = []string{modeNew, modeExtends, modeRepeat}

// uniqueScript is wrk's Lua for completions of max_tokens 1 in a prompt mode. It prints
// wrkScript's WRK line.
func uniqueScript(model, mode string) string {
	shared := strings.Repeat("Shared instructions for the benchmark, long enough to span blocks. ", 22)
	var sb strings.Builder
	fmt.Fprintf(&sb, "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n")
	fmt.Fprintf(&sb, "local model, shared, mode = %q, %q, %q\n", model, shared, mode)
	sb.WriteString(`
local threads = {}
function setup(t) table.insert(threads, t) end
function init(args) events = 0; streams = 0; truncated = 0; n = 0; salt = tostring({}):sub(8) end
function request()
  n = n + 1
  local head, tail = "", "the same question"
  if mode ~= "repeat" then tail = "question " .. salt .. "-" .. n end
  if mode == "new" then head = tail end
  return wrk.format(nil, nil, nil, string.format('{"model":"%s","prompt":"%s %s %s","max_tokens":1,"seed":1}', model, head, shared, tail))
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d events=%d streams=%d truncated=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout, 0, 0, 0))
end
`)
	return sb.String()
}

// BenchmarkRenderTTFT measures what gateway.tokenizer = "engine" adds to a request's time to
// first token (R22): two precise_prefix gateways, one with tokenizer = "engine" and one with
// "estimate", over the same two tlengine processes publishing vLLM-format KV events (each
// engine heartbeats to both and both subscribe), all pinned to core 1, wrk on core 0. The
// requests are one-token completions, whose latency is their TTFT. Rounds alternate the two
// gateways in short phases at one and at 64 connections, in each prompt mode (every prompt new:
// a render on an engine per request, the worst case; a shared text then a new question; one
// prompt repeated: the gateway's cache). A
// figure is the median over rounds of engine − estimate. Run with -benchtime 1x;
// tests/bench/render.sh prints them. TLGW_BENCH_PHASE (2s) and TLGW_BENCH_ROUNDS (8) as in
// proxy.sh.
func BenchmarkRenderTTFT(b *testing.B) {
	needTools(b)
	phaseLen := envDuration(b, "TLGW_BENCH_PHASE", 2*time.Second)
	rounds := 8
	if v := os.Getenv("TLGW_BENCH_ROUNDS"); v != "" {
		if _, err := fmt.Sscan(v, &rounds); err != nil || rounds < 1 {
			b.Fatalf("TLGW_BENCH_ROUNDS=%q", v)
		}
	}
	dir := b.TempDir()
	var bins [2]string
	for i, pkg := range []string{"cmd/tlgw", "cmd/tlengine"} {
		bin, err := proctest.Build(dir, "github.com/tlgw/tlgw/"+pkg)
		if err != nil {
			b.Fatal(err)
		}
		bins[i] = bin
	}
	g := &rig{b: b, dir: dir}
	var gws [2]*proctest.Proc
	var targets [2]target
	for i, tok := range []string{"engine", "estimate"} {
		cfg := filepath.Join(dir, tok+".toml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(renderGatewayTOML, tok)), 0o600); err != nil {
			b.Fatal(err)
		}
		gws[i] = proctest.Start(b, "taskset", []string{"-c", serverCore, bins[0], "serve", "--config", cfg})
		base := "http://" + gws[i].HTTPAddr
		targets[i] = target{name: tok, base: base, model: "smol", proc: gws[i],
			mallocs: func() (uint64, error) { return scrapeCounter(base+"/metrics", "go_memstats_mallocs_total") }}
	}
	for i := range 2 {
		p := proctest.Start(b, "taskset", []string{"-c", serverCore, bins[1], "--id", fmt.Sprint("render-", i), "--model", "smol",
			"--gateway", gws[0].GRPCAddr + "," + gws[1].GRPCAddr, "--token", "engine-secret", "--max-running", "1024",
			"--kv-blocks", "65536", "--log-level", "warn", "--kv-events", "zmq://127.0.0.1:0"})
		g.engines = append(g.engines, p)
	}
	for _, t := range targets {
		gwtest.Eventually(b, t.name+" gateway ready", func() bool {
			resp, err := http.Get(t.base + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	for _, e := range g.engines {
		gwtest.Eventually(b, "both gateways subscribed to "+e.HTTPAddr, func() bool {
			n, err := scrapeCounter("http://"+e.HTTPAddr+"/metrics", "tlengine_kv_events_subscribers")
			return err == nil && n == 2
		})
	}
	scripts := map[string]string{}
	for _, mode := range renderModes {
		scripts[mode] = filepath.Join(dir, mode+".lua")
		if err := os.WriteFile(scripts[mode], []byte(uniqueScript("smol", mode)), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	// Warm both gateways' connection pools (and the engine gateway's cache for the repeat).
	for _, t := range targets {
		g.runScript(t, scripts[modeRepeat], "/v1/completions", benchConns, time.Second)
	}
	b.ResetTimer()
	type key struct {
		mode  string
		conns int
	}
	added50, added99 := map[key][]float64{}, map[key][]float64{}
	last := map[key][2]phase{}
	for r := range rounds {
		for _, mode := range renderModes {
			for _, conns := range []int{1, benchConns} {
				k := key{mode, conns}
				var ph [2]phase
				for j := range 2 {
					i := (j + r) % 2 // each round starts with the other gateway
					ph[i] = g.runScript(targets[i], scripts[mode], "/v1/completions", conns, phaseLen)
					if ph[i].errors > 0 {
						b.Fatalf("%s: %d errors in %d requests", targets[i].name, ph[i].errors, ph[i].requests)
					}
				}
				added50[k] = append(added50[k], float64((ph[0].p50 - ph[1].p50).Microseconds()))
				added99[k] = append(added99[k], float64((ph[0].p99 - ph[1].p99).Microseconds()))
				last[k] = ph
			}
		}
	}
	b.StopTimer()
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	for _, name := range renderModes {
		for _, conns := range []int{1, benchConns} {
			k := key{name, conns}
			b.ReportMetric(median(added50[k]), fmt.Sprintf("%s-added-p50-µs@%dconn", name, conns))
			b.ReportMetric(median(added99[k]), fmt.Sprintf("%s-added-p99-µs@%dconn", name, conns))
			b.ReportMetric(float64(last[k][1].p50.Microseconds()), fmt.Sprintf("%s-estimate-p50-µs@%dconn", name, conns))
		}
	}
	// The engine gateway's own counts: every unique prompt rendered, the repeats cached.
	for _, o := range []string{"render", "cache", "partial", "fallback"} {
		n, err := scrapeLabelled(targets[0].base+"/metrics", "tlgw_tokenizer_requests_total", `outcome="`+o+`"`)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(n, "tokenizer-"+o)
	}
}

// scrapeLabelled reads one labelled sample (name{label}) from a Prometheus text exposition.
func scrapeLabelled(url, name, label string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+"{"+label+"} "); ok {
			var f float64
			_, err := fmt.Sscan(v, &f)
			return f, err
		}
	}
	return 0, fmt.Errorf("%s has no %s{%s}", url, name, label)
}
