// Package router is the router actor: it holds the route table and the view of every worker
// (pushed to it by the worker actors), and answers picks from that view in O(log n) without
// asking any other actor (SPEC R3, R5). Its concerns are separate types — the route table
// (routes.go), the worker view and its reservations (view.go), the admission queue's host
// (admit.go) — and the actor only dispatches messages to them.
package router

import (
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/rollout"
)

// Config is what the router needs.
type Config struct {
	Policy     string  // route_policy
	LoadFactor float64 // affinity_load_factor
	Routes     []config.Route
	// CanaryKey is the canary draw's key (R20); nil = a random one for this process.
	CanaryKey *CanaryKey
	Metrics   *Metrics
	Logger    *slog.Logger
	// Admission turns the admission queue on (nil: every pick is answered at once).
	Admission *AdmissionConfig
	// Clock times the queue (default the real clock).
	Clock clock.Clock
	// RolloutWindows, in a cluster, takes each rollout window's counts as it closes (R25): the
	// store publishes them, one replica decides from every replica's and stores the state,
	// which comes back as SetRolloutStates. Nil: this router decides alone. Called from the
	// router's goroutine; it must not block.
	RolloutWindows func(route string, window time.Time, canary, baseline rollout.Tally)
	// PrefixIndexBlocks turns the approximate prefix index on (chunk hashes remembered per
	// worker); 0 = off.
	PrefixIndexBlocks int
	// FallbackIndexBlocks (R22): with precise_prefix, the approximate prefix index of that many
	// chunks per worker is turned on when the first worker reports its engine's own (vLLM)
	// events, for the picks of requests that come without token ids; 0 = never.
	FallbackIndexBlocks int
	// KVIndexBlocks bounds the exact prefix index of route_policy = "precise_prefix" (R18.2):
	// chunk ids kept per worker, beyond which reported ones are dropped (internal/kvindex);
	// 0 = kvindex.DefaultBlocksPerWorker. The index is on only for that policy.
	KVIndexBlocks int
	// Outlier is [gateway.outlier] (R14.2): how long a worker whose failure streak asked for an
	// ejection is kept out of its pool, and how many of a model's workers may be out at once.
	// The workers count the streaks (ConsecutiveFailures is theirs); 0 there turns it off.
	Outlier config.Outlier
	// WarmupMinBytes turns prefix warm-ups on (warm.go): a prefix_aware or precise_prefix pick
	// that matched at least this many bytes of the rendered prompt, on a worker the pick left
	// at the bounded-load cap with no other holder under it, also reserves the least loaded
	// worker for a copy of that prefix. 0 = off.
	WarmupMinBytes int
	// MaxStoredResponses bounds the stored responses the router routes back to their workers
	// (R21, responses.go); 0 = DefaultMaxStoredResponses.
	MaxStoredResponses int
	// LoRALoadOnDemand and LoRAAdapters are gateway.lora_load_on_demand and
	// [[gateway.lora_adapters]] (R21, lora.go).
	LoRALoadOnDemand bool
	LoRAAdapters     []config.LoRAAdapter
	// LoRAUnaware picks an adapter's worker as the least loaded of those serving it, blind to
	// which have it loaded (lora.go). It is the fleet simulator's baseline only, the
	// adapter-unaware least_outstanding that policy.PickLoRA is measured against; the gateway
	// never sets it.
	LoRAUnaware bool
	// PeerLoad counts in a worker's load what its engine reports running and queued beyond
	// this router's own picks (view.go: slot.peer): the load of the gateway's other replicas,
	// which share the engines (R23). Off, a worker's load is this router's in-flight count and
	// the engine's queue, as with one gateway.
	PeerLoad bool
	// TieSalt, when not 0, orders equally loaded workers by a hash of their id salted with it
	// (policy.Member.Tie) instead of by id: each replica of a gateway gets its own (R23).
	TieSalt uint64
}

