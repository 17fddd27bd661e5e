// Package app assembles a running gateway from a configuration: the actor tree, the HTTP and
// gRPC listeners, metrics, and graceful shutdown. cmd/tlgw calls it; so do tests that need a
// whole gateway in-process.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	_ "github.com/tlgw/tlgw/actors/router/admission/classifiers" // the classifier names config may use
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/adapters/cluster"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/adapters/kvzmq"
	"github.com/tlgw/tlgw/adapters/scrape"
	"github.com/tlgw/tlgw/internal/accesslog"
	"github.com/tlgw/tlgw/internal/actormetrics"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gopool"
	"github.com/tlgw/tlgw/internal/tracing"
)

// Options tune what Start builds beyond the configuration.
type Options struct {
	Clock  clock.Clock  // default: the real clock
	Logger *slog.Logger // default: slog.Default()
	// ActorOptions adds props options per actor kind after the metrics ones (tests: crash
	// injection). May be nil.
	ActorOptions func(kind string) []actor.PropsOption
	// Transport carries attempts to engines (default httpapi.NewCheckedTransport with the
	// engine address rules).
	Transport http.RoundTripper
	// Resolver resolves engine names for every connection to an engine (nil: the default
	// resolver; tests point it at a test DNS server).
	Resolver *net.Resolver
	// Stdout is where access_log.path = "-" writes (default os.Stdout).
	Stdout io.Writer
}

// App is a running gateway.
type App struct {
	Gateway  *gateway.Gateway
	HTTP     *httpapi.Server
	HTTPAddr string // the bound address (a configured port 0 resolved)
	GRPCAddr string
	Registry *prometheus.Registry

	cfg     *config.Config
	log     *slog.Logger
	canary  router.CanaryKey // this process's canary key (R20); a cluster's stored one replaces it
	httpSrv *http.Server
	drain   *drainGate // keeps the listener open while requests finish (Shutdown)
	grpcLis *grpcapi.Listener
	engines *grpcapi.Engines
	kvs     *grpcapi.KVSubscriber // nil unless route_policy = "precise_prefix"
	kvz     *kvzmq.Subscriber     // the engines' own KV events (R22); nil unless precise_prefix with connect or listen
	tokens  *httpapi.EngineTokens // gateway.tokenizer = "engine" (R22); nil otherwise
	static  *staticWorkers
	pools   *enginePools   // [[gateway.engine_pools]] (R23)
	store   *cluster.Store // the control plane in etcd (R16); nil without [cluster]
	// storeRef is store for the router's goroutine (rolloutWindows), which runs before it is set.
	storeRef *atomic.Pointer[cluster.Store]
	share    *loadShare      // the replicas' load exchange (R23); nil without it
	hist     *historySampler // GET /admin/v1/history (R24)
	self     cluster.Replica // this replica
	clock    clock.Clock
	unwatch  func()
	pool     *gopool.Pool
	alog     *accesslog.Log    // [access_log] (R24); nil: off
	tracing  *tracing.Provider // [tracing] (R24); nil: off
	reqDeps  *request.Deps     // what every request actor is spawned with
	serveErr chan error
}

