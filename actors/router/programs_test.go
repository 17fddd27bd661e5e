package router

import (
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
)

// programRig is a rig whose admission classifier is thunderagent (cfg) on the rig's clock,
// with the router's metrics on reg and one worker w1 of capacity blocks × blockSize tokens.
func programRig(t *testing.T, cfg thunderagent.Config, reg *prometheus.Registry, blocks, blockSize int64) *rig {
	t.Helper()
	var r *rig
	pol := thunderagent.New(cfg, func() time.Time { return r.clk.Now() })
	adm := admissionCfg(pol, 0)
	adm.PolicyName = "thunderagent"
	r = newRig(t, Config{Admission: adm, Metrics: NewMetrics(reg)})
	r.joinWith("w1", "smol", RoleUnified, 0, func(i *WorkerInfo) { i.KVTotalBlocks, i.BlockSize = blocks, blockSize })
	return r
}

// programs asks the router for its programs, as the admin API does.
func (r *rig) programs() *ProgramList {
	r.t.Helper()
	admin := actor.NewPID("local", "admin")
	r.deliver(admin, &GetPrograms{})
	as := r.inbox[admin.Id]
	delete(r.inbox, admin.Id)
	if len(as) != 1 {
		r.t.Fatalf("GetPrograms: %d answers %v, want one", len(as), as)
	}
	l, ok := as[0].(*ProgramList)
	if !ok {
		r.t.Fatalf("GetPrograms answered %#v", as[0])
	}
	return l
}

// programGauges reads tlgw_programs{state} in the order reasoning, acting, paused.
func programGauges(r *rig) [3]float64 {
	var out [3]float64
	for i, s := range programStates {
		out[i] = testutil.ToFloat64(r.st.adm.metrics.programs.WithLabelValues(s))
	}
	return out
}

// TestProgramsListAndGauges (R15.1): with thunderagent, a session's turn is a program
// reasoning on the worker it went to, listed by GET /admin/v1/programs under a hash of its
// session id, with its prompt as its tokens; once its request actor says it finished, it is
// acting there with the answer's tokens. tlgw_programs{state} follows after each event, its
// three states always exported.
func TestProgramsListAndGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := programRig(t, thunderagent.DefaultConfig(), reg, 1024, 16)
	if n, err := testutil.GatherAndCount(reg, "tlgw_programs"); err != nil || n != 3 {
		t.Fatalf("before any program: %d tlgw_programs series (%v), want the three states", n, err)
	}
	if g := programGauges(r); g != [3]float64{0, 0, 0} {
		t.Fatalf("no program yet: gauges %v", g)
	}
	a := r.newRequester()
	a.pickWith("t1", "smol", AdmitInfo{SessionID: "alice", PromptTokens: 1000})
	p := a.picked()
	if p.Err != nil || p.WorkerID != "w1" || !p.Admitted {
		t.Fatalf("first turn: %+v", p)
	}
	l := r.programs()
	if l.Classifier != "thunderagent" || !l.Tracks || len(l.Programs) != 1 {
		t.Fatalf("while the turn runs: %+v", l)
	}
	pv := l.Programs[0]
	if pv.State != thunderagent.StateReasoning || pv.Worker != "w1" || pv.Tokens != 1000 || pv.PausedSince != nil {
		t.Fatalf("while the turn runs: %+v, want reasoning on w1 with 1000 tokens", pv)
	}
	if pv.Session == "" || strings.Contains(pv.Session, "alice") {
		t.Fatalf("session %q: want a hash, never the id", pv.Session)
	}
	if g := programGauges(r); g != [3]float64{1, 0, 0} {
		t.Fatalf("one reasoning: gauges %v", g)
	}

	a.release(p)
	r.deliver(a.pid, &Finished{Key: a.key, Tokens: 1500})
	l = r.programs()
	if len(l.Programs) != 1 {
		t.Fatalf("after the turn: %+v", l)
	}
	if got := l.Programs[0]; got.State != thunderagent.StateActing || got.Worker != "w1" || got.Tokens != 1500 || got.Session != pv.Session {
		t.Fatalf("after the turn: %+v, want acting on w1 with the answer's 1500 tokens (session %s)", got, pv.Session)
	}
	if g := programGauges(r); g != [3]float64{0, 1, 0} {
		t.Fatalf("one acting: gauges %v", g)
	}
}

