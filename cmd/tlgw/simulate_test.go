package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/sim/fleet"
)

func TestSimulateJSONAndPlot(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "sim.png")
	var stdout, stderr bytes.Buffer
	args := []string{"simulate", "--trace", "shared-prefix", "--workers", "4", "--requests", "200", "--load", "0.7",
		"--policies", "round_robin,prefix_aware", "--seed", "3", "--slo-ttft-ms", "250", "--format", "json", "--plot", plot}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	var doc struct {
		Results []struct {
			Policy        string   `json:"policy"`
			HitRate       *float64 `json:"hit_rate"`
			TTFTP50       *float64 `json:"ttft_p50_ms"`
			TTFTP99       *float64 `json:"ttft_p99_ms"`
			TokensPerS    *float64 `json:"tokens_per_s"`
			Imbalance     *float64 `json:"imbalance"`
			SLOAttainment *float64 `json:"slo_attainment"`
		} `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(doc.Results) != 2 || doc.Results[0].Policy != "round_robin" || doc.Results[1].Policy != "prefix_aware" {
		t.Fatalf("results: %s", stdout.String())
	}
	for _, r := range doc.Results {
		if r.HitRate == nil || r.TTFTP50 == nil || r.TTFTP99 == nil || r.TokensPerS == nil || r.Imbalance == nil || r.SLOAttainment == nil {
			t.Fatalf("a field of R18.1 is missing: %s", stdout.String())
		}
	}
	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("--plot did not write a PNG: %v", err)
	}
	// Markdown, the default format, with the same run.
	stdout.Reset()
	if code := run([]string{"simulate", "--workers", "2", "--requests", "50", "--policies", "least_outstanding"}, &stdout, &stderr); code != 0 {
		t.Fatalf("markdown: exit %d, stderr %q", code, stderr.String())
	}
	if !strings.HasPrefix(stdout.String(), "| policy | hit_rate |") || !strings.Contains(stdout.String(), "| least_outstanding |") {
		t.Fatalf("markdown:\n%s", stdout.String())
	}
}

func TestSimulateBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--trace", "bursty"}, `unknown trace "bursty"`},
		{[]string{"--workers", "0"}, "--workers must be at least 1"},
		{[]string{"--requests", "0"}, "--requests must be at least 1"},
		{[]string{"--load", "-1"}, "--load must be a positive fraction"},
		{[]string{"--load", "NaN"}, "--load must be a positive fraction"},
		{[]string{"--load", "0.5,x"}, "--load must be a positive fraction"},
		{[]string{"--load", "0.5,,1"}, "--load must be a positive fraction"},
		{[]string{"--load", "0.5,0"}, "--load must be a positive fraction"},
		{[]string{"--load", strings.Repeat("0.5,", 32) + "1"}, "--load must be a positive fraction"},
		{[]string{"--slo-ttft-ms", "0"}, "--slo-ttft-ms must be a positive"},
		{[]string{"--format", "csv"}, "--format must be json or markdown"},
		{[]string{"--policies", " , "}, "--policies names no policy"},
		{[]string{"--policies", "round_robin,random"}, `unknown route policy "random"`},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--workers", "x"}, "invalid value"},
		{[]string{"--kv-blocks", "0"}, "--kv-blocks must be at least 1"},
		{[]string{"--restart-every", "-1s"}, "--restart-every must not be negative"},
		{[]string{"--load-factor", "0.9"}, "--load-factor must be at least 1"},
		{[]string{"--load-factor", "NaN"}, "--load-factor must be at least 1"},
		// Bounds that keep a run within the machine's memory and its time finite.
		{[]string{"--workers", "10001"}, "workers must be 1 to 10000"},
		{[]string{"--requests", "1000001"}, "requests must be 1 to 1000000"},
		{[]string{"--load", "0.5,0.001"}, "load must be a fraction of capacity from 0.01 to 100, got 0.001"},
		{[]string{"--load", "101"}, "load must be a fraction of capacity from 0.01 to 100"},
		{[]string{"--restart-every", "999us"}, "engines restart every 1ms or more"},
		{[]string{"--kv-blocks", "2000000"}, "20 engines of 2000000 KV blocks are over the bound"},
		// The lora trace's flags are its own, and its policies are lora and least_outstanding.
		{[]string{"--adapters", "4"}, "--adapters is for --trace lora only"},
		{[]string{"--max-loras", "2"}, "--max-loras is for --trace lora only"},
		{[]string{"--lora-swap-ms", "5"}, "--lora-swap-ms is for --trace lora only"},
		{[]string{"--trace", "lora", "--lora-swap-ms", "-1"}, "--lora-swap-ms must be a number of milliseconds"},
		{[]string{"--trace", "lora", "--adapters", "0"}, "--adapters must be at least 1"},
		{[]string{"--trace", "lora", "--max-loras", "0"}, "--max-loras must be at least 1"},
		{[]string{"--trace", "lora", "--adapters", "1025"}, "adapters must be 1 to 1024"},
		{[]string{"--trace", "lora", "--max-loras", "1025"}, "max_loras must be 1 to 1024"},
		{[]string{"--trace", "lora", "--policies", "prefix_aware"}, `the lora trace compares [least_outstanding lora], not "prefix_aware"`},
		{[]string{"--policies", "lora"}, `policy "lora" is the lora trace's only`},
		// The vLLM event path's flags.
		{[]string{"--kv-events", "zmq"}, `--kv-events must be tl or vllm, got "zmq"`},
		{[]string{"--kv-events", "vllm", "--kv-gap", "-0.1"}, "--kv-gap must be a fraction of batches from 0 to 0.5"},
		{[]string{"--kv-events", "vllm", "--kv-gap", "0.6"}, "--kv-gap must be a fraction of batches from 0 to 0.5"},
		{[]string{"--kv-events", "vllm", "--kv-gap", "NaN"}, "--kv-gap must be a fraction of batches"},
		{[]string{"--kv-gap", "0.01"}, "--kv-gap is for --kv-events vllm only"},
		{[]string{"--kv-replay"}, "--kv-replay is for --kv-events vllm only"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"simulate"}, tc.args...), &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: stderr %q, want it to say %q", tc.args, stderr.String(), tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%v: wrote %q to stdout", tc.args, stdout.String())
		}
	}
}

