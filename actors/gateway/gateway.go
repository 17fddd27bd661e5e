// Package gateway starts tlgw's actor tree: a root actor that supervises the router and the
// registry (the registry spawns one worker actor per engine). It also gives non-actor callers
// (the HTTP and gRPC adapters) typed request/reply helpers over that tree.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	cmap "github.com/orcaman/concurrent-map"

	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/rollout"
)

// Config is what the actor tree needs.
type Config struct {
	Clock      clock.Clock
	Policy     string
	LoadFactor float64
	Routes     []config.Route
	// CanaryKey is the canary draw's key (R20); nil = a random one for this process.
	CanaryKey         *router.CanaryKey
	HeartbeatInterval time.Duration // T
	MissLimit         int           // k
	Logger            *slog.Logger
	RouterMetrics     *router.Metrics
	// Options returns extra props options per actor kind ("router", "registry", "worker"):
	// the mailbox metrics in production, crash injectors in tests. May be nil.
	Options func(kind string) []actor.PropsOption
	// AskTimeout bounds every request/reply with the tree (default 5 s). The actors answer in
	// microseconds; a timeout means an actor panicked while handling that very message.
	AskTimeout time.Duration
	// Admission turns the router's admission queue on (R10); nil: no queueing.
	Admission *router.AdmissionConfig
	// PrefixIndexBlocks turns the router's approximate prefix index on (0 = off).
	PrefixIndexBlocks int
	// FallbackIndexBlocks: router.Config's (R22; 0 = off).
	FallbackIndexBlocks int
	// PeerLoad: router.Config's (R23: on with [cluster], whose replicas share the engines).
	PeerLoad bool
	// TieSalt: router.Config's (R23: each replica its own order among equally loaded workers).
	TieSalt uint64
	// RolloutWindows: router.Config's (R25: with [cluster], each window's counts go to the
	// cluster's store, and the states come back through SetRolloutStates).
	RolloutWindows func(route string, window time.Time, canary, baseline rollout.Tally)
	// KVIndexBlocks bounds precise_prefix's exact index per worker (0 = its default).
	KVIndexBlocks int
	// WarmupMinBytes turns the router's prefix warm-ups on (router.Config; 0 = off).
	WarmupMinBytes int
	// LoRALoadOnDemand and LoRAAdapters: R21's on-demand adapter loads (router.Config).
	LoRALoadOnDemand bool
	LoRAAdapters     []config.LoRAAdapter
	// MaxWorkers caps the registered workers (R13.2; 0 = no cap).
	MaxWorkers int
	// OnEvict, when set, is told each worker the registry evicts (on the registry's goroutine;
	// it must return at once).
	OnEvict func(router.WorkerInfo)
	// OnMoved, when set, is told a live worker's old and new info when a heartbeat changes its
	// gRPC or KV address (registry.Config.OnMoved).
	OnMoved func(old, cur router.WorkerInfo)
	// OnAccepted, when set, is told each heartbeat the registry accepts, with its registration
	// (WorkerInfo.Reg), on the registry's goroutine, in order with OnEvict (registry.Config);
	// it must return at once.
	OnAccepted func(router.WorkerInfo)
	// Outlier is [gateway.outlier] (R14.2): the workers count failure streaks, the router ejects.
	// The zero value turns ejection off.
	Outlier config.Outlier
}

// Gateway is the running actor tree.
type Gateway struct {
	System    *actor.ActorSystem
	Router    *actor.PID
	Registry  *actor.PID
	root      *actor.PID
	timeout   time.Duration
	interval  time.Duration
	missLimit int
}

type started struct {
	router, registry *actor.PID
	err              error
}

