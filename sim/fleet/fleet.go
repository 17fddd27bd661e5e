// Package fleet is `tlgw simulate` (SPEC R18.1): the router's real code — its policies, its
// prefix index and its pick path, driven through router.Sim — in front of N simulated engines
// on a fake clock, with no sockets, no sleeps and no actor system in the loop. It is a
// discrete-event simulation: arrivals (Poisson, at a fraction of the fleet's estimated
// capacity), request completions, engine heartbeats and in-flight samples are events in one
// time-ordered heap, and the simulated time jumps from one to the next.
//
// The engines are sim/engine's model (see EngineModel) over sim/kv's block pool and prefix
// cache, so a hit is what an engine's cache really held when the request ran, not what the
// router believed. They report to the router as heartbeats do (queue depth, running, KV free
// and total blocks) every Options.Heartbeat; the router's own in-flight counts move with every
// pick and release, as with real worker actors.
package fleet

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/sim/kv"
)

// Bounds on a simulation, so that a mistyped flag is an error and not a run that exhausts the
// machine's memory or never ends (measured on this project's 2-core machine: an engine holds
// about 150 KB, a KV block about 65 B, a request of the trace about 7 KB; events come every
// heartbeat per engine and every 100 ms over the simulated time, which a tiny load stretches).
const (
	MaxWorkers  = 10000     // the registry's default max_workers; about 1.5 GB
	MaxRequests = 1_000_000 // about 7 GB
	// MaxFleetKVBlocks bounds Workers × the engine's KVBlocks (about 2.2 GB); the default
	// engine allows MaxWorkers.
	MaxFleetKVBlocks = 1 << 25
	MinLoad, MaxLoad = 0.01, 100.0
	// MinHeartbeat and MinRestartEvery bound how often those events come.
	MinHeartbeat, MinRestartEvery = 10 * time.Millisecond, time.Millisecond
)

// Options are a simulation's inputs.
type Options struct {
	Trace    string   // one of Traces
	Workers  int      // engines in the fleet (1 to MaxWorkers)
	Requests int      // requests in the trace (1 to MaxRequests)
	Load     float64  // offered load as a fraction of the fleet's estimated capacity (MinLoad to MaxLoad)
	Policies []string // route policies to compare, each a run over the same trace and arrivals
	Seed     uint64
	// Heterogeneous: engines cycle through three kinds — half the KV and half the speed, the
	// default, twice the KV and twice the speed — instead of all being Engine.
	Heterogeneous bool
	SLOTTFT       time.Duration // the TTFT objective of slo_attainment (default 1 s)

	Engine    EngineModel   // default DefaultEngine
	Heartbeat time.Duration // engine report interval (default 2 s, the gateway's default T)
	// LoadFactor is affinity_load_factor (default 1.25); PrefixIndexBlocks sizes the
	// router's prefix index for prefix_aware and its exact index for precise_prefix (default
	// 4096, the config's default).
	LoadFactor        float64
	PrefixIndexBlocks int
	// WarmupMinBytes is gateway.prefix_warmup_min_bytes (0: the config's default, negative:
	// off): prefix warm-ups of the router (actors/router/warm.go), run as warm.go here says.
	WarmupMinBytes int
	// RestartEvery, when positive, restarts one engine (in turn) every RestartEvery of
	// simulated time: its prefix cache starts empty (precise.go).
	RestartEvery time.Duration
	// Admission turns the router's admission queue on as `[admission]` with one class and no
	// busy threshold (queue limit Requests, max wait AdmissionMaxWait): nothing waits for room,
	// and under predicted_latency a request that no engine is predicted to serve within its
	// objective waits in the gateway until one is, and is shed when its objective passes (R18.4).
	Admission bool
	// Parallel bounds the policies run at once (default GOMAXPROCS).
	Parallel int
	// The lora trace (R21): Adapters is its K (default DefaultAdapters), every engine serving
	// the base model and all of them; MaxLoRAs the GPU slots of each engine (default 4, as
	// tlengine's --max-loras); LoRASwap what loading an adapter into a slot adds to a
	// request's prefill (default 20 ms, as tlengine's --lora-swap-ms; negative: none).
	Adapters int
	MaxLoRAs int
	LoRASwap time.Duration
	// KVEvents is the format of the events precise_prefix's engines report (and
	// predicted_latency's, which reads the same index): KVEventsTL ("" too), tlengine's chunk
	// ids (precise.go), or KVEventsVLLM, a vLLM engine's own block events (vllm.go). On the
	// vLLM path KVGap (0 to MaxKVGap) is the fraction of event batches lost on their way, and
	// KVReplay whether the gateway replays a gap from the engine (else it clears the worker).
	KVEvents string
	KVGap    float64
	KVReplay bool
	// Replicas is the gateway's replicas in front of the fleet (replicas.go; 0 or 1: one
	// router), 1 to MaxReplicas; ReportDelay how long an engine's report (heartbeat, KV event
	// message) takes to reach them (0: at once, as before replicas were simulated), 0 to
	// MaxReportDelay.
	// With more than one replica each router counts the load its engines report beyond its own
	// picks (router.Config.PeerLoad) unless NoPeerLoad: the design before replicas were
	// measured, each replica blind to the others' requests but for the engines' queues.
	// LoadShare is how often each replica tells the others its own in-flight counts per worker
	// (router.ReplicaLoad, as adapters/replicaload does; 0: they share nothing), MinLoadShare to
	// MaxReportDelay.
	Replicas    int
	ReportDelay time.Duration
	NoPeerLoad  bool
	LoadShare   time.Duration
	// audit: tests check the engine model as the run goes (audit.go).
	audit bool
}

