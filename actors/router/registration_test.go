package router

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// TestWorkerStateOfAnEarlierRegistration: w1 is evicted and registered again; its new actor's
// first report reaches the router before the old actor's last one (a report it made while the
// registry was stopping it: its expiry, a drain, a heartbeat it was handling) and before the
// old actor's Terminated. The old report, live or not, is not the registration the router
// holds now: the new one stays listed, routable and picked, under its own actor.
func TestWorkerStateOfAnEarlierRegistration(t *testing.T) {
	for _, live := range []bool{false, true} {
		r := newRig(t, Config{})
		r.join("w1", "smol", 0)
		r.join("w2", "smol", 0)
		old := r.workers[r.workerPID("w1").Id]
		r.gens["w1"]++ // evicted: the next registration of the id has a new actor
		delete(r.workers, old.pid.Id)
		r.join("w1", "smol", 0)
		cur := r.workers[r.workerPID("w1").Id]
		old.live = live
		r.report(old)
		r.deliver(nil, &actor.Terminated{Who: old.pid})
		row := r.row(t, "w1")
		if !row.Routable || row.Info.Reg != cur.info.Reg {
			t.Fatalf("old actor's late report (live %v): w1 is %+v, want the routable registration %d", live, row, cur.info.Reg)
		}
		q := r.newRequester()
		p := r.st.pick(&Pick{Model: "smol", RequestID: "x", Requester: q.pid, Exclude: []string{"w2"}}, r)
		if p.Err != nil || !p.Worker.Equal(cur.pid) || p.WorkerReg != cur.info.Reg {
			t.Fatalf("old actor's late report (live %v): picked %+v, want w1's new actor %s", live, p, cur.pid.Id)
		}
		if len(cur.holds) != 1 || len(old.holds) != 0 {
			t.Fatalf("the Acquire went to the old actor: new holds %d, old %d", len(cur.holds), len(old.holds))
		}
	}
}

// TestObservedTTFTOfAnEarlierRegistration: a TTFT measured on an attempt picked before w0 was
// evicted and registered again (its engine restarted, maybe on other hardware) arrives after
// the new registration's first report. It is the old engine's: the new registration's model
// does not learn it. The new registration's own observations do.
func TestObservedTTFTOfAnEarlierRegistration(t *testing.T) {
	s, err := NewSim(Config{Policy: config.PolicyPredictedLatency, LoadFactor: 4})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", HTTPAddress: "w0"})
	before, ok := s.Pick(&Pick{Model: "m", RequestID: "r"})
	if !ok || before.Err != nil || before.WorkerID != "w0" {
		t.Fatalf("pick: %v %+v", ok, before)
	}
	s.RemoveWorker("w0")
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", HTTPAddress: "w0"})
	if before.WorkerReg == s.regOf("w0") {
		t.Fatalf("the re-registration kept number %d", before.WorkerReg)
	}
	x := ttftmodel.Features(1, 0)
	for range 10 {
		s.ObserveTTFT(&Picked{WorkerID: "w0", WorkerReg: before.WorkerReg, Features: x}, 900*time.Millisecond)
	}
	if m := s.st.view.list(0).Workers[0].TTFT; m != nil {
		t.Fatalf("the new registration learnt the old engine's TTFTs: %+v", *m)
	}
	after, ok := s.Pick(&Pick{Model: "m", RequestID: "r"})
	if !ok || after.Err != nil {
		t.Fatalf("pick: %v %+v", ok, after)
	}
	s.ObserveTTFT(after, 20*time.Millisecond)
	if m := s.st.view.list(0).Workers[0].TTFT; m == nil || m.Observations != 1 {
		t.Fatalf("the new registration's own observation: model %+v, want 1 observation", m)
	}
}

// TestKVEventsOfAnEarlierRegistration: w0's engine reported what it holds, then w0 was evicted
// and registered again (a new engine at the same or another address). Events of the earlier
// registration's subscription that reach the router after the new registration's report are
// refused: the new engine holds none of it, and picks must not go there as cached. Events of a
// registration the router has not heard of yet are refused too (the subscriber's handshake is
// retried); the current registration's are applied.
func TestKVEventsOfAnEarlierRegistration(t *testing.T) {
	s := preciseSim(t, 2)
	h := longPrompt("the long system prompt ", 8)
	oldReg := s.regOf("w0")
	if !s.KVEvents(&KVEvents{WorkerID: "w0", Reg: oldReg, Clear: true, Stored: h[:6]}) {
		t.Fatal("the registration's own snapshot was refused")
	}
	s.RemoveWorker("w0")
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", HTTPAddress: "127.0.0.1:9", KVEvents: true})
	if s.KVEvents(&KVEvents{WorkerID: "w0", Reg: oldReg, Stored: h}) {
		t.Fatal("an earlier registration's event was applied to the new one")
	}
	if s.KVEvents(&KVEvents{WorkerID: "w0", Reg: s.regOf("w0") + 1, Clear: true, Stored: h}) {
		t.Fatal("an event of a registration the router has not heard of was applied")
	}
	if n := s.st.view.kidx.Entries(); n != 0 {
		t.Fatalf("the exact index holds %d entries after the re-registration, want 0", n)
	}
	if p := s.pickFor(t, h); p.Reason == policy.ReasonPrefix {
		t.Fatalf("picked %s as holding the prompt's prefix; no registration reported it", p.WorkerID)
	}
	if !s.KVEvents(&KVEvents{WorkerID: "w0", Reg: s.regOf("w0"), Clear: true, Stored: h[:6]}) {
		t.Fatal("the current registration's snapshot was refused")
	}
	if p := s.pickFor(t, h); p.WorkerID != "w0" {
		t.Fatalf("picked %s, want w0 for its 6 chunks", p.WorkerID)
	}
}
