package replicaload

import "github.com/prometheus/client_golang/prometheus"

// Outcomes of tlgw_replica_load_tables_total.
const (
	outcomeApplied         = "applied"
	outcomeRejected        = "rejected"
	outcomeUnauthenticated = "unauthenticated"
)

// serverMetrics are the Server's; no worker or replica id is a label (their number is the
// fleet's, not a bound of the metrics).
type serverMetrics struct {
	peers  prometheus.Gauge
	tables *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer) *serverMetrics {
	m := &serverMetrics{
		peers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tlgw_replica_load_peers",
			Help: "Replicas whose load table this replica holds: each has a Share stream open to it (R23).",
		}),
		tables: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_replica_load_tables_total",
			Help: "Load tables received from other replicas (R23): applied, rejected (invalid, not a live replica, over the bound on replicas), or unauthenticated (a stream refused for its secret).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{outcomeApplied, outcomeRejected, outcomeUnauthenticated} {
		m.tables.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.peers, m.tables)
	}
	return m
}

// sharerMetrics are the Sharer's.
type sharerMetrics struct {
	ignored  prometheus.Gauge
	failures prometheus.Counter
}

func newSharerMetrics(reg prometheus.Registerer) *sharerMetrics {
	m := &sharerMetrics{
		ignored: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tlgw_replica_load_peers_ignored",
			Help: "Other replicas this replica does not send its load to, as it already streams to as many as it may (R23).",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tlgw_replica_load_stream_failures_total",
			Help: "Share streams to other replicas that failed (could not be opened, or broke); each is redialled with backoff (R23).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.ignored, m.failures)
	}
	return m
}
