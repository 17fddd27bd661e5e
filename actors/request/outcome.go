package request

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/tlgw/tlgw/actors/router"
)

// errCut ends a committed answer that did not reach its end: the engine broke it off, sent an
// oversized event, ended a stream without [DONE], or was silent for stream_idle_timeout.
var errCut = errors.New("the answer was cut after its first byte")

// statusError is an engine's answer with a status that ends its part (503 before the first
// byte, a tokenize that did not answer 200).
type statusError struct {
	what   string
	status int
}

func (e statusError) Error() string { return fmt.Sprintf("%s answered %d", e.what, e.status) }

// outcome is the verdict on one worker's part of a request (R14.2), from the error its
// exchange ended in (nil: none) and the HTTP status it answered (0: none), in this order:
//
//	a timeout: R14.1's (first byte, request, control, stream idle), a dial or read deadline → Timeout
//	the connection refused, or not made (a dial error)                                     → Refused
//	errCut: a committed answer cut by the engine or by stream_idle_timeout                  → Interrupted
//	the client's cancellation, or no room in the buffer budget (the gateway's own limit)   → None
//	any other error (a reset, EOF before the headers, a stream that ended before its first
//	event, a broken gRPC call)                                                             → Reset
//	a statusError is its status; no error: status ≥ 500 → 5xx, another status → Success, none → None
//
// A stream cut by stream_idle_timeout after its first byte is Interrupted, not Timeout: the
// relay reports it as a cut (errCut), since the client got the R6 error event like any other
// interrupted stream.
func outcome(err error, status int) router.Outcome {
	if err != nil {
		o, s := errOutcome(err)
		if s == 0 {
			return o
		}
		status = s
	}
	switch {
	case status >= 500:
		return router.Outcome5xx
	case status > 0:
		return router.OutcomeSuccess
	}
	return router.OutcomeNone
}

// errOutcome classifies a failed exchange's error: an outcome, or (a statusError) the status
// it stands for. It is apart from outcome so that the success path does not pay for the
// errors.As targets, which escape.
func errOutcome(err error) (router.Outcome, int) {
	var se statusError
	var ne net.Error
	var op *net.OpError
	switch {
	case errors.As(err, &se):
		return router.OutcomeNone, se.status
	case errors.Is(err, errFirstByteTimeout), errors.Is(err, errRequestTimeout), errors.Is(err, errControlTimeout),
		errors.Is(err, errStreamIdle), errors.As(err, &ne) && ne.Timeout():
		return router.OutcomeTimeout, 0
	case errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &op) && op.Op == "dial":
		return router.OutcomeRefused, 0
	case errors.Is(err, errCut):
		return router.OutcomeInterrupted, 0
	case errors.Is(err, context.Canceled), errors.Is(err, errBufferBudget):
		return router.OutcomeNone, 0
	}
	return router.OutcomeReset, 0
}

// cut is what ended a relayed answer, as outcome reads it: nil when it reached its end,
// context.Canceled when the client left, errBufferBudget when the gateway had no room to
// buffer it, errCut when it was cut.
func (res relayResult) cut() error {
	switch {
	case !res.ended:
		return context.Canceled
	case res.shed:
		return errBufferBudget
	case !res.finished:
		return errCut
	}
	return nil
}
