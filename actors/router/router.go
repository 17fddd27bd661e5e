// Package router is the router actor: it holds the route table and the view of every worker
// (pushed to it by the worker actors), and answers picks from that view in O(log n) without
// asking any other actor (SPEC R3, R5).
package router

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// Config is what the router needs.
type Config struct {
	Policy     string  // route_policy
	LoadFactor float64 // affinity_load_factor
	Routes     []config.Route
	Metrics    *Metrics
	Logger     *slog.Logger
	// Admission turns the admission queue on (nil: every pick is answered at once).
	Admission *AdmissionConfig
	// Clock times the queue (default the real clock).
	Clock clock.Clock
	// PrefixIndexBlocks turns the approximate prefix index on (chunk hashes remembered per
	// worker); 0 = off.
	PrefixIndexBlocks int
}

// slot is the router's record of one registered worker.
type slot struct {
	pid  *actor.PID
	info WorkerInfo
	live bool
	// The worker's reported in-flight count and Acquire count, and how many picks the router
	// has handed out for it: load = reported + (acqSent − acqSeen) + queue depth. Both counters
	// are monotonic, so an optimistic reservation reconciles exactly with the next report.
	reported int64
	acqSeen  uint64
	acqSent  uint64
	// acqSentAtBeat is acqSent at the previous heartbeat report: a reservation older than a
	// heartbeat interval whose Acquire never came (its requester crashed between the pick and
	// the Acquire) is dropped at the next one, so a lost reservation never inflates the load.
	acqSentAtBeat uint64
	member        policy.Member
	pool          *pool // the pool the member is in while routable, else nil
	state         string
}

func (s *slot) load() int64 {
	return s.reported + int64(s.acqSent-s.acqSeen) + s.info.QueueDepth
}

func (s *slot) routable() bool {
	return s.live && !s.info.Draining && !s.info.AdminDrained
}

func (s *slot) stateName() string {
	switch {
	case !s.live:
		return stateNone
	case s.info.AdminDrained:
		return stateDrained
	case s.info.Draining:
		return stateDraining
	}
	return stateRoutable
}

type poolKey struct {
	model string
	role  Role
}

