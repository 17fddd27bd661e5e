package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/sim/fleet"
)

const simulateUsage = `usage:
  tlgw simulate --trace shared-prefix|multi-turn|agentic|no-sharing --workers N --requests M
                --load F --policies a,b,… --seed S [--heterogeneous] [--slo-ttft-ms X]
                --format json|markdown [--plot FILE.png]
      the router's real policies over N simulated engines on a fake clock (SPEC R18.1)
  tlgw simulate --trace lora --adapters K [--max-loras N] [--lora-swap-ms X] …
      requests for K LoRA adapters (R21) that every engine serves in N GPU slots: the router's
      adapter pick (lora) against the adapter-unaware least_outstanding
  tlgw simulate … --kv-events vllm [--kv-gap F [--kv-replay]]
      precise_prefix's engines publish vLLM's own KV events (R22) instead of tl.kv chunk ids;
      a fraction F of event batches is lost, and the gateway replays the gap or keeps the worker's entries
  tlgw simulate … --replicas N[,N…] [--report-delay D]
      N gateway replicas (R23), each a router of its own, clients spread over them round robin;
      every engine's heartbeats and KV events reach every replica D after they are sent
`

// runSimulate runs `tlgw simulate`. Exit codes: 0 done, 1 the run or its output failed, 2 bad
// usage.
func runSimulate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, simulateUsage); fs.PrintDefaults() }
	trace := fs.String("trace", "shared-prefix", "the workload: "+strings.Join(fleet.Traces, ", "))
	workers := fs.Int("workers", 20, fmt.Sprintf("simulated engines (at most %d)", fleet.MaxWorkers))
	requests := fs.Int("requests", 2000, fmt.Sprintf("requests in the trace (at most %d)", fleet.MaxRequests))
	load := fs.String("load", "0.8", fmt.Sprintf("offered load as a fraction of the fleet's estimated capacity (%v to %v); a comma-separated list is a rate sweep", fleet.MinLoad, fleet.MaxLoad))
	policies := fs.String("policies", "round_robin,least_outstanding,affinity,prefix_aware", "route policies to compare, comma-separated")
	seed := fs.Uint64("seed", 1, "seed of the trace and the arrivals")
	hetero := fs.Bool("heterogeneous", false, "a fleet of mixed KV sizes and speeds")
	slo := fs.Float64("slo-ttft-ms", 1000, "TTFT objective for slo_attainment, in ms (> 0)")
	format := fs.String("format", "markdown", "json or markdown")
	plot := fs.String("plot", "", "also draw hit rate and TTFT p99 per policy into this PNG file")
	kvBlocks := fs.Int("kv-blocks", fleet.DefaultEngine.KVBlocks, "KV blocks per engine (16 tokens each): fewer means more evictions")
	loadFactor := fs.Float64("load-factor", 1.25, "affinity_load_factor, the bounded-load c of affinity, prefix_aware, precise_prefix and predicted_latency (≥ 1)")
	adm := fs.Bool("admission", false, "the router's admission queue on (one class, no busy threshold): under predicted_latency a request no engine is predicted to serve within --slo-ttft-ms waits in the gateway and is shed when that has passed")
	warmMin := fs.Int("warmup-min-bytes", config.DefaultPrefixWarmupMinBytes, "gateway.prefix_warmup_min_bytes: prefix warm-ups of prompts matched over at least this many rendered bytes (0: off)")
	restartEvery := fs.Duration("restart-every", 0, "restart one engine in turn every this much simulated time (at least 1ms), emptying its cache (0: never)")
	adapters := fs.Int("adapters", fleet.DefaultAdapters, fmt.Sprintf("--trace lora: the LoRA adapters, every engine serving all of them (1 to %d)", fleet.MaxAdapters))
	maxLoRAs := fs.Int("max-loras", fleet.DefaultMaxLoRAs, "--trace lora: each engine's GPU slots for adapters, as vLLM's --max-loras")
	swapMs := fs.Float64("lora-swap-ms", float64(fleet.DefaultLoRASwap)/float64(time.Millisecond), "--trace lora: what loading an adapter into a slot adds to its request's prefill, in ms (≥ 0)")
	kvEvents := fs.String("kv-events", fleet.KVEventsTL, "the KV events precise_prefix's engines publish: tl (tl.kv chunk ids) or vllm (vLLM's block events, keyed by token ids)")
	kvGap := fs.Float64("kv-gap", 0, fmt.Sprintf("--kv-events vllm: the fraction of event batches lost on their way (0 to %v)", fleet.MaxKVGap))
	kvReplay := fs.Bool("kv-replay", false, "--kv-events vllm: the gateway replays a gap's lost batches from the engine (else it keeps the worker's entries)")
	replicas := fs.String("replicas", "1", fmt.Sprintf("gateway replicas in front of the fleet (1 to %d), each a router of its own; a comma-separated list runs each", fleet.MaxReplicas))
	loadShare := fs.Duration("load-share", 100*time.Millisecond, fmt.Sprintf("--replicas over 1: how often each replica tells the others its in-flight requests per worker (0: they share nothing; else %v to %v)", fleet.MinLoadShare, fleet.MaxReportDelay))
	reportDelay := fs.Duration("report-delay", 0, fmt.Sprintf("how long an engine's heartbeat or KV event message takes to reach the replicas (0 to %v)", fleet.MaxReportDelay))
	peerLoad := fs.Bool("peer-load", true, "--replicas over 1: each replica counts the load its engines report beyond its own requests (false: blind to the other replicas' but for the engines' queues)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tlgw simulate: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	loads, ok := parseLoads(*load)
	if !ok {
		loads = nil
	}
	reps, ok := parseReplicas(*replicas)
	if !ok {
		reps = nil
	}
	switch {
	case *workers < 1:
		return bad("--workers must be at least 1, got %d", *workers)
	case *requests < 1:
		return bad("--requests must be at least 1, got %d", *requests)
	case len(loads) == 0:
		return bad("--load must be a positive fraction of capacity (or a comma-separated list of them), got %q", *load)
	case !(*slo > 0) || math.IsInf(*slo, 0):
		return bad("--slo-ttft-ms must be a positive number of milliseconds, got %v", *slo)
	case *format != "json" && *format != "markdown":
		return bad("--format must be json or markdown, got %q", *format)
	case *kvBlocks < 1:
		return bad("--kv-blocks must be at least 1, got %d", *kvBlocks)
	case !(*loadFactor >= 1) || math.IsInf(*loadFactor, 0):
		return bad("--load-factor must be at least 1, got %v", *loadFactor)
	case *warmMin < 0:
		return bad("--warmup-min-bytes must not be negative, got %d", *warmMin)
	case *restartEvery < 0:
		return bad("--restart-every must not be negative, got %v", *restartEvery)
	case !(*swapMs >= 0) || math.IsInf(*swapMs, 0):
		return bad("--lora-swap-ms must be a number of milliseconds, at least 0, got %v", *swapMs)
	case *adapters < 1:
		return bad("--adapters must be at least 1, got %d", *adapters)
	case *maxLoRAs < 1:
		return bad("--max-loras must be at least 1, got %d", *maxLoRAs)
	case *kvEvents != fleet.KVEventsTL && *kvEvents != fleet.KVEventsVLLM:
		return bad("--kv-events must be %s or %s, got %q", fleet.KVEventsTL, fleet.KVEventsVLLM, *kvEvents)
	case !(*kvGap >= 0 && *kvGap <= fleet.MaxKVGap):
		return bad("--kv-gap must be a fraction of batches from 0 to %v, got %v", fleet.MaxKVGap, *kvGap)
	case len(reps) == 0:
		return bad("--replicas must be 1 to %d (or a comma-separated list of such), got %q", fleet.MaxReplicas, *replicas)
	case *loadShare != 0 && (*loadShare < fleet.MinLoadShare || *loadShare > fleet.MaxReportDelay):
		return bad("--load-share must be 0 or %v to %v, got %v", fleet.MinLoadShare, fleet.MaxReportDelay, *loadShare)
	case *reportDelay < 0 || *reportDelay > fleet.MaxReportDelay:
		return bad("--report-delay must be 0 to %v, got %v", fleet.MaxReportDelay, *reportDelay)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *trace == fleet.TraceLoRA && !set["policies"] {
		*policies = strings.Join(fleet.LoRAPolicies, ",")
	}
	for _, name := range []string{"adapters", "max-loras", "lora-swap-ms"} {
		if set[name] && *trace != fleet.TraceLoRA {
			return bad("--%s is for --trace lora only", name)
		}
	}
	for _, name := range []string{"kv-gap", "kv-replay"} {
		if set[name] && *kvEvents != fleet.KVEventsVLLM {
			return bad("--%s is for --kv-events vllm only", name)
		}
	}
	var pols []string
	for _, p := range strings.Split(*policies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			pols = append(pols, p)
		}
	}
	if len(pols) == 0 {
		return bad("--policies names no policy")
	}
	o := fleet.Options{Trace: *trace, Workers: *workers, Requests: *requests, Load: loads[0], Policies: pols,
		Seed: *seed, Heterogeneous: *hetero, SLOTTFT: time.Duration(*slo * float64(time.Millisecond)),
		RestartEvery: *restartEvery, LoadFactor: *loadFactor, Admission: *adm, WarmupMinBytes: *warmMin,
		KVEvents: *kvEvents, KVGap: *kvGap, KVReplay: *kvReplay, ReportDelay: *reportDelay, NoPeerLoad: !*peerLoad,
		LoadShare: *loadShare}
	if *warmMin == 0 {
		o.WarmupMinBytes = -1
	}
	if *trace == fleet.TraceLoRA {
		o.Adapters, o.MaxLoRAs = *adapters, *maxLoRAs
		o.LoRASwap = time.Duration(*swapMs * float64(time.Millisecond))
		if o.LoRASwap == 0 {
			o.LoRASwap = -1 // none
		}
	}
	o.Engine = fleet.DefaultEngine
	o.Engine.KVBlocks = *kvBlocks
	for _, n := range reps { // every run is checked before the first starts
		for _, l := range loads {
			o.Load, o.Replicas = l, n
			if err := o.Validate(); err != nil {
				return bad("%v", err)
			}
		}
	}
	rep := &fleet.Report{}
	for _, n := range reps {
		o.Replicas = n
		r, err := fleet.Sweep(o, loads)
		if err != nil {
			fmt.Fprintf(stderr, "tlgw simulate: %v\n", err)
			return 1
		}
		rep.Results = append(rep.Results, r.Results...)
	}
	var err error
	if *format == "json" {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteMarkdown(stdout)
	}
	if err == nil && *plot != "" {
		err = writePlot(*plot, rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tlgw simulate: %v\n", err)
		return 1
	}
	return 0
}

func writePlot(path string, rep *fleet.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WritePNG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// maxLoads bounds a sweep's loads.
const maxLoads = 32

// parseReplicas reads --replicas: one count from 1 to fleet.MaxReplicas, or up to maxLoads of
// them separated by commas; ok is false for anything else.
func parseReplicas(s string) ([]int, bool) {
	parts := strings.Split(s, ",")
	if len(parts) > maxLoads {
		return nil, false
	}
	out := make([]int, 0, len(parts))
	for _, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || n > fleet.MaxReplicas {
			return nil, false
		}
		out = append(out, n)
	}
	return out, true
}

// parseLoads reads --load: one positive finite fraction, or up to maxLoads of them separated by
// commas (a rate sweep); ok is false for anything else.
func parseLoads(s string) ([]float64, bool) {
	parts := strings.Split(s, ",")
	if len(parts) > maxLoads {
		return nil, false
	}
	loads := make([]float64, 0, len(parts))
	for _, p := range parts {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(f > 0) || math.IsInf(f, 0) {
			return nil, false
		}
		loads = append(loads, f)
	}
	return loads, true
}