// Start builds the tree and returns once the router and the registry are running.
func Start(cfg Config) (*Gateway, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.AskTimeout <= 0 {
		cfg.AskTimeout = 5 * time.Second
	}
	if cfg.HeartbeatInterval <= 0 || cfg.MissLimit <= 0 {
		return nil, errors.New("gateway: heartbeat interval and miss limit must be positive")
	}
	opts := func(kind string) []actor.PropsOption {
		if cfg.Options == nil {
			return nil
		}
		return cfg.Options(kind)
	}
	if cfg.RouterMetrics == nil {
		cfg.RouterMetrics = router.NewMetrics(nil)
	}
	routerProps, err := router.Props(router.Config{
		Policy: cfg.Policy, LoadFactor: cfg.LoadFactor, Routes: cfg.Routes, CanaryKey: cfg.CanaryKey,
		Metrics: cfg.RouterMetrics, Logger: cfg.Logger.With("actor", "router"),
		Admission: cfg.Admission, Clock: cfg.Clock, PrefixIndexBlocks: cfg.PrefixIndexBlocks,
		FallbackIndexBlocks: cfg.FallbackIndexBlocks, PeerLoad: cfg.PeerLoad, TieSalt: cfg.TieSalt,
		KVIndexBlocks: cfg.KVIndexBlocks, WarmupMinBytes: cfg.WarmupMinBytes,
		Outlier: cfg.Outlier, LoRALoadOnDemand: cfg.LoRALoadOnDemand, LoRAAdapters: cfg.LoRAAdapters,
		RolloutWindows: cfg.RolloutWindows,
	}, opts("router")...)
	if err != nil {
		return nil, err
	}
	sys := actor.NewActorSystem(
		actor.WithLoggerFactory(func(s *actor.ActorSystem) *slog.Logger {
			return cfg.Logger.With("lib", "protoactor")
		}),
		actor.WithDeadLetterRequestLogging(false),
	)
	smallRegistry(sys)
	ready := make(chan started, 1)
	var regPID *actor.PID // set in Started, read by the same actor afterwards
	rootProps := actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *actor.Started:
			rt, err := c.SpawnNamed(routerProps, "router")
			if err != nil {
				ready <- started{err: err}
				return
			}
			reg, err := c.SpawnNamed(registry.Props(registry.Config{
				Clock: cfg.Clock, Router: rt,
				TTL:           time.Duration(cfg.MissLimit) * cfg.HeartbeatInterval,
				Logger:        cfg.Logger.With("actor", "registry"),
				WorkerOptions: opts("worker"), MaxWorkers: cfg.MaxWorkers, OnEvict: cfg.OnEvict, OnMoved: cfg.OnMoved,
				OnAccepted:          cfg.OnAccepted,
				ConsecutiveFailures: cfg.Outlier.ConsecutiveFailures,
			}, opts("registry")...), "registry")
			regPID = reg
			ready <- started{router: rt, registry: reg, err: err}
		case *router.EpochChanged:
			c.Send(regPID, m)
		}
	}, actor.WithSupervisor(actor.RestartingSupervisorStrategy()))
	root, err := sys.Root.SpawnNamed(rootProps, "tlgw")
	if err != nil {
		return nil, err
	}
	s := <-ready
	if s.err != nil {
		_ = sys.Root.StopFuture(root).Wait()
		return nil, fmt.Errorf("gateway: start: %w", s.err)
	}
	return &Gateway{System: sys, Router: s.router, Registry: s.registry, root: root,
		timeout: cfg.AskTimeout, interval: cfg.HeartbeatInterval, missLimit: cfg.MissLimit}, nil
}

// Stop stops the whole tree (children first) and the actor system.
func (g *Gateway) Stop() {
	_ = g.System.Root.PoisonFuture(g.Registry).Wait() // stops every worker it registered
	_ = g.System.Root.PoisonFuture(g.root).Wait()
	g.System.Shutdown()
}

// HeartbeatInterval is T, echoed in heartbeat acks.
func (g *Gateway) HeartbeatInterval() time.Duration { return g.interval }

func ask[T any](g *Gateway, pid *actor.PID, msg any) (T, error) {
	var zero T
	res, err := g.System.Root.RequestFuture(pid, msg, g.timeout).Result()
	if err != nil {
		return zero, fmt.Errorf("%T to %s: %v: %w", msg, pid.Id, err, errs.ErrInternal)
	}
	switch v := res.(type) {
	case T:
		return v, nil
	case error:
		return zero, v
	}
	return zero, fmt.Errorf("%T to %s: unexpected reply %T: %w", msg, pid.Id, res, errs.ErrInternal)
}

// Pick asks the router for a worker. On success the caller holds the pick's tickets (its
// Requester, when set, is watched by the workers) and calls Release when the attempt ends.
func (g *Gateway) Pick(p *router.Pick) (*router.Picked, error) {
	res, err := ask[*router.Picked](g, g.Router, p)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return res, res.Err
	}
	return res, nil
}

// Release ends the in-flight counts a pick holds (its worker's and its prefill worker's).
func (g *Gateway) Release(p *router.Picked) {
	g.System.Root.Send(p.Worker, &router.Release{Ticket: p.Ticket})
	if p.Prefill != nil {
		g.System.Root.Send(p.Prefill.Worker, &router.Release{Ticket: p.Prefill.Ticket})
	}
}

// Heartbeat hands one validated heartbeat to the registry and waits for its ack.
func (g *Gateway) Heartbeat(info router.WorkerInfo) (*registry.Ack, error) {
	return g.HeartbeatContext(context.Background(), info)
}

// HeartbeatContext is Heartbeat bounded by ctx (and the ask timeout), from an open registry
// (no credential).
func (g *Gateway) HeartbeatContext(ctx context.Context, info router.WorkerInfo) (*registry.Ack, error) {
	return g.HeartbeatAs(ctx, "", info)
}

