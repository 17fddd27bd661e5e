package fleet

import (
	"slices"
	"strconv"
	"time"

	"github.com/tlgw/tlgw/actors/router"
)

// Gateway replicas (SPEC R23, Options.Replicas): N routers in front of the one fleet, each a
// router.Sim of its own — its own in-flight counts (its worker actors hold its own tickets
// only), its own admission queue and its own approximate prefix index (what it sent) — while
// what the engines report reaches every one of them, as it does when every replica scrapes or
// hears every engine: each heartbeat (queue depth, running, KV blocks) and each KV event
// message. Those reports travel Options.ReportDelay (0: at once, as a single router hears them);
// a replica's own releases and its worker actors' counts do not (they are in its own process).
// Clients are spread over the replicas round robin: request i goes to replica i mod N, and so
// does everything of it (its release, its warm-up, its TTFT observation, its admission).
//
// The engines' first reports, at time 0, reach every replica at once: a gateway knows its
// fleet before its first client (the registry's registration), whatever the delay.

// MaxReplicas bounds Options.Replicas: each replica holds a router's whole view and indexes.
const MaxReplicas = 64

// MaxReportDelay bounds Options.ReportDelay (a report older than a heartbeat interval of the
// gateway's default T is a stale one, not a delay).
const MaxReportDelay = 10 * time.Second

// report is an engine's report on its way to the replicas: a heartbeat's worker info, or (kv
// non-nil) one KV event message, its ids copied (the sender reuses its buffers).
type report struct {
	info router.WorkerInfo
	kv   *router.KVEvents
}

// MinLoadShare bounds Options.LoadShare from below (the product's bound, config's
// load_share_interval).
const MinLoadShare = 10 * time.Millisecond

// shareTransit is how long a replica's load table takes to reach the others: one message over
// the cluster's network, far below the interval.
const shareTransit = int64(time.Millisecond)

// share is one replica's load table on its way to the others.
type share struct {
	from  int
	table *router.ReplicaLoad
}

// share sends replica k's own load table to the others (they receive it shareTransit later).
func (r *runner) share(k int32) {
	own := r.sims[k].OwnLoad()
	r.shares = append(r.shares, share{from: int(k), table: &router.ReplicaLoad{Replica: strconv.Itoa(int(k)), Loads: own.Loads}})
	r.q.push(r.now+shareTransit, evShareArrive, 0)
}

// shareArrived delivers the oldest load table on its way to every replica but its sender.
func (r *runner) shareArrived() {
	sh := r.shares[r.shareHead]
	r.shares[r.shareHead] = share{}
	r.shareHead++
	if r.shareHead == len(r.shares) {
		r.shares, r.shareHead = r.shares[:0], 0
	}
	for k, s := range r.sims {
		if k != sh.from {
			s.ReplicaLoad(sh.table)
		}
	}
}

// routerOf is the replica that serves request i.
func (r *runner) routerOf(i int32) *router.Sim { return r.sims[int(i)%len(r.sims)] }

// toRouters delivers a heartbeat's worker info to every replica, at once or after the delay.
func (r *runner) toRouters(info router.WorkerInfo, now bool) {
	if now || r.o.ReportDelay == 0 {
		for _, s := range r.sims {
			s.SetWorker(info)
		}
		return
	}
	r.post(report{info: info})
}

// kvToRouters delivers one KV event message to every replica, at once (reporting whether every
// replica applied it, as router.Sim.KVEvents) or after the delay (reporting true: the
// subscriber hears no answer from a router on its way).
func (r *runner) kvToRouters(ev *router.KVEvents) bool {
	if r.o.ReportDelay == 0 {
		ok := true
		for _, s := range r.sims {
			ev.Reg = 0 // each replica numbers its own registrations
			ok = s.KVEvents(ev) && ok
		}
		return ok
	}
	c := *ev
	c.Stored, c.Removed = slices.Clone(ev.Stored), slices.Clone(ev.Removed)
	r.post(report{kv: &c})
	return true
}

// post sends rep on its way: it reaches the replicas ReportDelay from now. Reports travel in
// order (one delay for all), so pending is a FIFO; it holds the reports of one delay's worth of
// simulated time (every engine's heartbeats and KV messages in that window).
func (r *runner) post(rep report) {
	r.pending = append(r.pending, rep)
	r.q.push(r.now+int64(r.o.ReportDelay), evReport, 0)
}

// arrived delivers the oldest report on its way to every replica.
func (r *runner) reportArrived() {
	rep := r.pending[r.pendHead]
	r.pending[r.pendHead] = report{}
	r.pendHead++
	if r.pendHead > 1024 && 2*r.pendHead > len(r.pending) {
		r.pending = append(r.pending[:0], r.pending[r.pendHead:]...)
		r.pendHead = 0
	}
	if rep.kv == nil {
		for _, s := range r.sims {
			s.SetWorker(rep.info)
		}
		return
	}
	for _, s := range r.sims {
		rep.kv.Reg = 0
		s.KVEvents(rep.kv)
	}
}
