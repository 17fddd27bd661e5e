package enginev1

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestIsDecodeTarget: only a status with the DECODE_TARGET ErrorInfo of this domain, and a code
// the contract names for it (Unavailable, ResourceExhausted), blames the decode target; the
// status a client makes up when the prefill worker itself is unreachable has no detail.
func TestIsDecodeTarget(t *testing.T) {
	other, err := status.New(codes.Unavailable, "x").WithDetails(&errdetails.ErrorInfo{Reason: ReasonDecodeTarget, Domain: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	internal, err := status.New(codes.Internal, "x").WithDetails(&errdetails.ErrorInfo{Reason: ReasonDecodeTarget, Domain: ErrorDomain})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable, with the detail", DecodeTargetError(codes.Unavailable, "decode target d: refused"), true},
		{"no room, with the detail", DecodeTargetError(codes.ResourceExhausted, "decode target d: full"), true},
		{"wrapped", fmt.Errorf("prefill on p: %w", DecodeTargetError(codes.Unavailable, "x")), true},
		{"the prefill worker unreachable (no detail)", status.Error(codes.Unavailable, "connection refused"), false},
		{"another domain's reason", other.Err(), false},
		{"a code the contract does not name for it", internal.Err(), false},
		{"not a status", errors.New("decode target d: refused"), false},
		{"nil", nil, false},
	} {
		if got := IsDecodeTarget(c.err); got != c.want {
			t.Errorf("%s: IsDecodeTarget = %v, want %v", c.name, got, c.want)
		}
	}
	if st := status.Convert(DecodeTargetError(codes.ResourceExhausted, "m")); st.Code() != codes.ResourceExhausted || st.Message() != "m" {
		t.Errorf("DecodeTargetError kept %v %q, want ResourceExhausted \"m\"", st.Code(), st.Message())
	}
}
