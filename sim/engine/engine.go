// Package engine is tlengine, the simulated inference engine (SPEC R12): OpenAI completions
// and chat over HTTP with deterministic sampling, a paged KV pool with a prefix cache, a
// running set with a queue behind it, a timing model, heartbeats to gateways, Prometheus
// metrics, and fault switches. It behaves like an engine for the gateway's purposes; it is
// what `tlgw demo`, the end-to-end tests and the benchmarks run.
//
// Disaggregated serving (SPEC R8): a prefill (or unified) engine serves EngineControl.Prefill
// on its gRPC address and pushes the prompt's KV to a decode worker; a decode (or unified)
// engine serves KvTransferService (Push, Release) on its KV address, holds pushed KV under
// leased handles, and resumes a request that names one in X-TL-KV-Handle.
//
// KV events (SPEC R18.3): every engine serves KvEvents/Subscribe on its gRPC address, streaming
// which of the gateway's prompt chunk ids its prefix cache holds (kvevents.go), and says so in
// its heartbeats (kv_events).
//
// Concurrency: each request runs on its HTTP handler (or gRPC) goroutine; the shared state (KV
// pool, running set, queue) sits behind one mutex in the scheduler; KV handles sit behind their
// own mutex, taken before the scheduler's, never inside it; the KV events hub's mutex is taken
// inside the scheduler's (events are published in the pool's order). The simulator is a stand-in for
// a GPU process, not part of the gateway's actor system.
package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/sim/faults"
	"github.com/tlgw/tlgw/sim/kvpub"
)

// Role is the engine's serving role.
type Role string

