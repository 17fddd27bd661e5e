package router

import (
	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/internal/config"
)

// route is a compiled entry of the route table (R5).
type route struct {
	id       string
	cfg      config.Route
	backends []backend // cumulative weights, for the canary draw
	total    float64
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

// servedModel is the model id an attempt of this route sends to the engine: a backend drawn
// by the request id, the last cascade step (cascade steps arrive with the request actor; until
// then a cascade route serves its final, most capable step), or the route's own id.
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
	if n := len(r.cfg.Cascade); n > 0 {
		return r.cfg.Cascade[n-1].Model
	}
	return r.id
}