// HeartbeatAs is HeartbeatContext for a worker that presented credential (R13.1), counted
// against quotas (R20: a new id beyond one is refused). A refusal
// (registry.ErrIDTaken, registry.ErrTooManyWorkers) is returned as the error. The ack comes
// back on a channel rather than a future: heartbeats are the gateway's most frequent ask, so
// the wait allocates nothing in the steady state (a pooled reply channel and timer, the ack by
// value) and is bounded by ctx and the ask timeout.
func (g *Gateway) HeartbeatAs(ctx context.Context, credential string, info router.WorkerInfo, quotas ...registry.Quota) (*registry.Ack, error) {
	reply := replyPool.Get().(chan registry.Ack)
	t := timerPool.Get().(*time.Timer)
	t.Reset(g.timeout)
	defer func() { t.Stop(); timerPool.Put(t) }()
	g.System.Root.Send(g.Registry, &registry.Heartbeat{Info: info, Reply: reply, Credential: credential, Quotas: quotas})
	select {
	case ack := <-reply:
		replyPool.Put(reply) // drained: no late ack can land in it
		if ack.Err != nil {
			return nil, ack.Err
		}
		return &ack, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("heartbeat: %v: %w", ctx.Err(), errs.ErrInternal)
	case <-t.C:
		return nil, fmt.Errorf("heartbeat: no answer from the registry within %v: %w", g.timeout, errs.ErrInternal)
	}
}

// The heartbeat waits' reusable parts. A timer from the pool is stopped, so Reset arms it
// afresh and its channel holds nothing stale; a reply channel goes back only once drained.
var (
	replyPool = sync.Pool{New: func() any { return make(chan registry.Ack, 1) }}
	timerPool = sync.Pool{New: func() any {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	}}
)

// Scraped hands one successful scrape of a static worker to the registry: a heartbeat whose
// deadline is ttl (k·scrape_interval).
func (g *Gateway) Scraped(info router.WorkerInfo, ttl time.Duration) error {
	ack, err := ask[*registry.Ack](g, g.Registry, &registry.Heartbeat{Info: info, TTL: ttl, Credential: registry.CredentialStatic})
	if err != nil {
		return err
	}
	return ack.Err
}

// ScrapedAs is Scraped under another credential than the static workers' (an engine pool's,
// registry.CredentialPool).
func (g *Gateway) ScrapedAs(credential string, info router.WorkerInfo, ttl time.Duration) error {
	ack, err := ask[*registry.Ack](g, g.Registry, &registry.Heartbeat{Info: info, TTL: ttl, Credential: credential})
	if err != nil {
		return err
	}
	return ack.Err
}

// Retire removes the worker id registered under credential now (registry.Retire).
func (g *Gateway) Retire(id, credential string) {
	g.System.Root.Send(g.Registry, &registry.Retire{ID: id, Credential: credential})
}

// ScrapeFailed records a static worker's failed scrape.
func (g *Gateway) ScrapeFailed(id, reason string) {
	g.System.Root.Send(g.Registry, &registry.ScrapeFailed{ID: id, Reason: reason})
}

// MissLimit is k of R1.
func (g *Gateway) MissLimit() int { return g.missLimit }

// Workers lists the registered workers.
func (g *Gateway) Workers() (*router.WorkerList, error) {
	return ask[*router.WorkerList](g, g.Router, &router.ListWorkers{})
}

// Routes returns the route table.
func (g *Gateway) Routes() (*router.RouteTable, error) {
	return ask[*router.RouteTable](g, g.Router, &router.GetRoutes{})
}

// PutRoutes replaces the route table if ifMatch is its current epoch.
func (g *Gateway) PutRoutes(ifMatch uint64, routes []config.Route) (*router.RouteTable, error) {
	return ask[*router.RouteTable](g, g.Router, &router.PutRoutes{IfMatch: ifMatch, Routes: routes})
}

// InstallRoutes sets the route table and its epoch as the cluster's store read them (R16).
func (g *Gateway) InstallRoutes(epoch uint64, routes []config.Route) {
	g.System.Root.Send(g.Router, &router.SetRoutes{Epoch: epoch, Routes: routes})
}

// SetCanaryKey replaces the canary draw's key with the cluster's shared one (R20, R16).
func (g *Gateway) SetCanaryKey(key [32]byte) {
	g.System.Root.Send(g.Router, &router.SetCanaryKey{Key: key})
}

// SetRolloutStates installs the rollout states the cluster's store read (R25), by route id, at
// version, with the replica that decides them.
func (g *Gateway) SetRolloutStates(version uint64, decider string, states map[string]rollout.Stored) {
	g.System.Root.Send(g.Router, &router.SetRolloutStates{Version: version, Decider: decider, States: states})
}

