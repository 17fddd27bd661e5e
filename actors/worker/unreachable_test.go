package worker

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
)

// workerRig is one worker actor on a fake clock whose router is a probe.
type workerRig struct {
	t       *testing.T
	sys     *actor.ActorSystem
	clk     *clock.Fake
	w       *actor.PID
	probe   *actor.PID
	info    router.WorkerInfo
	seq     uint64
	states  chan *router.WorkerState
	reports chan *router.LoadReport
}

func newWorkerRig(t *testing.T, static bool) *workerRig {
	t.Helper()
	r := &workerRig{t: t, sys: actor.NewActorSystem(), clk: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		states: make(chan *router.WorkerState, 64), reports: make(chan *router.LoadReport, 64), seq: 1}
	r.probe = r.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *router.WorkerState:
			r.states <- m
		case *router.LoadReport:
			r.reports <- m
		}
	}))
	r.info = router.WorkerInfo{ID: "w1", Model: "smol", HTTPAddress: "127.0.0.1:9", LastHeartbeat: r.clk.Now(), Static: static}
	r.w = r.sys.Root.Spawn(Props(Config{Clock: r.clk, Router: r.probe, Registry: r.probe, TTL: time.Hour, ConsecutiveFailures: 100},
		Status{Info: r.info, Seq: 1, TTL: time.Hour}))
	t.Cleanup(func() { _ = r.sys.Root.StopFuture(r.w).Wait() })
	if s := r.state(); s.Unreachable || s.FailLoad != 0 {
		t.Fatalf("first report %+v", s)
	}
	return r
}

