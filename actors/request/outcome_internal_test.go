package request

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/tlgw/tlgw/actors/router"
)

// netTimeout is a net.Error that timed out (a dial or read deadline).
type netTimeout struct{}

func (netTimeout) Error() string   { return "i/o timeout" }
func (netTimeout) Timeout() bool   { return true }
func (netTimeout) Temporary() bool { return false }

// netOther is a net.Error that did not time out.
type netOther struct{}

func (netOther) Error() string   { return "broken" }
func (netOther) Timeout() bool   { return false }
func (netOther) Temporary() bool { return false }

// TestOutcome (R14.2): the verdict on a worker's part, from the error its exchange ended in
// and the status it answered.
func TestOutcome(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	for _, c := range []struct {
		name   string
		err    error
		status int
		want   router.Outcome
	}{
		{"nothing happened", nil, 0, router.OutcomeNone},
		{"200", nil, 200, router.OutcomeSuccess},
		{"the smallest status", nil, 1, router.OutcomeSuccess},
		{"404: the engine answered", nil, 404, router.OutcomeSuccess},
		{"499", nil, 499, router.OutcomeSuccess},
		{"500", nil, 500, router.Outcome5xx},
		{"503", nil, 503, router.Outcome5xx},
		{"503 before the first byte", statusError{what: "worker a", status: 503}, 0, router.Outcome5xx},
		{"tokenize answered 400, wrapped", fmt.Errorf("prefill worker p: %w", fmt.Errorf("%w: bad", statusError{what: "tokenize", status: 400})), 0, router.OutcomeSuccess},
		{"stream_first_byte_timeout", fmt.Errorf("%w: %v", errFirstByteTimeout, context.Canceled), 0, router.OutcomeTimeout},
		{"request_timeout", errRequestTimeout, 0, router.OutcomeTimeout},
		{"control_timeout", fmt.Errorf("prefill on p: %w", controlErr(timedOutCtx(), errors.New("rpc error"))), 0, router.OutcomeTimeout},
		{"stream_idle_timeout", errStreamIdle, 0, router.OutcomeTimeout},
		{"a deadline", context.DeadlineExceeded, 0, router.OutcomeTimeout},
		{"a net timeout", &net.OpError{Op: "read", Err: netTimeout{}}, 0, router.OutcomeTimeout},
		{"a net error that is no timeout", netOther{}, 0, router.OutcomeReset},
		{"connection refused", refused, 0, router.OutcomeRefused},
		{"refused, bare", syscall.ECONNREFUSED, 0, router.OutcomeRefused},
		{"a dial error", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x"}}, 0, router.OutcomeRefused},
		{"reset while reading", &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}, 0, router.OutcomeReset},
		{"EOF before the headers", io.EOF, 0, router.OutcomeReset},
		{"the stream ended before its first event", fmt.Errorf("worker a: %w", errNoFirstEvent), 0, router.OutcomeReset},
		{"a reset wins over a status", io.ErrUnexpectedEOF, 503, router.OutcomeReset},
		{"a committed answer cut", errCut, 200, router.OutcomeInterrupted},
		{"the client left", context.Canceled, 200, router.OutcomeNone},
		{"no room in the buffer budget (R20): the gateway's limit, not the worker's fault", errBufferBudget, 200, router.OutcomeNone},
	} {
		if got := outcome(c.err, c.status); got != c.want {
			t.Errorf("%s: outcome(%v, %d) = %s, want %s", c.name, c.err, c.status, got, c.want)
		}
	}
	if got := (statusError{what: "worker a", status: 503}).Error(); got != "worker a answered 503" {
		t.Errorf("statusError reads %q", got)
	}
}

func timedOutCtx() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errControlTimeout)
	return ctx
}

// TestRelayCut: a relayed answer that reached its end is no error, one the client left is the
// client's cancellation, one the buffer budget had no room for is that (R20), and one that
// ended otherwise was cut.
func TestRelayCut(t *testing.T) {
	for _, c := range []struct {
		res  relayResult
		want error
	}{
		{relayResult{ended: true, finished: true}, nil},
		{relayResult{ended: true}, errCut},
		{relayResult{}, context.Canceled},
		{relayResult{ended: true, shed: true}, errBufferBudget},
	} {
		if got := c.res.cut(); !errors.Is(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("%+v: cut %v, want %v", c.res, got, c.want)
		}
	}
}