// Start binds both listeners and starts serving. On error nothing is left running.
func Start(cfg *config.Config, o Options) (*App, error) {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	for _, w := range cfg.PlaintextCredentials() {
		o.Logger.Warn(w) // once, at start (R20)
	}
	g := cfg.Gateway
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	am := actormetrics.New(reg)
	regOpts, grpcOpts, err := registryOptions(cfg)
	if err != nil {
		return nil, err
	}
	if err := config.HTTPExposure(cfg); err != nil {
		return nil, fmt.Errorf("config: gateway.allow_unauthenticated: %w", err)
	}
	admCfg, err := admissionConfig(cfg, o.Clock)
	if err != nil {
		return nil, err
	}
	prefixBlocks := prefixIndexBlocks(cfg, admCfg)
	// Every connection to an engine is checked at dial time on the address its name resolved
	// to (R20): the gRPC ones here, HTTP attempts (o.Transport) and scrapes below.
	rules := cfg.EngineRules()
	engines := grpcapi.NewEngines(grpcapi.EnginesOptions{
		Rules: rules, Resolver: o.Resolver, MaxConns: grpcapi.ConnLimit(cfg.Registry.MaxWorkers),
		Clock: o.Clock, Logger: o.Logger.With("component", "engines"),
	})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tlgw_engine_connections",
		Help: "gRPC connections open to engines (EngineControl, KvTransferService, KvEvents): at most two per registered worker.",
	}, func() float64 { return float64(engines.Len()) }))
	// The KvEvents subscriber of precise_prefix (R18.3); set right after the tree starts, before
	// the registry listener can register (and so evict) anybody.
	var kvs *grpcapi.KVSubscriber
	var kvz *kvzmq.Subscriber
	// Every actor's mailbox and every request's I/O run on pooled goroutines (internal/gopool).
	pool := gopool.New(0)
	canary := router.NewCanaryKey()
	storeRef := new(atomic.Pointer[cluster.Store])
	gw, err := gateway.Start(gateway.Config{
		CanaryKey: &canary,
		Admission: admCfg, PrefixIndexBlocks: prefixBlocks, MaxWorkers: cfg.Registry.MaxWorkers,
		// precise_prefix's exact index keeps as many chunk ids per worker as the approximate one,
		// or, with the engines' own events (R22), as many blocks as [gateway.kv_events] allows.
		KVIndexBlocks: kvIndexBlocks(cfg),
		// A request without token ids on a pool keyed by its engines' own events is picked
		// on the approximate index (R22), turned on when such events first arrive.
		FallbackIndexBlocks: fallbackIndexBlocks(cfg),
		// Replicas share the engines: a worker's load counts the others' requests its engine
		// reports (R23; measured in tlgw simulate --replicas, docs/simulate.md "Replicas").
		PeerLoad: cfg.Cluster.Enabled,
		// Each replica its own order among equally loaded workers (R23): with one order,
		// replicas whose shared counts agree would all send to the same one.
		TieSalt: tieSalt(cfg.Cluster.Enabled),
		// With [cluster] the rollouts' states live in etcd and one replica decides (R25).
		RolloutWindows: rolloutWindows(cfg.Cluster.Enabled, storeRef),
		Outlier:        g.Outlier,
		// An evicted registration's gRPC connections are closed (R13.4, R20): nothing dials it
		// any more; another registration's at the same address stay.
		OnEvict: func(info router.WorkerInfo) {
			if kvs != nil {
				kvs.Forget(info.ID) // before its connection closes under it
			}
			if kvz != nil {
				kvz.Forget(info.ID)
			}
			engines.Forget(info)
		},
		// The connections, and the subscriber after them, follow each registration from the
		// registry's own goroutine, so a registration's connections and subscription never
		// outlive its eviction (KVSubscriber.Watch); a move closes the connections it left,
		// at the rate Engines follows moves, and the subscription moves with them.
		OnAccepted: func(info router.WorkerInfo) {
			var watch func(router.WorkerInfo)
			if kvs != nil {
				watch = kvs.Watch // before a connection it leaves closes under it
			}
			engines.Accept(info, watch)
			if kvz != nil {
				kvz.Watch(info)
			}
		},
		Clock: o.Clock, Policy: g.RoutePolicy, LoadFactor: g.AffinityLoadFactor, Routes: g.Routes,
		WarmupMinBytes:   g.PrefixWarmupMinBytes,
		LoRALoadOnDemand: g.LoRALoadOnDemand, LoRAAdapters: g.LoRAAdapters,
		HeartbeatInterval: g.HeartbeatInterval, MissLimit: g.HeartbeatMissLimit,
		Logger: o.Logger, RouterMetrics: router.NewMetrics(reg),
		Options: func(kind string) []actor.PropsOption {
			opts := append(am.Options(kind), actor.WithDispatcher(pool))
			if o.ActorOptions != nil {
				opts = append(opts, o.ActorOptions(kind)...)
			}
			return opts
		},
	})
	if err != nil {
		pool.Close()
		return nil, err
	}
	if policy.ReadsOf(g.RoutePolicy).KVEvents {
		kvs = grpcapi.NewKVSubscriber(grpcapi.KVSubscriberOptions{Sink: gw, Engines: engines, Clock: o.Clock,
			Logger: o.Logger.With("component", "kv_events")})
	}
	if ke := g.KVEvents; policy.ReadsOf(g.RoutePolicy).KVEvents && (ke.Connect || ke.Listen != "") {
		kvz, err = kvzmq.New(kvzmq.Options{Sink: gw, Listen: ke.Listen, Connect: ke.Connect, Replay: ke.Replay,
			MaxBlocks: ke.MaxBlocksPerWorker, Clock: o.Clock, Logger: o.Logger.With("component", "kv_events_zmq"), Registerer: reg})
		if err != nil {
			if kvs != nil {
				kvs.Close()
			}
			gw.Stop()
			pool.Close()
			return nil, err
		}
	}
	a := &App{Gateway: gw, Registry: reg, cfg: cfg, canary: canary, storeRef: storeRef, log: o.Logger, serveErr: make(chan error, 2), pool: pool,
		clock: o.Clock, kvs: kvs, kvz: kvz}
	a.unwatch = am.WatchSystem(gw.System)
	if al := cfg.AccessLog; al.Enabled() {
		// Opened before anything serves, closed (flushed) by stopActors once requests have
		// drained: every request finished before then has its line.
		a.alog, err = accesslog.Open(al.Path, accesslog.Options{Buffer: al.Buffer, Clock: o.Clock, Registerer: reg,
			Logger: o.Logger.With("component", "access_log"), Stdout: o.Stdout})
		if err != nil {
			a.stopActors()
			return nil, fmt.Errorf("access_log.path: %w", err)
		}
	}
	if tc := cfg.Tracing; tc.Enabled() {
		// Before anything serves; shut down by stopActors once the requests (and so their
		// spans) have ended, flushing what waits for the collector. It does not dial: a
		// collector that is down shows as failed exports, never stops the start.
		a.tracing, err = tracing.New(tc.Options(), reg, o.Logger.With("component", "tracing"))
		if err != nil {
			a.stopActors()
			return nil, err // "tracing: …"
		}
	}

	httpLis, err := net.Listen("tcp", g.HTTPListen)
	if err != nil {
		a.stopActors()
		return nil, fmt.Errorf("http_listen %s: %w", g.HTTPListen, err)
	}
	grpcLis, err := net.Listen("tcp", g.RegistryListen)
	if err != nil {
		_ = httpLis.Close()
		a.stopActors()
		return nil, fmt.Errorf("registry_listen %s: %w", g.RegistryListen, err)
	}
	a.HTTPAddr, a.GRPCAddr = httpLis.Addr().String(), grpcLis.Addr().String()
	id, err := replicaID(cfg, a.HTTPAddr)
	if err != nil {
		_ = httpLis.Close()
		_ = grpcLis.Close()
		a.stopActors()
		return nil, err
	}
	a.self = cluster.Replica{ID: id, HTTPAddress: a.HTTPAddr, GRPCAddress: a.GRPCAddr, StartedAt: startedAt(o.Clock.Now())}
	if cfg.Cluster.Enabled {
		// What the other replicas dial for load sharing (R23): a wildcard listener's own
		// address is no address to dial.
		if a.self.GRPCAddress, err = advertiseAddress(cfg.Cluster.AdvertiseAddress, a.GRPCAddr, net.InterfaceAddrs); err != nil {
			_ = httpLis.Close()
			_ = grpcLis.Close()
			a.stopActors()
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	if o.Transport == nil {
		o.Transport = httpapi.NewCheckedTransport(rules.Control, o.Resolver)
	}
	a.engines = engines
	deps := &request.Deps{
		Router: gw.Router, Transport: o.Transport, Engines: a.engines, MaxAttempts: g.MaxAttempts,
		Metrics: request.NewMetrics(reg), Logger: o.Logger, Errors: httpapi.ErrorWriter{},
		Admission: admCfg != nil, Clock: o.Clock, PrefixHashes: prefixBlocks > 0 || policy.ReadsOf(g.RoutePolicy).KVEvents,
		StreamFirstByteTimeout: g.StreamFirstByteTimeout, RequestTimeout: g.RequestTimeout,
		StreamIdleTimeout: g.StreamIdleTimeout, ControlTimeout: g.ControlTimeout,
		RetryBudget: request.NewRetryBudget(g.RetryBudgetPercent), ObserveTTFT: policy.ReadsOf(g.RoutePolicy).TTFT,
		BufferBudget: bufferBudget(g.MaxBufferedBytes),
		Warmups:      request.NewWarmups(request.DefaultMaxWarmups),
		Go:           pool.Go,
		AccessLog:    a.alog,
		KeyNames:     keyNames(cfg.Auth.Keys),
		Tracer:       a.tracing.Tracer(), // nil when off
	}
	a.reqDeps = deps
	reqOpts := append(am.Options("request"), actor.WithDispatcher(pool))
	if o.ActorOptions != nil {
		reqOpts = append(reqOpts, o.ActorOptions("request")...)
	}
	a.static = &staticWorkers{mgr: scrape.NewManager(scrapeSink{gw: gw, cred: registry.CredentialStatic}, o.Clock, reg, scrape.WithDialControl(rules.Control, o.Resolver)), rules: rules}
	a.static.start(g.StaticWorkers)
	a.pools = newEnginePools(gw, o.Clock, reg, rules, o.Resolver, o.Logger)
	a.pools.start(g.EnginePools)
	a.static.pools = a.pools
	var core httpapi.Core = gw
	var static httpapi.StaticWorkers = a.static
	pools := poolTable{enginePools: a.pools, static: a.static}
	var tokens httpapi.TokenSource
	if g.Tokenizer == config.TokenizerEngine && policy.ReadsOf(g.RoutePolicy).KVEvents {
		a.tokens = httpapi.NewEngineTokens(gw.RenderTarget, o.Transport, g, o.Clock, reg)
		tokens = a.tokens
	}
	if cfg.Cluster.Enabled {
		core, static = clusterCore{Gateway: gw, app: a}, clusterStatic{staticWorkers: a.static, app: a}
		pools.app = a
	}
	a.hist = a.startHistory()
	a.HTTP = httpapi.New(httpapi.Options{
		Static: static, Pools: pools, Replicas: a.replicas, History: a.hist.snapshot,
		Core: core, Keys: cfg.Auth.Keys, MaxBodyBytes: g.MaxBodyBytes, Logger: o.Logger,
		Admission:  httpAdmission(cfg),
		Serve:      func(x *request.Exchange) { request.Spawn(gw.System, deps, x, reqOpts...) },
		Registerer: reg, Gatherer: reg,
		MaxInFlight: g.MaxInFlight, BodyReadTimeout: g.BodyReadTimeout, ClientWriteTimeout: g.ClientWriteTimeout,
		RenderPrompts: deps.PrefixHashes,
		Tokens:        tokens,
	})
	a.drain = newDrainGate()
	a.httpSrv = newHTTPServer(a.drain.wrap(a.HTTP), g)
	if cfg.Cluster.Enabled {
		if err := a.startCluster(a.self); err != nil {
			_ = httpLis.Close()
			_ = grpcLis.Close()
			a.static.mgr.Close()
			a.pools.close()
			a.hist.close()
			a.stopActors()
			return nil, err
		}
	}
	a.grpcLis = grpcapi.NewListener(gw, regOpts, grpcOpts...)
	if a.store != nil && cfg.Cluster.LoadShareInterval > 0 {
		a.share = newLoadShare(a.grpcLis.Server)
		if err := a.share.start(a, a.store); err != nil {
			_ = httpLis.Close()
			_ = grpcLis.Close()
			a.store.Close()
			a.static.mgr.Close()
			a.pools.close()
			a.hist.close()
			a.stopActors()
			return nil, err
		}
	}
	go func() {
		if err := a.httpSrv.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.serveErr <- fmt.Errorf("http: %w", err)
		}
	}()
	go func() {
		if err := a.grpcLis.Serve(grpcLis); err != nil && !errors.Is(err, net.ErrClosed) {
			a.serveErr <- fmt.Errorf("grpc: %w", err)
		}
	}()
	return a, nil
}

