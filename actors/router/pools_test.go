package router

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// TestPoolCountsItsKVReporters: whatever workers join, leave, change model, start or stop
// reporting kv_events, or are drained and undrained, every pool's count of members that
// report kv_events (which predicted_latency reads to choose the exact index) is the number of
// its members that do, and a worker outside every pool is counted nowhere.
func TestPoolCountsItsKVReporters(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := newRig(t, Config{Policy: config.PolicyPredictedLatency, KVIndexBlocks: 64})
		ids := []string{"w0", "w1", "w2", "w3", "w4"}
		models := []string{"smol", "big"}
		for step := rapid.IntRange(1, 60).Draw(t, "steps"); step > 0; step-- {
			id := ids[rapid.IntRange(0, len(ids)-1).Draw(t, "id")]
			w := r.workers[r.workerPID(id).Id]
			switch op := rapid.IntRange(0, 3).Draw(t, "op"); {
			case w == nil || op == 0: // (re)join, with or without kv_events, on either model
				kv := rapid.Bool().Draw(t, "kv")
				r.joinWith(id, models[rapid.IntRange(0, 1).Draw(t, "model")], RoleUnified, 0,
					func(i *WorkerInfo) { i.KVEvents = kv; i.BlockSize = 16 })
			case op == 1:
				r.leave(id)
			case op == 2: // its next heartbeat says otherwise about kv_events
				w.info.KVEvents = !w.info.KVEvents
				r.report(w)
			default: // drained or undrained in place
				w.info.AdminDrained = !w.info.AdminDrained
				r.report(w)
			}
			for key, pl := range r.st.view.pools {
				n := 0
				for _, s := range pl.members {
					if s.info.KVEvents {
						n++
					}
					if s.kvIn != s.info.KVEvents {
						t.Fatalf("%s in %v: counted %v, reports %v", s.info.ID, key, s.kvIn, s.info.KVEvents)
					}
				}
				if pl.kvMembers != n {
					t.Fatalf("pool %v counts %d kv reporters of %d members, %d report", key, pl.kvMembers, len(pl.members), n)
				}
			}
			for id, s := range r.st.view.slots {
				if s.pool == nil && s.kvIn {
					t.Fatalf("%s is in no pool yet counted as a kv reporter", id)
				}
			}
		}
	})
}

// TestWorkerStateWithTheSameAcquiresApplies: a heartbeat that has seen no new Acquire since the
// last report still carries the worker's in-flight count (a Release lowered it, or requests it
// counts arrived by another gateway), and the router takes it.
func TestWorkerStateWithTheSameAcquiresApplies(t *testing.T) {
	r := newRig(t, Config{})
	r.join("w1", "smol", 0)
	w := r.workers[r.workerPID("w1").Id]
	w.holds[1], w.holds[2] = nil, nil
	r.report(w)
	if got := r.row(t, "w1").InFlight; got != 2 {
		t.Fatalf("in flight %d after a report of 2", got)
	}
	delete(w.holds, 1) // a Release: the count falls, no Acquire was seen
	r.report(w)
	if got := r.row(t, "w1").InFlight; got != 1 {
		t.Fatalf("in flight %d, want 1 from a report with the same Acquires seen", got)
	}
}

// steerer is an admission policy whose gate lets every head go with a soft target.
type steerer struct{ target string }

func (s *steerer) Classify(*admission.Request, []string, func([]string) int) {}
func (s *steerer) Gate() admission.Gate                                      { return s }
func (s *steerer) Check(*admission.Request, admission.View) admission.Decision {
	return admission.Decision{Go: true, Target: s.target}
}
func (s *steerer) Dispatched(*admission.Request, string)    {}
func (s *steerer) Moved(*admission.Request, string, string) {}
func (s *steerer) Completed(*admission.Request, string)     {}
func (s *steerer) Recheck() time.Duration                   { return 0 }

