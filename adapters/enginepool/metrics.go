package enginepool

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the pools' series. Their pool label is a pool's configured name (at most
// config.MaxEnginePools at once; a pool's series go when it does); no address is ever a label.
type Metrics struct {
	members  *prometheus.GaugeVec
	failures *prometheus.CounterVec
	drops    *prometheus.CounterVec
}

// NewMetrics registers the series on reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tlgw_engine_pool_workers",
			Help: "Workers of each engine pool (R23) by state: active (a record of the last good resolve) or draining (its record vanished; removed once nothing is in flight on it).",
		}, []string{"pool", "state"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_engine_pool_resolve_failures_total",
			Help: "Resolves of an engine pool's name that kept the last good set: a failed lookup, or a first empty answer (the next one confirms it).",
		}, []string{"pool"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_engine_pool_records_dropped_total",
			Help: "Records of an engine pool left out, per resolve, by reason: over_limit (past 1024 records), refused (the engine address rules), drain_overflow (a draining worker retired early: over 1024 drained at once).",
		}, []string{"pool", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.members, m.failures, m.drops)
	}
	return m
}

func (m *Metrics) workers(pool string, active, draining int) {
	if m == nil {
		return
	}
	m.members.WithLabelValues(pool, "active").Set(float64(active))
	m.members.WithLabelValues(pool, "draining").Set(float64(draining))
}

func (m *Metrics) failed(pool string) {
	if m != nil {
		m.failures.WithLabelValues(pool).Inc()
	}
}

func (m *Metrics) dropped(pool, reason string, n int) {
	if m != nil && n > 0 {
		m.drops.WithLabelValues(pool, reason).Add(float64(n))
	}
}

// forget drops a pool's series once it has left the table and drained.
func (m *Metrics) forget(pool string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"pool": pool}
	m.members.DeletePartialMatch(l)
	m.failures.DeletePartialMatch(l)
	m.drops.DeletePartialMatch(l)
}
