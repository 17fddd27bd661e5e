package router

import (
	"cmp"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Load sharing between the gateway's replicas (R23). Each replica's worker actors count its
// own requests only; a router that picked by them alone would let every replica fill the same
// holder of a hot prefix up to the bounded-load cap, none seeing the others' requests until the
// engine's next report. So the replicas tell one another their own in-flight counts per worker
// (adapters/replicaload, about every 100 ms): a router counts what each other replica last told
// it in that worker's load (slot.others), beside its own exact count, and its policies order and
// cap by the sum, as one router in front of the whole fleet would. What the engine reports
// beyond both (a replica that shares nothing, requests from elsewhere) stays the peer load of
// Config.PeerLoad.
//
// A replica's table replaces its previous one whole (an id it no longer names is 0 there); its
// end (the stream closed, the replica gone) forgets it. Tables name workers by id; an id this
// router does not know is skipped (not kept: a worker that registers later starts at 0 and
// gets the replica's count with its next table, at most a share interval later).

// MaxShareReplicas bounds the other replicas whose tables a router keeps (as the cluster
// follows at most 64 replicas); a table from one more is dropped and counted.
const MaxShareReplicas = 64

// maxShareInFlight bounds one count of a table (a replica's requests on one worker).
const maxShareInFlight = 1 << 20

// WorkerLoad is one worker's in-flight requests at one replica.
type WorkerLoad struct {
	ID       string
	InFlight int64
}

// ReplicaLoad is another replica's whole table: its in-flight requests per worker (the
// workers it does not name have none of its). Answered with nothing.
type ReplicaLoad struct {
	Replica string
	Loads   []WorkerLoad
}

// ForgetReplica drops another replica's table: its counts no longer hold (its stream ended).
type ForgetReplica struct{ Replica string }

// GetOwnLoad asks for this router's own in-flight requests per worker, the table it shares
// with the other replicas: answered with *OwnLoad.
type GetOwnLoad struct{}

// OwnLoad is this router's own in-flight requests on each worker that has any, sorted by id.
type OwnLoad struct{ Loads []WorkerLoad }

// replicaTable is what one other replica told: raw, its last table (worker id → its in-flight
// requests there), and counts, what this router counts of them — for each worker the lesser of
// its last two tables' counts. A request counts once two tables in a row hold it, and stops as
// soon as one table no longer does: a request shorter than the share interval (which a table
// would still show up to an interval after it ended, long after it mattered) never counts, and
// the replicas keep agreeing on a lightly loaded affinity owner; a long one counts an interval
// after it started. Both maps hold only ids of workers this router knows (bounded by them);
// spare is a cleared map reused for the next raw table.
type replicaTable struct {
	raw, counts, spare map[string]int64
}

// shareTables is the other replicas' tables by replica name, at most MaxShareReplicas.
type shareTables struct {
	by      map[string]*replicaTable
	dropped uint64 // tables refused over MaxShareReplicas
}

// replicaLoad applies one replica's table; it reports whether some worker's load fell (room may
// have freed for the admission queue).
func (v *workerView) replicaLoad(m *ReplicaLoad) (fell bool) {
	t := v.share.by[m.Replica]
	if t == nil {
		if len(v.share.by) >= MaxShareReplicas {
			v.share.dropped++
			return false
		}
		if v.share.by == nil {
			v.share.by = make(map[string]*replicaTable)
		}
		t = &replicaTable{raw: make(map[string]int64), counts: make(map[string]int64)}
		v.share.by[m.Replica] = t
	}
	next := t.spare
	if next == nil {
		next = make(map[string]int64, len(m.Loads))
	}
	for _, l := range m.Loads {
		if l.InFlight <= 0 {
			continue
		}
		if s := v.slots[l.ID]; s != nil && s.live {
			next[l.ID] = min(l.InFlight, maxShareInFlight) // a repeated id: its last count
		}
	}
	for id, old := range t.counts {
		if _, ok := next[id]; !ok {
			fell = v.addOthers(v.slots[id], -old) || fell
			delete(t.counts, id)
		}
	}
	for id, n := range next {
		c := min(n, t.raw[id]) // 0 when the last table did not hold it
		if d := c - t.counts[id]; d != 0 {
			fell = v.addOthers(v.slots[id], d) || fell
		}
		if c > 0 {
			t.counts[id] = c
		} else {
			delete(t.counts, id)
		}
	}
	clear(t.raw)
	t.raw, t.spare = next, t.raw
	return fell
}

// forgetReplica drops a replica's table; it reports whether some worker's load fell.
func (v *workerView) forgetReplica(name string) (fell bool) {
	t := v.share.by[name]
	if t == nil {
		return false
	}
	for id, n := range t.counts {
		fell = v.addOthers(v.slots[id], -n) || fell
	}
	delete(v.share.by, name)
	return fell
}

// addOthers moves slot s's count of the other replicas' requests by d; it reports whether its
// load fell.
func (v *workerView) addOthers(s *slot, d int64) bool {
	if s == nil || d == 0 {
		return false
	}
	s.others += d
	if s.pool != nil {
		s.pool.p.SetLoad(&s.member, s.pool.memberLoad(s))
	}
	return d < 0
}

// forgetShared takes a removed worker out of every replica's table, so a worker registering
// later under its id starts at 0.
func (v *workerView) forgetShared(id string) {
	for _, t := range v.share.by {
		delete(t.counts, id)
		delete(t.raw, id)
	}
}

// tieKey is a member's policy.Member.Tie: 0 without a salt (id order), else a hash of its id
// mixed with the salt (never 0, so a salted order never falls back to ids but on a collision).
func tieKey(salt uint64, id string) uint64 {
	if salt == 0 {
		return 0
	}
	x := xxhash.Sum64String(id) ^ salt
	x ^= x >> 33 // a 64-bit finaliser: every salt bit moves every output bit
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x | 1
}

// ownLoad is this router's table for the other replicas.
func (v *workerView) ownLoad() *OwnLoad {
	out := &OwnLoad{}
	for id, s := range v.slots {
		if n := s.inFlight(); n > 0 && s.live {
			out.Loads = append(out.Loads, WorkerLoad{ID: id, InFlight: n})
		}
	}
	slices.SortFunc(out.Loads, func(a, b WorkerLoad) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