// Result is one policy's run (R18.1's fields first).
type Result struct {
	Policy        string  `json:"policy"`
	Load          float64 `json:"load"` // the offered load of its run (Options.Load)
	HitRate       float64 `json:"hit_rate"`
	TTFTP50Ms     float64 `json:"ttft_p50_ms"`
	TTFTP99Ms     float64 `json:"ttft_p99_ms"`
	TokensPerS    float64 `json:"tokens_per_s"`
	Imbalance     float64 `json:"imbalance"`
	SLOAttainment float64 `json:"slo_attainment"`
	QueueMeanMs   float64 `json:"queue_mean_ms"` // arrival to the start of prefill, mean
	TTFTMeanMs    float64 `json:"ttft_mean_ms"`
	Requests      int     `json:"requests"`
	Completed     int     `json:"completed"`
	Rejected      int     `json:"rejected"` // no worker, a prompt larger than its engine's KV, or shed by the admission queue
	Held          int     `json:"held"`     // requests that waited in the gateway's admission queue (Options.Admission)
	Warmups       int     `json:"warmups"`  // prefix warm-ups the router asked for and the engines ran (warm.go)
	// The lora trace: adapters loaded into a slot, in all and per 1,000 requests, and the
	// requests that waited for a slot (every slot's adapter had running requests). Adapters is
	// the trace's K (0 on the other traces).
	Adapters   int     `json:"adapters"`
	Swaps      int     `json:"swaps"`
	SwapsPer1k float64 `json:"swaps_per_1k"`
	LoRAWaits  int     `json:"lora_waits"`
	OfferedRPS float64 `json:"offered_rps"`
	// The vLLM event path (Options.KVEvents = "vllm"): event batches the engines published,
	// those lost on the way, the gaps the subscriber saw, how many it replayed and how many it
	// passed keeping the worker's entries, the clears (a tracker over its bound), and stored
	// events it could not key (their parent was lost).
	KVBatches  int     `json:"kv_batches,omitempty"`
	KVLost     int     `json:"kv_lost,omitempty"`
	KVGaps     int     `json:"kv_gaps,omitempty"`
	KVReplays  int     `json:"kv_replays,omitempty"`
	KVKept     int     `json:"kv_kept,omitempty"`
	KVClears   int     `json:"kv_clears,omitempty"`
	KVOrphans  int     `json:"kv_orphans,omitempty"`
	SimSeconds float64 `json:"sim_seconds"` // simulated time until the last request ended
	// Replicas is the run's gateway replicas when more than one (replicas.go), ReportDelayMs
	// the engines' reports' delay when not 0.
	Replicas      int     `json:"replicas,omitempty"`
	ReportDelayMs float64 `json:"report_delay_ms,omitempty"`
	// LoadShareMs is how often the replicas shared their load when they did (Options.LoadShare).
	LoadShareMs float64 `json:"load_share_ms,omitempty"`
}

// Report is a simulation's output: {"results": [...]}, one per policy in the order asked.
type Report struct {
	Results []Result `json:"results"`
}

// AdmissionMaxWait is the simulated class's max_wait (the config's default).
const AdmissionMaxWait = 30 * time.Second

// model is the one model every simulated engine serves.
const model = "sim"

// The lora trace's policies (R21): PolicyLoRA is the router's LoRA-aware pick
// (policy.PickLoRA); least_outstanding there is the adapter-unaware baseline
// (router.Config.LoRAUnaware), the least loaded of the workers serving the adapter.
const PolicyLoRA = "lora"

// LoRAPolicies are the policies a lora trace compares.
var LoRAPolicies = []string{"least_outstanding", PolicyLoRA}

// Bounds and defaults of the lora trace.
const (
	DefaultAdapters = 50
	MaxAdapters     = router.MaxLoRAAdapters
	DefaultLoRASwap = 20 * time.Millisecond
	DefaultMaxLoRAs = 4
)

// Validate checks o as Run will (after filling its defaults), naming what is wrong.
func (o Options) Validate() error { return o.defaults() }