// keyNames are the keys' names by index, for the access log: each one's configured name, or
// (a key built in code rather than parsed) key-<index>, the name Parse gives it.
func keyNames(keys []config.Key) []string {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.Name
		if names[i] == "" {
			names[i] = "key-" + strconv.Itoa(i)
		}
	}
	return names
}

// bufferBudget is gateway.max_buffered_bytes' budget (R20); a configuration built in code
// without it (0) has no bound, as Parse never gives one.
func bufferBudget(limit int64) *request.BufferBudget {
	if limit <= 0 {
		return nil
	}
	return request.NewBufferBudget(limit)
}

// Err delivers a listener's failure while serving.
func (a *App) Err() <-chan error { return a.serveErr }

// Shutdown drains: new inference requests get 503 shutting_down and /readyz 503 at once, on
// a listener kept open while in-flight requests and streams finish, until ctx ends (the
// configured grace period); then everything stops.
func (a *App) Shutdown(ctx context.Context) error {
	a.HTTP.SetDraining()
	a.drain.wait(ctx)
	err := a.httpSrv.Shutdown(ctx)
	if err != nil {
		_ = a.httpSrv.Close() // grace period over: cut what is left
	}
	a.grpcLis.Stop(ctx)
	a.hist.close()
	if a.store != nil {
		a.share.stop()  // the streams to the other replicas end: they forget this one's table
		a.store.Close() // revokes this replica's lease: the others count one replica less at once
	}
	a.static.mgr.Close()
	a.pools.close()
	a.stopActors()
	a.engines.Close()
	return err
}

