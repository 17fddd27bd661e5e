package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// bareProxy is the baseline of DEVELOPERS.md: httputil.ReverseProxy buffering the request body
// (Rewrite sets Out.Body to the bytes read), FlushInterval 0 (ReverseProxy still flushes
// text/event-stream at once), a Transport with MaxIdleConnsPerHost 1024, round robin over the
// same upstreams.
func bareProxy(upstreams []string) http.Handler {
	var next atomic.Uint64
	targets := make([]*url.URL, len(upstreams))
	for i, u := range upstreams {
		targets[i] = &url.URL{Scheme: "http", Host: u}
	}
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			body, _ := io.ReadAll(r.In.Body)
			r.Out.Body = io.NopCloser(bytes.NewReader(body))
			r.Out.ContentLength = int64(len(body))
			r.SetURL(targets[next.Add(1)%uint64(len(targets))])
		},
		Transport: &http.Transport{
			MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second,
			DisableCompression: true,
		},
		ErrorLog: nil,
	}
}

// loadResult is what one phase of the load generator measured.
type loadResult struct {
	requests, events, truncated, failed int
	elapsed                             time.Duration
	cpu                                 time.Duration // this process's CPU over the phase
	latencies                           []time.Duration
}

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPer is the process CPU per unit (request or event), in µs.
func (r loadResult) cpuPer(n int) float64 { return float64(r.cpu.Nanoseconds()) / 1000 / float64(n) }

func (r loadResult) perSecond(n int) float64 { return float64(n) / r.elapsed.Seconds() }

