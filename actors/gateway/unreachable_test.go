package gateway_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestRefusedWorkerOutOfRoutingUntilItHeartbeats (R19), over the registry, worker and router
// actors on the fake clock: a Release saying the connection was refused takes the worker out of
// every pick at once, though it still heartbeats on time; a heartbeat stamped at the refusal's
// instant does not bring it back; one that arrives later does. A pick whose only candidate is
// unreachable is answered no_capacity, with no ejection involved.
func TestRefusedWorkerOutOfRoutingUntilItHeartbeats(t *testing.T) {
	h := gwtest.New(t)
	h.Beat(gwtest.Worker("a", "smol", 0))
	h.Beat(gwtest.Worker("b", "smol", 0))
	refuse := func() {
		t.Helper()
		p, err := h.Pick(router.Pick{Model: "smol", RequestID: "r"})
		if err != nil {
			t.Fatal(err)
		}
		h.GW.System.Root.Send(p.Worker, &router.Release{Ticket: p.Ticket, Outcome: router.OutcomeRefused, Unreachable: true})
		h.Eventually(p.WorkerID+" unreachable", func() bool { v, _ := h.View(p.WorkerID); return v.Unreachable && !v.Routable })
	}
	refuse() // a: loads tie, smallest id
	for range 5 {
		if got := h.MustPick("smol"); got != "b" {
			t.Fatalf("a pick went to %s while a is unreachable", got)
		}
	}
	h.InFlight("b", 5)
	h.Beat(gwtest.Worker("a", "smol", 0)) // stamped at the refusal's instant: proves nothing
	if v, _ := h.View("a"); v.Routable || !v.Unreachable {
		t.Fatalf("a after a heartbeat at the refusal's instant: %+v", v)
	}
	h.Clock.Advance(time.Second)
	h.Beat(gwtest.Worker("a", "smol", 0))
	if v, _ := h.View("a"); !v.Routable || v.Unreachable || v.EjectedUntil != (time.Time{}) {
		t.Fatalf("a after a later heartbeat: %+v", v)
	}
	if got := h.MustPick("smol"); got != "a" {
		t.Fatalf("a pick went to %s with a back and idle", got)
	}

	refuse() // a again: 1 in flight against b's 5
	if _, err := h.Pick(router.Pick{Model: "smol", RequestID: "x", Exclude: []string{"b"}}); !errors.Is(err, errs.ErrNoCapacity) {
		t.Fatalf("only a, unreachable, left to pick: %v", err)
	}
}
