package router

// Finished tells the router that an admitted request ended, once: its request actor sends it
// from its finish, or from its stop after a crash (which every stop runs), so the router needs
// no watch of each admitted requester. A request still queued is cancelled; a dispatched one
// ends its turn for the gate with what its answer cost (R15: a program's context grows by it).
// A key the router does not know (not admitted, or already answered by the queue) is ignored.
type Finished struct {
	Key uint64
	// Tokens is what the answer cost: its usage.total_tokens, else the gateway's estimate.
	Tokens int64
	// Aborted: the request ended without a whole successful answer (an error, the client
	// gone, a crash).
	Aborted bool
}

// IgnoreDeadLetterLogging: the router may be stopping.
func (*Finished) IgnoreDeadLetterLogging() {}
