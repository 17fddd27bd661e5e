package router

import (
	"fmt"
	"slices"

	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/rollout"
)

// routeTable is the route table (R5) and its epoch; PUT /admin/v1/routes replaces it whole.
type routeTable struct {
	epoch  uint64
	routes []config.Route    // the operator's table, replaced whole
	byName map[string]*route // its routes by model and alias, rebuilt with it
	canary *canaryDraw       // the canary draw under the process's or the cluster's key (R20)
}

func newRouteTable(routes []config.Route, key CanaryKey) *routeTable {
	t := &routeTable{epoch: 1, canary: newCanaryDraw(key)}
	t.set(routes)
	return t
}

func (t *routeTable) set(routes []config.Route) {
	t.routes = slices.Clone(routes)
	t.byName = compileRoutes(t.routes)
}

// put replaces the table when ifMatch is its epoch.
func (t *routeTable) put(ifMatch uint64, routes []config.Route) (*RouteTable, error) {
	if ifMatch != t.epoch {
		return nil, fmt.Errorf("route table is at epoch %d, If-Match names %d: %w", t.epoch, ifMatch, errs.ErrEtagMismatch)
	}
	t.epoch++
	t.set(routes)
	return t.view(), nil
}

// install sets the table and its epoch as the cluster's store gives them (R16).
func (t *routeTable) install(epoch uint64, routes []config.Route) {
	t.epoch = epoch
	t.set(routes)
}

func (t *routeTable) view() *RouteTable {
	return &RouteTable{Epoch: t.epoch, Routes: slices.Clone(t.routes)}
}

// target is a resolved Pick: the answer's template (route, model, step), the pool it goes to.
type target struct {
	out    *Picked
	key    poolKey
	disagg bool
	// endpoint is the Pick's (R21); adapter the LoRA adapter the model id names ("" when it
	// names a base model: lora.go), whose workers are in the pool of key.
	endpoint oai.Kind
	adapter  string
	load     *LoRALoad // an adapter to load on demand (lora.go)
}

// resolve finds what a Pick asks for (R5); out.Err is set for an unknown model. A model id
// with no route is its own route when a live worker serves it, as its base model or as a LoRA
// adapter (R21). A disaggregated route serves completions and chat through prefill and
// decode; its other endpoints go to a decode worker alone.
func (t *routeTable) resolve(m *Pick, v *workerView) target {
	served := func(model string) bool {
		return v.models[model] > 0 || len(v.loraIdx[model]) > 0 || v.onDemand[model] != nil
	}
	var model, routeID string
	stepIdx, steps := 0, 1
	var accept *cascade.Accept
	disagg, pd := false, ""
	var win *rollout.Window
	if rt := t.byName[m.Model]; rt != nil {
		routeID, win = rt.id, rt.window
		model, stepIdx, steps, accept = rt.target(t.canary, m.RequestID, m.Step)
		if win != nil && model == rt.cfg.Rollout.Canary && (len(m.Exclude) > 0 || v.models[model] == 0) {
			// R25: a request whose attempt failed during a rollout goes on on the baseline,
			// whatever its draw: the canary's failure is counted in its window, and the
			// client does not pay for it beyond the failover. So does one drawn for a canary
			// that has no live worker (not up yet, or restarting).
			model = rt.cfg.Rollout.Baseline
		}
		disagg, pd = rt.disaggregated, rt.cfg.PD()
	} else if served(m.Model) {
		model, routeID = m.Model, m.Model
	} else {
		return target{out: &Picked{Tag: m.Tag, Err: fmt.Errorf("the model %s does not exist: %w", errs.Echo(m.Model), errs.ErrModelNotFound)}}
	}
	role := RoleUnified
	if disagg {
		role = RoleDecode
		disagg = m.Endpoint <= oai.Chat
	}
	t2 := target{
		out: &Picked{Tag: m.Tag, Route: routeID, ServedModel: model, Step: stepIdx, Steps: steps, Accept: accept},
		key: poolKey{model: model, role: role}, disagg: disagg, endpoint: m.Endpoint,
	}
	t2.out.Rollout = win
	if disagg {
		t2.out.PDProtocol = pd
		// A decode worker alone: its request carries the KV its first prefill left (R22).
		t2.disagg = !m.DecodeOnly
	}
	if v.models[model] == 0 {
		if len(v.loraIdx[model]) > 0 {
			t2.adapter, t2.key.model = model, v.loraBase(model)
		}
		if a := v.onDemand[model]; a != nil {
			// A configured adapter is of its configured base model, whatever base a worker
			// lists it under.
			t2.adapter, t2.load, t2.key.model = model, &LoRALoad{Name: a.Name, Path: a.Path}, a.BaseModel
		}
	}
	return t2
}