// TestSimulatePressureAndRestarts: --kv-blocks and --restart-every reach the simulation: fewer
// KV blocks and restarts lower prefix_aware's hit rate, and precise_prefix follows what the
// engines really hold.
func TestSimulatePressureAndRestarts(t *testing.T) {
	hit := func(args ...string) map[string]float64 {
		t.Helper()
		m := map[string]float64{}
		for _, r := range simulateJSON(t, append([]string{"--trace", "shared-prefix", "--workers", "8", "--requests", "1500",
			"--load", "0.9", "--seed", "1", "--policies", "prefix_aware,precise_prefix"}, args...)...) {
			m[r.Policy] = r.HitRate
		}
		return m
	}
	roomy, tight := hit(), hit("--kv-blocks", "512", "--restart-every", "1s")
	if !(tight["prefix_aware"] < roomy["prefix_aware"]) {
		t.Fatalf("prefix_aware hit rate %.3f with pressure and restarts, %.3f without", tight["prefix_aware"], roomy["prefix_aware"])
	}
	if !(tight["precise_prefix"] > tight["prefix_aware"]) {
		t.Fatalf("under pressure and restarts precise_prefix %.3f, prefix_aware %.3f", tight["precise_prefix"], tight["prefix_aware"])
	}
}

// TestSimulateLoadFactor: --load-factor reaches the bounded-load cap: a tighter c lowers
// prefix_aware's imbalance.
func TestSimulateLoadFactor(t *testing.T) {
	imbalance := func(c string) float64 {
		t.Helper()
		rs := simulateJSON(t, "--trace", "shared-prefix", "--workers", "20", "--requests", "2000",
			"--load", "0.8", "--seed", "1", "--policies", "prefix_aware", "--load-factor", c)
		if len(rs) != 1 {
			t.Fatalf("%d results", len(rs))
		}
		return rs[0].Imbalance
	}
	if loose, tight := imbalance("2"), imbalance("1"); !(tight < loose) {
		t.Fatalf("imbalance %.3f with c = 1, %.3f with c = 2", tight, loose)
	}
}

// TestSimulateAdmission: --admission reaches the simulation: under predicted_latency with a
// tight objective some requests wait in the gateway's queue (JSON held), none without it.
func TestSimulateAdmission(t *testing.T) {
	held := func(args ...string) int {
		t.Helper()
		rs := simulateJSON(t, append([]string{"--trace", "shared-prefix", "--workers", "30", "--requests", "4000",
			"--load", "1.3", "--seed", "1", "--heterogeneous", "--slo-ttft-ms", "200", "--policies", "predicted_latency"}, args...)...)
		if len(rs) != 1 {
			t.Fatalf("%d results", len(rs))
		}
		return rs[0].Held
	}
	if off, on := held(), held("--admission"); off != 0 || on == 0 {
		t.Fatalf("held %d without the queue (want 0), %d with it (want some)", off, on)
	}
}

// TestSimulateSweep: a comma-separated --load is a rate sweep: every policy at every load, in
// order, in the JSON (each result naming its load) and a line plot.
func TestSimulateSweep(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "sweep.png")
	rs := simulateJSON(t, "--trace", "no-sharing", "--workers", "4", "--requests", "300", "--load", "0.5, 1.2",
		"--policies", "round_robin,least_outstanding", "--plot", plot)
	var got []string
	for _, r := range rs {
		got = append(got, fmt.Sprintf("%s@%g", r.Policy, r.Load))
	}
	if want := "round_robin@0.5 least_outstanding@0.5 round_robin@1.2 least_outstanding@1.2"; strings.Join(got, " ") != want {
		t.Fatalf("results %v, want %s", got, want)
	}
	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("--plot did not write a PNG: %v", err)
	}
}

