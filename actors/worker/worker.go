// Package worker is the worker actor: one per registered engine. It owns the engine's latest
// status, its heartbeat deadline and the gateway's in-flight count for it, and reports every
// change to the router, which keeps the view that picks read (so a pick never asks N workers).
package worker

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
)

// Status is one heartbeat as the registry accepted it. Seq numbers the statuses the registry
// has forwarded to this worker, so an expiry can tell whether a newer heartbeat is on its way.
type Status struct {
	Info router.WorkerInfo // LastHeartbeat is the arrival time on the gateway's clock
	Seq  uint64
	TTL  time.Duration // the worker's k·T (k·scrape_interval for a static worker)
}

// ScrapeError records a static worker's failed scrape (shown in the listing; the deadline
// is not moved: only a successful scrape keeps the worker live).
type ScrapeError struct{ Reason string }

// SetDrained marks the worker's model as drained (or not) through the admin API.
type SetDrained struct{ Drained bool }

// Expired tells the registry that the deadline fired with no heartbeat newer than
// Seq. The registry stops the worker unless it has forwarded a newer status since.
type Expired struct {
	ID  string
	Seq uint64
	// Retired: not the deadline but a Retire ended the worker.
	Retired bool
}

// Retire ends a live worker now, as its deadline would (R23: an engine pool's record vanished
// and its drain is over): it leaves routing and asks the registry to stop it, which a newer
// status still on its way overrides as it overrides an expiry.
type Retire struct{}

// deadline is the worker's own heartbeat timer firing; gen discards stale timers.
type deadline struct{ gen uint64 }

// failDecay is a half-life of the failure load passing (failload.go); gen discards stale timers.
type failDecay struct{ gen uint64 }

// Config is what every worker actor needs.
type Config struct {
	Clock    clock.Clock
	Router   *actor.PID
	Registry *actor.PID
	// TTL is k·T (R1): the worker is live while now − last heartbeat < TTL.
	TTL time.Duration
	// ConsecutiveFailures is [gateway.outlier] consecutive_failures (R14.2): a streak of this
	// many failed attempts asks the router to eject the worker. 0 = ejection off.
	ConsecutiveFailures int
}

// state survives restarts: the producer hands the same state to every incarnation, so a
// panicking handler loses neither the in-flight count nor the deadline.
type state struct {
	cfg     Config
	info    router.WorkerInfo
	seq     uint64
	live    bool
	holds   holds
	acqSeen uint64
	streak  int // failed attempts in a row (R14.2); a success or an ejection request resets it
	gen     uint64
	timer   clock.Timer // the one heartbeat deadline, stopped at Stopping and re-armed, never added
	due     time.Time   // when timer fires
	// R19: recent failures as load (failload.go), and its decay timer (running only while
	// the load is above 0).
	fails     failLoad
	failGen   uint64
	failTimer clock.Timer
	// R19: a Release said the engine refused a connection (nothing listens on its HTTP
	// address) at unreachableAt; the worker is out of routing until a status that arrived
	// after that (a heartbeat, or a successful scrape of a static worker).
	unreachable   bool
	unreachableAt time.Time
}

// Props returns the props of a worker actor whose first status is first.
func Props(cfg Config, first Status, opts ...actor.PropsOption) *actor.Props {
	st := &state{cfg: cfg, info: first.Info, seq: first.Seq, live: true}
	return actor.PropsFromProducer(func() actor.Actor { return &workerActor{st: st} }, opts...)
}

type workerActor struct{ st *state }