// SyncDrains sets the drained models to exactly models, as the cluster's store read them.
func (g *Gateway) SyncDrains(models []string) {
	g.System.Root.Send(g.Registry, &registry.SyncDrains{Models: models})
}

// KVEvents hands a worker's prefix-cache events to the router's exact index (R18.3).
func (g *Gateway) KVEvents(ev *router.KVEvents) {
	g.System.Root.Send(g.Router, ev)
}

// OwnLoad is this replica's own in-flight requests per worker, the table it shares with the
// other replicas (R23).
func (g *Gateway) OwnLoad() (*router.OwnLoad, error) {
	return ask[*router.OwnLoad](g, g.Router, &router.GetOwnLoad{})
}

// ReplicaLoad hands the router another replica's whole load table (R23).
func (g *Gateway) ReplicaLoad(replica string, loads []router.WorkerLoad) {
	g.System.Root.Send(g.Router, &router.ReplicaLoad{Replica: replica, Loads: loads})
}

// ForgetReplica tells the router another replica's table no longer holds (R23).
func (g *Gateway) ForgetReplica(replica string) {
	g.System.Root.Send(g.Router, &router.ForgetReplica{Replica: replica})
}

// Models lists the model ids clients may use.
func (g *Gateway) Models() (*router.ModelList, error) {
	return ask[*router.ModelList](g, g.Router, &router.ListModels{})
}

// Routable counts routable workers.
func (g *Gateway) Routable() (int, error) {
	r, err := ask[*router.Readiness](g, g.Router, &router.Ready{})
	if err != nil {
		return 0, err
	}
	return r.Routable, nil
}

// Drain drains (or undrains) every worker of a served model.
func (g *Gateway) Drain(model string, drained bool) (*registry.DrainResult, error) {
	return ask[*registry.DrainResult](g, g.Registry, &registry.DrainModel{Model: model, Drained: drained})
}

// Queue returns the admission queue's admin view.
func (g *Gateway) Queue() (*router.QueueView, error) {
	return ask[*router.QueueView](g, g.Router, &router.GetQueue{})
}

// Programs returns the admission classifier's agent programs (GET /admin/v1/programs).
func (g *Gateway) Programs() (*router.ProgramList, error) {
	return ask[*router.ProgramList](g, g.Router, &router.GetPrograms{})
}

// Rollouts is the route table's rollouts (R25).
func (g *Gateway) Rollouts() (*router.RolloutsView, error) {
	return ask[*router.RolloutsView](g, g.Router, &router.GetRollouts{})
}

// RolloutAction pauses, resumes, promotes or aborts route's rollout (R25), when ifMatch (if
// set) is the rollouts' version.
func (g *Gateway) RolloutAction(route, action string, ifMatch *uint64) (*router.RolloutView, error) {
	return ask[*router.RolloutView](g, g.Router, &router.RolloutAction{Route: route, Action: action, IfMatch: ifMatch})
}

// RegistryBuckets is how many buckets the gateway's actor system's process registry has
// (protoactor's own: 1,024), each of cmap's 32 shard maps.
//
// A Go map keeps the slot group it allocated at its first insert after its entries are
// deleted, and every new actor id (a request actor per request) lands in one of the registry's
// buckets × 32 shard maps: with 1,024 buckets the heap grew by about 280 bytes for each of
// 32,768 shards first touched, 0.56 objects a request over the first 35,000 requests and up
// to ~9 MiB, 95% of it by 100,000 (docs/bounds.md). 64 buckets make 2,048 shard maps (~0.6
// MiB at most, all touched within ~15,000 requests); each has its own lock, far more than
// the spawns and lookups of a gateway contend for (an actor's PID caches its process, so a
// send does not look it up).
const RegistryBuckets = 64

// smallRegistry gives sys a process registry of RegistryBuckets buckets, moving the processes
// the system registered at its creation (dead letters, the event stream, guardians). It runs
// before anything else uses sys.
func smallRegistry(sys *actor.ActorSystem) {
	old := sys.ProcessRegistry.LocalPIDs
	sm := &actor.SliceMap{LocalPIDs: make([]cmap.ConcurrentMap, RegistryBuckets)}
	for i := range sm.LocalPIDs {
		sm.LocalPIDs[i] = cmap.New()
	}
	for _, m := range old.LocalPIDs {
		for id, p := range m.Items() {
			sm.GetBucket(id).Set(id, p)
		}
	}
	sys.ProcessRegistry.LocalPIDs = sm
}

// RenderTarget asks the router where a request's prompt may be rendered into token ids (R22).
func (g *Gateway) RenderTarget(m *router.RenderTarget) (*router.RenderTargetReply, error) {
	return ask[*router.RenderTargetReply](g, g.Router, m)
}
