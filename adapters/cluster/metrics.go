package cluster

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	up       prometheus.Gauge
	replicas prometheus.Gauge
	// rateExchange is 1 while the replicas' rate-limit usage is exchanged (rates.go).
	rateExchange prometheus.Gauge
}

// newMetrics registers tlgw_config_store_up and tlgw_cluster_replicas (reg may be nil).
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tlgw_config_store_up",
			Help: "1 while etcd, the cluster's configuration store, answers this replica; 0 while it serves its last known state (R16).",
		}),
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tlgw_cluster_replicas",
			Help: "Live gateway replicas as this replica last saw them in etcd (it counts itself); rate limits are divided by it (R13.5).",
		}),
		rateExchange: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tlgw_ratelimit_exchange_up",
			Help: "1 while this replica's rate-limit shares follow the replicas' traffic exchanged through etcd; 0 while it takes the even share ⌈limit / replicas⌉ (R13.5, R16).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.up, m.replicas, m.rateExchange)
	}
	return m
}
