package request

import (
	"errors"
	"testing"
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
	r.become(Routing, nil)
}
