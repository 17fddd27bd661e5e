package router

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
)

// holdGate holds every head whose session starts with "hold" (asked again on every capacity
// free: not SessionOnly) and counts the asks per request key.
type holdGate struct{ asks map[uint64]int }

func (g *holdGate) Classify(*admission.Request, []string, func([]string) int) {}
func (g *holdGate) Gate() admission.Gate                                      { return g }
func (g *holdGate) Check(head *admission.Request, _ admission.View) admission.Decision {
	g.asks[head.Key]++
	if strings.HasPrefix(head.SessionID, "hold") {
		return admission.Decision{}
	}
	return admission.Decision{Go: true}
}
func (g *holdGate) Dispatched(*admission.Request, string)    {}
func (g *holdGate) Moved(*admission.Request, string, string) {}
func (g *holdGate) Completed(*admission.Request, string)     {}
func (g *holdGate) Recheck() time.Duration                   { return 0 }

// TestFreedWorkerWakesOnlyTheHeadsItCanServe (issue 34, review finding 7): a worker whose load
// falls (its LoadReport after a release, or a heartbeat) wakes only the held heads that could
// be sent to it — of its pool, within their allowed set — not every held head of every model:
// the others would get the answer they got.
func TestFreedWorkerWakesOnlyTheHeadsItCanServe(t *testing.T) {
	g := &holdGate{asks: map[uint64]int{}}
	r := newRig(t, Config{Admission: admissionCfg(g, 0)})
	r.join("a1", "a", 0)
	r.join("b1", "b", 0)
	held, asks := holdThree(r, g)
	before := asks()
	if before != 3 {
		t.Fatalf("%d asks to queue three heads", before)
	}
	// Model b's worker frees a slot, and heartbeats: nothing of model a can go there.
	other := r.newRequester()
	other.pick("other", "b", "")
	other.release(other.picked())
	r.join("b1", "b", 0)
	if n := asks(); n != before {
		t.Fatalf("model a's held heads were asked %d times for model b's worker", n-before)
	}
	// Model a's worker frees a slot: each of its held heads is asked again.
	mine := r.newRequester()
	mine.pick("mine", "a", "")
	mine.release(mine.picked())
	if n := asks(); n != before+3 {
		t.Fatalf("%d asks of model a's held heads when a1 freed, want 3", n-before)
	}
	for _, q := range held {
		q.silent()
	}
}

// TestBurstOfFreesWakesOnce (issue 34, review finding 7): reports that arrive one after
// another (a burst of completions, and their workers' heartbeats) wake the queue once for all
// of them — each held head is asked once, not once per report — and no later than the next
// message of another kind (a pick never overtakes a free).
func TestBurstOfFreesWakesOnce(t *testing.T) {
	g := &holdGate{asks: map[uint64]int{}}
	r := newRig(t, Config{Admission: admissionCfg(g, 1)})
	r.join("a1", "a", 0)
	r.join("a2", "a", 0)
	_, asks := holdThree(r, g)
	busy := []*requester{r.newRequester(), r.newRequester()}
	for _, q := range busy {
		q.pick("busy", "a", "")
		q.picked()
	}
	// The workers let their requests go and report, and heartbeat, one message after another
	// before the router gets to anything else.
	before := asks()
	for _, id := range []string{"a1", "a2"} {
		w := r.workers[r.workerPID(id).Id]
		clear(w.holds)
		r.sender = w.pid
		r.handle(&LoadReport{ID: id, Reg: w.info.Reg, InFlight: 0, AcqSeen: w.acqSeen})
		r.handle(&WorkerState{PID: w.pid, Info: w.info, Live: true, AcqSeen: w.acqSeen})
	}
	if n := asks(); n != before {
		t.Fatalf("the held heads were asked %d times before the run of reports ended", n-before)
	}
	r.flushDue() // the wake the router sent itself
	if n := asks(); n != before+3 {
		t.Fatalf("four reports asked the three held heads %d times, want once each", n-before)
	}
	// A free is woken for before a pick is handled.
	w := r.workers[r.workerPID("a1").Id]
	q := r.newRequester()
	q.pick("next", "a", "")
	q.picked()
	before = asks()
	r.sender = w.pid
	clear(w.holds)
	r.handle(&LoadReport{ID: "a1", Reg: w.info.Reg, InFlight: 0, AcqSeen: w.acqSeen})
	late := r.newRequester()
	r.sender = late.pid
	r.handle(&Pick{Model: "a", RequestID: "late", Key: late.key, Requester: late.pid, Tag: 1, Admit: &AdmitInfo{SessionID: "hold-late"}})
	if n := asks(); n != before+3 {
		t.Fatalf("the free before the pick asked the held heads %d times, want once each before the pick", n-before)
	}
	late.queued()
	r.flushDue()
	if n := asks(); n != before+3 {
		t.Fatalf("the free was woken for twice (%d asks)", n-before)
	}
}