type pool struct {
	key     poolKey
	p       policy.Policy
	members map[string]*slot // by worker id
	ids     []string         // member ids in order, rebuilt after a membership change
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

// state survives restarts of the router actor: a panic while handling one message must not
// lose the route table or the worker view.
type state struct {
	cfg       Config
	epoch     uint64
	routes    []config.Route
	byName    map[string]*route
	slots     map[string]*slot // by worker id
	byPID     map[string]*slot // by worker actor id, for Terminated
	pools     map[poolKey]*pool
	models    map[string]int // live workers per served model
	routable  int
	decisions [maxReasons]prometheus.Counter
	gauges    map[string]prometheus.Gauge
	adm       *admissionState // nil without [admission]
	// The approximate prefix index (nil when off) and the one scoring function prefix_aware
	// pools use, reading the hashes of the pick at hand.
	pidx        *prefixindex.Index
	scoreHashes []uint64
	scoreFn     func(id string) int
}

// Props returns the router actor's props. The route table starts at epoch 1.
func Props(cfg Config, opts ...actor.PropsOption) (*actor.Props, error) {
	if _, err := policy.New(cfg.Policy, policy.Options{LoadFactor: cfg.LoadFactor}); err != nil {
		return nil, err
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	st := &state{
		cfg:       cfg,
		epoch:     1,
		slots:     make(map[string]*slot),
		byPID:     make(map[string]*slot),
		pools:     make(map[poolKey]*pool),
		models:    make(map[string]int),
		decisions: cfg.Metrics.decisionCounters(cfg.Policy),
		gauges:    cfg.Metrics.workerGauges(),
	}
	st.setRoutes(cfg.Routes)
	if cfg.PrefixIndexBlocks > 0 {
		st.pidx = prefixindex.New(cfg.PrefixIndexBlocks)
		st.scoreFn = func(id string) int { return st.pidx.Match(id, st.scoreHashes) }
	}
	if cfg.Admission != nil {
		clk := cfg.Clock
		if clk == nil {
			clk = clock.Real{}
		}
		st.adm = newAdmission(cfg.Admission, clk, cfg.Metrics.admission)
	}
	return actor.PropsFromProducer(func() actor.Actor { return &routerActor{st: st} }, opts...), nil
}

type routerActor struct{ st *state }

// Receive handles the router's messages.
func (r *routerActor) Receive(c actor.Context) {
	st := r.st
	if st.admissionMessage(c, c.Message()) {
		return
	}
	switch m := c.Message().(type) {
	case *GetQueue:
		c.Respond(&QueueView{})
	case *Pick:
		if m.Admit != nil && st.adm != nil {
			st.admit(c, m)
			return
		}
		c.Respond(st.pick(m))
	case *LoadReport:
		if st.loadReport(m) {
			st.wakeCapacity(c)
		}
	case *WorkerState:
		if st.workerState(c, m) {
			st.wakeAll(c)
		} else {
			st.wakeCapacity(c) // a heartbeat may report a shorter queue
		}
	case *actor.Terminated:
		st.removeByPID(m.Who)
		st.wakeAll(c)
	case *ListWorkers:
		c.Respond(st.listWorkers())
	case *GetRoutes:
		c.Respond(&RouteTable{Epoch: st.epoch, Routes: slices.Clone(st.routes)})
	case *PutRoutes:
		if m.IfMatch != st.epoch {
			c.Respond(fmt.Errorf("route table is at epoch %d, If-Match names %d: %w", st.epoch, m.IfMatch, errs.ErrEtagMismatch))
			return
		}
		st.epoch++
		st.setRoutes(m.Routes)
		st.cfg.Logger.Info("route table replaced", "epoch", st.epoch, "routes", len(m.Routes))
		if p := c.Parent(); p != nil {
			c.Send(p, &EpochChanged{Epoch: st.epoch})
		}
		c.Respond(&RouteTable{Epoch: st.epoch, Routes: slices.Clone(st.routes)})
	case *ListModels:
		c.Respond(st.listModels())
	case *Ready:
		c.Respond(&Readiness{Routable: st.routable})
	}
}

func (st *state) setRoutes(routes []config.Route) {
	st.routes = slices.Clone(routes)
	st.byName = compileRoutes(st.routes)
}

// target is a resolved Pick: the route, the served model and pool, the cascade step.
type target struct {
	out    *Picked // the answer's template (route, model, step)
	key    poolKey
	disagg bool
}

// resolve finds what a Pick asks for (R5); out.Err is set for an unknown model.
func (st *state) resolve(m *Pick) target {
	var served, routeID string
	stepIdx, steps := 0, 1
	var accept *cascade.Accept
	disagg := false
	if rt := st.byName[m.Model]; rt != nil {
		routeID = rt.id
		served, stepIdx, steps, accept = rt.target(m.RequestID, m.Step)
		disagg = rt.disaggregated
	} else if st.models[m.Model] > 0 {
		served, routeID = m.Model, m.Model // a model with no route is its own route
	} else {
		return target{out: &Picked{Tag: m.Tag, Err: fmt.Errorf("the model %q does not exist: %w", m.Model, errs.ErrModelNotFound)}}
	}
	role := RoleUnified
	if disagg {
		role = RoleDecode
	}
	return target{
		out: &Picked{Tag: m.Tag, Route: routeID, ServedModel: served, Step: stepIdx, Steps: steps, Accept: accept},
		key: poolKey{model: served, role: role}, disagg: disagg,
	}
}

// pick answers one Pick that needs no admission. Nothing here blocks or allocates except the
// reply.
func (st *state) pick(m *Pick) *Picked {
	t := st.resolve(m)
	if t.out.Err != nil {
		return t.out
	}
	return st.choose(t, m.PrefixHash, m.PrefixHashes, m.Exclude, "")
}

// choose picks (and reserves) the worker(s) for a resolved pick: the soft target when it is in
// the pool and not excluded, else the pool's policy; plus the least loaded prefill worker of a
// disaggregated route.
func (st *state) choose(t target, prefixHash uint64, hashes []uint64, exclude []string, soft string) *Picked {
	out := t.out
	var s *slot
	reason := policy.ReasonLeastLoad
	if soft != "" {
		if ts := st.slots[soft]; ts != nil && ts.pool != nil && ts.pool.key == t.key && !slices.Contains(exclude, soft) {
			s = ts
		}
	}
	if s == nil {
		if pl := st.pools[t.key]; pl != nil && st.pidx != nil && len(hashes) > 0 {
			if ps, ok := pl.p.(policy.PrefixScorer); ok {
				st.scoreHashes = hashes
				ps.SetScores(st.scoreFn)
			}
		}
		s, reason = st.pickIn(t.key, prefixHash, exclude)
	}
	if s == nil {
		out.Err = fmt.Errorf("no routable %s worker serves %q: %w", t.key.role, t.key.model, errs.ErrNoCapacity)
		return out
	}
	if t.disagg {
		// R8: the prefill worker is the least loaded one (prefill pools are least_outstanding).
		p, _ := st.pickIn(poolKey{model: t.key.model, role: RolePrefill}, 0, exclude)
		if p == nil {
			out.Err = fmt.Errorf("no routable prefill worker serves %q: %w", t.key.model, errs.ErrNoCapacity)
			return out
		}
		st.reserve(p)
		out.Prefill = &PickedWorker{Worker: p.pid, WorkerID: p.info.ID, HTTPAddress: p.info.HTTPAddress, GRPCAddress: p.info.GRPCAddress}
	}
	st.reserve(s)
	st.decisions[reason].Inc()
	if st.pidx != nil && len(hashes) > 0 {
		st.pidx.Record(s.info.ID, hashes) // its engine will hold this prompt's KV now
	}
	out.Worker, out.WorkerID, out.HTTPAddress = s.pid, s.info.ID, s.info.HTTPAddress
	out.GRPCAddress, out.KVAddress, out.Reason = s.info.GRPCAddress, s.info.KVAddress, reason
	return out
}

func (st *state) pickIn(key poolKey, prefixHash uint64, exclude []string) (*slot, policy.Reason) {
	pl := st.pools[key]
	if pl == nil {
		return nil, 0
	}
	mem, reason := pl.p.Pick(prefixHash, exclude)
	if mem == nil {
		return nil, reason
	}
	return mem.Ref.(*slot), reason
}

// reserve counts a pick on s before its Acquire arrives (the optimistic reservation).
func (st *state) reserve(s *slot) {
	s.acqSent++
	if s.pool != nil {
		s.pool.p.SetLoad(&s.member, s.load())
	}
}

// loadReport applies a worker's in-flight change; it reports whether the load fell (room may
// have freed: a wake for the admission queue).
func (st *state) loadReport(m *LoadReport) bool {
	s := st.slots[m.ID]
	if s == nil || m.AcqSeen < s.acqSeen {
		return false // stale: a newer report has been applied
	}
	before := s.load()
	s.reported, s.acqSeen = m.InFlight, m.AcqSeen
	if s.acqSent < s.acqSeen {
		s.acqSent = s.acqSeen // Acquires that did not come from this router's picks
	}
	if s.pool != nil {
		s.pool.p.SetLoad(&s.member, s.load())
	}
	return s.load() < before
}

// workerState applies a worker's report; it reports whether the worker's membership of a pool
// changed (it joined, left or changed pool: a wake for the admission queue).
func (st *state) workerState(c actor.Context, m *WorkerState) bool {
	s := st.slots[m.Info.ID]
	if s != nil && !s.pid.Equal(m.PID) {
		// A new actor for the same id (the old one was evicted and its Terminated is still on
		// the way): start a fresh record.
		st.remove(s)
		s = nil
	}
	if s == nil {
		if !m.Live {
			return false
		}
		s = &slot{pid: m.PID}
		s.member.ID = m.Info.ID
		s.member.Ref = s
		st.slots[m.Info.ID] = s
		st.byPID[m.PID.Id] = s
		c.Watch(m.PID)
	}
	if s.live {
		st.dropModel(s.info.Model)
	}
	prev := s.pool
	s.info, s.live = m.Info, m.Live
	if m.AcqSeen >= s.acqSeen {
		s.reported, s.acqSeen = m.InFlight, m.AcqSeen
		if s.acqSent < s.acqSeen {
			s.acqSent = s.acqSeen
		}
		if m.Heartbeat {
			if lost := int64(s.acqSentAtBeat) - int64(s.acqSeen); lost > 0 {
				st.cfg.Logger.Warn("dropping reservations never acquired", "worker", s.info.ID, "count", lost)
				s.acqSent -= uint64(lost)
			}
			s.acqSentAtBeat = s.acqSent
		}
	}
	if s.live {
		st.models[s.info.Model]++
	}
	if prev != nil && s.routable() && prev.key == (poolKey{model: s.info.Model, role: s.info.Role}) {
		// Still routable in the same pool (every heartbeat): update in place, so the policy
		// keeps its state (round robin counters, ring position).
		prev.p.SetWeight(&s.member, s.info.KVTotalBlocks)
		prev.p.SetLoad(&s.member, s.load())
		st.setState(s, s.stateName())
		return false
	}
	was := s.pool != nil
	st.leavePool(s)
	st.joinPool(s)
	return was || s.pool != nil
}

// joinPool puts a routable slot into its pool and updates the state gauges.
func (st *state) joinPool(s *slot) {
	st.setState(s, s.stateName())
	if !s.routable() {
		return
	}
	key := poolKey{model: s.info.Model, role: s.info.Role}
	pl := st.pools[key]
	if pl == nil {
		name := st.cfg.Policy
		if key.role == RolePrefill {
			name = "least_outstanding" // R8: the least loaded prefill worker
		}
		p, _ := policy.New(name, policy.Options{LoadFactor: st.cfg.LoadFactor}) // validated in Props
		pl = &pool{key: key, p: p, members: make(map[string]*slot)}
		st.pools[key] = pl
	}
	pl.p.Add(&s.member, s.load(), s.info.KVTotalBlocks)
	pl.members[s.info.ID] = s
	pl.ids = nil
	s.pool = pl
	st.routable++
}

func (st *state) leavePool(s *slot) {
	if s.pool == nil {
		return
	}
	s.pool.p.Remove(&s.member)
	delete(s.pool.members, s.info.ID)
	s.pool.ids = nil
	if s.pool.p.Len() == 0 {
		delete(st.pools, s.pool.key)
	}
	s.pool = nil
	st.routable--
}

func (st *state) setState(s *slot, name string) {
	if s.state == name {
		return
	}
	if g := st.gauges[s.state]; g != nil {
		g.Dec()
	}
	if g := st.gauges[name]; g != nil {
		g.Inc()
	}
	s.state = name
}

func (st *state) remove(s *slot) {
	st.leavePool(s)
	st.setState(s, stateNone)
	if s.live {
		st.dropModel(s.info.Model)
		s.live = false
	}
	delete(st.slots, s.info.ID)
	delete(st.byPID, s.pid.Id)
	if st.pidx != nil {
		st.pidx.Forget(s.info.ID)
	}
}

// dropModel forgets one live worker of model.
func (st *state) dropModel(model string) {
	if st.models[model]--; st.models[model] <= 0 {
		delete(st.models, model)
	}
}

func (st *state) removeByPID(pid *actor.PID) {
	if s := st.byPID[pid.Id]; s != nil && s.pid.Equal(pid) {
		st.remove(s)
	}
}

func (st *state) listWorkers() *WorkerList {
	out := &WorkerList{Epoch: st.epoch, Workers: make([]WorkerView, 0, len(st.slots))}
	for _, s := range st.slots {
		if !s.live {
			continue // evicted (R1): no longer listed
		}
		out.Workers = append(out.Workers, WorkerView{
			Info: s.info, InFlight: s.reported + int64(s.acqSent-s.acqSeen), Routable: s.routable(),
		})
	}
	slices.SortFunc(out.Workers, func(a, b WorkerView) int { return cmp.Compare(a.Info.ID, b.Info.ID) })
	return out
}

func (st *state) listModels() *ModelList {
	seen := make(map[string]bool)
	for _, rt := range st.routes {
		seen[rt.Model] = true
		for _, a := range rt.Aliases {
			seen[a] = true
		}
	}
	for model := range st.models {
		seen[model] = true
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return &ModelList{IDs: ids}
}
