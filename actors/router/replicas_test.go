package router

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// table delivers replica's table twice, as two shares in a row: what it holds counts.
func (r *rig) table(replica string, loads ...WorkerLoad) {
	for range 2 {
		r.deliver(nil, &ReplicaLoad{Replica: replica, Loads: loads})
	}
}

// ownLoadOf asks the router for its own table, as the load sharer does.
func (r *rig) ownLoadOf() []WorkerLoad {
	q := r.newRequester()
	r.deliver(q.pid, &GetOwnLoad{})
	as := q.answers()
	if len(as) != 1 {
		r.t.Fatalf("GetOwnLoad: %d answers", len(as))
	}
	return as[0].(*OwnLoad).Loads
}

// The other replicas' tables count in a worker's load: picks go where the fleet's whole load is
// least, a newer table replaces the older whole, and a forgotten replica counts no more.
func TestReplicaTablesCountInTheLoad(t *testing.T) {
	r := newRig(t, Config{Policy: "precise_prefix"}) // a bounded-load policy; no prefix: by load
	r.join("a", "smol", 0)
	r.join("b", "smol", 0)
	pickOne := func() string {
		t.Helper()
		q := r.newRequester()
		q.pick("x", "smol", "")
		p := q.picked()
		q.release(p)
		return p.WorkerID
	}
	if got := pickOne(); got != "a" {
		t.Fatalf("no tables: picked %s, want a (ties to the smaller id)", got)
	}
	r.table("r2", WorkerLoad{ID: "a", InFlight: 3})
	if got := pickOne(); got != "b" {
		t.Fatalf("r2 has 3 on a: picked %s, want b", got)
	}
	r.table("r3", WorkerLoad{ID: "b", InFlight: 5})
	if got := pickOne(); got != "a" {
		t.Fatalf("a 3, b 5: picked %s, want a", got)
	}
	// r2's next table names b only: a's 3 are gone.
	r.table("r2", WorkerLoad{ID: "b", InFlight: 1})
	if a, b := r.st.view.slots["a"].others, r.st.view.slots["b"].others; a != 0 || b != 6 {
		t.Fatalf("after r2's second table: a %d b %d, want 0 and 6", a, b)
	}
	r.deliver(nil, &ForgetReplica{Replica: "r3"})
	r.deliver(nil, &ForgetReplica{Replica: "nobody"}) // unknown: nothing
	if b := r.st.view.slots["b"].others; b != 1 {
		t.Fatalf("after r3 is forgotten: b %d, want 1", b)
	}
	ws := r.st.view.list(0).Workers
	if ws[1].Info.ID != "b" || ws[1].ReplicasInFlight != 1 || ws[1].InFlight != 0 {
		t.Fatalf("listing: %+v", ws[1])
	}
}

// least_outstanding orders by this replica's own requests (and the engines' queues), not the
// shared counts, which every replica holds alike between shares; the admission threshold still
// sees the whole load.
func TestLeastOutstandingOrdersByItsOwn(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 4)})
	r.join("a", "smol", 0)
	r.join("b", "smol", 0)
	r.table("r2", WorkerLoad{ID: "a", InFlight: 3})
	q := r.newRequester()
	q.pick("x", "smol", "")
	p := q.picked()
	if p.WorkerID != "a" {
		t.Fatalf("picked %s, want a (own loads 0 and 0, ties by id)", p.WorkerID)
	}
	if s := r.st.view.slots["a"]; s.member.Load() != 1 || s.load() != 4 || !r.st.adm.full(s) {
		t.Fatalf("a: policy load %d, load %d, full %v; want 1, 4, full", s.member.Load(), s.load(), r.st.adm.full(s))
	}
	q.release(p)
}

// Salted ties: equally loaded members are ordered by a hash of their ids that differs between
// salts (replicas), and by id without a salt.
func TestTieKeys(t *testing.T) {
	if tieKey(0, "a") != 0 || tieKey(0, "b") != 0 {
		t.Fatal("no salt: ties by id")
	}
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprint("w", i)
	}
	first := func(salt uint64) string {
		best := ids[0]
		for _, id := range ids[1:] {
			if tieKey(salt, id) < tieKey(salt, best) {
				best = id
			}
		}
		return best
	}
	seen := map[string]bool{}
	for salt := uint64(1); salt <= 8; salt++ {
		if tieKey(salt, "w1") == 0 || tieKey(salt, "w1") != tieKey(salt, "w1") {
			t.Fatal("a salted key is 0 or not stable")
		}
		seen[first(salt)] = true
	}
	if len(seen) < 5 {
		t.Fatalf("8 salts put only %d distinct members first among 64", len(seen))
	}
	r := newRig(t, Config{TieSalt: 7})
	r.join("a", "smol", 0)
	if s := r.st.view.slots["a"]; s.member.Tie != tieKey(7, "a") {
		t.Fatalf("a's tie %d, want %d", s.member.Tie, tieKey(7, "a"))
	}
}