// state survives restarts of the router actor: a panic while handling one message must not
// lose the route table or the worker view.
type state struct {
	log    *slog.Logger
	table  *routeTable
	view   *workerView
	adm    *admitter // nil without [admission]
	parent *actor.PID
	gauges routeGauges      // tlgw_route_routable_workers
	kvSize prometheus.Gauge // tlgw_kv_index_entries
	// tlgw_kv_index_dropped_total, and the index's count it has published.
	kvDropped   prometheus.Counter
	kvDroppedAt uint64
	// responses maps stored responses to their workers (R21, responses.go).
	responses *responseTable
	// rollouts are the table's progressive rollouts (R25, rollouts.go).
	rollouts rollouts
}

func newState(cfg Config) *state {
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	st := &state{log: cfg.Logger, table: newRouteTable(cfg.Routes, canaryKey(cfg.CanaryKey)), view: newWorkerView(cfg, clk),
		gauges: routeGauges{vec: cfg.Metrics.routes, dirty: true}, kvSize: cfg.Metrics.kvIndex,
		kvDropped: cfg.Metrics.kvDropped, responses: newResponseTable(cfg.MaxStoredResponses)}
	if cfg.Admission != nil {
		st.adm = newAdmitter(cfg.Admission, clk, cfg.Metrics.admission, st.view)
	}
	st.rollouts = rollouts{clock: clk, step: cfg.Metrics.rolloutStep, decisions: cfg.Metrics.rolloutDecisions, closeWindow: cfg.RolloutWindows}
	st.rollouts.sync(st.table, st.log)
	return st
}

// Props returns the router actor's props. The route table starts at epoch 1.
func Props(cfg Config, opts ...actor.PropsOption) (*actor.Props, error) {
	if _, err := policy.New(cfg.Policy, policy.Options{LoadFactor: cfg.LoadFactor}); err != nil {
		return nil, err
	}
	st := newState(cfg)
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	return actor.PropsFromProducer(func() actor.Actor { return &routerActor{st: st, clock: clk} }, opts...), nil
}

// effects is how the router's logic reaches other actors: the actor's context in production,
// a recorder in tests that drive the logic without an actor system.
type effects interface {
	respond(msg any)                            // to the sender of the message at hand
	send(to *actor.PID, msg any)                // to any actor
	watch(pid *actor.PID)                       // *actor.Terminated arrives when pid stops
	after(d time.Duration, msg any) clock.Timer // msg arrives at the router after d on the clock
	later(msg any)                              // msg arrives at the router after the messages already in its mailbox
}

type routerActor struct {
	st    *state
	clock clock.Clock
}

// ctxEffects implements effects over an actor context.
type ctxEffects struct {
	c     actor.Context
	clock clock.Clock
}

func (e ctxEffects) respond(msg any)             { e.c.Respond(msg) }
func (e ctxEffects) send(to *actor.PID, msg any) { e.c.Send(to, msg) }
func (e ctxEffects) watch(pid *actor.PID)        { e.c.Watch(pid) }
func (e ctxEffects) later(msg any)               { e.c.Send(e.c.Self(), msg) }
func (e ctxEffects) after(d time.Duration, msg any) clock.Timer {
	self, root := e.c.Self(), e.c.ActorSystem().Root
	return e.clock.AfterFunc(d, func() { root.Send(self, msg) })
}

// Receive handles the router's messages.
func (r *routerActor) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Started); ok {
		r.st.parent = c.Parent()
		r.st.rollouts.arm(ctxEffects{c: c, clock: r.clock}) // the first windows' ends, with no message yet
		return
	}
	fx := ctxEffects{c: c, clock: r.clock}
	r.st.handle(c.Message(), fx)
	r.st.rollouts.arm(fx)
	r.st.afterMessage()
}

