package request

import (
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// TestTransitionTable: every state but Done can reach Done, nothing leaves Done, and become
// panics on a transition the table does not list.
func TestTransitionTable(t *testing.T) {
	for s := Routing; s < Done; s++ {
		if !allowed(s, Done) {
			t.Errorf("%s cannot reach done", s)
		}
	}
	for s := Routing; s <= Done; s++ {
		if allowed(Done, s) {
			t.Errorf("done → %s is allowed", s)
		}
	}
	if allowed(Relaying, Attempting) || allowed(Relaying, Routing) {
		t.Error("a committed request may go back to routing: that would splice")
	}
	r := &requestActor{d: &Deps{Metrics: NewMetrics(nil)}, state: Relaying}
	defer func() {
		var it IllegalTransition
		err, _ := recover().(error)
		if !errors.As(err, &it) || it.From != Relaying || it.To != Routing {
			t.Fatalf("recovered %v, want IllegalTransition relaying → routing", err)
		}
	}()
	r.become(Routing)
}

// TestTheTableDrivesTheMachine: become takes the step function from the table, so every live
// state has one and Done has none; a state outside the table allows nothing.
func TestTheTableDrivesTheMachine(t *testing.T) {
	for s := Routing; s < Done; s++ {
		if machine[s].step == nil {
			t.Errorf("%s has no step function", s)
		}
	}
	if machine[Done].step != nil || len(machine[Done].next) != 0 {
		t.Error("done handles messages or moves on")
	}
	if allowed(Done+1, Done) {
		t.Error("a state outside the table moves")
	}
	if got := (Done + 1).String(); got != "state(9)" {
		t.Errorf("an unknown state reads %q", got)
	}
	// A request in Releasing gets its step from the table: the Release's answer runs the
	// continuation and nothing else does.
	var ran []string
	r := &requestActor{d: &Deps{Metrics: NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		state: Attempting, kvHandle: "h"}
	r.afterRelease = func(actor.Context) { ran = append(ran, r.state.String()) }
	r.become(Releasing)
	machine[r.state].step(r, nil, attemptResult{})
	if len(ran) != 0 {
		t.Fatal("Releasing ran its continuation on another message")
	}
	machine[r.state].step(r, nil, releasedKV{})
	if !slices.Equal(ran, []string{"releasing"}) || r.kvHandle != "" || r.afterRelease != nil {
		t.Fatalf("ran %v, handle %q", ran, r.kvHandle)
	}
}