func (o *Options) defaults() error {
	if o.Engine == (EngineModel{}) {
		o.Engine = DefaultEngine
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 2 * time.Second
	}
	if o.LoadFactor == 0 {
		o.LoadFactor = 1.25
	}
	if o.WarmupMinBytes == 0 {
		o.WarmupMinBytes = config.DefaultPrefixWarmupMinBytes
	}
	if o.PrefixIndexBlocks == 0 {
		o.PrefixIndexBlocks = prefixindex.DefaultBlocksPerWorker
	}
	if o.SLOTTFT == 0 {
		o.SLOTTFT = time.Second
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Parallel <= 0 {
		o.Parallel = runtime.GOMAXPROCS(0)
	}
	lora := o.Trace == TraceLoRA
	if lora && o.Adapters == 0 {
		o.Adapters = DefaultAdapters
	}
	if lora && o.MaxLoRAs == 0 {
		o.MaxLoRAs = DefaultMaxLoRAs
	}
	switch {
	case lora && o.LoRASwap == 0:
		o.LoRASwap = DefaultLoRASwap
	case o.LoRASwap < 0:
		o.LoRASwap = 0
	}
	switch {
	case !slices.Contains(Traces, o.Trace):
		return fmt.Errorf("unknown trace %q (known: %v)", o.Trace, Traces)
	case o.Workers < 1 || o.Workers > MaxWorkers:
		return fmt.Errorf("workers must be 1 to %d, got %d", MaxWorkers, o.Workers)
	case o.Requests < 1 || o.Requests > MaxRequests:
		return fmt.Errorf("requests must be 1 to %d, got %d", MaxRequests, o.Requests)
	case !(o.Load >= MinLoad && o.Load <= MaxLoad):
		return fmt.Errorf("load must be a fraction of capacity from %v to %v, got %v", MinLoad, MaxLoad, o.Load)
	case o.Heartbeat < MinHeartbeat:
		return fmt.Errorf("the heartbeat interval must be at least %v, got %v", MinHeartbeat, o.Heartbeat)
	case o.RestartEvery < 0 || (o.RestartEvery > 0 && o.RestartEvery < MinRestartEvery):
		return fmt.Errorf("engines restart every %v or more (or never: 0), got %v", MinRestartEvery, o.RestartEvery)
	case len(o.Policies) == 0:
		return errors.New("no policies")
	case o.SLOTTFT < 0:
		return fmt.Errorf("the TTFT objective must be positive, got %v", o.SLOTTFT)
	case !(o.LoadFactor >= 1) || math.IsInf(o.LoadFactor, 0):
		return fmt.Errorf("the load factor must be at least 1, got %v", o.LoadFactor)
	case o.PrefixIndexBlocks < 1:
		return fmt.Errorf("the prefix index must have at least 1 block per worker, got %d", o.PrefixIndexBlocks)
	case o.Engine.KVBlocks < 1 || o.Engine.BlockSize < 1 || o.Engine.MaxRunning < 1 ||
		o.Engine.PrefillPerToken < 0 || o.Engine.DecodePerToken < 0:
		return fmt.Errorf("bad engine model %+v", o.Engine)
	case o.Engine.KVBlocks > MaxFleetKVBlocks/o.Workers:
		return fmt.Errorf("%d engines of %d KV blocks are over the bound of %d blocks in all", o.Workers, o.Engine.KVBlocks, MaxFleetKVBlocks)
	case !lora && (o.Adapters != 0 || o.MaxLoRAs != 0):
		return fmt.Errorf("adapters and max_loras are the lora trace's, not %s's", o.Trace)
	case lora && (o.Adapters < 1 || o.Adapters > MaxAdapters):
		return fmt.Errorf("adapters must be 1 to %d, got %d", MaxAdapters, o.Adapters)
	case lora && (o.MaxLoRAs < 1 || o.MaxLoRAs > MaxAdapters):
		return fmt.Errorf("max_loras must be 1 to %d, got %d", MaxAdapters, o.MaxLoRAs)
	case o.KVEvents != "" && o.KVEvents != KVEventsTL && o.KVEvents != KVEventsVLLM:
		return fmt.Errorf("kv events must be %q or %q, got %q", KVEventsTL, KVEventsVLLM, o.KVEvents)
	case !(o.KVGap >= 0 && o.KVGap <= MaxKVGap):
		return fmt.Errorf("the kv event gap must be a fraction of batches from 0 to %v, got %v", MaxKVGap, o.KVGap)
	case o.KVEvents != KVEventsVLLM && (o.KVGap != 0 || o.KVReplay):
		return fmt.Errorf("a kv event gap and replay are the %q events' only", KVEventsVLLM)
	case o.Replicas < 1 || o.Replicas > MaxReplicas:
		return fmt.Errorf("replicas must be 1 to %d, got %d", MaxReplicas, o.Replicas)
	case o.ReportDelay < 0 || o.ReportDelay > MaxReportDelay:
		return fmt.Errorf("the report delay must be 0 to %v, got %v", MaxReportDelay, o.ReportDelay)
	case o.LoadShare != 0 && (o.LoadShare < MinLoadShare || o.LoadShare > MaxReportDelay):
		return fmt.Errorf("the load share interval must be 0 or %v to %v, got %v", MinLoadShare, MaxReportDelay, o.LoadShare)
	}
	for _, p := range o.Policies {
		switch {
		case lora && !slices.Contains(LoRAPolicies, p):
			// The router picks an adapter's worker by policy.PickLoRA whatever the route policy.
			return fmt.Errorf("the lora trace compares %v, not %q", LoRAPolicies, p)
		case !lora && p == PolicyLoRA:
			return fmt.Errorf("policy %q is the lora trace's only", p)
		case p == PolicyLoRA:
			continue
		}
		if _, err := policy.New(p, policy.Options{}); err != nil {
			return err
		}
	}
	return nil
}

// models is the fleet: engine i's model.
func (o *Options) models() []EngineModel {
	ms := make([]EngineModel, o.Workers)
	for i := range ms {
		ms[i] = o.Engine
		if o.Heterogeneous {
			switch i % 3 {
			case 0:
				ms[i] = o.Engine.scaled(0.5, 0.5)
			case 2:
				ms[i] = o.Engine.scaled(2, 2)
			}
		}
	}
	return ms
}

// capacity estimates the fleet's throughput in requests per second with no prefix cache:
// per engine, its concurrent requests (MaxRunning, or fewer when the trace's mean sequence
// does not fit that many times in its KV) over the mean service time (the whole prompt's
// prefill and the answer's decode).
func capacity(ms []EngineModel, tr *trace) float64 {
	var prompt, out float64
	for i := range tr.reqs {
		prompt += float64(tr.reqs[i].promptTokens())
		out += float64(tr.reqs[i].out.n)
	}
	prompt /= float64(len(tr.reqs))
	out /= float64(len(tr.reqs))
	total := 0.0
	for _, m := range ms {
		slots := min(float64(m.MaxRunning), float64(m.KVBlocks*m.BlockSize)/(prompt+out))
		slots = max(slots, 1)
		service := (prompt*float64(m.PrefillPerToken) + out*float64(m.DecodePerToken)) / float64(time.Second)
		if service <= 0 {
			service = 1e-9
		}
		total += slots / service
	}
	return total
}

// Run simulates every policy of o over one trace and one arrival sequence.
func Run(o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	tr, err := genTrace(o.Trace, o.Requests, o.Workers, o.Adapters, o.Seed)
	if err != nil {
		return nil, err
	}
	ms := o.models()
	rate := o.Load * capacity(ms, tr)
	arrivals := make([]int64, len(tr.reqs))
	r := rand.New(rand.NewPCG(o.Seed, 0x61727269766573)) // "arrives"
	at := 0.0
	for i := range arrivals {
		at += r.ExpFloat64() / rate
		arrivals[i] = int64(at * 1e9)
	}
	out := &Report{Results: make([]Result, len(o.Policies))}
	errs := make([]error, len(o.Policies))
	sem := make(chan struct{}, o.Parallel)
	var wg sync.WaitGroup
	for i, pol := range o.Policies {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			res, err := runPolicy(&o, ms, tr, arrivals, pol)
			out.Results[i], errs[i] = res, err
			out.Results[i].Load = o.Load
			if o.Replicas > 1 {
				out.Results[i].Replicas = o.Replicas
			}
			out.Results[i].ReportDelayMs = float64(o.ReportDelay) / float64(time.Millisecond)
			if o.Replicas > 1 {
				out.Results[i].LoadShareMs = float64(o.LoadShare) / float64(time.Millisecond)
			}
			if res.SimSeconds > 0 {
				out.Results[i].OfferedRPS = round(rate, 2)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// Sweep runs o at each of loads in turn (a rate sweep: the same trace, arrivals at each load):
// the results of every load, in order, each policy's as Run gives them.
func Sweep(o Options, loads []float64) (*Report, error) {
	if len(loads) == 0 {
		return nil, errors.New("no loads")
	}
	out := &Report{}
	for _, l := range loads {
		o.Load = l
		r, err := Run(o)
		if err != nil {
			return nil, err
		}
		out.Results = append(out.Results, r.Results...)
	}
	return out, nil
}

// Event kinds.
const (
	evArrive = iota // idx: the request
	evDone          // idx: the request
	evBeat          // idx: the engine
	evSample
	evRestart     // idx: the engine
	evFirst       // idx: the request; its first token, which predicted_latency's router hears of
	evWarmDone    // idx: the warm-up (warm.go)
	evReport      // the oldest report on its way reaches the replicas (replicas.go)
	evShare       // idx: the replica; it sends its load table to the others (replicas.go)
	evShareArrive // the oldest load table on its way reaches the other replicas
)

type event struct {
	at   int64 // ns since the start
	seq  uint64
	kind uint8
	idx  int32
}

// events is a min-heap by (at, seq): equal times in scheduling order, so a run is exact and
// repeatable.
type events struct {
	h   []event
	seq uint64
}

func (q *events) push(at int64, kind uint8, idx int32) {
	q.seq++
	q.h = append(q.h, event{at: at, seq: q.seq, kind: kind, idx: idx})
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

func (q *events) less(i, j int) bool {
	a, b := &q.h[i], &q.h[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (q *events) pop() event {
	top := q.h[0]
	last := len(q.h) - 1
	q.h[0] = q.h[last]
	q.h = q.h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= last {
			break
		}
		c := l
		if r := l + 1; r < last && q.less(r, l) {
			c = r
		}
		if !q.less(c, i) {
			break
		}
		q.h[i], q.h[c] = q.h[c], q.h[i]
		i = c
	}
	return top
}

// job is one request's life in a run.
type job struct {
	picked  *router.Picked
	seq     *kv.Seq
	pool    *kv.Pool // the engine's pool when it started (a restart replaces the engine's)
	eng     int32
	arrival int64
	start   int64
	cached  int32
	prompt  int32
	swapped bool // its adapter was loaded into a slot for it: the swap precedes its prefill
}

// runner is one policy's run.
type runner struct {
	o        *Options
	tr       *trace
	arrivals []int64
	sims     []*router.Sim // the gateway's replicas (replicas.go): request i's is sims[i mod len]
	engines  []*engine
	byID     map[string]int32
	jobs     []job
	q        events
	now      int64
	index    bool // a prefix index is on: picks carry the prompt's chunk hashes
	observe  bool // predicted_latency: the router hears each request's TTFT at its first token
	audit    *audit
	precise  bool       // precise_prefix: the engines report what they hold (precise.go)
	vllm     bool       // precise and Options.KVEvents = "vllm": in their own events (vllm.go)
	gap      *rand.Rand // the vLLM path's lost batches (Options.KVGap)
	kv       kvStats
	// pending is the engines' reports on their way to the replicas from pendHead on
	// (replicas.go): one Options.ReportDelay's worth.
	pending  []report
	pendHead int
	// shares is the replicas' load tables on their way to the others from shareHead on
	// (replicas.go): at most one per replica (shareTransit is far below an interval).
	shares    []share
	shareHead int

	toks   []uint32     // scratch: a prompt's tokens
	body   []byte       // scratch: a request body
	hashes []uint64     // scratch: a prompt's chunk hashes
	blocks []int        // scratch: the KV block carrying each chunk (precise.go)
	ready  []loraPlaced // scratch: requests an adapter's slot let go

	inFlight  int // requests picked and not yet done
	arrived   int
	ttft      []float64 // ms
	queueSum  float64   // ms
	outTokens int64
	rejected  int
	held      int
	loraWaits int // requests that waited for their adapter's slot
	lastDone  int64
	warms     []warmJob // prefix warm-ups (warm.go)
	warmLive  int       // warm-ups not yet ended
	maxSum    float64   // Σ over samples of the largest in-flight count
	meanSum   float64   // Σ over samples of the mean in-flight count
}

const sampleEvery = 100 * time.Millisecond

func runPolicy(o *Options, ms []EngineModel, tr *trace, arrivals []int64, pol string) (Result, error) {
	cfg := router.Config{Policy: pol, LoadFactor: o.LoadFactor, WarmupMinBytes: max(o.WarmupMinBytes, 0)}
	if o.Trace == TraceLoRA {
		// Every request names an adapter, so the route policy picks nothing: lora is the
		// router's own adapter pick, least_outstanding the same router blind to where adapters
		// are loaded.
		cfg.Policy, cfg.LoRAUnaware = "least_outstanding", pol != PolicyLoRA
	}
	// As the gateway's app: the approximate index is on for prefix_aware and predicted_latency;
	// precise_prefix and predicted_latency have the exact one, fed by the engines' events (every
	// simulated engine reports them).
	reads := policy.ReadsOf(cfg.Policy)
	index, precise := reads.PrefixIndex, reads.KVEvents
	if index {
		cfg.PrefixIndexBlocks = o.PrefixIndexBlocks
	}
	if precise {
		cfg.KVIndexBlocks = o.PrefixIndexBlocks
		index = true
	}
	cfg.PeerLoad = o.Replicas > 1 && !o.NoPeerLoad
	if o.Admission {
		cfg.Admission = &router.AdmissionConfig{PolicyName: pol, Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: len(tr.reqs), MaxWait: AdmissionMaxWait}},
			DefaultClass: "default"}}
	}
	sims := make([]*router.Sim, o.Replicas) // Options.Replicas, at most MaxReplicas
	for k := range sims {
		if o.Replicas > 1 {
			cfg.TieSalt = uint64(k) + 1 // each replica its own order among equally loaded workers, as with [cluster]
		}
		s, err := router.NewSim(cfg)
		if err != nil {
			return Result{}, err
		}
		sims[k] = s
	}
	r := &runner{o: o, tr: tr, arrivals: arrivals, sims: sims, index: index, precise: precise,
		observe: reads.TTFT, byID: make(map[string]int32, len(ms)),
		jobs: make([]job, len(tr.reqs)), ttft: make([]float64, 0, len(tr.reqs))}
	if o.audit {
		r.audit = &audit{order: make([][]int32, len(ms))}
	}
	if r.vllm = precise && o.KVEvents == KVEventsVLLM; r.vllm {
		r.gap = rand.New(rand.NewPCG(o.Seed, 0x6b76676170)) // "kvgap"
	}
	width := len(strconv.Itoa(len(ms) - 1))
	for i, m := range ms {
		id := fmt.Sprintf("w%0*d", width, i)
		r.engines = append(r.engines, newEngine(id, m))
		if r.vllm {
			r.engines[i].vk = &vllmKV{tr: vllmkv.NewTracker(kvMaxBlocks), needClear: true}
			r.engines[i].pool = r.newVLLMPool(int32(i))
		}
		if len(tr.adapters) > 0 {
			r.engines[i].lora = newLoRASlots(o.MaxLoRAs)
		}
		r.watch(int32(i))
		r.byID[id] = int32(i)
		r.beat(int32(i), true)
		// Heartbeats are spread over the interval, as independent engines' are.
		r.q.push(int64(o.Heartbeat)*int64(i+1)/int64(len(ms)), evBeat, int32(i))
	}
	r.q.push(arrivals[0], evArrive, 0)
	if len(r.sims) > 1 && o.LoadShare > 0 {
		for k := range r.sims {
			// The replicas' ticks are spread over the interval, as independent processes' are.
			r.q.push(int64(o.LoadShare)*int64(k+1)/int64(len(r.sims)), evShare, int32(k))
		}
	}
	if o.RestartEvery > 0 {
		r.q.push(int64(o.RestartEvery), evRestart, 0)
	}
	r.q.push(int64(sampleEvery), evSample, 0)
	for len(r.q.h) > 0 {
		ev := r.q.pop()
		r.now = ev.at
		for _, s := range sims {
			s.AdvanceTo(router.SimStart.Add(time.Duration(ev.at)))
		}
		r.dispatched() // the queue's timers: expiries
		switch ev.kind {
		case evArrive:
			r.arrive(ev.idx)
			if next := int(ev.idx) + 1; next < len(arrivals) {
				r.q.push(arrivals[next], evArrive, int32(next))
			}
		case evDone:
			r.done(ev.idx)
		case evWarmDone:
			r.warmDone(ev.idx)
		case evFirst:
			j := &r.jobs[ev.idx]
			r.routerOf(ev.idx).ObserveTTFT(j.picked, time.Duration(r.now-j.arrival))
		case evBeat:
			if r.busy() {
				r.beat(ev.idx, false)
				r.q.push(r.now+int64(o.Heartbeat), evBeat, ev.idx)
			}
		case evRestart:
			r.restart(ev.idx)
			if r.arrived < len(arrivals) {
				r.q.push(r.now+int64(o.RestartEvery), evRestart, (ev.idx+1)%int32(len(ms)))
			}
		case evReport:
			r.reportArrived()
		case evShare:
			if r.busy() {
				r.share(ev.idx)
				r.q.push(r.now+int64(o.LoadShare), evShare, ev.idx)
			}
		case evShareArrive:
			r.shareArrived()
		case evSample:
			r.sample()
			if r.arrived < len(arrivals) {
				r.q.push(r.now+int64(sampleEvery), evSample, 0)
			}
		}
		r.dispatched() // what the event released or taught the router
	}
	// Every pick was released: a request the router still counts would have skewed every pick
	// after it. And every request ended: it completed or was rejected, and no engine still
	// runs or queues one.
	for _, e := range r.engines {
		for k, s := range sims {
			if n := s.InFlight(e.id); n != 0 {
				return Result{}, fmt.Errorf("%s: router %d still counts %d requests in flight on %s after the run", pol, k, n, e.id)
			}
		}
		if e.run != 0 || e.queued() != 0 {
			return Result{}, fmt.Errorf("%s: %s still runs %d and queues %d requests after the run", pol, e.id, e.run, e.queued())
		}
	}
	if r.warmLive != 0 {
		return Result{}, fmt.Errorf("%s: %d warm-ups still run after the run", pol, r.warmLive)
	}
	if ended := len(r.ttft) + r.rejected; r.inFlight != 0 || ended != len(tr.reqs) {
		return Result{}, fmt.Errorf("%s: %d of %d requests ended (%d counted in flight) after the run", pol, ended, len(tr.reqs), r.inFlight)
	}
	if r.audit != nil && len(r.audit.faults) > 0 {
		return Result{}, fmt.Errorf("%s: the engine model was broken %d times, first: %s", pol, len(r.audit.faults), r.audit.faults[0])
	}
	return r.result(pol), nil
}

func (r *runner) busy() bool { return r.arrived < len(r.arrivals) || r.inFlight > 0 }

// beat is engine i's heartbeat: its queue, running set and KV blocks, and as tlengine's the
// adapters it serves and its max_loras (not which are running: that only a scraped vLLM
// tells, so the router's belief is what it sent). It reaches every replica, at once when now
// (the first registration) or else after the report delay.
func (r *runner) beat(i int32, now bool) {
	e := r.engines[i]
	st := e.pool.Stats()
	info := router.WorkerInfo{ID: e.id, Model: model, HTTPAddress: "sim:" + e.id,
		QueueDepth: int64(e.queued()), Running: int64(e.run), KVFreeBlocks: int64(st.FreeBlocks),
		KVTotalBlocks: int64(st.TotalBlocks), BlockSize: int64(e.model.BlockSize), KVEvents: true}
	if r.vllm {
		// A vLLM engine serves no tl.kv stream: it publishes its own events (vllm.go).
		info.KVEvents, info.KVEventsEndpoint = false, "tcp://"+e.id+".sim:5557"
	}
	if e.lora != nil {
		info.LoRAAdapters, info.MaxLoRAs = r.tr.adapters, e.lora.max // read-only, shared
	}
	r.toRouters(info, now)
}

// prompt fills r.toks with request i's prompt tokens.
func (r *runner) prompt(i int32) []uint32 {
	r.toks = r.toks[:0]
	for _, m := range r.tr.reqs[i].msgs {
		r.toks = appendTokens(r.toks, r.o.Seed, m)
	}
	return r.toks
}

// chatBody writes a chat body of msgs; all: every message, else only as much as the prefix
// key (R4, the rendered prompt's first 64 bytes) reads, which gives the same key.
func chatBody(dst []byte, seed uint64, msgs []message, all bool) []byte {
	dst = append(dst[:0], `{"model":"`+model+`","messages":[`...)
	rendered := 0
	for k, m := range msgs {
		if !all && rendered >= oai.PrefixLen {
			break
		}
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"role":"`...)
		dst = append(dst, roleNames[m.role]...)
		dst = append(dst, `","content":"`...)
		if !all {
			// The key reads 64 rendered bytes: a long message's first tokens give the same key.
			m.n = min(m.n, int32((oai.PrefixLen-rendered)/4+1))
		}
		dst = appendContent(dst, seed, m)
		dst = append(dst, `"}`...)
		rendered += len(roleNames[m.role]) + 1 + 4*int(m.n) + 1
	}
	return append(dst, "]}"...)
}

// pick builds request i's Pick as the request actor does (actors/request: pick): the prefix
// key's hash from the parsed body, and with the prefix index on the chunk hashes of the whole
// rendered prompt.
func (r *runner) pick(i int32) (*router.Picked, error) {
	req := &r.tr.reqs[i]
	r.body = chatBody(r.body, r.o.Seed, req.msgs, r.index)
	key, err := oai.PrefixKey(oai.Chat, r.body)
	if err != nil {
		return nil, err
	}
	name := model
	if req.lora > 0 {
		name = r.tr.adapters[req.lora-1]
	}
	p := &router.Pick{Model: name, RequestID: strconv.Itoa(int(i)), Key: uint64(i) + 1,
		PrefixHash: xxhash.Sum64(key), Tag: uint64(i) + 1, SLOTTFTMs: r.o.SLOTTFT.Milliseconds()}
	if r.index {
		rendered := oai.RenderPrompt(oai.Chat, r.body, len(r.body))
		r.hashes = prefixindex.Hashes(r.hashes, rendered)
		p.PrefixHashes = r.hashes
	}
	if r.vllm {
		// The prompt as the engine tokenizes it (its render endpoint's answer).
		p.TokenIDs = r.prompt(i)
	}
	if r.o.Admission {
		// An admitted pick, as the request actor makes it: the router keeps it while it waits.
		p.PrefixHashes = slices.Clone(p.PrefixHashes)
		p.TokenIDs = slices.Clone(p.TokenIDs)
		p.Requester = actor.NewPID("sim", "request/"+p.RequestID)
		p.Admit = &router.AdmitInfo{PromptTokens: r.tr.reqs[i].promptTokens()}
	}
	pk, ok := r.routerOf(i).Pick(p)
	if !ok && !r.o.Admission {
		return nil, errors.New("queued without admission")
	}
	return pk, nil // nil: it waits in the queue
}

func (r *runner) arrive(i int32) {
	r.arrived++
	r.jobs[i].arrival = r.now
	pk, err := r.pick(i)
	if err != nil {
		panic(fmt.Sprintf("fleet: request %d: %v", i, err)) // a bug in the simulator
	}
	if pk == nil {
		r.inFlight++ // waiting in the gateway (dispatched)
		r.held++
		return
	}
	r.place(i, pk)
}

// dispatched places the requests the admission queue answered since the last call: a pick
// goes to its engine, a rejection (shed) is counted.
func (r *runner) dispatched() {
	if !r.o.Admission {
		return
	}
	for _, s := range r.sims {
		for _, d := range s.Deliveries() {
			pk, ok := d.Msg.(*router.Picked)
			if !ok || pk.Tag == 0 || pk.Tag > uint64(len(r.jobs)) {
				continue
			}
			r.inFlight--
			r.place(int32(pk.Tag-1), pk)
		}
	}
}

// place sends picked request i to its engine: it runs at once or waits in the engine's queue.
func (r *runner) place(i int32, pk *router.Picked) {
	if pk.Err != nil {
		r.rejected++
		return
	}
	if pk.Warm != nil {
		defer r.warmup(i, pk.Warm)
	}
	j := &r.jobs[i]
	j.picked, j.eng = pk, r.byID[pk.WorkerID]
	e := r.engines[j.eng]
	prompt := r.prompt(i)
	j.prompt = int32(len(prompt))
	if !e.fits(len(prompt)) {
		r.rejected++
		r.routerOf(i).Release(pk, router.OutcomeNone)
		r.finished(i, true)
		return
	}
	r.inFlight++
	if a := r.tr.reqs[i].lora - 1; a >= 0 {
		ok, swapped := e.lora.place(a)
		if !ok {
			e.lora.waiting = append(e.lora.waiting, i)
			r.loraWaits++
			return
		}
		j.swapped = swapped
	}
	r.schedule(i)
}

// schedule hands request i (with its adapter's slot, if it names one) to its engine's
// scheduler: it runs at once or waits in the queue.
func (r *runner) schedule(i int32) {
	j := &r.jobs[i]
	e := r.engines[j.eng]
	r.audit.placed(j.eng, i)
	if e.waiting() == 0 {
		seq, cached, ok := e.tryStart(r.prompt(i))
		r.flushKV(j.eng)
		if ok {
			r.start(i, seq, cached)
			return
		}
	}
	e.queue = append(e.queue, i)
}

// start runs request i: its first token after the uncached prompt's prefill, its end after
// the answer's decode.
func (r *runner) start(i int32, seq *kv.Seq, cached int) {
	j := &r.jobs[i]
	e := r.engines[j.eng]
	m := e.model
	j.seq, j.pool, j.start, j.cached = seq, e.pool, r.now, int32(cached)
	r.audit.started(j.eng, i)
	r.tag(i, j.eng, seq)
	prefill := int64(int(j.prompt)-cached) * int64(m.PrefillPerToken)
	if j.swapped {
		prefill += int64(r.o.LoRASwap)
	}
	first := r.now + prefill
	r.ttft = append(r.ttft, float64(first-j.arrival)/1e6)
	r.queueSum += float64(r.now-j.arrival) / 1e6
	out := r.tr.reqs[i].out
	if r.observe {
		r.q.push(first, evFirst, i)
	}
	r.q.push(first+int64(out.n)*int64(m.DecodePerToken), evDone, i)
}

func (r *runner) done(i int32) {
	j := &r.jobs[i]
	e := r.engines[j.eng]
	out := r.tr.reqs[i].out
	r.toks = appendTokens(r.toks[:0], r.o.Seed, out)
	e.finish(j.pool, j.seq, r.toks)
	r.flushKV(j.eng)
	j.seq, j.pool = nil, nil
	r.outTokens += int64(out.n)
	r.lastDone = r.now
	r.inFlight--
	r.routerOf(i).Release(j.picked, router.OutcomeSuccess)
	r.finished(i, false)
	j.picked = nil
	if a := r.tr.reqs[i].lora - 1; a >= 0 {
		e.lora.release(a)
		r.ready = e.lora.ready(r.ready[:0], func(w int32) int32 { return r.tr.reqs[w].lora - 1 })
		for _, p := range r.ready {
			r.jobs[p.job].swapped = p.swapped
			r.schedule(p.job)
		}
	}
	r.drain(j.eng)
}

// drain starts engine eng's queued requests and warm-ups, in order, while it has room.
func (r *runner) drain(eng int32) {
	e := r.engines[eng]
	for e.waiting() > 0 {
		h := e.queue[e.head]
		var prompt []uint32
		if h >= 0 {
			prompt = r.prompt(h)
		} else {
			prompt = r.warms[^h].toks
		}
		seq, cached, ok := e.tryStart(prompt)
		r.flushKV(eng)
		if !ok {
			break
		}
		e.head++
		if h >= 0 {
			r.start(h, seq, cached)
		} else {
			r.startWarm(^h, seq, cached)
		}
	}
	if e.head > 64 && 2*e.head > len(e.queue) {
		e.queue = append(e.queue[:0], e.queue[e.head:]...)
		e.head = 0
	}
}

// finished tells the admission queue request i ended, as its request actor does.
func (r *runner) finished(i int32, aborted bool) {
	if r.o.Admission {
		req := &r.tr.reqs[i]
		r.routerOf(i).Finished(&router.Finished{Key: uint64(i) + 1, Tokens: int64(req.promptTokens()) + int64(req.out.n), Aborted: aborted})
	}
}

// sample records the largest and the mean in-flight count over the engines. Imbalance is the
// ratio of their sums over the samples (time averages, every sampleEvery until the last
// arrival), not the mean of per-sample ratios, which the first moments of a run — a handful of
// requests over many engines, max/mean = n/k — would dominate.
func (r *runner) sample() {
	sum, mx := 0, 0
	for _, e := range r.engines {
		n := e.inFlight()
		sum += n
		mx = max(mx, n)
	}
	r.maxSum += float64(mx)
	r.meanSum += float64(sum) / float64(len(r.engines))
}

func (r *runner) result(pol string) Result {
	res := Result{Policy: pol, Requests: len(r.tr.reqs), Completed: len(r.ttft), Rejected: r.rejected, Held: r.held,
		Warmups: len(r.warms)}
	var hit, look uint64
	for _, e := range r.engines {
		st := e.pool.Stats()
		hit += st.HitTokens + e.oldHit
		look += st.LookupTokens + e.oldLook
	}
	if look > 0 {
		res.HitRate = round(float64(hit)/float64(look), 4)
	}
	if n := len(r.ttft); n > 0 {
		sorted := slices.Clone(r.ttft)
		slices.Sort(sorted)
		res.TTFTP50Ms = round(percentile(sorted, 0.50), 2)
		res.TTFTP99Ms = round(percentile(sorted, 0.99), 2)
		sum, met := 0.0, 0
		slo := float64(r.o.SLOTTFT) / 1e6
		for _, v := range sorted {
			sum += v
			if v <= slo {
				met++
			}
		}
		res.TTFTMeanMs = round(sum/float64(n), 2)
		res.QueueMeanMs = round(r.queueSum/float64(n), 2)
		res.SLOAttainment = round(float64(met)/float64(len(r.tr.reqs)), 4)
	}
	if r.lastDone > 0 {
		res.SimSeconds = round(float64(r.lastDone)/1e9, 3)
		res.TokensPerS = round(float64(r.outTokens)/(float64(r.lastDone)/1e9), 1)
	}
	if r.meanSum > 0 {
		res.Imbalance = round(r.maxSum/r.meanSum, 3)
	}
	res.Adapters, res.LoRAWaits = len(r.tr.adapters), r.loraWaits
	for _, e := range r.engines {
		if e.lora != nil {
			res.Swaps += e.lora.swaps
		}
	}
	res.SwapsPer1k = round(float64(res.Swaps)*1000/float64(len(r.tr.reqs)), 2)
	k := r.kv
	res.KVBatches, res.KVLost, res.KVGaps, res.KVReplays, res.KVKept, res.KVClears, res.KVOrphans =
		k.batches, k.lost, k.gaps, k.replays, k.kept, k.clears, k.orphans
	return res
}

// percentile is the nearest-rank q-quantile of sorted.
func percentile(sorted []float64, q float64) float64 {
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

func round(x float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(x*p) / p
}