func (a *App) stopActors() {
	if a.tokens != nil {
		a.tokens.Close()
	}
	if a.kvz != nil {
		a.kvz.Close()
	}
	if a.kvs != nil {
		a.kvs.Close()
	}
	if a.unwatch != nil {
		a.unwatch()
	}
	a.Gateway.Stop()
	a.pool.Close()
	if a.alog != nil {
		// After the requests: a request that finished has handed its record over. One that
		// finishes later (a crashed actor's answer outliving the grace period) is counted as
		// dropped.
		if err := a.alog.Close(); err != nil {
			a.log.Error("access log: closing", "err", err)
		}
	}
	if a.tracing != nil {
		// After the requests too: their spans have ended. The flush is bounded, so a collector
		// that is down delays the exit by tracingFlush at most (its spans are counted dropped).
		ctx, cancel := context.WithTimeout(context.Background(), tracingFlush)
		if err := a.tracing.Shutdown(ctx); err != nil {
			a.log.Warn("tracing: the last spans were not all exported", "err", err)
		}
		cancel()
	}
}

// tracingFlush bounds the export of the last spans at shutdown.
const tracingFlush = 5 * time.Second

// kvIndexBlocks is the exact index's bound per worker.
func kvIndexBlocks(cfg *config.Config) int {
	n := cfg.Admission.PrefixIndex.BlocksPerWorker
	if ke := cfg.Gateway.KVEvents; ke.Connect || ke.Listen != "" {
		n = max(n, ke.MaxBlocksPerWorker)
	}
	return n
}

