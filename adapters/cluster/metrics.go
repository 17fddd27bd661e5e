package cluster

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	up       prometheus.Gauge
	replicas prometheus.Gauge
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
	}
	if reg != nil {
		reg.MustRegister(m.up, m.replicas)
	}
	return m
}