// Receive handles the worker's messages.
func (w *workerActor) Receive(c actor.Context) {
	st := w.st
	switch m := c.Message().(type) {
	case *actor.Started:
		// First start or restart: (re)arm the deadline and tell the router everything.
		w.arm(c)
		w.report(c)
	case *Status:
		st.info = m.Info // AdminDrained and DrainEcho included: the registry owns the drains
		st.seq = m.Seq
		if m.TTL > 0 {
			st.cfg.TTL = m.TTL
		}
		st.live = true
		if st.unreachable && m.Info.LastHeartbeat.After(st.unreachableAt) {
			// The engine spoke after its address refused us: it (or its successor at a new
			// address) is up again. A status that arrived before the refusal and was behind it
			// in the mailbox proves nothing.
			st.unreachable = false
		}
		w.armBy(c, st.info.LastHeartbeat.Add(st.cfg.TTL))
		w.report(c)
	case *router.Acquire:
		// No report: the router counted this request when it picked (its optimistic delta),
		// and the next report carries InFlight and AcqSeen together, which zeroes it.
		st.acqSeen++
		if st.holds.add(m.Ticket, m.Requester) {
			c.Watch(m.Requester)
		}
	case *router.Release:
		if m.Addr != "" && m.Addr != st.info.HTTPAddress {
			// The attempt went to an address this worker has left (its engine was restarted
			// elsewhere under the same id): the verdict is about the engine that was there.
			m = &router.Release{Ticket: m.Ticket, Outcome: router.OutcomeNone}
		}
		// The verdict counts even when the hold is gone already: a requester sends its last
		// Release and stops, and its Terminated (a system message) may overtake the Release.
		eject := st.judge(m.Outcome)
		failed := m.Outcome.Failed()
		if st.fails.add(m.Outcome) {
			w.armDecay(c)
		}
		released := st.holds.release(m.Ticket)
		if m.Unreachable && !st.unreachable {
			// R19: provably down. The full report takes it out of routing at once (and carries
			// the in-flight count and the failure load); an ejection asked for still follows.
			st.unreachable, st.unreachableAt = true, st.cfg.Clock.Now()
			w.report(c)
			released, failed = false, false
		}
		if released || failed || eject != router.OutcomeNone {
			w.loadReport(c, eject)
		}
	case *actor.Terminated:
		// A requester stopped with holds left (it crashed, or its Release is still behind
		// this system message): they end now.
		if st.holds.stopped(m.Who) > 0 {
			w.loadReport(c, router.OutcomeNone)
		}
	case *ScrapeError:
		if st.info.ScrapeError != m.Reason {
			st.info.ScrapeError = m.Reason
			w.report(c)
		}
	case *SetDrained:
		if st.info.AdminDrained != m.Drained {
			st.info.AdminDrained = m.Drained
			w.report(c)
		}
	case deadline:
		if m.gen != st.gen {
			return
		}
		st.timer = nil // it fired: a heartbeat from now on sets a new one (armBy)
		if !st.live {
			return
		}
		// R1: evicted once now − t_last ≥ k·T. The timer was armed for exactly that instant;
		// checking again guards against a clock that fired early.
		if now := st.cfg.Clock.Now(); now.Sub(st.info.LastHeartbeat) < st.cfg.TTL {
			w.arm(c)
			return
		}
		st.live = false
		w.report(c)
		c.Send(st.cfg.Registry, &Expired{ID: st.info.ID, Seq: st.seq})
	case *Retire:
		if !st.live {
			return
		}
		st.live = false
		w.report(c)
		c.Send(st.cfg.Registry, &Expired{ID: st.info.ID, Seq: st.seq, Retired: true})
	case failDecay:
		if m.gen != st.failGen {
			return
		}
		st.failTimer = nil
		if st.fails.halve() {
			w.armDecay(c)
		}
		w.loadReport(c, router.OutcomeNone)
	case *actor.Stopping:
		if st.timer != nil {
			st.timer.Stop()
		}
		if st.failTimer != nil {
			st.failTimer.Stop()
		}
	}
}

// armDecay schedules the failure load's next halving, a half-life from now on the injected
// clock (failload.go).
func (w *workerActor) armDecay(c actor.Context) {
	st := w.st
	if st.failTimer != nil {
		st.failTimer.Stop()
	}
	st.failGen++
	gen, self, root := st.failGen, c.Self(), c.ActorSystem().Root
	st.failTimer = st.cfg.Clock.AfterFunc(FailureHalfLife, func() { root.Send(self, failDecay{gen: gen}) })
}

// arm schedules the deadline at last heartbeat + TTL on the injected clock. The callback only
// sends a message (through Root: the context is not safe off the actor's goroutine).
func (w *workerActor) arm(c actor.Context) {
	st := w.st
	if st.timer != nil {
		st.timer.Stop()
	}
	st.gen++
	gen, self, root := st.gen, c.Self(), c.ActorSystem().Root
	st.due = st.info.LastHeartbeat.Add(st.cfg.TTL)
	st.timer = st.cfg.Clock.AfterFunc(st.due.Sub(st.cfg.Clock.Now()), func() { root.Send(self, deadline{gen: gen}) })
}

// armBy makes sure the deadline timer fires no later than at: a heartbeat moves the deadline
// later, and the timer already set fires early, finds the deadline not passed and is set again
// for the rest (the deadline case), so a heartbeat costs no timer of its own. Only a deadline
// that came nearer (a shorter TTL) sets the timer now.
func (w *workerActor) armBy(c actor.Context, at time.Time) {
	if st := w.st; st.timer == nil || at.Before(st.due) {
		w.arm(c)
	}
}

func (w *workerActor) report(c actor.Context) {
	st := w.st
	c.Send(st.cfg.Router, &router.WorkerState{
		PID: c.Self(), Info: st.info, Live: st.live, InFlight: st.holds.count(), AcqSeen: st.acqSeen,
		FailLoad: st.fails.load(), Unreachable: st.unreachable,
	})
}

func (w *workerActor) loadReport(c actor.Context, eject router.Outcome) {
	st := w.st
	c.Send(st.cfg.Router, &router.LoadReport{ID: st.info.ID, Reg: st.info.Reg, InFlight: st.holds.count(), AcqSeen: st.acqSeen,
		Eject: eject, FailLoad: st.fails.load()})
}

// judge counts one attempt's outcome in the failure streak (R14.2). When the streak reaches
// consecutive_failures it returns the last failure (the report asks the router to eject the
// worker) and starts again: the router may refuse (max_ejected_percent), and the next request
// then takes another full streak. Otherwise it returns OutcomeNone.
func (st *state) judge(o router.Outcome) router.Outcome {
	switch {
	case o == router.OutcomeSuccess:
		st.streak = 0
	case o.Failed() && st.cfg.ConsecutiveFailures > 0:
		if st.streak++; st.streak >= st.cfg.ConsecutiveFailures {
			st.streak = 0
			return o
		}
	}
	return router.OutcomeNone
}
