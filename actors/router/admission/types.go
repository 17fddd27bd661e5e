// Package admission is tlgw's admission queue and dispatch gate (SPEC R10), pure Go, owned by
// the router actor: classes served by deficit round robin, lanes (one shared lane per class and
// pool, one per session, classifier-named lanes) where a held or blocked head blocks only its
// own lane, a DispatchGate that policies use to hold or steer a lane head, and every wait —
// order, class budget, expiry, wake-ups — owned by the queue. Classifiers never park a request.
//
// Termination is by construction: a head is asked at most once per pump unless it dispatched,
// and a head with no candidate worker (or no room on any) is never dispatchable, so the work
// done for one message is bounded by the lanes and the requests it dispatches.
//
// Each classifier (a Policy) is its own subpackage that parses its keys of [admission]
// classifier; Register names its Factory, and the one table of names is the classifiers
// subpackage.
package admission

import "time"

// Request is what the queue and its policies know of one request.
type Request struct {
	// Key is the request's internal id, unique among live requests. Every table of the queue
	// and of the policies is keyed by it, never by the client's X-Request-ID (SPEC R13.4: two
	// live requests may share one).
	Key uint64
	// ID is the client-visible request id, for the admin view only.
	ID        string
	Class     string // set by Classify: the class name (default class when empty)
	Lane      string // set by Classify: a classifier-named lane ("" = shared or session lane)
	SessionID string // from X-Session-ID or the body's user; "" = none
	// Allowed narrows the workers the request may go to (nil = the route's). Classify sets it
	// by intersection with the route's set; an empty intersection keeps the route's.
	Allowed []string
	// APIKey is the index of the configured API key the request came with (-1: none): a
	// class's queue_limit is shared among the keys that queue in it (Queue.Admit), and a
	// policy may share its own limits so (R20). Never a client's string.
	APIKey int
	// PromptTokens is the size estimate of every prompt of the request (text bytes / 4 and
	// token ids; the gateway has no tokenizer). CachedTokens is the best matched prefix, in
	// tokens, over the allowed workers, from the prefix index. OutputTokens is the most the
	// request may generate (prompts × n × max_tokens; 0 when unbounded): what it asks of a
	// worker beyond its uncached prompt.
	PromptTokens int
	CachedTokens int
	OutputTokens int
	// Tag is the policy's own mark (e.g. cold_pool's "warm"/"cold"); shown in the admin view.
	Tag string
	// Pool names the pool the request goes to (its model and role; the queue sets it from the
	// entry before Classify): requests of one pool compete for the same workers.
	Pool string
	// Objective is the request's own time objective (R18.4: its TTFT objective under
	// predicted_latency; 0 = none), counted from its admission. Its owner dispatches it only to
	// a worker predicted to meet what is left of it. Such a request waits in a lane and a
	// candidate set of its own: whether it can go depends on its own prompt and time, so it
	// holds back no other request (one behind it in a shared lane might be served in time),
	// and a request that can go is never queued behind it. A pump asks at most MaxLateAsks of
	// them in vain, oldest first. It waits at most until the objective has passed (a later
	// dispatch could not meet it) or its class's max_wait, whichever comes first (then 503
	// queue_timeout).
	Objective time.Duration
	// Final marks a session's last turn (X-TL-Session-Final: true): a program policy frees the
	// session's state when it is admitted (R15.1).
	Final bool
	// Refuse, set by Classify, rejects the request before it is queued or counted (a policy's
	// own limit); it must wrap ErrQueueFull (429 queue_full).
	Refuse error
	// Set when the request ends, before the gate's Completed: ContextTokens is what its answer
	// cost (usage.total_tokens, prompt and completion, else the gateway's estimate), Aborted
	// that it ended without a whole successful answer (an error, the client gone, a crash).
	ContextTokens int
	Aborted       bool
}

// Worker is one candidate worker as the queue and gates see it.
type Worker struct {
	ID   string
	Load int64 // R2: in flight + reported queue depth
	Full bool  // load ≥ the admission busy_threshold (never when none is configured)
	// Capacity is the worker's KV capacity in tokens (kv_total_blocks × block_size; 0 =
	// unknown: the worker is live but has no known capacity).
	Capacity int64
}