// TestPausedProgramsAreAskedOncePerFree (issue 34, review finding 7): under thunderagent, a
// capacity free asks one of the heads of paused programs (of a candidate set), not all of
// them: its ask settles the ledger, and the programs it resumes have their turns asked at
// once, in the same wake. A paused program still goes when room comes back.
func TestPausedProgramsAreAskedOncePerFree(t *testing.T) {
	var r *rig
	ta := thunderagent.New(thunderagent.DefaultConfig(), func() time.Time { return r.clk.Now() })
	cfg := admissionCfg(ta, 0)
	cfg.Queue.Recheck = 0 // no periodic wake: only frees ask
	r = newRig(t, Config{Admission: cfg})
	kv := func(w *WorkerInfo) { w.KVTotalBlocks, w.KVFreeBlocks, w.BlockSize = 1000, 1000, 1 }
	r.joinWith("w1", "m", RoleUnified, 0, kv)
	r.joinWith("w2", "m", RoleUnified, 0, kv)
	var running []*requester
	var picks []*Picked
	for i := range 2 {
		q := r.newRequester()
		q.pickWith(fmt.Sprint("run", i), "m", AdmitInfo{SessionID: fmt.Sprint("run", i), PromptTokens: 800})
		running, picks = append(running, q), append(picks, q.picked())
	}
	var paused []*requester
	for i := range 10 {
		q := r.newRequester()
		q.pickWith(fmt.Sprint("new", i), "m", AdmitInfo{SessionID: fmt.Sprint("new", i), PromptTokens: 400})
		q.queued()
		paused = append(paused, q)
	}
	if s := ta.Stats(); s.Paused != 10 || s.Reasoning != 2 {
		t.Fatalf("set-up: %+v", s)
	}
	asks := r.st.adm.q.GateAsks()
	running[0].release(picks[0]) // w1's load falls
	if n := r.st.adm.q.GateAsks() - asks; n != 1 {
		t.Fatalf("a free asked %d heads of paused programs, want 1", n)
	}
	// The running turns end; their programs' tokens decay on the resume side, and a heartbeat
	// (a free) lets the ledger settle: two paused programs fit, one on each worker, and go.
	running[0].end(800, false)
	running[1].release(picks[1])
	running[1].end(800, false)
	r.advance(10 * time.Second)
	asks = r.st.adm.q.GateAsks()
	r.joinWith("w1", "m", RoleUnified, 0, kv)
	var went []string
	for _, q := range paused {
		if as := q.answers(); len(as) > 0 {
			p, ok := as[0].(*Picked)
			if !ok || p.Err != nil {
				t.Fatalf("%s: %#v", q.pid.Id, as[0])
			}
			went = append(went, p.WorkerID)
		}
	}
	slices.Sort(went)
	if !slices.Equal(went, []string{"w1", "w2"}) {
		t.Fatalf("went to %v, want one resumed program on each worker", went)
	}
	if n := r.st.adm.q.GateAsks() - asks; n > 3 {
		t.Fatalf("%d asks to let two resumed programs go, want the probe and their turns", n)
	}
}

// holdThree queues three heads of model a that g holds, and returns them with a count of the
// gate's asks about them so far.
func holdThree(r *rig, g *holdGate) ([]*requester, func() int) {
	var held []*requester
	for _, s := range []string{"hold1", "hold2", "hold3"} {
		q := r.newRequester()
		q.pick(s, "a", s)
		q.queued()
		held = append(held, q)
	}
	return held, func() (n int) {
		for _, q := range held {
			n += g.asks[q.key]
		}
		return n
	}
}
