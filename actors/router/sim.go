package router

import (
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/clock"
)

// Sim drives the router's logic synchronously, without an actor system, for the fleet
// simulator (`tlgw simulate`, SPEC R18.1). It is the production router — the same state and
// the same handle step for *Pick, *WorkerState, *LoadReport, *Finished, *ObservedTTFT and the
// timer messages — with different effects: Sim plays the worker actors (it holds tickets,
// counts Acquires and reports the in-flight count after each Release, as actors/worker does)
// and delivers the router's timers on its own fake clock. Every call is handled to the end before it returns: a
// simulated worker counts an Acquire as the router sends it, and the router learns the count
// from the worker's next report (its LoadReport after a Release, its WorkerState on a
// heartbeat), as it does from worker actors.
//
// A Sim is not safe for concurrent use.
type Sim struct {
	st      *state
	clk     *clock.Fake
	workers map[string]*simWorker // by actor id
	byID    map[string]*simWorker // by worker id
	reply   any                   // the router's answer to the message at hand
	out     []Delivery            // messages to other actors (requesters), in order
	due     []any                 // timer messages that fell due
	kvReply chan bool             // KVEvents' reply, reused
	regs    uint64                // registrations numbered so far (WorkerInfo.Reg), as the registry does
}

// Delivery is a message the router sent to an actor Sim does not play: an admitted request's
// *Picked once it leaves the queue.
type Delivery struct {
	To  *actor.PID
	Msg any
}

type simWorker struct {
	pid     *actor.PID
	reg     uint64 // its registration (WorkerInfo.Reg)
	info    WorkerInfo
	holds   map[uint64]struct{} // tickets in flight
	acqSeen uint64
}

// SimStart is the fake clock's reading when a Sim starts.
var SimStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewSim returns a router driven by Sim. cfg is as for Props; its Clock is replaced by the
// Sim's fake clock, and a nil Logger discards.
func NewSim(cfg Config) (*Sim, error) {
	if _, err := policy.New(cfg.Policy, policy.Options{LoadFactor: cfg.LoadFactor}); err != nil {
		return nil, err
	}
	s := &Sim{clk: clock.NewFake(SimStart), workers: map[string]*simWorker{}, byID: map[string]*simWorker{}}
	cfg.Clock = s.clk
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s.st = newState(cfg)
	return s, nil
}

// Now is the Sim's clock.
func (s *Sim) Now() time.Time { return s.clk.Now() }

// AdvanceTo moves the clock to t (never back) and delivers the router's timers that fall due.
func (s *Sim) AdvanceTo(t time.Time) {
	if d := t.Sub(s.clk.Now()); d > 0 {
		s.Advance(d)
	}
}

// Advance moves the clock by d and delivers the router's timers that fall due.
func (s *Sim) Advance(d time.Duration) {
	s.clk.Advance(d)
	s.flushDue()
}

// SetWorker registers a live worker or updates it, as its worker actor does after a
// heartbeat: info is the engine's report (queue depth, running, KV blocks …); the in-flight
// count and Acquires seen are the Sim's own, and so is its registration number (a worker
// removed and set again is a new registration, with a new actor). A zero LastHeartbeat reads
// the clock.
func (s *Sim) SetWorker(info WorkerInfo) {
	w := s.byID[info.ID]
	if w == nil {
		s.regs++
		w = &simWorker{pid: actor.NewPID("sim", "worker/"+info.ID+"#"+strconv.FormatUint(s.regs, 10)),
			reg: s.regs, holds: map[uint64]struct{}{}}
		s.byID[info.ID] = w
		s.workers[w.pid.Id] = w
	}
	if info.LastHeartbeat.IsZero() {
		info.LastHeartbeat = s.clk.Now()
	}
	info.Reg = w.reg
	w.info = info
	s.deliver(&WorkerState{PID: w.pid, Info: info, Live: true, InFlight: int64(len(w.holds)), AcqSeen: w.acqSeen})
}

// RemoveWorker evicts a worker as the registry does: its last report says not live, then its
// actor stops (its holds die with it).
func (s *Sim) RemoveWorker(id string) {
	w := s.byID[id]
	if w == nil {
		return
	}
	s.deliver(&WorkerState{PID: w.pid, Info: w.info, Live: false, InFlight: int64(len(w.holds)), AcqSeen: w.acqSeen})
	delete(s.byID, id)
	delete(s.workers, w.pid.Id)
	s.deliver(&actor.Terminated{Who: w.pid})
}

// Pick hands the router a pick, as a request actor does. It returns the router's *Picked
// (Err set when there is nothing to pick), or nil and false when an admitted pick waits in
// the queue: its *Picked arrives later among Deliveries, sent to p.Requester.
func (s *Sim) Pick(p *Pick) (*Picked, bool) {
	n := len(s.out)
	s.deliver(p)
	r := s.reply
	s.reply = nil
	if r == nil && p.Requester != nil {
		// An admitted pick is answered by a message to its requester, *Picked or *Queued.
		for i := n; i < len(s.out); i++ {
			if d := s.out[i]; d.To.Equal(p.Requester) {
				s.out = append(s.out[:i], s.out[i+1:]...)
				r = d.Msg
				break
			}
		}
	}
	if pk, ok := r.(*Picked); ok {
		return pk, true
	}
	return nil, false
}

// Release ends a pick's attempt as its request actor does: Release for its tickets to the
// worker(s), each of which reports its new in-flight count to the router.
func (s *Sim) Release(p *Picked, o Outcome) {
	if p == nil || p.Err != nil {
		return
	}
	s.send(p.Worker, &Release{Ticket: p.Ticket, Outcome: o})
	if p.Prefill != nil {
		s.send(p.Prefill.Worker, &Release{Ticket: p.Prefill.Ticket, Outcome: o})
	}
	s.flushDue()
}

