package router

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
)

// rig drives the router's logic without an actor system: it is the router's effects, it plays
// the worker actors (holds by ticket, reports after a release, releases a stopped requester's
// holds) and the request actors (their inboxes), on a fake clock.
type rig struct {
	t       tb
	clk     *clock.Fake
	st      *state
	sender  *actor.PID
	due     []any            // timer messages due (admTicks, ejection ends), delivered after the message at hand
	inbox   map[string][]any // messages sent to each requester (by actor id)
	workers map[string]*fakeWorker
	watched map[string]bool // actors the router watches
	gens    map[string]int  // registrations of each worker id ended so far
	handled int             // messages handled
	// onMessage runs before each message the router handles (the model's per-message budget).
	onMessage func()
}

type fakeWorker struct {
	pid     *actor.PID
	info    WorkerInfo
	live    bool
	holds   map[uint64]*actor.PID // ticket → requester
	acqSeen uint64
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// tb is what the rig needs of a test (testing.TB or *rapid.T).
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func newRig(t tb, cfg Config) *rig {
	r := &rig{t: t, clk: clock.NewFake(t0), inbox: map[string][]any{}, workers: map[string]*fakeWorker{},
		watched: map[string]bool{}, gens: map[string]int{}}
	if cfg.Policy == "" {
		cfg.Policy = "least_outstanding"
	}
	cfg.Clock = r.clk
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r.st = newState(cfg)
	return r
}

// admissionCfg is one class (limit 100, max wait 30 s) with policy pol and threshold.
func admissionCfg(pol admission.Policy, threshold int64) *AdmissionConfig {
	return &AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 100, MaxWait: 30 * time.Second}},
			DefaultClass: "default", Policy: pol, Recheck: time.Second,
		},
		BusyThreshold: threshold, PolicyName: "test",
	}
}

func (r *rig) respond(msg any) { r.send(r.sender, msg) }

func (r *rig) send(to *actor.PID, msg any) {
	if to == nil {
		return
	}
	if w := r.workers[to.Id]; w != nil {
		r.toWorker(w, msg)
		return
	}
	if strings.HasPrefix(to.Id, "worker/") {
		return // a worker actor that has stopped: the message is lost
	}
	r.inbox[to.Id] = append(r.inbox[to.Id], msg)
}

func (r *rig) watch(pid *actor.PID) { r.watched[pid.Id] = true }

func (r *rig) later(msg any) { r.due = append(r.due, msg) }

func (r *rig) after(d time.Duration, msg any) clock.Timer {
	return r.clk.AfterFunc(d, func() { r.due = append(r.due, msg) })
}

// deliver hands the router one message from `from`, then the timer messages that fell due.
func (r *rig) deliver(from *actor.PID, msg any) {
	r.sender = from
	r.handle(msg)
	r.flushDue()
}

// flushDue delivers the timer messages that fell due, in order.
func (r *rig) flushDue() {
	for len(r.due) > 0 {
		msg := r.due[0]
		r.due = r.due[1:]
		r.sender = nil
		r.handle(msg)
	}
}

func (r *rig) handle(msg any) {
	r.handled++
	if r.onMessage != nil {
		r.onMessage()
	}
	r.st.handle(msg, r)
	r.st.rollouts.arm(r) // as the actor's Receive does after each message
}

// advance moves the clock and delivers the router's ticks.
func (r *rig) advance(d time.Duration) {
	r.clk.Advance(d)
	r.flushDue()
}

// workerPID is the actor of worker id's current registration (a new one after each leave).
func (r *rig) workerPID(id string) *actor.PID {
	return actor.NewPID("local", fmt.Sprintf("worker/%s#%d", id, r.gens[id]))
}

// regOf is the number of worker id's current registration (WorkerInfo.Reg): 1, then one more
// after each leave.
func (r *rig) regOf(id string) uint64 { return uint64(r.gens[id]) + 1 }

// join registers (or updates) a live unified worker.
func (r *rig) join(id, model string, queue int64) {
	r.joinRole(id, model, RoleUnified, queue)
}

func (r *rig) joinRole(id, model string, role Role, queue int64) {
	r.joinWith(id, model, role, queue, func(*WorkerInfo) {})
}

// joinWith is joinRole with the worker's info changed by set before it reports (its KV
// blocks, its block size).
func (r *rig) joinWith(id, model string, role Role, queue int64, set func(*WorkerInfo)) {
	pid := r.workerPID(id)
	w := r.workers[pid.Id]
	if w == nil {
		w = &fakeWorker{pid: pid, holds: map[uint64]*actor.PID{}}
		r.workers[pid.Id] = w
	}
	w.live = true
	w.info = WorkerInfo{ID: id, Model: model, Role: role, HTTPAddress: "127.0.0.1:9", QueueDepth: queue,
		KVTotalBlocks: 1024, KVFreeBlocks: 1024, LastHeartbeat: r.clk.Now()}
	set(&w.info)
	w.info.Reg = r.regOf(id)
	r.report(w)
}

func (r *rig) report(w *fakeWorker) {
	r.deliver(w.pid, &WorkerState{PID: w.pid, Info: w.info, Live: w.live, InFlight: int64(len(w.holds)), AcqSeen: w.acqSeen})
}