// simulateJSON runs `tlgw simulate` with args (JSON output) and returns its results.
// TestSimulateVLLMEvents: --kv-events vllm, --kv-gap and --kv-replay reach the engines:
// precise_prefix's engines publish batches, a gap loses some of them, and replay fills every
// gap it sees where clearing does not.
func TestSimulateVLLMEvents(t *testing.T) {
	base := []string{"--trace", "shared-prefix", "--workers", "4", "--requests", "600", "--load", "0.8", "--seed", "1",
		"--policies", "precise_prefix", "--kv-events", "vllm"}
	plain := simulateJSON(t, base...)[0]
	kept := simulateJSON(t, append(base, "--kv-gap", "0.05")...)[0]
	replay := simulateJSON(t, append(base, "--kv-gap", "0.05", "--kv-replay")...)[0]
	if plain.KVBatches == 0 || plain.KVLost != 0 || plain.Completed != plain.Requests {
		t.Fatalf("--kv-events vllm: %+v", plain)
	}
	if kept.KVLost == 0 || kept.KVKept != kept.KVGaps || kept.KVClears != 0 || kept.KVReplays != 0 {
		t.Fatalf("--kv-gap 0.05: %+v", kept)
	}
	if replay.KVGaps == 0 || replay.KVReplays != replay.KVGaps || replay.KVClears != 0 {
		t.Fatalf("--kv-gap 0.05 --kv-replay: %+v", replay)
	}
}

func simulateJSON(t *testing.T, args ...string) []fleet.Result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"simulate", "--format", "json"}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var out fleet.Report
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	return out.Results
}

// TestSimulateLoRA: --trace lora compares lora with least_outstanding by default; --adapters,
// --max-loras and --lora-swap-ms reach the engines (one slot per engine and one adapter
// per slot's worth of engines swap less than four adapters in one slot; no swap cost is a
// lower p50), and the markdown table gains swaps_per_1k and lora_waits.
func TestSimulateLoRA(t *testing.T) {
	base := []string{"--trace", "lora", "--workers", "4", "--requests", "400", "--load", "0.6", "--seed", "2"}
	rs := simulateJSON(t, base...)
	if len(rs) != 2 || rs[0].Policy != "least_outstanding" || rs[1].Policy != "lora" || rs[0].Adapters != fleet.DefaultAdapters {
		t.Fatalf("default lora run: %+v", rs)
	}
	few := simulateJSON(t, append(base, "--adapters", "4", "--max-loras", "4")...)
	one := simulateJSON(t, append(base, "--adapters", "4", "--max-loras", "1")...)
	if few[0].Adapters != 4 || !(few[0].Swaps < one[0].Swaps) {
		t.Fatalf("least_outstanding swaps: %d with 4 slots, %d with 1", few[0].Swaps, one[0].Swaps)
	}
	free := simulateJSON(t, append(base, "--adapters", "4", "--max-loras", "1", "--lora-swap-ms", "0")...)
	if !(free[0].TTFTMeanMs < one[0].TTFTMeanMs) {
		t.Fatalf("mean TTFT %.1f ms without a swap cost, %.1f with 20 ms", free[0].TTFTMeanMs, one[0].TTFTMeanMs)
	}
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"simulate", "--format", "markdown"}, base...), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "| swaps_per_1k | lora_waits |") {
		t.Fatalf("markdown:\n%s", stdout.String())
	}
}

// --replicas and --report-delay (R23): bad values exit 2 naming the flag; a list runs each
// count, and the Markdown gains a replicas column.
func TestSimulateReplicasFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--replicas", "0"}, {"--replicas", "65"}, {"--replicas", "two"}, {"--replicas", "1,x"}, {"--replicas", ""},
		{"--report-delay", "-1ms"}, {"--report-delay", "11s"},
	} {
		var stdout, stderr bytes.Buffer
		all := append([]string{"simulate", "--workers", "2", "--requests", "20"}, args...)
		if code := run(all, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), args[0]) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", args, code, stderr.String(), args[0])
		}
	}
	var stdout, stderr bytes.Buffer
	args := []string{"simulate", "--workers", "4", "--requests", "200", "--policies", "least_outstanding,precise_prefix",
		"--replicas", "1,3", "--report-delay", "50ms", "--seed", "2"}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"| replicas | policy |", "| 1 | least_outstanding |", "| 1 | precise_prefix |",
		"| 3 | least_outstanding |", "| 3 | precise_prefix |"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	// One replica without a delay is today's output, without the column.
	stdout.Reset()
	if code := run([]string{"simulate", "--workers", "2", "--requests", "50", "--replicas", "1", "--format", "json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if strings.Contains(stdout.String(), "replicas") || strings.Contains(stdout.String(), "report_delay") {
		t.Fatalf("one replica's JSON names replicas:\n%s", stdout.String())
	}
}
