package request

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
)

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
	// RemotePrefill: disaggregated over vLLM's protocol (R22), the prefill worker answers
	// call 1 (max_tokens 1, kv_transfer_params do_remote_decode) with the parameters that name
	// the KV it holds for the decode.
	RemotePrefill
	// Attempting: the request is on its way to an engine; nothing has reached the client. A
	// disaggregated request over SGLang's protocol (R22) is here with both of its calls: the
	// decode worker's, whose answer the client gets, and the prefill worker's, at once.
	Attempting
	// CascadeStep: a non-final cascade step's answer is being read in full, to be judged.
	CascadeStep
	// Relaying: committed; the engine's answer goes to the client as it arrives.
	Relaying
	// Releasing: disaggregated, a KV handle that will not be consumed (the decode stream did
	// not finish, a failover, request_timeout, the client leaving) is released on the decode
	// worker; then the request finishes, or (a failover) routes again.
	Releasing
	// Done: the client has its one terminal outcome.
	Done
)

var stateNames = [...]string{"routing", "tokenizing", "prefilling", "remote_prefill", "attempting", "cascade_step", "relaying", "releasing", "done"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// stateSpec is one row of the machine: the state's step function (the handler of every
// message the actor gets in it, after the client-gone and timeout paths) and the states it may
// move to.
type stateSpec struct {
	step func(r *requestActor, c actor.Context, msg any)
	next []State
}

// machine is the request's state machine: become(to) takes the step from here, so a state and
// its handler cannot disagree, and a transition missing from next panics. Filled in init: the
// step functions call become, which reads the table.
var machine [Done + 1]stateSpec

func init() {
	machine = [Done + 1]stateSpec{
		Routing:       {(*requestActor).stepRouting, []State{Attempting, Tokenizing, RemotePrefill, Routing, Done}},
		Tokenizing:    {(*requestActor).stepTokenizing, []State{Prefilling, Routing, Done}},
		Prefilling:    {(*requestActor).stepPrefilling, []State{Attempting, Routing, Releasing, Done}},
		RemotePrefill: {(*requestActor).stepRemotePrefill, []State{Attempting, Routing, Done}},
		Attempting:    {(*requestActor).stepAttempting, []State{Relaying, CascadeStep, Routing, Releasing, Done}},
		CascadeStep:   {(*requestActor).stepCascade, []State{Routing, Releasing, Done}},
		Relaying:      {(*requestActor).stepRelaying, []State{Releasing, Done}},
		Releasing:     {(*requestActor).stepReleasing, []State{Routing, Done}},
		Done:          {nil, nil},
	}
}

// IllegalTransition is the panic value of a transition the table does not allow.
type IllegalTransition struct{ From, To State }

func (e IllegalTransition) Error() string {
	return fmt.Sprintf("request: illegal transition %s → %s", e.From, e.To)
}

func allowed(from, to State) bool {
	if int(from) >= len(machine) {
		return false
	}
	for _, s := range machine[from].next {
		if s == to {
			return true
		}
	}
	return false
}