// A count holds once two tables in a row hold it — the lesser of the two — and falls as soon
// as one table holds less: a request shorter than a share interval never counts.
func TestReplicaCountsNeedTwoTables(t *testing.T) {
	r := newRig(t, Config{Policy: "precise_prefix"})
	r.join("a", "smol", 0)
	s := r.st.view.slots["a"]
	for i, c := range []struct {
		n, want int64
	}{{3, 0}, {0, 0}, {2, 0}, {5, 2}, {5, 5}, {1, 1}, {4, 1}, {4, 4}, {0, 0}, {7, 0}} {
		var ls []WorkerLoad
		if c.n > 0 {
			ls = []WorkerLoad{{ID: "a", InFlight: c.n}}
		}
		r.deliver(nil, &ReplicaLoad{Replica: "r2", Loads: ls})
		if s.others != c.want || s.member.Load() != c.want {
			t.Fatalf("table %d (a: %d): others %d, policy load %d; want %d", i, c.n, s.others, s.member.Load(), c.want)
		}
	}
}

// What a table may not move: unknown workers, counts ≤ 0, counts over the bound (clamped), more
// replicas than the bound; a removed worker is forgotten, so its id registering again starts at 0.
func TestReplicaTablesBounds(t *testing.T) {
	r := newRig(t, Config{})
	r.join("a", "smol", 0)
	r.deliver(nil, &ReplicaLoad{Replica: "r2", Loads: []WorkerLoad{
		{ID: "ghost", InFlight: 4}, {ID: "a", InFlight: -7}, {ID: "a", InFlight: 0},
	}})
	if n := r.st.view.slots["a"].others; n != 0 || len(r.st.view.share.by["r2"].counts) != 0 {
		t.Fatalf("a %d, r2's table %v: want nothing kept", n, r.st.view.share.by["r2"].counts)
	}
	r.table("r2", WorkerLoad{ID: "a", InFlight: 1 << 40})
	if n := r.st.view.slots["a"].others; n != maxShareInFlight {
		t.Fatalf("a %d, want the bound %d", n, maxShareInFlight)
	}
	for i := range MaxShareReplicas + 3 {
		r.table(fmt.Sprint("x", i), WorkerLoad{ID: "a", InFlight: 1})
	}
	if n, d := len(r.st.view.share.by), r.st.view.share.dropped; n != MaxShareReplicas || d != 8 { // 4 replicas, 2 tables each
		t.Fatalf("%d tables kept, %d dropped; want %d and 8", n, d, MaxShareReplicas)
	}
	if n := r.st.view.slots["a"].others; n != maxShareInFlight+MaxShareReplicas-1 {
		t.Fatalf("a %d", n)
	}
	r.leave("a")
	if _, ok := r.st.view.slots["a"]; ok {
		t.Fatal("a still has a slot after leaving")
	}
	for name, tb := range r.st.view.share.by {
		if len(tb.counts) != 0 {
			t.Fatalf("replica %s still counts %v for a removed worker", name, tb.counts)
		}
	}
	r.join("a", "smol", 0)
	if n := r.st.view.slots["a"].others; n != 0 {
		t.Fatalf("a registering again starts at %d, want 0", n)
	}
	for i := range MaxShareReplicas {
		r.deliver(nil, &ForgetReplica{Replica: fmt.Sprint("x", i)})
	}
	r.deliver(nil, &ForgetReplica{Replica: "r2"})
	if len(r.st.view.share.by) != 0 {
		t.Fatalf("%d tables left after every replica is forgotten", len(r.st.view.share.by))
	}
}

// The router's own table lists its own in-flight requests (not the other replicas'), by id.
func TestOwnLoadTable(t *testing.T) {
	r := newRig(t, Config{Policy: "precise_prefix"})
	for _, id := range []string{"c", "a", "b"} {
		r.join(id, "smol", 0)
	}
	if got := r.ownLoadOf(); len(got) != 0 {
		t.Fatalf("idle: %v", got)
	}
	r.table("r2", WorkerLoad{ID: "a", InFlight: 9}, WorkerLoad{ID: "b", InFlight: 9})
	var held []*Picked
	qs := r.newRequester()
	for range 3 {
		qs.pick("x", "smol", "")
		held = append(held, qs.picked())
	}
	got := r.ownLoadOf()
	want := []WorkerLoad{{ID: "c", InFlight: 3}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("own table %v, want %v (a and b carry the other replica's 9)", got, want)
	}
	for _, p := range held {
		qs.release(p)
	}
	if got := r.ownLoadOf(); len(got) != 0 {
		t.Fatalf("after the releases: %v", got)
	}
}

