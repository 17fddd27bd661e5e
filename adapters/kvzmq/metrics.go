package kvzmq

import "github.com/prometheus/client_golang/prometheus"

// metrics are the subscriber's series (R22). Labels take only fixed values: an event kind the
// decoder knows, a resync cause.
type metrics struct {
	events       *prometheus.CounterVec // tlgw_kv_zmq_events_total{kind}
	batches      prometheus.Counter     // tlgw_kv_zmq_batches_total
	gaps         prometheus.Counter     // tlgw_kv_zmq_gaps_total
	resyncs      *prometheus.CounterVec // tlgw_kv_zmq_resyncs_total{how}
	decodeErrors prometheus.Counter     // tlgw_kv_zmq_decode_errors_total
	dropped      prometheus.Counter     // tlgw_kv_zmq_dropped_batches_total
	orphans      prometheus.Counter     // tlgw_kv_zmq_orphan_events_total
	unknownTopic prometheus.Counter     // tlgw_kv_zmq_unknown_topic_total
	refused      prometheus.Counter     // tlgw_kv_zmq_refused_connections_total
	replayErrors prometheus.Counter     // tlgw_kv_zmq_replay_errors_total
}

func newMetrics(reg prometheus.Registerer) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tlgw_kv_zmq_events_total",
			Help: "Engines' own KV events received (R22), by kind: BlockStored, BlockRemoved, AllBlocksCleared."}, []string{"kind"}),
		batches: c("tlgw_kv_zmq_batches_total", "KV event batches applied or resynced from (R22)."),
		gaps:    c("tlgw_kv_zmq_gaps_total", "KV event seq gaps: batches a worker published that the gateway missed."),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tlgw_kv_zmq_resyncs_total",
			Help: "Resyncs of a worker's KV state: replay (a gap was filled), kept (a gap could not be filled: its entries were kept), clear (its entries were dropped: over a bound), restart (its seq went back)."}, []string{"how"}),
		decodeErrors: c("tlgw_kv_zmq_decode_errors_total", "KV event messages or connections refused as malformed or over a bound."),
		dropped:      c("tlgw_kv_zmq_dropped_batches_total", "KV event batches dropped because the worker's buffer was full (a resync follows)."),
		orphans:      c("tlgw_kv_zmq_orphan_events_total", "BlockStored events whose parent block is unknown (not indexed)."),
		unknownTopic: c("tlgw_kv_zmq_unknown_topic_total", "KV event batches whose topic names no live worker the connection may speak for."),
		refused:      c("tlgw_kv_zmq_refused_connections_total", "Connections to the kv_events listen address refused: not from a live worker's host, or over the bound."),
		replayErrors: c("tlgw_kv_zmq_replay_errors_total", "Replay requests that failed."),
	}
	for _, k := range []string{"BlockStored", "BlockRemoved", "AllBlocksCleared"} {
		m.events.WithLabelValues(k)
	}
	for _, h := range []string{"replay", "kept", "clear", "restart"} {
		m.resyncs.WithLabelValues(h)
	}
	if reg != nil {
		reg.MustRegister(m.events, m.batches, m.gaps, m.resyncs, m.decodeErrors, m.dropped, m.orphans, m.unknownTopic, m.refused, m.replayErrors)
	}
	return m
}
