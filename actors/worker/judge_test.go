package worker

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
)

// TestJudgeCountsFailureStreaks: consecutive failures up to consecutive_failures ask for an
// ejection with the last failure and start the streak again; a success resets it; OutcomeNone
// and values that are no outcome change nothing; 0 turns it off.
func TestJudgeCountsFailureStreaks(t *testing.T) {
	st := &state{cfg: Config{ConsecutiveFailures: 3}}
	steps := []struct {
		in, want router.Outcome
		streak   int
	}{
		{router.OutcomeRefused, router.OutcomeNone, 1},
		{router.OutcomeNone, router.OutcomeNone, 1},
		{router.Outcome(99), router.OutcomeNone, 1},
		{router.Outcome5xx, router.OutcomeNone, 2},
		{router.OutcomeSuccess, router.OutcomeNone, 0},
		{router.OutcomeReset, router.OutcomeNone, 1},
		{router.OutcomeTimeout, router.OutcomeNone, 2},
		{router.OutcomeInterrupted, router.OutcomeInterrupted, 0},
		{router.Outcome5xx, router.OutcomeNone, 1},
	}
	for i, s := range steps {
		if got := st.judge(s.in); got != s.want || st.streak != s.streak {
			t.Fatalf("step %d (%v): judged %v with streak %d, want %v and %d", i, s.in, got, st.streak, s.want, s.streak)
		}
	}
	off := &state{}
	for range 10 {
		if got := off.judge(router.Outcome5xx); got != router.OutcomeNone {
			t.Fatalf("ejection off, yet judge asked for one: %v", got)
		}
	}
}

// TestReleaseVerdictCountsAfterTheHoldEnded: a worker actor with consecutive_failures = 2. Two
// failed Releases ask the router for an ejection in the load report, also when the second one's
// hold had already ended (its requester's Terminated overtook it); a success in between starts
// the streak again.
func TestReleaseVerdictCountsAfterTheHoldEnded(t *testing.T) {
	sys := actor.NewActorSystem()
	reports := make(chan *router.LoadReport, 16)
	probe := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*router.LoadReport); ok {
			reports <- m
		}
	}))
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	info := router.WorkerInfo{ID: "w1", Model: "smol", LastHeartbeat: clk.Now()}
	w := sys.Root.Spawn(Props(Config{Clock: clk, Router: probe, Registry: probe, TTL: time.Hour, ConsecutiveFailures: 2},
		Status{Info: info, Seq: 1, TTL: time.Hour}))
	defer func() { _ = sys.Root.StopFuture(w).Wait() }()
	next := func() *router.LoadReport {
		t.Helper()
		select {
		case r := <-reports:
			return r
		case <-time.After(5 * time.Second):
			t.Fatal("no load report")
			return nil
		}
	}
	sys.Root.Send(w, &router.Acquire{Ticket: 1})
	sys.Root.Send(w, &router.Release{Ticket: 1, Outcome: router.Outcome5xx})
	if r := next(); r.InFlight != 0 || r.Eject != router.OutcomeNone {
		t.Fatalf("first failure: %+v", r)
	}
	sys.Root.Send(w, &router.Acquire{Ticket: 2})
	sys.Root.Send(w, &router.Release{Ticket: 2, Outcome: router.OutcomeSuccess})
	if r := next(); r.Eject != router.OutcomeNone {
		t.Fatalf("success: %+v", r)
	}
	sys.Root.Send(w, &router.Acquire{Ticket: 3})
	sys.Root.Send(w, &router.Release{Ticket: 3, Outcome: router.OutcomeRefused})
	if r := next(); r.Eject != router.OutcomeNone {
		t.Fatalf("a streak of one after the success asked for an ejection: %+v", r)
	}
	sys.Root.Send(w, &router.Release{Ticket: 99, Outcome: router.OutcomeReset}) // its hold is gone
	if r := next(); r.Eject != router.OutcomeReset || r.InFlight != 0 {
		t.Fatalf("the second failure in a row: %+v, want Eject reset", r)
	}
	sys.Root.Send(w, &router.Release{Ticket: 98, Outcome: router.OutcomeNone}) // nothing held, no verdict
	sys.Root.Send(w, &router.Acquire{Ticket: 4})
	sys.Root.Send(w, &router.Release{Ticket: 4})
	if r := next(); r.Eject != router.OutcomeNone || r.AcqSeen != 4 {
		t.Fatalf("after the ejection request: %+v (a Release with no hold and no verdict reports nothing)", r)
	}
}