// With PeerLoad, what an engine reports beyond this replica's and the tables' requests is the
// peer load: a replica that shares nothing.
func TestPeerLoadIsWhatNoTableExplains(t *testing.T) {
	r := newRig(t, Config{PeerLoad: true, Policy: "precise_prefix"})
	r.join("a", "smol", 0)
	q := r.newRequester()
	q.pick("x", "smol", "")
	p := q.picked()
	r.table("r2", WorkerLoad{ID: "a", InFlight: 3})
	w := r.workers[r.workerPID("a").Id]
	w.info.Running = 6
	r.report(w)
	s := r.st.view.slots["a"]
	if s.peer != 2 || s.pool.peer != 2 {
		t.Fatalf("peer %d (pool %d), want 6 − 1 own − 3 shared = 2", s.peer, s.pool.peer)
	}
	w.info.Running = 2 // the engine counted before some of the shared ones began
	r.report(w)
	if s.peer != 0 {
		t.Fatalf("peer %d, want 0 (never below)", s.peer)
	}
	q.release(p)
}

// Whatever the order of tables, forgets, picks, releases, leaves and joins: a worker's count of
// the other replicas' requests is the sum of the tables' counts for it, its policy load is its
// load, and nothing is kept for a worker the router does not know.
func TestReplicaTablesProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		r := newRig(rt, Config{Policy: "precise_prefix"})
		ids := []string{"a", "b", "c"}
		joined := map[string]bool{}
		for _, id := range ids {
			r.join(id, "smol", 0)
			joined[id] = true
		}
		q := r.newRequester()
		var held []*Picked
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0:
				var ls []WorkerLoad
				for range rapid.IntRange(0, 5).Draw(rt, "n") {
					ls = append(ls, WorkerLoad{ID: rapid.SampledFrom(append(ids, "ghost")).Draw(rt, "id"),
						InFlight: rapid.Int64Range(-2, 9).Draw(rt, "count")})
				}
				r.deliver(nil, &ReplicaLoad{Replica: rapid.SampledFrom([]string{"r1", "r2", "r3"}).Draw(rt, "rep"), Loads: ls})
			case 1:
				r.deliver(nil, &ForgetReplica{Replica: rapid.SampledFrom([]string{"r1", "r2", "r3"}).Draw(rt, "rep")})
			case 2:
				q.pick("x", "smol", "")
				if as := q.answers(); len(as) == 1 {
					if p, ok := as[0].(*Picked); ok && p.Err == nil {
						held = append(held, p)
					}
				}
			case 3:
				if len(held) > 0 {
					q.release(held[0])
					held = held[1:]
				}
			case 4:
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				if joined[id] && len(r.workers[r.workerPID(id).Id].holds) == 0 {
					r.leave(id)
					joined[id] = false
				}
			case 5:
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				if !joined[id] {
					r.join(id, "smol", 0)
					joined[id] = true
				}
			}
			sums := map[string]int64{}
			for _, tb := range r.st.view.share.by {
				for id, n := range tb.counts {
					if r.st.view.slots[id] == nil || n <= 0 {
						rt.Fatalf("a table keeps %s = %d", id, n)
					}
					sums[id] += n
				}
			}
			for id, s := range r.st.view.slots {
				if s.others != sums[id] {
					rt.Fatalf("%s: others %d, tables sum %d", id, s.others, sums[id])
				}
				if s.pool != nil && s.member.Load() != s.load() {
					rt.Fatalf("%s: policy load %d, load %d", id, s.member.Load(), s.load())
				}
			}
		}
		for _, p := range held {
			q.release(p)
		}
	})
}

// A request queued because the other replicas' requests fill the only worker is sent when a
// table shows them gone, and one forgotten replica frees it as well.
func TestReplicaTableWakesTheQueue(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("w1", "smol", 0)
	r.table("r2", WorkerLoad{ID: "w1", InFlight: 1})
	a := r.newRequester()
	a.pick("a", "smol", "")
	a.queued()
	r.deliver(nil, &ReplicaLoad{Replica: "r2", Loads: nil})
	p := a.picked()
	if p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("a after r2's table emptied: %+v", p)
	}
	a.release(p)
	r.table("r3", WorkerLoad{ID: "w1", InFlight: 2})
	b := r.newRequester()
	b.pick("b", "smol", "")
	b.queued()
	r.deliver(nil, &ForgetReplica{Replica: "r3"})
	if p := b.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("b after r3 was forgotten: %+v", p)
	}
}
