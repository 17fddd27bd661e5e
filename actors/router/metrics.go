package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/policy"
)

// Metrics are the router's Prometheus series (R11). Every label is a bounded set: the
// configured policy, decision reasons, worker states and ejection reasons are fixed; route ids
// are the route table's (routeGauges deletes the series of a route that leaves it); the
// admission series are by configured class (admissionMetrics). No worker id, model or client
// string labels a router series.
type Metrics struct {
	decisions *prometheus.CounterVec
	workers   *prometheus.GaugeVec
	ejections *prometheus.CounterVec
	routes    *prometheus.GaugeVec // tlgw_route_routable_workers{route}
	kvIndex   prometheus.Gauge     // tlgw_kv_index_entries
	kvDropped prometheus.Counter   // tlgw_kv_index_dropped_total
	warmups   prometheus.Counter   // tlgw_prefix_warmups_total
	admission admissionMetrics
	// R25: tlgw_rollout_step{route} (the canary's share in percent) and
	// tlgw_rollout_decisions_total{route,decision}; route ids are the configuration's.
	rolloutStep      *prometheus.GaugeVec
	rolloutDecisions *prometheus.CounterVec
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
			Help: "Registered workers by state: routable, draining (engine-reported), drained (admin), ejected (outlier detection).",
		}, []string{"state"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_outlier_ejections_total",
			Help: "Workers ejected by outlier detection (R14.2), by the failure that ended the streak: refused, reset, timeout, 5xx, interrupted.",
		}, []string{"reason"}),
	}
	m.routes = newRouteGaugeVec()
	m.kvIndex = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tlgw_kv_index_entries",
		Help: "Chunk ids precise_prefix's exact index holds, summed over workers (R18.3; 0 under other policies).",
	})
	m.kvDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tlgw_kv_index_dropped_total",
		Help: "Chunk ids engines reported STORED that precise_prefix's exact index did not record: the worker already held blocks_per_worker ids (R18.3). Growing means the bound is below what the engines cache.",
	})
	m.warmups = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tlgw_prefix_warmups_total",
		Help: "Prefix warm-ups reserved: a prefix pick left every holder of the matched prefix at the bounded-load cap, so its prefix was copied to the least loaded worker ahead of demand (gateway.prefix_warmup_min_bytes).",
	})
	m.admission = newAdmissionMetrics()
	m.rolloutStep = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tlgw_rollout_step",
		Help: "R25: the canary's share of each route with a rollout, in percent (0 after a rollback or an abort, 100 once promoted).",
	}, []string{"route"})
	m.rolloutDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tlgw_rollout_decisions_total",
		Help: "R25: rollout decisions by route: advance, hold, rollback, promote, abort.",
	}, []string{"route", "decision"})
	if reg != nil {
		a := m.admission
		reg.MustRegister(m.decisions, m.workers, m.ejections, m.routes, m.kvIndex, m.kvDropped, m.warmups, a.queueLength, a.queueWait, a.gateDecisions, a.queueRejections,
			a.programs, a.programPauses, a.programForcedResumes, m.rolloutStep, m.rolloutDecisions)
	}
	return m
}

// Worker states exported by tlgw_workers.
const (
	stateNone     = ""
	stateRoutable = "routable"
	stateDraining = "draining"
	stateDrained  = "drained"
	stateEjected  = "ejected"
	// stateUnreachable: its address refused a connection since its last heartbeat (R19).
	stateUnreachable = "unreachable"
)

// decisionCounters caches the counter of every reason for one policy, so a pick does no label
// lookup.
func (m *Metrics) decisionCounters(policyName string) [maxReasons]prometheus.Counter {
	var out [maxReasons]prometheus.Counter
	for r := range policy.Reason(maxReasons) {
		if name := r.String(); name != "unknown" {
			out[r] = m.decisions.WithLabelValues(policyName, name)
		}
	}
	return out
}

// maxReasons bounds the policy.Reason values the decision counters cover.
const maxReasons = 8

func (m *Metrics) workerGauges() map[string]prometheus.Gauge {
	return map[string]prometheus.Gauge{
		stateRoutable:    m.workers.WithLabelValues(stateRoutable),
		stateDraining:    m.workers.WithLabelValues(stateDraining),
		stateDrained:     m.workers.WithLabelValues(stateDrained),
		stateEjected:     m.workers.WithLabelValues(stateEjected),
		stateUnreachable: m.workers.WithLabelValues(stateUnreachable),
	}
}