// View is the gate's read-only view of the pool a head would go to. It is valid during the
// call it is passed to only (the host reuses it): a gate copies what it keeps.
type View interface {
	// Workers lists the head's candidate workers (route ∩ allowed), in id order. None means
	// the head cannot be dispatched now, whatever the gate says.
	Workers() []Worker
	// Now is the injected clock's time.
	Now() time.Time
}

// PoolView is an optional View interface: the ids of every routable worker of the head's
// pool, in id order, whatever the head's allowed set and exclusions (Workers lists only those
// this head may use). A gate that keeps work per worker tells by it a worker gone from one
// this head may not use. nil means the host does not tell (the gate then has Workers only).
type PoolView interface {
	PoolWorkers() []string
}

// Decision is a gate's answer about a lane head.
type Decision struct {
	// Go dispatches the head; Target, when set and allowed and not full, is where it goes
	// (a soft target: the picker falls back to its policy otherwise).
	Go     bool
	Target string
	// Until (with Go false) holds the head until that time at the latest; the zero time holds
	// it until the next wake (a capacity change, a worker arriving or leaving, the gate's own
	// recheck). A time not in the future arms no timer and means "ask again at the next wake".
	Until time.Time
	// Wait says why a head is held, for the admin view (WaitHeld when unset).
	Wait Wait
	// SessionOnly says only the end of a turn of the head's own session (besides its Hold
	// time, the gate's recheck and workers coming or going) can change this answer, so a
	// capacity free elsewhere need not ask again. By default a held head is asked again on
	// every capacity free (GATE-PITFALLS 8).
	SessionOnly bool
	// GateWakes (a Waker's answer only) says the hold ends by the gate's own later decision,
	// which names the head in Woken, at Until, or when workers come, go or change. A capacity
	// free then asks only one such head per class and candidate set — its ask lets the gate
	// settle, and the gate names the heads it let go — not every one of them.
	GateWakes bool
}

// Gate is a policy's dispatch gate. Every method is called on the router actor's goroutine and
// must return at once.
type Gate interface {
	// Check is asked about a lane head before the capacity check.
	Check(head *Request, v View) Decision
	// Dispatched is called exactly once per request, when it leaves the queue for worker
	// (also for requests that never waited).
	Dispatched(r *Request, worker string)
	// Moved is called when a dispatched request goes on on another worker (a failover, a
	// later cascade step, a repeated pick): the bookkeeping follows the worker used.
	Moved(r *Request, from, to string)
	// Completed is called once when a dispatched request ends, whatever its outcome, with the
	// last worker it was on.
	Completed(r *Request, worker string)
	// Recheck is how often held heads are asked again with no other wake (0 = never).
	Recheck() time.Duration
}

// Waker is an optional Gate interface: a gate whose holds end by its own later decisions
// (thunderagent resumes paused programs when it settles) names the held heads to ask again.
// The queue reads it after every call into the gate.
type Waker interface {
	// Woken calls wake with the key of each request the gate let go of since it was last
	// read, and forgets them.
	Woken(wake func(key uint64))
}

// Classifier assigns class, lane and allowed workers, and may read cached tokens.
type Classifier interface {
	// Classify returns at once; it never parks a request. cached gives the best matched
	// prefix (tokens) over a set of workers.
	Classify(r *Request, route []string, cached func(workers []string) int)
}

// Policy is a registered admission policy: a classifier and, optionally, a gate.
type Policy interface {
	Classifier
	Gate() Gate // nil: no gate (every head is Go)
}

// QueueObserver is an optional policy interface: told when a request joins the queue and
// when it leaves without being dispatched (cancelled or expired).
type QueueObserver interface {
	Enqueued(*Request)
	Left(*Request)
}

// LaneLimiter is an optional policy interface: the queue limit and max wait of the lanes it
// names (Cold Pool's cold lane has its own, GATE-PITFALLS 15).
type LaneLimiter interface {
	LaneLimits() map[string]LaneLimit
}

// Intersect narrows allowed to the route's workers; an empty intersection keeps route (R10.1).
func Intersect(route, allowed []string) []string {
	if allowed == nil {
		return route
	}
	set := make(map[string]bool, len(allowed))
	for _, w := range allowed {
		set[w] = true
	}
	var out []string
	for _, w := range route {
		if set[w] {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return route
	}
	return out
}
