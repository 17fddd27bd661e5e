package router

import (
	"github.com/prometheus/client_golang/prometheus"
)

// routeGauges is tlgw_route_routable_workers{route} (R17.2: the "no routable worker" alert):
// per configured route, the routable workers its requests can go to. Route ids are the
// operator's (the route table), never an engine's string, so the series are bounded by the
// table; a route that leaves the table loses its series.
type routeGauges struct {
	vec   *prometheus.GaugeVec
	shown map[string]bool // the route ids published last: the table's
	dirty bool            // the table or a pool's membership changed since the last publish
}

func newRouteGaugeVec() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tlgw_route_routable_workers",
		Help: "Routable workers a configured route can send requests to (a disaggregated route: its decode workers, 0 without a routable prefill worker); 0 means its requests fail no_capacity.",
	}, []string{"route"})
}

// routableFor counts the routable workers of a route: the unified workers of every model it
// serves (its backends, its cascade steps, or its own id), each model once; for a
// disaggregated route the decode workers, when a prefill worker is routable too.
func (v *workerView) routableFor(r *route) int {
	size := func(model string, role Role) int {
		if pl := v.pools[poolKey{model: model, role: role}]; pl != nil {
			return pl.p.Len()
		}
		return 0
	}
	models := make([]string, 0, 1+len(r.backends)+len(r.steps))
	for _, b := range r.backends {
		models = append(models, b.model)
	}
	for _, s := range r.steps {
		models = append(models, s.model)
	}
	if len(models) == 0 {
		models = append(models, r.id)
	}
	n := 0
	for i, m := range models {
		if indexOf(models[:i], m) >= 0 {
			continue
		}
		if r.disaggregated {
			if size(m, RolePrefill) > 0 {
				n += size(m, RoleDecode)
			}
			continue
		}
		n += size(m, RoleUnified)
	}
	return n
}

func indexOf(ss []string, s string) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return -1
}

// publish sets every configured route's gauge and drops the series of routes gone from the
// table. It runs after a message that changed the table or a pool.
func (g *routeGauges) publish(t *routeTable, v *workerView) {
	if g == nil || !g.dirty {
		return
	}
	g.dirty = false
	seen := make(map[string]bool, len(t.routes))
	for _, rc := range t.routes {
		r := t.byName[rc.Model]
		if r == nil || seen[r.id] {
			continue
		}
		seen[r.id] = true
		g.vec.WithLabelValues(r.id).Set(float64(v.routableFor(r)))
	}
	for id := range g.shown {
		if !seen[id] {
			g.vec.DeleteLabelValues(id)
		}
	}
	g.shown = seen
}
