package gateway_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// routeGauge reads tlgw_route_routable_workers{route}; ok is false when the series is absent.
func routeGauge(t *testing.T, reg *prometheus.Registry, route string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tlgw_route_routable_workers" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == route {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestRouteRoutableWorkersGauge (R17.2): per configured route, the routable workers its
// requests can reach — backends and cascade steps counted per model once, a disaggregated
// route's decode workers only with a prefill worker up — following drains, evictions and
// table changes; a route that leaves the table loses its series.
func TestRouteRoutableWorkersGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	routes := config.NormalizeRoutes([]config.Route{
		{Model: "chat", Backends: []config.Backend{{Model: "smol", Weight: 3}, {Model: "smol", Weight: 1}, {Model: "big", Weight: 1}}},
		{Model: "auto", Cascade: []config.CascadeStep{{Model: "smol", AcceptIf: "mean_logprob > -1.0"}, {Model: "big"}}},
		{Model: "pd", Backends: []config.Backend{{Model: "smol-pd", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
		{Model: "ghost"},
	})
	h := gwtest.New(t, gwtest.WithRoutes(routes...), gwtest.WithRouterMetrics(reg))
	h.Beat(gwtest.Worker("s1", "smol", 0))
	h.Beat(gwtest.Worker("s2", "smol", 0))
	h.Beat(gwtest.Worker("b1", "big", 0))
	dec := gwtest.Worker("d1", "smol-pd", 0)
	dec.Role = router.RoleDecode
	h.Beat(dec)
	want := func(what string, exp map[string]float64) {
		t.Helper()
		h.Eventually(what, func() bool {
			for r, n := range exp {
				got, ok := routeGauge(t, reg, r)
				if n < 0 {
					if ok {
						return false
					}
					continue
				}
				if !ok || got != n {
					return false
				}
			}
			return true
		})
	}
	want("decode without prefill counts 0", map[string]float64{"chat": 3, "auto": 3, "pd": 0, "ghost": 0})
	pre := gwtest.Worker("p1", "smol-pd", 0)
	pre.Role = router.RolePrefill
	h.Beat(pre)
	want("prefill up", map[string]float64{"pd": 1})
	h.GW.SyncDrains([]string{"smol"})
	want("smol drained", map[string]float64{"chat": 1, "auto": 1})
	h.GW.SyncDrains(nil)
	want("undrained", map[string]float64{"chat": 3, "auto": 3})
	h.GW.InstallRoutes(9, routes[:1])
	want("routes gone from the table lose their series", map[string]float64{"chat": 3, "auto": -1, "pd": -1, "ghost": -1})
}
