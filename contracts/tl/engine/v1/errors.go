package enginev1

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo details EngineControl's errors carry.
const ErrorDomain = "tl.engine.v1"

// ReasonDecodeTarget is the ErrorInfo reason of a Prefill that failed because of its
// decode_target: unreachable, failed the push (Unavailable), or without room
// (ResourceExhausted). The decode worker failed, not the prefill worker, which holds nothing
// for the request. A status the client makes up (the prefill worker itself unreachable) has
// no details, so the two never mix.
const ReasonDecodeTarget = "DECODE_TARGET"

// DecodeTargetError is the status a prefill worker answers when its decode_target failed.
func DecodeTargetError(code codes.Code, msg string) error {
	st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: ReasonDecodeTarget, Domain: ErrorDomain})
	if err != nil {
		return status.Error(code, msg) // only a detail that cannot be marshalled fails; this one can
	}
	return st.Err()
}

// IsDecodeTarget reports whether err is a status a prefill worker answered because its
// decode_target failed (an ErrorInfo of ErrorDomain with ReasonDecodeTarget).
func IsDecodeTarget(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return false
	}
	st := se.GRPCStatus()
	if c := st.Code(); c != codes.Unavailable && c != codes.ResourceExhausted {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == ReasonDecodeTarget {
			return true
		}
	}
	return false
}