// afterMessage publishes the route gauges when the message moved a pool or the table, and the
// exact index's size under precise_prefix.
func (st *state) afterMessage() {
	if st.view.kidx != nil {
		st.kvSize.Set(float64(st.view.kidx.Entries()))
		if d := st.view.kidx.Dropped(); d != st.kvDroppedAt {
			st.kvDropped.Add(float64(d - st.kvDroppedAt))
			st.kvDroppedAt = d
		}
	}
	if st.view.poolsMoved {
		st.view.poolsMoved = false
		st.gauges.dirty = true
	}
	if st.gauges.dirty {
		st.gauges.publish(st.table, st.view)
	}
}

// handle is the router's one dispatch: every message to the matching concern.
func (st *state) handle(msg any, fx effects) {
	switch msg.(type) {
	case *LoadReport, *WorkerState, admWake:
	default:
		// Capacity frees are woken together, once per run of reports (admit.go), and never
		// after a message that is not one: no pick or end overtakes them.
		st.adm.flush(fx)
	}
	switch m := msg.(type) {
	case *Pick:
		admit := st.adm != nil && m.Admit != nil
		if m.Response != "" && !admit {
			fx.respond(st.pinned(m, fx))
			return
		}
		if admit {
			st.adm.pick(st, m, fx)
			return
		}
		fx.respond(st.pick(m, fx))
	case *LoadReport:
		if st.view.registered(m.ID, m.Reg) == nil {
			return // an earlier registration's actor: nothing of it applies to this one
		}
		if st.view.loadReport(m) {
			st.adm.wakeFreed(m.ID, fx)
		}
		if m.Eject != OutcomeNone {
			// Out of its pool: nothing queued can gain, so no wake.
			if st.view.eject(m.ID, m.Eject, fx) {
				s := st.view.slots[m.ID]
				st.log.Warn("worker ejected by outlier detection", "worker", m.ID, "reason", m.Eject.String(),
					"until", s.ej.until, "ejections_in_run", s.ej.runs)
			} else {
				st.log.Info("outlier ejection not applied (already ejected, or the model's ejection caps)",
					"worker", m.ID, "reason", m.Eject.String())
			}
		}
	case ejectionOver:
		if st.view.ejectionOver(m) {
			st.log.Info("worker back from its outlier ejection", "worker", m.id)
			st.adm.wakeAll(fx)
		}
	case *WorkerState:
		if st.view.workerState(m, fx) {
			st.adm.wakeAll(fx)
		} else {
			st.adm.wakeFreed(m.Info.ID, fx) // a heartbeat may report a shorter queue
		}
	case *actor.Terminated:
		if st.view.removeByPID(m.Who) {
			st.adm.wakeAll(fx)
		}
	case *KVEvents:
		ok := st.kvEvents(m)
		if m.Reply != nil {
			select {
			case m.Reply <- ok:
			default:
			}
		}
	case *ReplicaLoad:
		if st.view.replicaLoad(m) {
			st.adm.wakeAll(fx)
		}
	case *ForgetReplica:
		if st.view.forgetReplica(m.Replica) {
			st.adm.wakeAll(fx)
		}
	case *GetOwnLoad:
		fx.respond(st.view.ownLoad())
	case *Finished:
		st.adm.finished(m, fx)
	case *WarmupSent:
		st.view.warmupSent(m)
	case *EndpointUnsupported:
		st.view.endpointUnsupported(m)
	case *LoRALoaded:
		st.view.loraLoaded(m)
	case *LoRAMissing:
		st.view.loraMissing(m)
	case *StoreResponse:
		st.responses.store(m)
	case *ForgetResponse:
		st.responses.forget(m)
	case *ObservedTTFT:
		st.view.observeTTFT(m)
		st.adm.wakeCapacity(fx) // a model changed: a request waiting for its objective may go
	case admTick:
		st.adm.tick(fx)
	case rolloutTick:
		st.rollouts.tick(m, st.table, st.log)
	case *GetRollouts:
		fx.respond(st.rollouts.view(st.table))
	case *RolloutAction:
		fx.respond(st.rollouts.act(m, st.table, st.log))
	case *SetRolloutStates:
		st.rollouts.setStored(m, st.table, st.log)
	case admWake:
		st.adm.woken(fx)
	case *GetQueue:
		fx.respond(st.adm.queueView())
	case *GetPrograms:
		fx.respond(st.adm.programList())
	case *ListWorkers:
		fx.respond(st.view.list(st.table.epoch))
	case *GetRoutes:
		fx.respond(st.table.view())
	case *PutRoutes:
		out, err := st.table.put(m.IfMatch, m.Routes)
		if err != nil {
			fx.respond(err)
			return
		}
		st.gauges.dirty = true
		st.rollouts.sync(st.table, st.log)
		st.log.Info("route table replaced", "epoch", out.Epoch, "routes", len(m.Routes))
		if st.parent != nil {
			fx.send(st.parent, &EpochChanged{Epoch: out.Epoch})
		}
		fx.respond(out)
	case *SetRoutes:
		st.table.install(m.Epoch, m.Routes)
		st.gauges.dirty = true
		st.rollouts.sync(st.table, st.log)
		st.log.Info("route table installed from the cluster store", "epoch", m.Epoch, "routes", len(m.Routes))
		if st.parent != nil {
			fx.send(st.parent, &EpochChanged{Epoch: m.Epoch})
		}
	case *SetCanaryKey:
		st.table.canary = newCanaryDraw(m.Key)
		st.log.Info("canary key installed from the cluster store")
	case *ListModels:
		fx.respond(st.listModels())
	case *RenderTarget:
		fx.respond(st.view.renderTarget(st.table, m))
	case *Ready:
		fx.respond(&Readiness{Routable: st.view.routable})
	}
}