// merge pools two phases' counts, time and latencies.
func (r loadResult) merge(o loadResult) loadResult {
	return loadResult{requests: r.requests + o.requests, events: r.events + o.events,
		truncated: r.truncated + o.truncated, failed: r.failed + o.failed, elapsed: r.elapsed + o.elapsed,
		cpu:       r.cpu + o.cpu,
		latencies: append(r.latencies, o.latencies...)}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func (r loadResult) pct(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	l := slices.Clone(r.latencies)
	slices.Sort(l)
	return l[int(q*float64(len(l)-1))]
}

// drive runs conns closed-loop clients for d against base. A stream counts as truncated when
// it ends without data: [DONE].
func drive(base, key, body string, stream bool, conns int, d time.Duration) loadResult {
	tr := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var mu sync.Mutex
	var res loadResult
	deadline := time.Now().Add(d)
	start, cpu0 := time.Now(), processCPU()
	var wg sync.WaitGroup
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local loadResult
			for time.Now().Before(deadline) {
				t0 := time.Now()
				req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				resp, err := client.Do(req)
				if err != nil {
					local.failed++
					continue
				}
				if !stream {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 {
						local.failed++
						continue
					}
					local.requests++
					local.latencies = append(local.latencies, time.Since(t0))
					continue
				}
				sc := bufio.NewScanner(resp.Body)
				done := false
				for sc.Scan() {
					line := sc.Text()
					if line == "data: [DONE]" {
						done = true
					} else if strings.HasPrefix(line, "data: ") {
						local.events++
					}
				}
				resp.Body.Close()
				local.requests++
				if !done {
					local.truncated++
				}
				local.latencies = append(local.latencies, time.Since(t0))
			}
			mu.Lock()
			res.requests += local.requests
			res.events += local.events
			res.truncated += local.truncated
			res.failed += local.failed
			res.latencies = append(res.latencies, local.latencies...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.elapsed, res.cpu = time.Since(start), processCPU()-cpu0
	return res
}

// BenchmarkProxyVsBare measures, in one run and with one load generator, routed non-streamed
// requests and the SSE relay through tlgw (auth, a canary route with model rewrite, metrics,
// request ids: every feature of the path on) against the bare ReverseProxy over the same two
// tlengine processes. Run with -benchtime 1x; tests/bench/proxy.sh prints the ratios.
func BenchmarkProxyVsBare(b *testing.B) {
	dir := b.TempDir()
	engineBin, err := proctest.Build(dir, "github.com/tlgw/tlgw/cmd/tlengine")
	if err != nil {
		b.Fatal(err)
	}
	// The gateway runs in this process, like the baseline proxy and the load generator.
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.Routes = config.NormalizeRoutes([]config.Route{{Model: "bench", Backends: []config.Backend{{Model: "smol", Weight: 1}}}})
	cfg.Auth.Keys = []config.Key{{Key: "sk-bench", Scopes: []string{"inference", "debug"}}}
	gw, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = gw.Shutdown(context.Background()) }()
	var upstreams []string
	for i := 0; i < 2; i++ {
		p := proctest.StartEngine(b, engineBin, "--id", fmt.Sprint("bench-", i), "--model", "smol",
			"--gateway", gw.GRPCAddr, "--max-running", "1024", "--kv-blocks", "65536")
		upstreams = append(upstreams, p.HTTPAddr)
	}
	gwtest.Eventually(b, "engines registered", func() bool { n, _ := gw.Gateway.Routable(); return n == 2 })

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	bare := &http.Server{Handler: bareProxy(upstreams)}
	go func() { _ = bare.Serve(lis) }()
	defer bare.Close()
	bareBase, gwBase := "http://"+lis.Addr().String(), "http://"+gw.HTTPAddr

	const conns, phase = 32, 2 * time.Second
	jsonBody := `{"model":"%s","prompt":"Benchmark prompt: tell me about routing","max_tokens":16,"seed":1}`
	sseBody := `{"model":"%s","prompt":"Benchmark prompt: tell me about routing","max_tokens":64,"seed":1,"stream":true}`
	// Warm both paths' connection pools.
	drive(bareBase, "", fmt.Sprintf(jsonBody, "smol"), false, conns, 300*time.Millisecond)
	drive(gwBase, "sk-bench", fmt.Sprintf(jsonBody, "bench"), false, conns, 300*time.Millisecond)

	b.ResetTimer()
	// Rounds alternate the two proxies so drift on the shared machine hits both alike; each
	// ratio is the median of the rounds' ratios, the latencies come from all rounds pooled.
	const rounds = 3
	var bj, gj, bs, gs loadResult
	var jsonRatios, sseRatios []float64
	for i := 0; i < rounds; i++ {
		b1 := drive(bareBase, "", fmt.Sprintf(jsonBody, "smol"), false, conns, phase)
		g1 := drive(gwBase, "sk-bench", fmt.Sprintf(jsonBody, "bench"), false, conns, phase)
		b2 := drive(bareBase, "", fmt.Sprintf(sseBody, "smol"), true, conns, phase)
		g2 := drive(gwBase, "sk-bench", fmt.Sprintf(sseBody, "bench"), true, conns, phase)
		jsonRatios = append(jsonRatios, g1.perSecond(g1.requests)/b1.perSecond(b1.requests))
		sseRatios = append(sseRatios, g2.perSecond(g2.events)/b2.perSecond(b2.events))
		bj, gj, bs, gs = bj.merge(b1), gj.merge(g1), bs.merge(b2), gs.merge(g2)
	}
	// Added latency at one connection.
	bj1 := drive(bareBase, "", fmt.Sprintf(jsonBody, "smol"), false, 1, phase)
	gj1 := drive(gwBase, "sk-bench", fmt.Sprintf(jsonBody, "bench"), false, 1, phase)
	b.StopTimer()

	for _, r := range []loadResult{bj, gj, bs, gs, bj1, gj1} {
		if r.failed > 0 || r.requests == 0 {
			b.Fatalf("a phase had %d failures and %d requests", r.failed, r.requests)
		}
	}
	if gs.truncated != 0 {
		b.Errorf("tlgw truncated %d of %d streams", gs.truncated, gs.requests)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(median(jsonRatios), "json-req/s-ratio")
	b.ReportMetric(median(sseRatios), "sse-events/s-ratio")
	b.ReportMetric(gj.perSecond(gj.requests), "tlgw-json-req/s")
	b.ReportMetric(bj.perSecond(bj.requests), "bare-json-req/s")
	b.ReportMetric(ms(gj.pct(0.5)), "tlgw-json-p50-ms")
	b.ReportMetric(ms(gj.pct(0.99)), "tlgw-json-p99-ms")
	b.ReportMetric(ms(bj.pct(0.5)), "bare-json-p50-ms")
	b.ReportMetric(ms(bj.pct(0.99)), "bare-json-p99-ms")
	b.ReportMetric(gs.perSecond(gs.events), "tlgw-sse-events/s")
	b.ReportMetric(bs.perSecond(bs.events), "bare-sse-events/s")
	b.ReportMetric(ms(gs.pct(0.5)), "tlgw-sse-p50-ms")
	b.ReportMetric(ms(gs.pct(0.99)), "tlgw-sse-p99-ms")
	b.ReportMetric(ms(bs.pct(0.5)), "bare-sse-p50-ms")
	b.ReportMetric(ms(bs.pct(0.99)), "bare-sse-p99-ms")
	b.ReportMetric(float64(gs.truncated), "tlgw-truncated-streams")
	b.ReportMetric(float64(bs.truncated), "bare-truncated-streams")
	b.ReportMetric(float64((gj1.pct(0.5) - bj1.pct(0.5)).Microseconds()), "added-p50-µs@1conn")
	// CPU of this process (load generator + the proxy under test; the engines run elsewhere):
	// the difference between the two paths is what tlgw's logic costs over the bare proxy.
	b.ReportMetric(gj.cpuPer(gj.requests), "tlgw-json-cpu-µs/req")
	b.ReportMetric(bj.cpuPer(bj.requests), "bare-json-cpu-µs/req")
	b.ReportMetric(gs.cpuPer(gs.events), "tlgw-sse-cpu-µs/event")
	b.ReportMetric(bs.cpuPer(bs.events), "bare-sse-cpu-µs/event")
}