// noCapacity is the answer's error when no worker of the target can be picked.
func (t target) noCapacity() error {
	if t.disagg {
		return fmt.Errorf("no routable decode and prefill workers serve %q: %w", t.key.model, errs.ErrNoCapacity)
	}
	return fmt.Errorf("no routable %s worker serves %q: %w", t.key.role, t.key.model, errs.ErrNoCapacity)
}

// route is a compiled entry of the route table (R5).
type route struct {
	id            string
	cfg           config.Route
	backends      []backend // cumulative weights, for the canary draw
	total         float64
	steps         []step // a cascade's steps (R7); empty otherwise
	disaggregated bool   // targets = ["disaggregated"] (R8)
	// window counts the route's rollout (R25) while it runs: every pick of the route carries
	// it (Picked.Rollout); nil without a rollout, or once it has ended.
	window *rollout.Window
}

type step struct {
	model  string
	accept *cascade.Accept // nil on the last step
}

type backend struct {
	model string
	cum   float64
}

// compileRoutes indexes a validated table by public id and alias.
func compileRoutes(routes []config.Route) map[string]*route {
	byName := make(map[string]*route, 2*len(routes))
	for _, rc := range routes {
		r := &route{id: rc.Model, cfg: rc}
		r.disaggregated = len(rc.Targets) == 1 && rc.Targets[0] == config.TargetDisaggregated
		for i, cs := range rc.Cascade {
			st := step{model: cs.Model}
			if i < len(rc.Cascade)-1 {
				a, err := cascade.ParseAcceptIf(cs.AcceptIf)
				if err == nil { // validated before it got here (config.ValidateRoutes)
					st.accept = &a
				}
			}
			r.steps = append(r.steps, st)
		}
		for _, b := range rc.Backends {
			r.total += b.Weight
			r.backends = append(r.backends, backend{model: b.Model, cum: r.total})
		}
		byName[rc.Model] = r
		for _, a := range rc.Aliases {
			byName[a] = r
		}
	}
	return byName
}

// target resolves a cascade step: the model served, the step index, the number of steps and
// the step's accept rule (nil on the last step). Other routes have one step.
func (r *route) target(canary *canaryDraw, requestID string, stepAsked int) (served string, stepIdx, steps int, accept *cascade.Accept) {
	if len(r.steps) == 0 {
		return r.servedModel(canary, requestID), 0, 1, nil
	}
	i := stepAsked
	if i < 0 || i >= len(r.steps) {
		i = len(r.steps) - 1
	}
	return r.steps[i].model, i, len(r.steps), r.steps[i].accept
}

// reaches reports whether the route can send a request to model: one of its backends or
// cascade steps, or its own id when it has neither (a disaggregated route's model).
func (r *route) reaches(model string) bool {
	for _, b := range r.backends {
		if b.model == model {
			return true
		}
	}
	for _, st := range r.steps {
		if st.model == model {
			return true
		}
	}
	return len(r.backends) == 0 && len(r.steps) == 0 && r.id == model
}

// servedModel is the model id an attempt of a non-cascade route sends to the engine: a
// backend drawn by the request id under the canary key, or the route's own id.
func (r *route) servedModel(canary *canaryDraw, requestID string) string {
	if len(r.backends) > 0 {
		x := canary.draw(requestID) * r.total
		for _, b := range r.backends {
			if x < b.cum {
				return b.model
			}
		}
		// x == total can only come from rounding; the last backend with weight takes it.
		for i := len(r.backends) - 1; i >= 0; i-- {
			if i == 0 || r.backends[i].cum > r.backends[i-1].cum {
				return r.backends[i].model
			}
		}
	}
	return r.id
}