// ReleaseWarm ends a pick's prefix warm-up (Picked.Warm) as its requester does.
func (s *Sim) ReleaseWarm(w *Warmup, o Outcome) {
	if w == nil {
		return
	}
	s.send(w.Worker, &Release{Ticket: w.Ticket, Outcome: o})
	s.flushDue()
}

// WarmupSent tells the router that a pick's prefix warm-up (Picked.Warm) has been sent, as
// its requester does when it sends one (the approximate index learns the copy then).
func (s *Sim) WarmupSent(w *Warmup) {
	if w == nil {
		return
	}
	s.deliver(&WarmupSent{WorkerID: w.WorkerID, Reg: w.Reg, Hashes: w.Hashes})
}

// KVEvents hands the router a worker's prefix-cache events, as the gateway's KvEvents
// subscriber does (R18.3), and reports whether they were applied (see KVEvents: a known, live
// worker that reports kv_events, with the exact index on). Reply is the Sim's own; a zero Reg
// is the worker's current registration (the subscriber of a simulated engine is always the
// current one's).
func (s *Sim) KVEvents(ev *KVEvents) bool {
	if w := s.byID[ev.WorkerID]; w != nil && ev.Reg == 0 {
		ev.Reg = w.reg
	}
	if s.kvReply == nil {
		s.kvReply = make(chan bool, 1)
	}
	ev.Reply = s.kvReply
	s.deliver(ev)
	ev.Reply = nil
	select {
	case ok := <-s.kvReply:
		return ok
	default:
		return false
	}
}

// KVHeld is how many ids (chunk ids or block keys) the exact index holds for worker id: 0
// for an unknown worker or with the index off.
func (s *Sim) KVHeld(id string) int {
	v := s.st.view
	sl := v.slots[id]
	if v.kidx == nil || sl == nil {
		return 0
	}
	return v.kidx.Len(&sl.member)
}

// ObserveTTFT reports the TTFT a pick's attempt took, as the request actor does under
// predicted_latency (ObservedTTFT).
func (s *Sim) ObserveTTFT(p *Picked, ttft time.Duration) {
	if p == nil || p.Err != nil {
		return
	}
	s.deliver(&ObservedTTFT{WorkerID: p.WorkerID, Reg: p.WorkerReg, Features: p.Features, TTFT: ttft})
}

// Finished tells the router an admitted request ended (see Finished).
func (s *Sim) Finished(f *Finished) { s.deliver(f) }

// Deliveries returns and clears the messages the router sent to requesters since the last
// call (dispatches out of the admission queue), in order.
func (s *Sim) Deliveries() []Delivery {
	out := s.out
	s.out = nil
	return out
}

// InFlight is the worker's count of tickets held (its worker actor's in-flight count); -1 for
// an unknown worker.
func (s *Sim) InFlight(id string) int64 {
	w := s.byID[id]
	if w == nil {
		return -1
	}
	return int64(len(w.holds))
}

// deliver hands the router one message, then the timer messages that fell due.
func (s *Sim) deliver(msg any) {
	s.handle(msg)
	s.flushDue()
}

func (s *Sim) handle(msg any) {
	s.st.handle(msg, s)
	s.st.afterMessage()
}

func (s *Sim) flushDue() {
	for len(s.due) > 0 {
		msg := s.due[0]
		s.due = s.due[1:]
		s.handle(msg)
	}
}

// The effects: Sim is the router's world.

func (s *Sim) respond(msg any) { s.reply = msg }

func (s *Sim) send(to *actor.PID, msg any) {
	if to == nil {
		return
	}
	if w := s.workers[to.Id]; w != nil {
		s.toWorker(w, msg)
		return
	}
	if s.st.parent != nil && to.Equal(s.st.parent) {
		return
	}
	s.out = append(s.out, Delivery{To: to, Msg: msg})
}

func (s *Sim) watch(*actor.PID) {}

func (s *Sim) later(msg any) { s.due = append(s.due, msg) }

func (s *Sim) after(d time.Duration, msg any) clock.Timer {
	return s.clk.AfterFunc(d, func() { s.due = append(s.due, msg) })
}

// toWorker is the worker actor's part: Acquire holds a ticket, Release gives it back and
// reports the new count (a ticket not held changes nothing).
func (s *Sim) toWorker(w *simWorker, msg any) {
	switch m := msg.(type) {
	case *Acquire:
		w.acqSeen++
		w.holds[m.Ticket] = struct{}{}
	case *Release:
		if _, ok := w.holds[m.Ticket]; ok {
			delete(w.holds, m.Ticket)
			s.handle(&LoadReport{ID: w.info.ID, Reg: w.reg, InFlight: int64(len(w.holds)), AcqSeen: w.acqSeen})
		}
	}
}

var _ effects = (*Sim)(nil)

// RenderTarget asks the router where a request's prompt may be rendered (R22).
func (s *Sim) RenderTarget(m *RenderTarget) *RenderTargetReply {
	s.deliver(m)
	r, _ := s.reply.(*RenderTargetReply)
	s.reply = nil
	return r
}

// ReplicaLoad hands the router another replica's load table (R23).
func (s *Sim) ReplicaLoad(m *ReplicaLoad) { s.deliver(m) }

// OwnLoad is the router's own table for the other replicas.
func (s *Sim) OwnLoad() *OwnLoad {
	s.deliver(&GetOwnLoad{})
	r, _ := s.reply.(*OwnLoad)
	s.reply = nil
	return r
}
