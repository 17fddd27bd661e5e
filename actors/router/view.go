package router

import (
	"cmp"
	"math"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// slot is the router's record of one registered worker.
type slot struct {
	pid  *actor.PID
	info WorkerInfo
	live bool
	// The worker owns the in-flight count; the router keeps its last report and an optimistic
	// delta: acqSent Acquires sent by its picks, acqSeen of them processed as of the report.
	// load = reported + (acqSent − acqSeen) + queue depth; the next report zeroes the delta,
	// and every Acquire the router sends reaches the worker, so nothing is guessed.
	reported int64
	acqSeen  uint64
	acqSent  uint64
	member   policy.Member
	pool     *pool // the pool the member is in while routable, else nil
	kvIn     bool  // counted in its pool's kvMembers
	state    string
	ej       ejection // R14.2 (outlier.go)
	// R19: the load the worker's recent failures add, as it last reported it (it decays on the
	// worker's clock), and whether its address refused a connection since its last heartbeat.
	failLoad    int64
	unreachable bool
	// peer (Config.PeerLoad): the engine's running and queued requests beyond this router's
	// own in flight, as of its last heartbeat or scrape — the other replicas' load on it;
	// peerIn is how much of it its pool counts (pool.peer).
	peer, peerIn int64
	// others is the other replicas' requests on it, as their last tables told (replicas.go):
	// part of its load.
	others int64
	// R22: the block size of the engine's own KV events (0 = none seen): a request's token ids
	// are cut by it for the router's block keys.
	kvBlockSize int
	// R21: the endpoints its engine refused (endpoints.go), and whether it is counted in its
	// pool's restricted members.
	marks        endpointMarks
	restrictedIn bool
	// loras is the LoRA adapters the router last sent it, most recent first, at most its
	// max_loras (lora.go).
	loras []string
	// onDemand is the adapters loaded on it on demand (lora.go), at most the configured ones.
	onDemand []onDemandLoRA
	// loraGone is the adapters its engine lists but answered 404 for (LoRAMissing), each
	// until its time: at most the adapters it lists (≤ MaxLoRAAdapters), the passed ones
	// dropped at each new mark.
	loraGone []loraMark
}

func (s *slot) inFlight() int64 { return s.reported + int64(s.acqSent-s.acqSeen) }

// load is what load-based policies read: in flight (this replica's and, shared, the other
// replicas'), the engine's queue, and recent failures.
func (s *slot) load() int64 { return s.inFlight() + s.others + s.info.QueueDepth + s.failLoad }

func (s *slot) routable() bool {
	return s.live && !s.info.SelfDraining() && !s.info.AdminDrained && !s.ej.on && !s.unreachable
}

func (s *slot) stateName() string {
	switch {
	case !s.live:
		return stateNone
	case s.unreachable:
		return stateUnreachable
	case s.ej.on:
		return stateEjected
	case s.info.AdminDrained:
		return stateDrained
	case s.info.SelfDraining():
		return stateDraining
	}
	return stateRoutable
}

type poolKey struct {
	model string
	role  Role
}

func (k poolKey) String() string { return k.role.String() + "/" + k.model }

type pool struct {
	key     poolKey
	name    string // key.String(), made once: the admission queue names lanes by it
	p       policy.Policy
	members map[string]*slot // by worker id: its routable workers (a pool goes with its last)
	ids     []string         // member ids in order, rebuilt after a membership change
	// kvMembers counts the members that report kv_events (slot.kvIn): predicted_latency reads
	// the exact index only when every member does.
	kvMembers int
	// restricted counts the members that may not serve some endpoint (slot.restrictedIn,
	// endpoints.go): 0 lets a pick skip the endpoint check.
	restricted int
	// peer is its members' peer load (slot.peer, Config.PeerLoad), told to a policy that is a
	// policy.PeerLoader.
	peer int64
	// kvBlockSize is the block size of its members' own (vLLM-format) KV events (R22; 0 =
	// none seen): a pick's token ids are cut by it into the router's block keys. A pool whose
	// engines use two block sizes takes the last one reported.
	kvBlockSize int
	// ownOrder: its policy orders members without the other replicas' requests (slot.others),
	// by this router's own and the engines' queues: a policy that is not a bounded-load one
	// (least_outstanding) picks the least loaded member outright, and were the order the
	// shared counts — the same on every replica between two shares — every replica would send
	// to the same members until the next share (8 replicas over 1,000 engines: p99 7.8× one
	// replica's). Each replica balancing its own requests balances their sum. Bounded-load
	// policies (policy.PeerLoader) count them: their cap must see a holder's whole load.
	ownOrder bool
}

// memberLoad is s's load as pool pl's policy reads it.
func (pl *pool) memberLoad(s *slot) int64 {
	if pl.ownOrder {
		return s.load() - s.others
	}
	return s.load()
}

// countKV counts member s in kvMembers while it reports kv_events.
func (pl *pool) countKV(s *slot) {
	if s.kvIn != s.info.KVEvents {
		s.kvIn = s.info.KVEvents
		if s.kvIn {
			pl.kvMembers++
		} else {
			pl.kvMembers--
		}
	}
}

// setPeer counts peer as member s's peer load in the pool's, and tells its policy.
func (pl *pool) setPeer(s *slot, peer int64) {
	if peer == s.peerIn {
		return
	}
	pl.peer += peer - s.peerIn
	s.peerIn = peer
	if p, ok := pl.p.(policy.PeerLoader); ok {
		p.SetPeerLoad(pl.peer)
	}
}

// memberIDs returns the pool's worker ids in order (shared: callers must not modify it).
func (pl *pool) memberIDs() []string {
	if pl.ids == nil {
		pl.ids = make([]string, 0, len(pl.members))
		for id := range pl.members {
			pl.ids = append(pl.ids, id)
		}
		slices.Sort(pl.ids)
	}
	return pl.ids
}

// workerView is the router's view of the workers, pushed to it by the worker actors: slots,
// the routable pools with their policies, and the reservations of the router's picks.
//
// Bounds (R19): slots and byPID hold one entry per registered worker actor (live, or evicted
// until its actor's Terminated: remove), so at most [registry] max_workers plus the evicted
// ones still stopping; pools one per (model, role) with a routable worker, deleted with their
// last member; models one per model a live worker serves (dropModel deletes at zero). The
// prefix indexes hold registered workers only (remove forgets), each within its per-worker
// bound; warming is a fixed array. Nothing here is kept per request.
type workerView struct {
	policy     string
	loadFactor float64
	// blockKeys is a pick's block keys (setHeld), reused: as long as the longest prompt's
	// token ids over the smallest block size seen.
	blockKeys  []uint64
	slots      map[string]*slot // by worker id
	byPID      map[string]*slot // by worker actor id, for Terminated
	pools      map[poolKey]*pool
	models     map[string]int // live workers per served model
	routable   int
	poolsMoved bool   // a pool's membership changed (read and cleared by the route gauges)
	ticket     uint64 // the last ticket handed out
	decisions  [maxReasons]prometheus.Counter
	gauges     map[string]prometheus.Gauge // the fixed worker states of tlgw_workers
	// The approximate prefix index (nil when off), which prefix_aware pools pick from.
	pidx *prefixindex.Index
	// fallbackBlocks: pidx's bound when engine events turn it on (Config.FallbackIndexBlocks).
	fallbackBlocks int
	// The exact prefix index (nil unless precise_prefix), fed by the engines' KvEvents and
	// keyed by each slot's member (kvevents.go).
	kidx *policy.HeldIndex
	// predicted: route_policy = "predicted_latency" (its pools score picks by their models).
	predicted bool
	// Outlier ejection (R14.2, outlier.go).
	clk       clock.Clock
	outlier   config.Outlier
	ejections *prometheus.CounterVec
	ejectSeq  uint64 // numbers ejections, so a stale end is ignored
	// Prefix warm-ups (warm.go): the least matched chunks (0 = off) and the pending claims.
	warmMin    int
	warmCredit int // prefix picks towards warm-ups (warmPicks)
	warming    [MaxWarmPending]warmClaim
	warmups    prometheus.Counter // tlgw_prefix_warmups_total
	// R21 (lora.go): the workers of each LoRA adapter, a pick's scratch, and whether the last
	// adapter pick found workers of the adapter but none serving the endpoint, or passed over
	// some whose engine refused the adapter (lastMissing).
	loraIdx      map[string][]*slot
	cands        []policy.LoRACandidate
	lastUnserved bool
	lastMissing  bool
	// onDemand is [[gateway.lora_adapters]] by name when lora_load_on_demand is on (nil: off).
	onDemand    map[string]*config.LoRAAdapter
	loraUnaware bool        // Config.LoRAUnaware: the simulator's baseline
	peerLoad    bool        // Config.PeerLoad
	share       shareTables // the other replicas' load tables (replicas.go)
	tieSalt     uint64      // Config.TieSalt
}

func newWorkerView(cfg Config, clk clock.Clock) *workerView {
	v := &workerView{
		policy: cfg.Policy, loadFactor: cfg.LoadFactor,
		clk: clk, outlier: cfg.Outlier, ejections: cfg.Metrics.ejections,
		slots:     make(map[string]*slot),
		byPID:     make(map[string]*slot),
		pools:     make(map[poolKey]*pool),
		models:    make(map[string]int),
		loraIdx:   make(map[string][]*slot),
		decisions: cfg.Metrics.decisionCounters(cfg.Policy),
		gauges:    cfg.Metrics.workerGauges(),
		warmMin:   warmMinChunks(cfg.WarmupMinBytes), warmCredit: warmBurst * warmPicks,
		warmups: cfg.Metrics.warmups, loraUnaware: cfg.LoRAUnaware, fallbackBlocks: cfg.FallbackIndexBlocks,
		peerLoad: cfg.PeerLoad,
		tieSalt:  cfg.TieSalt,
	}
	if cfg.PrefixIndexBlocks > 0 {
		v.pidx = prefixindex.New(cfg.PrefixIndexBlocks)
	}
	if cfg.LoRALoadOnDemand {
		v.onDemand = make(map[string]*config.LoRAAdapter, len(cfg.LoRAAdapters))
		for i := range cfg.LoRAAdapters {
			v.onDemand[cfg.LoRAAdapters[i].Name] = &cfg.LoRAAdapters[i]
		}
	}
	reads := policy.ReadsOf(cfg.Policy)
	v.predicted = reads.TTFT
	if reads.KVEvents {
		v.kidx = kvindex.New[*policy.Member](cfg.KVIndexBlocks)
	}
	return v
}

// choice is what a pick asks of the view once its target is resolved.
type choice struct {
	key        poolKey
	disagg     bool
	prefixHash uint64
	hashes     []uint64
	tokens     []uint32 // the prompt's token ids (R22; nil when not rendered)
	exclude    []string
	sloMs      int64 // the TTFT objective (R18.4; 0 = none), for predicted_latency
	// strict: only a worker predicted to meet sloMs will do (an admitted request with an
	// objective, dispatched from the queue); the gate's soft target is not taken, as it has no
	// prediction.
	strict    bool
	soft      string     // the gate's soft target ("" = none)
	requester *actor.PID // named in the Acquire, so the worker can watch it
	// endpoint is the serving endpoint asked for (R21; 0 = any), adapter the LoRA adapter
	// ("" = the pool's model itself, lora.go), load its on-demand load (nil: none configured).
	endpoint oai.Kind
	adapter  string
	load     *LoRALoad
}

// choose picks and reserves the worker(s) of a resolved pick into out: the soft target when it
// is in the pool and not excluded, else the pool's policy; plus the least loaded prefill worker
// of a disaggregated route. It reports whether it found them. Each reservation sends the
// worker its Acquire at once.
func (v *workerView) choose(ch choice, out *Picked, fx effects) bool {
	var s *slot
	reason := policy.ReasonLeastLoad
	if pl := v.pools[ch.key]; pl != nil && ch.adapter == "" {
		var serving int
		if ch.exclude, serving = v.endpointExclude(pl, ch.endpoint, ch.exclude); serving == 0 {
			out.Err = unserved(ch.key.model, ch.endpoint)
			return false
		}
	}
	if ch.soft != "" && !ch.strict {
		if ts := v.slots[ch.soft]; ts != nil && ts.pool != nil && ts.pool.key == ch.key && !slices.Contains(ch.exclude, ch.soft) &&
			(ch.adapter == "" || ts.info.ServesLoRA(ch.adapter)) {
			s = ts
		}
	}
	if ch.strict && ch.sloMs <= 0 {
		return false // its objective has passed: no worker is in time
	}
	if s == nil {
		if pl := v.pools[ch.key]; pl != nil && v.pidx != nil && len(ch.hashes) > 0 {
			if ps, ok := pl.p.(policy.PrefixScorer); ok {
				ps.SetPrefix(v.pidx, ch.hashes)
			}
		}
		v.setHeld(ch)
		ls := v.setLatency(ch)
		if ch.adapter != "" {
			s, reason = v.pickLoRA(ch)
			if s == nil && ch.load != nil {
				// No worker that serves it may take it now (none has it, or those that do
				// are excluded, draining or ejected): load it on another.
				if s = v.pickToLoad(ch); s != nil {
					s.touchLoRA(ch.adapter)
				}
			}
			if s != nil && ch.load != nil && s.pendingLoRA(ch.adapter) {
				out.LoadLoRA = ch.load
			}
			out.Adapter = ch.adapter
			switch {
			case s != nil:
			case v.lastUnserved:
				out.Err = unserved(ch.adapter, ch.endpoint)
			case v.lastMissing:
				out.Err = loraNotLoaded(ch.adapter, ch.key.model)
			}
			ls = nil
		} else {
			s, reason = v.pickIn(ch.key, ch.prefixHash, ch.exclude)
		}
		if ls != nil && s != nil {
			if now, idle := ls.Meets(); ch.strict && !now && idle {
				// Nothing reserved: the request waits for load to fall on a worker that
				// would be in time. One that no worker would serve in time even idle (its
				// prompt's prefill alone is too long) goes now, to the lowest prediction.
				return false
			}
			out.Features = ls.Features()
		}
	}
	if s == nil {
		return false
	}
	var p *slot
	if ch.disagg {
		// R8: the prefill worker is the least loaded one (prefill pools are least_outstanding).
		pk := poolKey{model: ch.key.model, role: RolePrefill}
		exclude := ch.exclude
		if ch.adapter != "" {
			exclude = v.loraExclude(pk, ch.adapter, exclude) // the prefill runs the adapter too
		}
		if p, _ = v.pickIn(pk, 0, exclude); p == nil {
			return false
		}
		out.Prefill = &PickedWorker{Ticket: v.reserve(p, ch.requester, fx), Worker: p.pid, WorkerID: p.info.ID,
			Reg: p.info.Reg, HTTPAddress: p.info.HTTPAddress, GRPCAddress: p.info.GRPCAddress,
			BootstrapPort: bootstrapPort(p.info)}
	}
	out.Ticket = v.reserve(s, ch.requester, fx)
	v.decisions[reason].Inc()
	if v.pidx != nil && len(ch.hashes) > 0 && ch.adapter == "" {
		// Its engine will hold this prompt's KV now. An adapter's KV is its own (the engine
		// keys blocks by the LoRA id): no base-model prompt may be routed on it.
		v.pidx.RecordWithin(s.info.ID, kvChunks(s.info), ch.hashes)
	}
	if v.warmMin > 0 && (reason == policy.ReasonPrefix || reason == policy.ReasonPredicted) && !ch.disagg {
		v.warm(ch, s, out, fx)
	}
	out.Worker, out.WorkerID, out.WorkerReg, out.HTTPAddress = s.pid, s.info.ID, s.info.Reg, s.info.HTTPAddress
	out.GRPCAddress, out.KVAddress, out.Reason = s.info.GRPCAddress, s.info.KVAddress, reason
	return true
}

// bootstrapPort is info's SGLang bootstrap port, SGLang's default when it has none (see
// WorkerInfo.BootstrapPort).
func bootstrapPort(info WorkerInfo) int {
	if info.BootstrapPort > 0 {
		return info.BootstrapPort
	}
	return config.DefaultBootstrapPort
}

// chunkTokens is about how many tokens a 64-byte prompt chunk makes (4 bytes a token).
const chunkTokens = prefixindex.ChunkBytes / 4

// kvChunks is how many prompt chunks worker info's KV cache can hold (0: unknown): the
// approximate index believes a worker holds no more than that, so it forgets what the engine
// must have evicted instead of sending prompts to a worker that no longer holds them.
func kvChunks(info WorkerInfo) int {
	return int(min(info.KVCapacityTokens()/chunkTokens, math.MaxInt32))
}

// servable reports whether a pick of key could find a worker now (a disaggregated one also
// needs a prefill worker).
func (v *workerView) servable(key poolKey, disagg bool) bool {
	if v.pools[key] == nil {
		return false
	}
	return !disagg || v.pools[poolKey{model: key.model, role: RolePrefill}] != nil
}

func (v *workerView) pickIn(key poolKey, prefixHash uint64, exclude []string) (*slot, policy.Reason) {
	pl := v.pools[key]
	if pl == nil {
		return nil, 0
	}
	mem, reason := pl.p.Pick(prefixHash, exclude)
	if mem == nil {
		return nil, reason
	}
	return mem.Ref.(*slot), reason
}

// reserve sends s an Acquire for a new ticket and counts it in the optimistic delta.
func (v *workerView) reserve(s *slot, requester *actor.PID, fx effects) uint64 {
	v.ticket++
	s.acqSent++
	fx.send(s.pid, &Acquire{Ticket: v.ticket, Requester: requester})
	if s.pool != nil {
		s.pool.p.SetLoad(&s.member, s.pool.memberLoad(s))
	}
	return v.ticket
}

// loadReport applies a worker's in-flight change; it reports whether the load fell (room may
// have freed: a wake for the admission queue).
func (v *workerView) loadReport(m *LoadReport) bool {
	s := v.slots[m.ID]
	if s == nil || m.AcqSeen < s.acqSeen {
		return false // stale: a newer report has been applied
	}
	before := s.load()
	s.reported, s.acqSeen, s.failLoad = m.InFlight, m.AcqSeen, m.FailLoad
	if s.pool != nil {
		s.pool.p.SetLoad(&s.member, s.pool.memberLoad(s))
	}
	return s.load() < before
}

// workerState applies a worker's report; it reports whether the worker's membership of a pool
// changed (it joined, left or changed pool: a wake for the admission queue).
func (v *workerView) workerState(m *WorkerState, fx effects) bool {
	s := v.slots[m.Info.ID]
	if s != nil && !s.pid.Equal(m.PID) {
		if m.Info.Reg < s.info.Reg {
			// An earlier registration's actor, late (its last report raced the new one's
			// first): nothing of it applies to the registration the router holds.
			return false
		}
		// A new actor for the same id (the old one was evicted and its Terminated is still on
		// the way): start a fresh record.
		v.remove(s)
		s = nil
	}
	if s == nil {
		if !m.Live {
			return false
		}
		s = &slot{pid: m.PID}
		s.member.ID = m.Info.ID
		s.member.Tie = tieKey(v.tieSalt, m.Info.ID)
		s.member.Ref = s
		v.slots[m.Info.ID] = s
		v.byPID[m.PID.Id] = s
		fx.watch(m.PID)
	}
	if s.live {
		v.dropModel(s.info.Model)
	}
	prev := s.pool
	if v.kidx != nil && (!m.Live || (!m.Info.KVEvents && s.kvBlockSize == 0)) {
		// It no longer reports what it holds, or it is not live: its events are refused until it
		// is (kvEvents), so what it holds is unknown until its subscriber's next snapshot. A
		// worker whose engine publishes its own events (R22: a block size seen) never reports
		// kv_events, and its subscriber sends changes only: its heartbeat or scrape keeps them.
		v.kidx.Forget(&s.member)
	}
	var oldLoRAs []string
	if s.live {
		oldLoRAs = s.servedLoRAs(s.info.LoRAAdapters)
	}
	var newLoRAs []string
	if m.Live {
		newLoRAs = s.servedLoRAs(m.Info.LoRAAdapters)
	}
	v.setLoRAs(s, oldLoRAs, newLoRAs)
	s.info, s.live, s.unreachable = m.Info, m.Live, m.Unreachable
	if m.AcqSeen >= s.acqSeen {
		s.reported, s.acqSeen, s.failLoad = m.InFlight, m.AcqSeen, m.FailLoad
	}
	if v.peerLoad {
		// The engine's count holds this router's requests too (and, late, some that ended
		// since it counted), and those the other replicas told of: what it reports beyond
		// them is load no table explains (a replica that shares nothing). All are bounded by
		// the report's validation of running and queue depth and by the tables' bounds.
		s.peer = max(0, s.info.Running+s.info.QueueDepth-s.inFlight()-s.others)
	}
	if s.live {
		v.models[s.info.Model]++
	}
	if prev != nil && s.routable() && prev.key == (poolKey{model: s.info.Model, role: s.info.Role}) {
		// Still routable in the same pool (every heartbeat): update in place, so the policy
		// keeps its state (round robin counters, ring position).
		prev.p.SetWeight(&s.member, s.info.KVTotalBlocks)
		prev.p.SetLoad(&s.member, prev.memberLoad(s))
		prev.setPeer(s, s.peer)
		prev.countKV(s)
		prev.countRestricted(s)
		v.setState(s, s.stateName())
		return false
	}
	was := s.pool != nil
	v.leavePool(s)
	v.joinPool(s)
	return was || s.pool != nil
}

// joinPool puts a routable slot into its pool and updates the state gauges.
func (v *workerView) joinPool(s *slot) {
	v.setState(s, s.stateName())
	if !s.routable() {
		return
	}
	key := poolKey{model: s.info.Model, role: s.info.Role}
	pl := v.pools[key]
	if pl == nil {
		name := v.policy
		if key.role == RolePrefill {
			name = "least_outstanding" // R8: the least loaded prefill worker
		}
		p, _ := policy.New(name, policy.Options{LoadFactor: v.loadFactor}) // validated in Props
		_, bounded := p.(policy.PeerLoader)
		pl = &pool{key: key, name: key.String(), p: p, members: make(map[string]*slot), ownOrder: !bounded}
		v.pools[key] = pl
	}
	pl.p.Add(&s.member, pl.memberLoad(s), s.info.KVTotalBlocks)
	pl.setPeer(s, s.peer)
	pl.members[s.info.ID] = s
	pl.ids = nil
	s.pool = pl
	pl.countKV(s)
	if s.kvBlockSize > 0 {
		pl.kvBlockSize = s.kvBlockSize
	}
	pl.countRestricted(s)
	v.routable++
	v.poolsMoved = true
}

func (v *workerView) leavePool(s *slot) {
	if s.pool == nil {
		return
	}
	s.pool.p.Remove(&s.member)
	s.pool.setPeer(s, 0)
	if s.kvIn {
		s.pool.kvMembers--
		s.kvIn = false
	}
	if s.restrictedIn {
		s.pool.restricted--
		s.restrictedIn = false
	}
	delete(s.pool.members, s.info.ID)
	s.pool.ids = nil
	if s.pool.p.Len() == 0 {
		delete(v.pools, s.pool.key)
	}
	s.pool = nil
	v.routable--
	v.poolsMoved = true
}

func (v *workerView) setState(s *slot, name string) {
	if s.state == name {
		return
	}
	if g := v.gauges[s.state]; g != nil {
		g.Dec()
	}
	if g := v.gauges[name]; g != nil {
		g.Inc()
	}
	s.state = name
}

func (v *workerView) remove(s *slot) {
	s.ej.stop()
	v.leavePool(s)
	v.setState(s, stateNone)
	if s.live {
		v.dropModel(s.info.Model)
		v.setLoRAs(s, s.servedLoRAs(s.info.LoRAAdapters), nil)
		s.live = false
	}
	delete(v.slots, s.info.ID)
	delete(v.byPID, s.pid.Id)
	v.forgetShared(s.info.ID)
	if v.pidx != nil {
		v.pidx.Forget(s.info.ID)
	}
	if v.kidx != nil {
		v.kidx.Forget(&s.member)
	}
}

// dropModel forgets one live worker of model.
func (v *workerView) dropModel(model string) {
	if v.models[model]--; v.models[model] <= 0 {
		delete(v.models, model)
	}
}

// removeByPID forgets the worker whose actor stopped; it reports whether pid was a worker's.
func (v *workerView) removeByPID(pid *actor.PID) bool {
	s := v.byPID[pid.Id]
	if s == nil || !s.pid.Equal(pid) {
		return false
	}
	v.remove(s)
	return true
}

func (v *workerView) list(epoch uint64) *WorkerList {
	out := &WorkerList{Epoch: epoch, Workers: make([]WorkerView, 0, len(v.slots))}
	for _, s := range v.slots {
		if !s.live {
			continue // evicted (R1): no longer listed
		}
		wv := WorkerView{Info: s.info, InFlight: s.inFlight(), Routable: s.routable(), Unreachable: s.unreachable,
			FailLoad: s.failLoad, ReplicasInFlight: s.others}
		if s.ej.on {
			wv.EjectedUntil, wv.EjectionReason = s.ej.until, s.ej.reason.String()
		}
		if n, w, ok := policy.Model(&s.member); ok {
			wv.TTFT = &TTFTModelView{Observations: n, BiasMs: w[ttftmodel.Bias], MsPerLoad: w[ttftmodel.Load],
				MsPer1kUncachedTokens: w[ttftmodel.KTokens]}
		}
		out.Workers = append(out.Workers, wv)
	}
	slices.SortFunc(out.Workers, func(a, b WorkerView) int { return cmp.Compare(a.Info.ID, b.Info.ID) })
	return out
}
