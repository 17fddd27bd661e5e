package request

import (
	"errors"
	"time"

	"github.com/tlgw/tlgw/internal/accesslog"
	"github.com/tlgw/tlgw/internal/errs"
)

// The access log's outcome words (R24): how a request ended, as the actor knows it.
const (
	OutcomeOK                = "ok"                 // an answer relayed whole, status < 400
	OutcomeEngineError       = "engine_error"       // an engine's own answer relayed whole, status ≥ 400
	OutcomeInterrupted       = "interrupted"        // an answer cut after its first byte (R6: the error event, or 502)
	OutcomeClientGone        = "client_gone"        // the client left first (status 499)
	OutcomeTimeout           = "timeout"            // request_timeout fired (504, R14.1)
	OutcomeFailoverExhausted = "failover_exhausted" // max_attempts workers failed before the first byte (503)
	OutcomeRetryBudget       = "retry_budget"       // a failure answered, the retry budget spent (503, R14.3)
	OutcomeNoCapacity        = "no_capacity"        // nothing routable, no attempt made (503)
	OutcomeModelNotFound     = "model_not_found"    // no route and no worker knows the model (404)
	OutcomeQueueFull         = "queue_full"         // the admission queue refused it (429, R10.2)
	OutcomeQueueTimeout      = "queue_timeout"      // it waited its class's max_wait (R10.5)
	OutcomeOverloaded        = "overloaded"         // no room in the buffer budget (503, R20)
	OutcomeInvalidRequest    = "invalid_request"    // the gateway could not use the request (400)
	OutcomeInternalError     = "internal_error"     // the router did not answer (500)
	OutcomeCrashed           = "crashed"            // the request actor panicked (R-D: answered 502 or an error event)
	OutcomeError             = "error"              // any other error the gateway answered
)

// failOutcome is the outcome word of an error the actor answers (fail).
func failOutcome(err error) string {
	for _, e := range [...]struct {
		err  error
		word string
	}{
		{errs.ErrNoCapacity, OutcomeNoCapacity}, {errs.ErrModelNotFound, OutcomeModelNotFound},
		{errs.ErrQueueFull, OutcomeQueueFull}, {errs.ErrQueueTimeout, OutcomeQueueTimeout},
		{errs.ErrOverloaded, OutcomeOverloaded}, {errs.ErrInvalidRequest, OutcomeInvalidRequest},
		{errs.ErrUpstreamTimeout, OutcomeTimeout}, {errs.ErrInternal, OutcomeInternalError},
	} {
		if errors.Is(err, e.err) {
			return e.word
		}
	}
	return OutcomeError
}

// outcomeWord is how the request ended with code: what fail recorded, else what the relay (or
// the answer the actor wrote itself) came to.
func (r *requestActor) outcomeWord(code int) string {
	out := r.relayOut
	switch {
	case code == statusClientGone:
		return OutcomeClientGone
	case r.failed != "":
		return r.failed
	case out != nil && out.ended:
		switch {
		case out.shed:
			return OutcomeOverloaded
		case !out.finished:
			return OutcomeInterrupted
		}
	case r.timedOut:
		return OutcomeTimeout
	}
	if code >= 400 {
		return OutcomeEngineError
	}
	return OutcomeOK
}

// accessRecord is the access log's record of the request as it stands: everything but its
// status, outcome, time and duration, which its end gives.
func (r *requestActor) accessRecord() accesslog.Record {
	return accesslog.Record{
		RequestID: r.x.ID, TraceID: r.x.TraceID, Key: r.x.KeyName,
		Route: r.route, Model: r.served, Endpoint: EndpointLabel(r.x.Kind), Worker: r.lastWorker,
		Attempts: r.tries, TTFT: r.ttft, PromptTokens: r.promptTokens, CompletionTokens: r.completionTokens,
		Stream: r.x.Req.Stream,
	}
}

// logAccess hands the finished request's record to the access log (finish; the log is on).
func (r *requestActor) logAccess(code int) {
	rec := r.accessRecord()
	rec.Time, rec.Duration = r.clock().Now(), time.Since(r.x.Start)
	rec.Status, rec.Outcome = code, r.outcomeWord(code)
	r.d.AccessLog.Record(&rec)
}
