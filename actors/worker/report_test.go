package worker

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
)

// TestReportsOnlyChanges: a scrape failure's reason and the admin drain reach the router once
// per change, not once per message; a requester that stops with a hold left ends it, and the
// router hears the lower in-flight count, naming this actor's registration (the router matches
// a report to the registration it names).
func TestReportsOnlyChanges(t *testing.T) {
	sys := actor.NewActorSystem()
	got := make(chan any, 16)
	probe := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *router.WorkerState, *router.LoadReport:
			got <- m
		}
	}))
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	info := router.WorkerInfo{ID: "w1", Reg: 7, Model: "smol", LastHeartbeat: clk.Now()}
	w := sys.Root.Spawn(Props(Config{Clock: clk, Router: probe, Registry: probe, TTL: time.Hour}, Status{Info: info, Seq: 1, TTL: time.Hour}))
	defer func() { _ = sys.Root.StopFuture(w).Wait() }()
	next := func(what string) any {
		t.Helper()
		select {
		case m := <-got:
			return m
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no report", what)
			return nil
		}
	}
	// quiet: nothing more reached the router once the worker and the probe handled all sent.
	quiet := func(what string) {
		t.Helper()
		for _, pid := range []*actor.PID{w, probe} {
			if err := sys.Root.RequestFuture(pid, &actor.Touch{}, 5*time.Second).Wait(); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case m := <-got:
			t.Fatalf("%s: an extra report %+v", what, m)
		default:
		}
	}
	state := func(what string) *router.WorkerState {
		t.Helper()
		m, ok := next(what).(*router.WorkerState)
		if !ok {
			t.Fatalf("%s: %T, want a worker state", what, m)
		}
		return m
	}
	state("start")

	sys.Root.Send(w, &ScrapeError{Reason: "timeout"})
	sys.Root.Send(w, &ScrapeError{Reason: "timeout"})
	if s := state("scrape error"); s.Info.ScrapeError != "timeout" || !s.Live {
		t.Fatalf("scrape error: %+v", s.Info)
	}
	quiet("the same scrape error again")
	sys.Root.Send(w, &ScrapeError{})
	if s := state("scrape recovered"); s.Info.ScrapeError != "" {
		t.Fatalf("scrape recovered: %+v", s.Info)
	}

	sys.Root.Send(w, &SetDrained{Drained: true})
	sys.Root.Send(w, &SetDrained{Drained: true})
	if s := state("drained"); !s.Info.AdminDrained {
		t.Fatalf("drained: %+v", s.Info)
	}
	quiet("drained again")
	sys.Root.Send(w, &SetDrained{})
	if s := state("undrained"); s.Info.AdminDrained {
		t.Fatalf("undrained: %+v", s.Info)
	}
	quiet("after undrain")

	requester := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	sys.Root.Send(w, &router.Acquire{Ticket: 7, Requester: requester})
	quiet("an Acquire") // the router counted it when it picked
	if err := sys.Root.StopFuture(requester).Wait(); err != nil {
		t.Fatal(err)
	}
	r, ok := next("the requester's stop").(*router.LoadReport)
	if !ok || r.InFlight != 0 || r.AcqSeen != 1 || r.Reg != 7 {
		t.Fatalf("after the requester stopped: %+v", r)
	}
	quiet("after the stop")

	// A requester whose hold ended before it stopped: its stop changes nothing.
	done := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	sys.Root.Send(w, &router.Acquire{Ticket: 8, Requester: done})
	sys.Root.Send(w, &router.Release{Ticket: 8, Outcome: router.OutcomeSuccess})
	if r, ok := next("the release").(*router.LoadReport); !ok || r.InFlight != 0 || r.AcqSeen != 2 || r.Reg != 7 {
		t.Fatalf("after the release: %+v", r)
	}
	if err := sys.Root.StopFuture(done).Wait(); err != nil {
		t.Fatal(err)
	}
	quiet("a stop with no hold left")
}