// Roles (SPEC B1).
const (
	RoleUnified Role = "unified"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// MaxBlockSize is the largest --block-size: the gateway refuses a heartbeat whose block_size
// is over 1 << 20 tokens (adapters/grpc.MaxBlockSize).
const MaxBlockSize = 1 << 20

// Config is one engine's configuration (tlengine's flags).
type Config struct {
	ID, Model       string
	Role            Role
	HTTPListen      string // each accepts port 0
	GRPCListen      string
	KVListen        string
	Gateways        []string // registries to heartbeat, host:port or dns:///name:port; empty = none
	KVBlocks        int      // default 1024
	BlockSize       int      // tokens per KV block, default 16, at most MaxBlockSize
	MaxRunning      int      // default 256
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	Fault           faults.Fault
	// HeartbeatInterval is T until a gateway's ack says otherwise (default 2 s).
	HeartbeatInterval time.Duration
	// KVLease is how long a decode engine holds pushed KV that no request has consumed and
	// nobody has released (--kv-lease, default 60 s, on Clock); then the handle is freed.
	KVLease time.Duration
	Clock   clock.Clock
	Logger  *slog.Logger
	// Exit ends the process for the crash-after fault (default os.Exit).
	Exit func(code int)
	// RegistryAuth is how heartbeats authenticate to the gateways' registry (R13.1).
	RegistryAuth RegistryAuth
	// Resolver answers dns:/// gateway names (default net.DefaultResolver); ResolveInterval is
	// how often they are looked up again, on Clock (default 30 s).
	Resolver        Resolver
	ResolveInterval time.Duration
	// Endpoints are the serving endpoints served (--endpoints, names of AllEndpoints); empty
	// is all of them. Another endpoint's paths answer 404 as an unknown path does.
	Endpoints []string
	// LoRAs are the adapters served besides the base model (--lora), at most MaxLoRAAdapters.
	LoRAs []LoRA
	// MaxLoRAs is the GPU slots for adapters: how many adapters' requests run at once
	// (--max-loras, default 4).
	MaxLoRAs int
	// LoRASwap is the cost of loading an adapter into a slot, on Clock, added to that
	// request's time to first token (--lora-swap-ms, default 20 ms; negative: none).
	LoRASwap time.Duration
	// AllowRuntimeLoRA serves POST /v1/load_lora_adapter and /v1/unload_lora_adapter
	// (--allow-runtime-lora); without it they answer 404 as an unknown path does.
	AllowRuntimeLoRA bool
	// KVEvents publishes vLLM-format KV-cache events over ZMQ (--kv-events, R22; zmqevents.go).
	KVEvents KVEventsConfig
	// PD is the disaggregation protocol spoken besides EngineControl (R22, pd.go): "tl"
	// (default: ours only), "vllm" (kv_transfer_params) or "sglang" (bootstrap rooms).
	PD string
	// BootstrapPort is the side channel's port under vllm or sglang on a prefill or unified
	// engine (--bootstrap-port, 8998 by default there; 0 here binds any port).
	BootstrapPort int
	// PDTimeout bounds a decode's wait for its KV: a bootstrap room's prefill, the fetch
	// (--pd-timeout, default 30 s).
	PDTimeout time.Duration
	// OTLPEndpoint exports a tlengine.request span per served HTTP request over OTLP/gRPC,
	// plaintext, to host:port (--otlp-endpoint; "" is off: no span and no exporter goroutine).
	OTLPEndpoint string
	// SpanExporter, when set, receives those spans instead of an OTLP exporter (tests).
	SpanExporter sdktrace.SpanExporter
}

// Engine is a running simulated engine.
type Engine struct {
	cfg   Config
	sched *scheduler
	met   *metrics
	log   *slog.Logger

	HTTPAddr string // the real bound addresses
	GRPCAddr string
	KVAddr   string
	// BootstrapAddr is the PD side channel's address ("" when it does not run, pd.go).
	BootstrapAddr string
	bootSrv       *http.Server
	pdt           *pdTable // KV held for remote decodes, rooms waited on (pd.go)
	// advertisedHTTP is what heartbeats report: HTTPAddr, or a dead address under --fault refuse.
	advertisedHTTP string

	httpSrv   *http.Server
	grpcSrv   *grpc.Server
	kvSrv     *grpc.Server
	drainAcks atomic.Int32     // gateways whose latest ack asks us to drain
	handles   handles          // pushed KV held for disaggregated decode
	kvev      *kvEvents        // KvEvents subscribers and sequence numbers (R18.3)
	zpub      *kvpub.Publisher // vLLM-format KV events over ZMQ (R22); nil when off
	sent      atomic.Int64
	stop      chan struct{}
	// stopCtx ends when stop closes: it cuts heartbeats and lookups in flight.
	stopCtx    context.Context
	cancelStop context.CancelFunc
	gateways   []gatewayEntry  // parsed Config.Gateways, each once
	serves     map[string]bool // the served endpoints (Config.Endpoints)
	loras      *loras
	responses  *responseStore // stored /v1/responses answers
	tps        traceparents   // the latest received traceparents (R24, tracing.go)
	// tp and tracer export the spans of served requests; both nil when spans are off.
	tp      *sdktrace.TracerProvider
	tracer  trace.Tracer
	hb      heartbeatLoops
	wg      sync.WaitGroup
	closeMu sync.Once
}

func (c *Config) defaults() error {
	if c.ID == "" || c.Model == "" {
		return errors.New("engine: --id and --model are required")
	}
	switch c.Role {
	case "":
		c.Role = RoleUnified
	case RoleUnified, RolePrefill, RoleDecode:
	default:
		return fmt.Errorf("engine: --role %q: want unified, prefill or decode", c.Role)
	}
	if c.KVBlocks == 0 {
		c.KVBlocks = 1024
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = 256
	}
	if c.KVBlocks < 1 || c.BlockSize < 1 || c.MaxRunning < 1 {
		return errors.New("engine: --kv-blocks, --block-size and --max-running must be positive")
	}
	if c.BlockSize > MaxBlockSize {
		return fmt.Errorf("engine: --block-size %d is over %d (a gateway refuses such a heartbeat)", c.BlockSize, MaxBlockSize)
	}
	if c.PrefillPerToken < 0 || c.DecodePerToken < 0 {
		return errors.New("engine: per-token costs must not be negative")
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 2 * time.Second
	}
	switch {
	case c.KVLease == 0:
		c.KVLease = 60 * time.Second
	case c.KVLease < 0:
		return errors.New("engine: --kv-lease must be positive")
	}
	switch {
	case c.ResolveInterval == 0:
		c.ResolveInterval = 30 * time.Second
	case c.ResolveInterval < 0:
		return errors.New("engine: the gateway resolve interval must be positive")
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if len(c.Endpoints) == 0 {
		c.Endpoints = AllEndpoints
	}
	for _, n := range c.Endpoints {
		if !isEndpoint(n) {
			return fmt.Errorf("engine: --endpoints: unknown endpoint %q", n)
		}
	}
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = 4
	}
	if c.MaxLoRAs < 1 || c.MaxLoRAs > MaxLoRAAdapters {
		return fmt.Errorf("engine: --max-loras %d: want 1 to %d", c.MaxLoRAs, MaxLoRAAdapters)
	}
	switch {
	case c.LoRASwap == 0:
		c.LoRASwap = 20 * time.Millisecond
	case c.LoRASwap < 0:
		c.LoRASwap = 0
	}
	if len(c.LoRAs) > MaxLoRAAdapters {
		return fmt.Errorf("engine: --lora: %d adapters, at most %d", len(c.LoRAs), MaxLoRAAdapters)
	}
	names := make(map[string]bool, len(c.LoRAs))
	for _, l := range c.LoRAs {
		if err := checkLoRA(l, c.Model); err != nil {
			return fmt.Errorf("engine: --lora: %w", err)
		}
		if names[l.Name] {
			return fmt.Errorf("engine: --lora: the adapter %q is named twice", l.Name)
		}
		names[l.Name] = true
	}
	if err := c.checkKVEvents(); err != nil {
		return err
	}
	if err := c.checkPDConfig(); err != nil {
		return err
	}
	if err := c.checkOTLPEndpoint(); err != nil {
		return err
	}
	if c.HTTPListen == "" {
		c.HTTPListen = "127.0.0.1:0"
	}
	if c.GRPCListen == "" {
		c.GRPCListen = "127.0.0.1:0"
	}
	if c.KVListen == "" {
		c.KVListen = "127.0.0.1:0"
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Exit == nil {
		c.Exit = os.Exit
	}
	return nil
}

// Start binds the three listeners, starts serving and heartbeating.
func Start(cfg Config) (*Engine, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	gateways, err := parseGateways(cfg.Gateways)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		gateways:  gateways,
		hb:        heartbeatLoops{loops: make(map[string]*runningLoop)},
		cfg:       cfg,
		sched:     newScheduler(cfg.newPool(), cfg.MaxRunning),
		log:       cfg.Logger.With("engine", cfg.ID),
		stop:      make(chan struct{}),
		handles:   handles{m: make(map[string]*kvHandle)},
		kvev:      newKVEvents(),
		serves:    make(map[string]bool),
		loras:     newLoRAs(cfg.Clock, cfg.MaxLoRAs, cfg.LoRASwap, cfg.LoRAs),
		responses: newResponseStore(maxStoredResponses, maxStoredResponseBytes),
		pdt:       newPDTable(),
	}
	for _, n := range cfg.Endpoints {
		e.serves[n] = true
	}
	e.sched.pool.OnUntag(func(ids []uint64) { e.kvev.publish(kvv1.KvEvent_REMOVED, ids) })
	e.met = newMetrics(e)
	var lis [3]net.Listener
	for i, addr := range []string{cfg.HTTPListen, cfg.GRPCListen, cfg.KVListen} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			for _, open := range lis[:i] {
				open.Close()
			}
			return nil, fmt.Errorf("engine: listen %s: %w", addr, err)
		}
		lis[i] = l
	}
	e.HTTPAddr, e.GRPCAddr, e.KVAddr = lis[0].Addr().String(), lis[1].Addr().String(), lis[2].Addr().String()
	e.advertisedHTTP = e.HTTPAddr
	if cfg.Fault.Kind == faults.Refuse {
		dead, err := deadAddress()
		if err != nil {
			for _, l := range lis {
				l.Close()
			}
			return nil, err
		}
		e.advertisedHTTP = dead
	}
	boot, err := e.startSideChannel(e.HTTPAddr)
	if err != nil {
		for _, l := range lis {
			l.Close()
		}
		return nil, err
	}
	if err := e.startZMQEvents(); err != nil {
		for _, l := range lis {
			l.Close()
		}
		if boot != nil {
			boot.Close()
		}
		return nil, err
	}
	if e.tp, err = newTracerProvider(&cfg); err != nil {
		for _, l := range lis {
			l.Close()
		}
		if boot != nil {
			boot.Close()
		}
		if e.zpub != nil {
			e.zpub.Close()
		}
		return nil, err
	}
	if e.tp != nil {
		e.tracer = e.tp.Tracer("github.com/tlgw/tlgw/sim/engine")
	}
	e.stopCtx, e.cancelStop = context.WithCancel(context.Background())

	e.httpSrv = &http.Server{Handler: e.routes(), ReadHeaderTimeout: 10 * time.Second}
	// Both gRPC listeners serve the health service. EngineControl runs on prefill and unified
	// engines, KvTransferService on decode and unified ones; the other role's calls answer
	// Unimplemented. KvEvents (R18.3) runs on every engine's gRPC listener. Unary calls' traceparents
	// are recorded (R24).
	e.grpcSrv, e.kvSrv = grpc.NewServer(grpc.UnaryInterceptor(e.recordUnary)), grpc.NewServer(grpc.UnaryInterceptor(e.recordUnary))
	for _, s := range []*grpc.Server{e.grpcSrv, e.kvSrv} {
		hs := health.NewServer()
		healthpb.RegisterHealthServer(s, hs)
	}
	kvv1.RegisterKvEventsServer(e.grpcSrv, kvEventsServer{e: e})
	if cfg.Role != RoleDecode {
		enginev1.RegisterEngineControlServer(e.grpcSrv, controlServer{e: e})
	}
	if cfg.Role != RolePrefill {
		kvv1.RegisterKvTransferServiceServer(e.kvSrv, kvServer{e: e})
	}
	e.wg.Add(3)
	go func() { defer e.wg.Done(); _ = e.httpSrv.Serve(lis[0]) }()
	go func() { defer e.wg.Done(); _ = e.grpcSrv.Serve(lis[1]) }()
	go func() { defer e.wg.Done(); _ = e.kvSrv.Serve(lis[2]) }()
	if boot != nil {
		e.bootSrv = &http.Server{Handler: e.sideChannel(), ReadHeaderTimeout: 10 * time.Second}
		e.wg.Add(1)
		go func() { defer e.wg.Done(); _ = e.bootSrv.Serve(boot) }()
	}
	if len(cfg.Gateways) > 0 && cfg.Fault.Kind != faults.NoHeartbeat {
		e.startHeartbeats()
	}
	return e, nil
}