// TestSoftTargetSteersThePick: the gate's soft target takes the request although the policy
// would pick another worker; a soft target that is excluded, of another model, not
// registered or not routable falls back to the policy.
func TestSoftTargetSteersThePick(t *testing.T) {
	g := &steerer{}
	r := newRig(t, Config{Admission: admissionCfg(g, 0)})
	r.join("w1", "smol", 0)
	r.join("w2", "smol", 5) // least_outstanding would never pick it
	r.join("b1", "big", 0)
	for _, tc := range []struct {
		target  string
		exclude []string
		want    string
	}{
		{"w2", nil, "w2"},
		{"w2", []string{"w2"}, "w1"},
		{"b1", nil, "w1"},
		{"nobody", nil, "w1"},
		{"", nil, "w1"},
	} {
		g.target = tc.target
		q := r.newRequester()
		runBounded(t, tc.target, func() { q.pick("id-"+tc.target, "smol", "", tc.exclude...) })
		p := q.picked()
		if p.Err != nil || p.WorkerID != tc.want {
			t.Fatalf("soft target %q, exclude %v: picked %q (%v), want %s", tc.target, tc.exclude, p.WorkerID, p.Err, tc.want)
		}
		q.release(p)
	}
	w := r.workers[r.workerPID("w2").Id]
	w.info.AdminDrained = true
	r.report(w)
	g.target = "w2"
	q := r.newRequester()
	runBounded(t, "drained", func() { q.pick("id-drained", "smol", "") })
	if p := q.picked(); p.WorkerID != "w1" {
		t.Fatalf("a drained soft target took the request: %q", p.WorkerID)
	}
}

// cacheReader is an admission policy whose classifier reads the cached prefix of each request
// on each of its route's workers.
type cacheReader struct{ seen []map[string]int }

func (c *cacheReader) Classify(_ *admission.Request, route []string, cached func([]string) int) {
	m := map[string]int{}
	for _, id := range route {
		m[id] = cached([]string{id})
	}
	m["*"] = cached(route)
	c.seen = append(c.seen, m)
}
func (c *cacheReader) Gate() admission.Gate { return nil }

// TestClassifierReadsCachedTokens: a classifier asks how many prompt tokens a set of workers
// holds; the answer is the prefix index's best match over them, at 16 tokens per 64-byte chunk
// (the gateway's estimate), and 0 for a request that carries no chunk hashes.
func TestClassifierReadsCachedTokens(t *testing.T) {
	c := &cacheReader{}
	r := newRig(t, Config{Policy: "prefix_aware", PrefixIndexBlocks: 64, Admission: admissionCfg(c, 0)})
	r.join("w1", "smol", 0)
	r.join("w2", "smol", 0)
	h := longPrompt("a prompt the classifier reads, long enough ", 5)
	send := func(id string, hashes []uint64) *Picked {
		q := r.newRequester()
		runBounded(t, id, func() {
			r.deliver(q.pid, &Pick{Model: "smol", RequestID: id, Key: q.key, Requester: q.pid, Tag: 1,
				PrefixHashes: hashes, Admit: &AdmitInfo{}})
		})
		p := q.picked()
		q.release(p)
		return p
	}
	first := send("first", h) // records the prompt on the worker it went to
	other := map[string]string{"w1": "w2", "w2": "w1"}[first.WorkerID]
	send("second", h)
	send("none", nil)
	want := len(h) * prefixindex.ChunkBytes / 4
	if got := c.seen[0]; got[first.WorkerID] != 0 || got["*"] != 0 {
		t.Fatalf("before any pick: %v", got)
	}
	if got := c.seen[1]; got[first.WorkerID] != want || got[other] != 0 || got["*"] != want {
		t.Fatalf("after the prompt went to %s: %v, want %d tokens there", first.WorkerID, got, want)
	}
	if got := c.seen[2]; got[first.WorkerID] != 0 || got["*"] != 0 {
		t.Fatalf("a request without hashes: %v", got)
	}
}
