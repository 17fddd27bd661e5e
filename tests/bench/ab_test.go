package bench

import (
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

// BenchmarkGatewayAB compares two builds of the gateway on the pinned set-up: each build
// serves with its own two tlengine processes (gateways and engines all on core 1), and wrk (64
// connections, core 0) alternates between them in short slices, each round starting with the
// other build. On this VM, whose speed moves by up to 2× within seconds, the median of the
// slices' ratios tells changes of a few percent apart where two separate runs cannot.
//
// TLGW_AB_A and TLGW_AB_B name the two module trees (tests/bench/ab.sh makes them from git
// revisions); TLGW_AB_KIND is sse (default) or json, TLGW_AB_ROUNDS the slices (default 20),
// TLGW_BENCH_PHASE a slice's length (default 2s); TLGW_AB_CONFIG_A or TLGW_AB_CONFIG_B
// replaces that side's configuration (the proxy benchmark's by default), so one build against
// itself with a feature off says what the feature costs; TLGW_AB_CONNS sets wrk's connections
// (default 64; 1 compares the latency a lone client sees). Reported: the median ratio A ÷ B of
// events/s (sse) or req/s (json), each build's median CPU per stream or request, and the
// median over the slices of A's p50 latency minus B's.
func BenchmarkGatewayAB(b *testing.B) {
	dirA, dirB := os.Getenv("TLGW_AB_A"), os.Getenv("TLGW_AB_B")
	if dirA == "" || dirB == "" {
		b.Skip("set TLGW_AB_A and TLGW_AB_B to two module trees (tests/bench/ab.sh REV_A REV_B)")
	}
	needTools(b)
	stream := os.Getenv("TLGW_AB_KIND") != "json"
	rounds := 20
	if v := os.Getenv("TLGW_AB_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			b.Fatalf("TLGW_AB_ROUNDS=%q", v)
		}
	}
	conns := benchConns
	if v := os.Getenv("TLGW_AB_CONNS"); v != "" {
		var err error
		if conns, err = strconv.Atoi(v); err != nil || conns < 1 {
			b.Fatalf("TLGW_AB_CONNS=%q", v)
		}
	}
	slice := envDuration(b, "TLGW_BENCH_PHASE", 2*time.Second)
	dir := b.TempDir()
	engineBin, err := proctest.Build(dir, "github.com/tlgw/tlgw/cmd/tlengine")
	if err != nil {
		b.Fatal(err)
	}
	cfg := filepath.Join(dir, "tlgw.toml")
	if err := os.WriteFile(cfg, []byte(benchGatewayTOML), 0o600); err != nil {
		b.Fatal(err)
	}
	side := func(name, tree string) (target, *rig) {
		cfg := cfg
		if own := os.Getenv("TLGW_AB_CONFIG_" + strings.ToUpper(name)); own != "" {
			cfg = own // this side's own configuration: what a feature costs, on one build
		}
		bin := filepath.Join(dir, "tlgw-"+name)
		cmd := exec.Command("go", "build", "-C", tree, "-o", bin, "./cmd/tlgw")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("building %s: %v\n%s", tree, err, out)
		}
		gw := proctest.Start(b, "taskset", []string{"-c", serverCore, bin, "serve", "--config", cfg})
		g := &rig{b: b, dir: filepath.Join(dir, name)}
		if err := os.Mkdir(g.dir, 0o700); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			g.engines = append(g.engines, proctest.Start(b, "taskset", []string{"-c", serverCore, engineBin,
				"--id", fmt.Sprint(name, "-", i), "--model", "smol", "--gateway", gw.GRPCAddr, "--token", "engine-secret",
				"--max-running", "1024", "--kv-blocks", "65536", "--log-level", "warn"}))
		}
		base := "http://" + gw.HTTPAddr
		gwtest.Eventually(b, name+" ready", func() bool {
			resp, err := http.Get(base + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
		return target{name: name, base: base, key: "sk-bench", model: "bench", proc: gw,
			mallocs: func() (uint64, error) { return scrapeCounter(base+"/metrics", "go_memstats_mallocs_total") }}, g
	}
	a, ga := side("A", dirA)
	bb, gb := side("B", dirB)

	prompt := "Benchmark prompt: " + strings.Repeat("tell me about routing requests across engines. ", 7)
	body := `{"model":"%s","prompt":"` + prompt + `","max_tokens":8,"seed":1}`
	if stream {
		body = `{"model":"%s","prompt":"` + prompt + `","max_tokens":64,"seed":1,"stream":true}`
	}
	ga.run(a, body, stream, conns, time.Second) // warm both
	gb.run(bb, body, stream, conns, time.Second)
	b.ResetTimer()
	var ratios, cpuA, cpuB, p50 []float64
	for i := 0; i < rounds; i++ {
		var pa, pb phase
		if i%2 == 0 {
			pa, pb = ga.run(a, body, stream, conns, slice), gb.run(bb, body, stream, conns, slice)
		} else {
			pb, pa = gb.run(bb, body, stream, conns, slice), ga.run(a, body, stream, conns, slice)
		}
		if pa.errors+pb.errors > 0 || (stream && (pa.truncated+pb.truncated > 0)) {
			b.Fatalf("round %d: errors A %d B %d, truncated A %d B %d", i, pa.errors, pb.errors, pa.truncated, pb.truncated)
		}
		units := func(p phase) int {
			if stream {
				return p.events
			}
			return p.requests
		}
		ratios = append(ratios, pa.perSecond(units(pa))/pb.perSecond(units(pb)))
		cpuA, cpuB = append(cpuA, pa.cpuPer(pa.requests)), append(cpuB, pb.cpuPer(pb.requests))
		p50 = append(p50, float64((pa.p50 - pb.p50).Microseconds()))
	}
	b.StopTimer()
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(median(ratios), "A/B-ratio")
	b.ReportMetric(median(cpuA), "A-cpu-µs/req")
	b.ReportMetric(median(cpuB), "B-cpu-µs/req")
	b.ReportMetric(median(p50), "A-B-p50-µs")
	b.ReportMetric(float64(rounds), "slices")
}
