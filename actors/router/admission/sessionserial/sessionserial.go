// Package sessionserial is the session_serial admission classifier: one turn in flight per
// session (SPEC R10.3, R10.4). It takes no keys of [admission] classifier and is registered by
// name in actors/router/admission/classifiers.
package sessionserial

import (
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// WaitBusy is the wait of a session head whose previous turn is still running.
var WaitBusy = admission.NewWait("session_busy")

// Policy is the one-turn-per-session policy: a request of a session is not dispatched
// while an earlier request of the same session is dispatched and not yet completed. Requests
// without a session are never held.
//
// Its Classify leaves class, lane and allowed workers alone: the queue itself puts a request
// with a session id in that session's lane (R10.3), which is what makes a held turn block only
// its own session. The gate's ledger is a per-session in-flight count, updated in Dispatched
// and Completed (the same actor turn that dispatches or completes, GATE-PITFALLS 14); an entry
// is deleted when its count reaches zero, so memory follows the requests in flight.
//
// Like every gate, it is used from the router actor's goroutine only.
type Policy struct {
	// Bounds: both follow the dispatched requests with a session not yet completed (an entry
	// goes with its last completion), so they are empty when no turn runs.
	inFlight map[string]int    // session id → dispatched, not yet completed
	bySID    map[uint64]string // request key → session id, for the requests counted above
}

var (
	_ admission.Policy  = (*Policy)(nil)
	_ admission.Gate    = (*Policy)(nil)
	_ admission.Factory = Factory
)

// Factory is the session_serial classifier's admission.Factory. The classifier has no keys:
// any key in its table is an error ("unknown key").
func Factory(raw map[string]any, _ admission.Env) (admission.Policy, error) {
	if err := admission.NewOptions(raw).Err(); err != nil {
		return nil, err
	}
	return New(), nil
}

// New returns an empty one-turn-per-session policy.
func New() *Policy {
	return &Policy{inFlight: make(map[string]int), bySID: make(map[uint64]string)}
}

// Classify leaves the request as it is (see the type's comment).
func (s *Policy) Classify(*admission.Request, []string, func([]string) int) {}

// Gate returns the policy itself.
func (s *Policy) Gate() admission.Gate { return s }

// Check holds a head whose session has a turn in flight, until the next wake (no time: only a
// completion can release it). The hold is SessionOnly: the queue asks again when a turn of
// that session completes, not on every capacity free elsewhere.
func (s *Policy) Check(head *admission.Request, _ admission.View) admission.Decision {
	if head.SessionID != "" && s.inFlight[head.SessionID] > 0 {
		return admission.Decision{Wait: WaitBusy, SessionOnly: true}
	}
	return admission.Decision{Go: true}
}

// Dispatched counts the request against its session. A second Dispatched for a request already
// counted is ignored, so one request never holds its session twice.
func (s *Policy) Dispatched(r *admission.Request, _ string) {
	if r.SessionID == "" {
		return
	}
	if _, ok := s.bySID[r.Key]; ok {
		return
	}
	s.bySID[r.Key] = r.SessionID
	s.inFlight[r.SessionID]++
}

// Completed ends the request's turn. A request that was never counted (no session, unknown, or
// already completed) changes nothing, so counts never go negative.
func (s *Policy) Completed(r *admission.Request, _ string) {
	sid, ok := s.bySID[r.Key]
	if !ok {
		return
	}
	delete(s.bySID, r.Key)
	if s.inFlight[sid] <= 1 {
		delete(s.inFlight, sid)
		return
	}
	s.inFlight[sid]--
}

// Moved changes nothing: the turn is the session's wherever it runs.
func (s *Policy) Moved(*admission.Request, string, string) {}

// Recheck is 0: a held turn is released only by its session's completion, which is a wake the
// queue delivers, so a periodic recheck would never change an answer.
func (s *Policy) Recheck() time.Duration { return 0 }

// Tracked counts the entries of the policy's ledger: 0 once every turn has completed.
func (p *Policy) Tracked() int { return len(p.inFlight) + len(p.bySID) }
