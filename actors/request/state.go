package request

import "fmt"

// State is where a request is in its life. Each state has one step function (see steps.go);
// a transition not in the table below is a bug and panics.
type State uint8

// The states.
const (
	// Routing: waiting for the router's pick.
	Routing State = iota
	// Tokenizing: disaggregated, asking the prefill worker for the prompt's token ids.
	Tokenizing
	// Prefilling: disaggregated, the prefill worker computes the prompt's KV and pushes it to
	// the decode worker.
	Prefilling
	// Attempting: the request is on its way to an engine; nothing has reached the client.
	Attempting
	// CascadeStep: a non-final cascade step's answer is being read in full, to be judged.
	CascadeStep
	// Relaying: committed; the engine's answer goes to the client as it arrives.
	Relaying
	// Releasing: disaggregated, the decode stream did not finish; its KV handle is released.
	Releasing
	// Done: the client has its one terminal outcome.
	Done
)

var stateNames = [...]string{"routing", "tokenizing", "prefilling", "attempting", "cascade_step", "relaying", "releasing", "done"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// legal lists every allowed transition.
var legal = map[State][]State{
	Routing:     {Attempting, Tokenizing, Routing, Done},
	Tokenizing:  {Prefilling, Routing, Done},
	Prefilling:  {Attempting, Routing, Releasing, Done},
	Attempting:  {Relaying, CascadeStep, Routing, Releasing, Done},
	CascadeStep: {Routing, Releasing, Done},
	Relaying:    {Releasing, Done},
	Releasing:   {Done},
}

// IllegalTransition is the panic value of a transition the table does not allow.
type IllegalTransition struct{ From, To State }

func (e IllegalTransition) Error() string {
	return fmt.Sprintf("request: illegal transition %s → %s", e.From, e.To)
}

func allowed(from, to State) bool {
	for _, s := range legal[from] {
		if s == to {
			return true
		}
	}
	return false
}
