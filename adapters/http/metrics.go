package httpapi

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// httpMetrics are the adapter's own series; the request-level ones belong to actors/request.
type httpMetrics struct {
	rejected *prometheus.CounterVec // by code: the statuses the gateway answers itself, a fixed set
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_requests_rejected_total",
			Help: "Inference requests answered before routing (bad input, auth, shutdown) by HTTP status.",
		}, []string{"code"}),
	}
	if reg != nil {
		reg.MustRegister(m.rejected)
	}
	return m
}

func (m *httpMetrics) reject(code int) { m.rejected.WithLabelValues(strconv.Itoa(code)).Inc() }
