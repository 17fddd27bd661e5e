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

// access is what the access log will say of a request, kept as it runs (the actor's acc; nil
// when there is no access log, and each method then does nothing).
type access struct {
	tries      int           // attempts made: every pick acted on, over all cascade steps
	lastWorker string        // the last attempt's worker id
	ttft       time.Duration // arrival to the first byte of the answer relayed (0: none)
	// usage is the answer's prompt and completion tokens (−1: not known): the relay's
	// goroutine writes it before it ends (relayer.usage), the cascade step when it keeps an
	// answer.
	usage  usageDetail
	failed string // the outcome of a failure the actor answered ("" until fail)
}

// usageDetail is an answer's usage.prompt_tokens and completion_tokens (or input_ and
// output_tokens); −1: not known.
type usageDetail struct{ prompt, completion int64 }

func (a *access) attempt(worker string) {
	if a != nil {
		a.tries++
		a.lastWorker = worker
	}
}

// firstByte notes the time to the first byte of the answer the client gets (0: none yet,
// as when a cascade step's answer is not kept).
func (a *access) firstByte(d time.Duration) {
	if a != nil {
		a.ttft = d
	}
}

// failedAs names the outcome of the failure about to be answered.
func (a *access) failedAs(word string) {
	if a != nil {
		a.failed = word
	}
}

// failedWith names the outcome of answering err, unless failedAs named one.
func (a *access) failedWith(err error) {
	if a != nil && a.failed == "" {
		a.failed = failOutcome(err)
	}
}

// usageOut is where the relay writes the answer's usage (nil: the log is off).
func (a *access) usageOut() *usageDetail {
	if a == nil {
		return nil
	}
	return &a.usage
}

// outcomeWord is how the request ended with code: what fail recorded, else what the relay (or
// the answer the actor wrote itself) came to.
func (r *requestActor) outcomeWord(code int) string {
	out := r.relayOut
	switch {
	case code == statusClientGone:
		return OutcomeClientGone
	case r.acc != nil && r.acc.failed != "":
		return r.acc.failed
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
// usage, status, outcome, time and duration, which its end gives.
func (r *requestActor) accessRecord() accesslog.Record {
	rec := accesslog.Record{
		RequestID: r.x.ID, TraceID: r.tr.traceID(), Route: r.route, Model: r.served,
		Endpoint: EndpointLabel(r.x.Kind), Stream: r.x.Req.Stream, PromptTokens: -1, CompletionTokens: -1,
	}
	if o := r.x.Owner; o >= 0 && o < len(r.d.KeyNames) {
		rec.Key = r.d.KeyNames[o]
	}
	if a := r.acc; a != nil {
		rec.Worker, rec.Attempts, rec.TTFT = a.lastWorker, a.tries, a.ttft
	}
	return rec
}

// logAccess hands the finished request's record to the access log (finish; the log is on).
func (r *requestActor) logAccess(code int) {
	rec := r.accessRecord()
	rec.PromptTokens, rec.CompletionTokens = r.acc.usage.prompt, r.acc.usage.completion
	rec.Time, rec.Duration = r.clock().Now(), time.Since(r.x.Start)
	rec.Status, rec.Outcome = code, r.outcomeWord(code)
	r.d.AccessLog.Record(&rec)
}