// pick answers one Pick that needs no admission. Nothing here blocks or allocates except the
// reply.
func (st *state) pick(m *Pick, fx effects) *Picked {
	t := st.table.resolve(m, st.view)
	if t.out.Err != nil {
		return t.out
	}
	ch := choice{key: t.key, disagg: t.disagg, prefixHash: m.PrefixHash, hashes: m.PrefixHashes, tokens: m.TokenIDs,
		exclude: m.Exclude, requester: m.Requester, sloMs: m.SLOTTFTMs, endpoint: t.endpoint, adapter: t.adapter, load: t.load}
	if !st.view.choose(ch, t.out, fx) && t.out.Err == nil {
		t.out.Err = t.noCapacity()
	}
	return t.out
}

func (st *state) listModels() *ModelList {
	seen := make(map[string]bool)
	for _, rt := range st.table.routes {
		seen[rt.Model] = true
		for _, a := range rt.Aliases {
			seen[a] = true
		}
	}
	info := make(map[string]ModelInfo)
	for _, s := range st.view.slots {
		if !s.live {
			continue
		}
		seen[s.info.Model] = true
		if mi := info[s.info.Model]; s.info.MaxModelLen > mi.MaxModelLen {
			info[s.info.Model] = ModelInfo{MaxModelLen: s.info.MaxModelLen}
		}
	}
	// Each adapter once (the index, not every worker's list), with the base model a pick of it
	// goes to; a configured on-demand adapter is listed while its base model is served.
	adapter := func(a, parent string) {
		if st.view.models[a] > 0 || !seen[parent] {
			return // a base model of other workers (listed as such), or no base served
		}
		seen[a] = true
		info[a] = ModelInfo{Parent: parent, MaxModelLen: info[parent].MaxModelLen}
	}
	for a := range st.view.loraIdx {
		if _, configured := st.view.onDemand[a]; !configured {
			adapter(a, st.view.loraBase(a))
		}
	}
	for a, cfg := range st.view.onDemand {
		adapter(a, cfg.BaseModel)
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return &ModelList{IDs: ids, Info: info}
}
