package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/policy"
)

// Metrics are the router's Prometheus series (R11).
type Metrics struct {
	decisions *prometheus.CounterVec
	workers   *prometheus.GaugeVec
}

// NewMetrics registers the router's series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_routing_decisions_total",
			Help: "Picks by route policy and reason (least_load, weighted, affinity, load).",
		}, []string{"policy", "reason"}),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tlgw_workers",
			Help: "Registered workers by state: routable, draining (engine-reported), drained (admin).",
		}, []string{"state"}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.workers)
	}
	return m
}

// Worker states exported by tlgw_workers.
const (
	stateNone     = ""
	stateRoutable = "routable"
	stateDraining = "draining"
	stateDrained  = "drained"
)

// decisionCounters caches the counter of every reason for one policy, so a pick does no label
// lookup.
func (m *Metrics) decisionCounters(policyName string) [4]prometheus.Counter {
	var out [4]prometheus.Counter
	for r := policy.ReasonLeastLoad; r <= policy.ReasonLoad; r++ {
		out[r] = m.decisions.WithLabelValues(policyName, r.String())
	}
	return out
}

func (m *Metrics) workerGauges() map[string]prometheus.Gauge {
	return map[string]prometheus.Gauge{
		stateRoutable: m.workers.WithLabelValues(stateRoutable),
		stateDraining: m.workers.WithLabelValues(stateDraining),
		stateDrained:  m.workers.WithLabelValues(stateDrained),
	}
}