// admissionConfig turns [admission] into the router's queue configuration (nil when absent).
func admissionConfig(cfg *config.Config, clk clock.Clock) (*router.AdmissionConfig, error) {
	a := cfg.Admission
	if !a.Enabled {
		return nil, nil
	}
	c := a.Classifier
	pol, err := admission.NewPolicy(c.Type, c.Options, admission.Env{Now: clk.Now})
	if err != nil {
		return nil, fmt.Errorf("config: %w", err) // config.Parse checked it; a hand-built Config may not be
	}
	q := admission.Config{DefaultClass: a.DefaultClass, Policy: pol, Recheck: a.Recheck}
	for _, cl := range a.Classes {
		q.Classes = append(q.Classes, admission.ClassConfig{
			Name: cl.Name, Quantum: cl.Quantum, QueueLimit: cl.QueueLimit, MaxWait: cl.MaxWait,
			Priority: cl.Priority, Order: cl.Order, Cost: cl.Cost,
		})
	}
	return &router.AdmissionConfig{Queue: q, BusyThreshold: a.BusyThreshold, PolicyName: c.Type}, nil
}

// prefixIndexBlocks sizes the router's prefix index: on (BlocksPerWorker) for a route policy
// that reads it (prefix_aware; predicted_latency, for each worker's uncached prompt tokens),
// an admission policy that reads cached tokens or a class that orders or
// charges by them (wspt, uncached_tokens); off (0) otherwise.
// fallbackIndexBlocks is the approximate index's bound for precise_prefix picks without
// token ids (R22), when the engines' own KV events may arrive; 0 otherwise.
func fallbackIndexBlocks(cfg *config.Config) int {
	ke := cfg.Gateway.KVEvents
	if policy.ReadsOf(cfg.Gateway.RoutePolicy).KVEvents && (ke.Connect || ke.Listen != "") {
		return cfg.Admission.PrefixIndex.BlocksPerWorker
	}
	return 0
}

func prefixIndexBlocks(cfg *config.Config, adm *router.AdmissionConfig) int {
	if policy.ReadsOf(cfg.Gateway.RoutePolicy).PrefixIndex || (adm != nil && adm.Queue.NeedsPrefixIndex()) {
		return cfg.Admission.PrefixIndex.BlocksPerWorker
	}
	return 0
}

func httpAdmission(cfg *config.Config) httpapi.Admission {
	a := cfg.Admission
	out := httpapi.Admission{Enabled: a.Enabled, DefaultClass: a.DefaultClass, AllowHeader: map[string]bool{}}
	for _, cl := range a.Classes {
		out.AllowHeader[cl.Name] = cl.Header
	}
	return out
}