// barrier returns once the worker and the probe have handled everything sent before.
func (r *workerRig) barrier() {
	r.t.Helper()
	for _, pid := range []*actor.PID{r.w, r.probe} {
		if err := r.sys.Root.RequestFuture(pid, &actor.Touch{}, 5*time.Second).Wait(); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *workerRig) state() *router.WorkerState {
	r.t.Helper()
	select {
	case s := <-r.states:
		return s
	case <-time.After(5 * time.Second):
		r.t.Fatal("no worker state")
		return nil
	}
}

func (r *workerRig) report() *router.LoadReport {
	r.t.Helper()
	select {
	case m := <-r.reports:
		return m
	case <-time.After(5 * time.Second):
		r.t.Fatal("no load report")
		return nil
	}
}

// quiet checks that the worker sent nothing more (after a barrier).
func (r *workerRig) quiet(when string) {
	r.t.Helper()
	r.barrier()
	select {
	case s := <-r.states:
		r.t.Fatalf("%s: worker state %+v", when, s)
	case m := <-r.reports:
		r.t.Fatalf("%s: load report %+v", when, m)
	default:
	}
}

// beat is a status that arrived now on the clock (a heartbeat, or a good scrape).
func (r *workerRig) beat() *router.WorkerState {
	r.t.Helper()
	r.seq++
	r.info.LastHeartbeat = r.clk.Now()
	r.sys.Root.Send(r.w, &Status{Info: r.info, Seq: r.seq, TTL: time.Hour})
	return r.state()
}

func (r *workerRig) attempt(ticket uint64, rel router.Release) {
	rel.Ticket = ticket
	r.sys.Root.Send(r.w, &router.Acquire{Ticket: ticket})
	r.sys.Root.Send(r.w, &rel)
}

// TestRefusedWorkerIsUnreachableUntilItsNextHeartbeat (R19): a Release that says the
// connection was refused sends the router a full report with Unreachable at once (with the
// in-flight count and the failure load); more refusals change nothing; a heartbeat that
// arrived no later than the refusal (it was behind it in the mailbox) keeps it unreachable,
// one that arrived after brings it back. A refused connection that is not a refusal of the
// engine's address (a DNS failure: Unreachable unset) only counts as a failure.
func TestRefusedWorkerIsUnreachableUntilItsNextHeartbeat(t *testing.T) {
	r := newWorkerRig(t, false)
	r.sys.Root.Send(r.w, &router.Acquire{Ticket: 1})
	r.attempt(2, router.Release{Outcome: router.OutcomeRefused, Unreachable: true, Addr: r.info.HTTPAddress})
	if s := r.state(); !s.Unreachable || !s.Live || s.InFlight != 1 || s.AcqSeen != 2 || s.FailLoad != 1 {
		t.Fatalf("after the refusal: %+v, want unreachable with 1 in flight and a failure load of 1", s)
	}
	r.quiet("after the refusal's report")
	r.attempt(3, router.Release{Outcome: router.OutcomeRefused, Unreachable: true, Addr: r.info.HTTPAddress})
	if m := r.report(); m.FailLoad != 2 || m.InFlight != 1 {
		t.Fatalf("a second refusal: %+v", m)
	}
	r.quiet("after a second refusal")
	if s := r.beat(); !s.Unreachable {
		t.Fatalf("a heartbeat stamped at the refusal's instant: %+v, want still unreachable", s)
	}
	r.clk.Advance(time.Millisecond)
	r.barrier()
	if s := r.beat(); s.Unreachable || !s.Live {
		t.Fatalf("a heartbeat after the refusal: %+v, want reachable", s)
	}
	r.attempt(4, router.Release{Outcome: router.OutcomeRefused}) // a dial error that proves nothing
	if m := r.report(); m.FailLoad != 3 {
		t.Fatalf("a refused dial without Unreachable: %+v", m)
	}
	r.quiet("after a refused dial without Unreachable")
}

// TestUnreachableStaticWorkerWaitsForAGoodScrape (R19): a scraped worker whose address refused
// a connection stays unreachable through failed scrapes and comes back with a good one.
func TestUnreachableStaticWorkerWaitsForAGoodScrape(t *testing.T) {
	r := newWorkerRig(t, true)
	r.attempt(1, router.Release{Outcome: router.OutcomeRefused, Unreachable: true, Addr: r.info.HTTPAddress})
	if s := r.state(); !s.Unreachable {
		t.Fatalf("after the refusal: %+v", s)
	}
	r.clk.Advance(time.Second)
	r.sys.Root.Send(r.w, &ScrapeError{Reason: "connection refused"})
	if s := r.state(); !s.Unreachable || s.Info.ScrapeError == "" {
		t.Fatalf("after a failed scrape: %+v, want still unreachable", s)
	}
	if s := r.beat(); s.Unreachable {
		t.Fatalf("after a good scrape: %+v, want reachable", s)
	}
}

// TestFailureLoadDecaysOnTheClock (R19): each failed attempt adds 1 to the failure load the
// worker reports; a success or an outcome that says nothing adds nothing; the load halves every
// FailureHalfLife on the injected clock, the first halving a whole half-life after the failure
// that started it; each halving is reported, and once it is 0 no timer is left.
func TestFailureLoadDecaysOnTheClock(t *testing.T) {
	r := newWorkerRig(t, false)
	for i, o := range []router.Outcome{router.Outcome5xx, router.OutcomeReset, router.OutcomeInterrupted} {
		r.attempt(uint64(i+1), router.Release{Outcome: o})
		if m := r.report(); m.FailLoad != int64(i+1) {
			t.Fatalf("failure %d: %+v", i+1, m)
		}
	}
	r.clk.Advance(FailureHalfLife / 2)
	r.barrier()
	r.attempt(4, router.Release{Outcome: router.OutcomeSuccess})
	r.attempt(5, router.Release{Outcome: router.OutcomeNone})
	for range 2 {
		if m := r.report(); m.FailLoad != 3 {
			t.Fatalf("a success or no verdict changed the failure load: %+v", m)
		}
	}
	r.attempt(6, router.Release{Outcome: router.OutcomeTimeout})
	if m := r.report(); m.FailLoad != 4 {
		t.Fatalf("a fourth failure: %+v", m)
	}
	r.clk.Advance(FailureHalfLife/2 - time.Nanosecond)
	r.quiet("1 ns before the first half-life")
	for _, want := range []int64{2, 1, 0} {
		r.clk.Advance(time.Nanosecond)
		if m := r.report(); m.FailLoad != want || m.InFlight != 0 {
			t.Fatalf("a half-life: %+v, want a failure load of %d", m, want)
		}
		r.clk.Advance(FailureHalfLife - time.Nanosecond)
		r.quiet("between half-lives")
	}
	r.clk.Advance(10 * FailureHalfLife)
	r.quiet("with no failure load left")
	if n := r.clk.Pending(); n != 1 {
		t.Fatalf("%d timers pending, want only the heartbeat deadline", n)
	}
	if s := r.beat(); s.FailLoad != 0 {
		t.Fatalf("a heartbeat after the decay: %+v", s)
	}
}

// TestFailLoadBounds: only failures count, each weighs FailureWeight, the load is at most
// MaxFailLoad, and halving forgets n failures after ⌊log₂ n⌋ + 1 half-lives.
func TestFailLoadBounds(t *testing.T) {
	var f failLoad
	for _, o := range []router.Outcome{router.OutcomeNone, router.OutcomeSuccess, router.Outcome(99)} {
		if f.add(o) || f.load() != 0 {
			t.Fatalf("%v counted as a failure", o)
		}
	}
	if !f.add(router.OutcomeRefused) || f.load() != FailureWeight {
		t.Fatalf("the first failure: %d, want it to start the decay", f.load())
	}
	for range 5000 {
		if f.add(router.Outcome5xx) {
			t.Fatal("a failure on a load above 0 started the decay again")
		}
	}
	if f.load() != MaxFailLoad {
		t.Fatalf("after 5001 failures: %d, want the bound %d", f.load(), MaxFailLoad)
	}
	halvings := 0
	for f.halve() {
		halvings++
	}
	if halvings+1 != 11 || f.load() != 0 {
		t.Fatalf("%d half-lives to forget %d, want 11", halvings+1, MaxFailLoad)
	}
}

// TestVerdictOnALeftAddressIsNotTheWorkers (R19, R14.2): an engine restarted at a new address
// under the same id moves its worker; attempts that went to the old address fail (refused,
// reset) after the move. Those verdicts are about the engine that is gone: the worker stays
// reachable, takes no failure load and no step towards an ejection, and only gives the hold
// back. A refusal of the address it is at still takes it out.
func TestVerdictOnALeftAddressIsNotTheWorkers(t *testing.T) {
	r := newWorkerRig(t, false)
	old := r.info.HTTPAddress
	r.info.HTTPAddress = "127.0.0.1:10"
	r.clk.Advance(time.Millisecond)
	r.beat() // the engine's successor, at its new address
	r.sys.Root.Send(r.w, &router.Acquire{Ticket: 1})
	r.attempt(2, router.Release{Outcome: router.OutcomeRefused, Unreachable: true, Addr: old})
	if m := r.report(); m.FailLoad != 0 || m.InFlight != 1 {
		t.Fatalf("a refusal at the old address: %+v, want the hold given back and no failure load", m)
	}
	r.attempt(3, router.Release{Outcome: router.OutcomeReset, Addr: old})
	if m := r.report(); m.FailLoad != 0 || m.Eject != router.OutcomeNone {
		t.Fatalf("a reset at the old address: %+v, want no failure load", m)
	}
	r.quiet("after verdicts on the old address")
	r.attempt(4, router.Release{Outcome: router.OutcomeRefused, Unreachable: true, Addr: r.info.HTTPAddress})
	if s := r.state(); !s.Unreachable || s.FailLoad != 1 {
		t.Fatalf("a refusal at the current address: %+v, want unreachable", s)
	}
}
