package router

import (
	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/config"
)

// route is a compiled entry of the route table (R5).
type route struct {
	id            string
	cfg           config.Route
	backends      []backend // cumulative weights, for the canary draw
	total         float64
	steps         []step // a cascade's steps (R7); empty otherwise
	disaggregated bool   // targets = ["disaggregated"] (R8)
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

// CanaryDraw maps a request id to u in [0, 1): the top 53 bits of Hash64(id) over 2^53 (R3.4,
// R5). One id always gives the same u, and u is uniform over ids.
func CanaryDraw(requestID string) float64 {
	return float64(xxhash.Sum64String(requestID)>>11) / (1 << 53)
}

// target resolves a cascade step: the model served, the step index, the number of steps and
// the step's accept rule (nil on the last step). Other routes have one step.
func (r *route) target(requestID string, stepAsked int) (served string, stepIdx, steps int, accept *cascade.Accept) {
	if len(r.steps) == 0 {
		return r.servedModel(requestID), 0, 1, nil
	}
	i := stepAsked
	if i < 0 || i >= len(r.steps) {
		i = len(r.steps) - 1
	}
	return r.steps[i].model, i, len(r.steps), r.steps[i].accept
}

// servedModel is the model id an attempt of a non-cascade route sends to the engine: a
// backend drawn by the request id, or the route's own id.
func (r *route) servedModel(requestID string) string {
	if len(r.backends) > 0 {
		x := CanaryDraw(requestID) * r.total
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