// deadAddress returns a loopback address nobody listens on (bound, then closed).
func deadAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// Close stops heartbeating and serving; in-flight requests are cut.
func (e *Engine) Close() {
	e.closeMu.Do(func() {
		close(e.stop)
		e.cancelStop()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := e.httpSrv.Shutdown(ctx); err != nil {
			_ = e.httpSrv.Close()
		}
		if e.bootSrv != nil {
			_ = e.bootSrv.Close() // its waits end on e.stop
		}
		e.grpcSrv.Stop()
		e.kvSrv.Stop()
		e.wg.Wait()
		if e.zpub != nil {
			e.zpub.Close()
		}
		e.dropHandles()
		e.dropPD()
		// Last, so that the spans of the handlers Shutdown waited for are exported; a handler the
		// stop cut that has not returned yet ends its span after this, and that span is dropped.
		e.flushSpans()
	})
}

// Status is what the engine reports in a heartbeat.
type Status struct {
	QueueDepth, Running, KVFreeBlocks, KVTotalBlocks int
	Draining                                         bool
	KVHandlesHeld                                    int // pushed KV not yet consumed or released
}

// Status reads the live values.
func (e *Engine) Status() Status {
	st := e.sched.status()
	return Status{
		QueueDepth: st.queued, Running: st.running, KVFreeBlocks: st.kv.FreeBlocks,
		KVTotalBlocks: st.kv.TotalBlocks,
		Draining:      e.cfg.Fault.Kind == faults.Draining || e.drainAcks.Load() > 0,
		KVHandlesHeld: e.handles.count(),
	}
}