// TestProgramPauseAndForcedResumeCounters (R15.1): tlgw_program_pauses_total and
// tlgw_program_forced_resumes_total advance with the policy's pauses and forced resumes. On a
// worker of 1000 tokens, alice (800 tokens, acting) is paused when bob's turn (100 + 100
// buffer) pushes the worker past 950. Her next turn waits: her 900 never fit under the resume
// ceiling (850), so she is not resumed by room; after resume_timeout she is resumed by force,
// as reasoning (her turn waits: it goes next), and her turn goes — and her 900 beside bob's
// acting 100 is over 950, so bob, between turns, is paused in the same settling.
func TestProgramPauseAndForcedResumeCounters(t *testing.T) {
	cfg := thunderagent.DefaultConfig()
	cfg.ResumeTimeout = 10 * time.Second // within the class's max wait (30 s)
	r := programRig(t, cfg, prometheus.NewRegistry(), 10, 100)
	m := r.st.adm.metrics
	counts := func() [2]float64 {
		return [2]float64{testutil.ToFloat64(m.programPauses), testutil.ToFloat64(m.programForcedResumes)}
	}

	alice := r.newRequester()
	alice.pickWith("a1", "smol", AdmitInfo{SessionID: "alice", PromptTokens: 300})
	p := alice.picked()
	alice.release(p)
	r.deliver(alice.pid, &Finished{Key: alice.key, Tokens: 800})

	bob := r.newRequester()
	bob.pickWith("b1", "smol", AdmitInfo{SessionID: "bob", PromptTokens: 100})
	p = bob.picked()
	if p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("bob: %+v", p)
	}
	if g, c := programGauges(r), counts(); g != [3]float64{1, 0, 1} || c != [2]float64{1, 0} {
		t.Fatalf("alice paused for bob: gauges %v, counters %v", g, c)
	}
	for _, pv := range r.programs().Programs {
		if pv.State == thunderagent.StatePaused && (pv.PausedSince == nil || !pv.PausedSince.Equal(t0) || pv.Worker != "" || pv.Tokens != 800) {
			t.Fatalf("paused program: %+v, want alice's 800 tokens paused since %v on no worker", pv, t0)
		}
	}
	bob.release(p)
	r.deliver(bob.pid, &Finished{Key: bob.key, Tokens: 100})

	alice2 := r.newRequester()
	alice2.pickWith("a2", "smol", AdmitInfo{SessionID: "alice", PromptTokens: 50})
	alice2.queued()
	if g, c := programGauges(r), counts(); g != [3]float64{0, 1, 1} || c != [2]float64{1, 0} {
		t.Fatalf("alice's next turn waits: gauges %v, counters %v", g, c)
	}
	r.advance(10 * time.Second)
	if p := alice2.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("alice after resume_timeout: %+v", p)
	}
	if g, c := programGauges(r), counts(); g != [3]float64{1, 0, 1} || c != [2]float64{2, 1} {
		t.Fatalf("alice resumed by force: gauges %v, counters %v", g, c)
	}
}

// TestProgramsWithoutPrograms: a classifier that keeps no programs answers its name and an
// empty list (not an error), and so does a router without admission; the program series
// stay at 0.
func TestProgramsWithoutPrograms(t *testing.T) {
	adm := admissionCfg(sessionserial.New(), 0)
	adm.PolicyName = "session_serial"
	r := newRig(t, Config{Admission: adm})
	r.join("w1", "smol", 0)
	q := r.newRequester()
	q.pick("t1", "smol", "alice")
	if p := q.picked(); p.Err != nil {
		t.Fatalf("pick: %+v", p)
	}
	if l := r.programs(); l.Classifier != "session_serial" || l.Tracks || l.Programs == nil || len(l.Programs) != 0 {
		t.Fatalf("session_serial: %+v, want its name and an empty list", l)
	}
	if r.st.adm.progs != nil {
		t.Fatal("session_serial is taken for a policy that keeps programs")
	}
	if g := programGauges(r); g != [3]float64{0, 0, 0} {
		t.Fatalf("session_serial: gauges %v", g)
	}

	off := newRig(t, Config{})
	if l := off.programs(); l.Classifier != "" || l.Tracks || l.Programs == nil || len(l.Programs) != 0 {
		t.Fatalf("no admission: %+v, want an empty list", l)
	}
}