// leave evicts a worker: its last report says not live, then its actor stops.
func (r *rig) leave(id string) {
	w := r.workers[r.workerPID(id).Id]
	r.gens[id]++
	w.live = false
	r.report(w)
	delete(r.workers, w.pid.Id)
	r.deliver(nil, &actor.Terminated{Who: w.pid})
}

func (r *rig) toWorker(w *fakeWorker, msg any) {
	switch m := msg.(type) {
	case *Acquire:
		w.acqSeen++
		w.holds[m.Ticket] = m.Requester
	case *Release:
		if _, ok := w.holds[m.Ticket]; ok {
			delete(w.holds, m.Ticket)
			r.deliver(w.pid, r.loadReportOf(w, OutcomeNone))
		}
	}
}

// loadReportOf is worker w's LoadReport of its holds now, asking for an ejection for eject
// (OutcomeNone: none).
func (r *rig) loadReportOf(w *fakeWorker, eject Outcome) *LoadReport {
	return &LoadReport{ID: w.info.ID, Reg: w.info.Reg, InFlight: int64(len(w.holds)), AcqSeen: w.acqSeen, Eject: eject}
}

// requester is a stand-in request actor.
type requester struct {
	r   *rig
	pid *actor.PID
	key uint64
	tag uint64
}

var nextReq uint64

func (r *rig) newRequester() *requester {
	nextReq++
	return &requester{r: r, pid: actor.NewPID("local", fmt.Sprint("req/", nextReq)), key: nextReq}
}

// pick sends an admitted pick (id is the client's X-Request-ID).
func (q *requester) pick(id, model, session string, exclude ...string) {
	q.pickWith(id, model, AdmitInfo{SessionID: session}, exclude...)
}

// pickWith sends an admitted pick with the given admission inputs.
func (q *requester) pickWith(id, model string, admit AdmitInfo, exclude ...string) {
	q.tag++
	q.r.deliver(q.pid, &Pick{Model: model, RequestID: id, Key: q.key, Requester: q.pid, Tag: q.tag,
		Exclude: exclude, Admit: &admit})
}

// answers returns and clears what the requester received.
func (q *requester) answers() []any {
	out := q.r.inbox[q.pid.Id]
	delete(q.r.inbox, q.pid.Id)
	return out
}

// picked returns the requester's one answer, failing unless it is a *Picked.
func (q *requester) picked() *Picked {
	q.r.t.Helper()
	as := q.answers()
	if len(as) != 1 {
		q.r.t.Fatalf("%s: %d answers %v, want one *Picked", q.pid.Id, len(as), as)
	}
	p, ok := as[0].(*Picked)
	if !ok {
		q.r.t.Fatalf("%s: answered %#v, want *Picked", q.pid.Id, as[0])
	}
	return p
}

// queued checks the requester's answer so far is exactly one Queued.
func (q *requester) queued() {
	q.r.t.Helper()
	as := q.answers()
	if len(as) != 1 {
		q.r.t.Fatalf("%s: %d answers %v, want one *Queued", q.pid.Id, len(as), as)
	}
	if _, ok := as[0].(*Queued); !ok {
		q.r.t.Fatalf("%s: answered %#v, want *Queued", q.pid.Id, as[0])
	}
}

// silent checks the requester has no answer.
func (q *requester) silent() {
	q.r.t.Helper()
	if as := q.answers(); len(as) > 0 {
		q.r.t.Fatalf("%s: answered %#v, want nothing yet", q.pid.Id, as)
	}
}

// release sends Release for a pick's tickets, as a request actor does when its attempt ends.
func (q *requester) release(p *Picked) {
	q.r.send(p.Worker, &Release{Ticket: p.Ticket})
	if p.Prefill != nil {
		q.r.send(p.Prefill.Worker, &Release{Ticket: p.Prefill.Ticket})
	}
}

// stop ends the requester as a request actor's stop does: every worker releases its holds
// (each reports), and the router is told it finished.
func (q *requester) stop() { q.end(0, false) }

// end is stop with what the answer cost and whether it was aborted.
func (q *requester) end(tokens int64, aborted bool) {
	for _, id := range sortedKeys(q.r.workers) {
		w := q.r.workers[id]
		n := 0
		for t, req := range w.holds {
			if req != nil && req.Id == q.pid.Id {
				delete(w.holds, t)
				n++
			}
		}
		if n > 0 {
			q.r.deliver(w.pid, q.r.loadReportOf(w, OutcomeNone))
		}
	}
	q.r.deliver(q.pid, &Finished{Key: q.key, Tokens: tokens, Aborted: aborted})
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// inFlight is the router's in-flight figure for a worker.
func (r *rig) inFlight(id string) int64 {
	for _, w := range r.st.view.list(0).Workers {
		if w.Info.ID == id {
			return w.InFlight
		}
	}
	return -1
}

func routeOf(model string, backends ...string) config.Route {
	rt := config.Route{Model: model, Targets: []string{config.TargetUnified}}
	for _, b := range backends {
		rt.Backends = append(rt.Backends, config.Backend{Model: b, Weight: 1})
	}
	return rt
}

// regOf is worker id's current registration in the Sim (0: unknown).
func (s *Sim) regOf(id string) uint64 {
	if w := s.byID[id]; w != nil {
		return w.reg
	}
	return 0
}
