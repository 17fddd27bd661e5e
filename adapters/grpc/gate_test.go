package grpcapi_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/clock"
)

// idleHeartbeat opens a Heartbeat call on cc that sends its headers and never its message, as
// a peer holding a place would; the channel gets the call's end when the server ends it.
func idleHeartbeat(ctx context.Context, cc *grpc.ClientConn, token string) <-chan error {
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	end := make(chan error, 1)
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/tl.control.v1.WorkerRegistry/Heartbeat")
	if err != nil {
		end <- err
		return end
	}
	go func() { end <- cs.RecvMsg(new(controlv1.HeartbeatAck)) }()
	return end
}

// ended waits for a call's end within 5 s and returns its code.
func ended(t *testing.T, what string, end <-chan error) codes.Code {
	t.Helper()
	select {
	case err := <-end:
		return status.Code(err)
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: still open after 5 s", what)
		return codes.OK
	}
}

// open reports that the call has not ended yet.
func open(end <-chan error) bool {
	select {
	case err := <-end:
		panic("the call ended: " + err.Error())
	default:
		return true
	}
}

// untilCode polls call until it answers want, within 5 s.
func untilCode(t *testing.T, what string, want codes.Code, call func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		err := call()
		if status.Code(err) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v, want %v within 5 s", what, err, want)
		}
		<-tick.C
	}
}

// dialFrom is a client of target whose connections come from the loopback address from.
func dialFrom(t *testing.T, target string, from net.IP) *grpc.ClientConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: from}}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func beatWith(cc *grpc.ClientConn, token, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	_, err := controlv1.NewWorkerRegistryClient(cc).Heartbeat(ctx, status1(id))
	return err
}

// TestHeartbeatTakesAPlaceOnlyWithACredential (R20, issue 35's pre-auth stream flood): with
// registry tokens, a Heartbeat call without a valid token is refused Unauthenticated as its
// headers arrive, before it takes a place, however many a peer opens: the two places stay free
// for engines. A credentialed call that sends no message holds its place only until
// RecvTimeout, then is ended, and the place serves again.
func TestHeartbeatTakesAPlaceOnlyWithACredential(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	auth := grpcapi.NewAuth([]grpcapi.Token{{Secret: "tok"}}, false)
	r := newRigWith(t, grpcapi.Options{Auth: auth, MaxCalls: 2, Clock: clk}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 50 {
		for _, tok := range []string{"", "wrong"} {
			if c := ended(t, "an idle heartbeat without a valid token", idleHeartbeat(ctx, r.conn, tok)); c != codes.Unauthenticated {
				t.Fatalf("idle heartbeat %d with token %q: %v, want Unauthenticated", i, tok, c)
			}
		}
	}
	if err := beatWith(r.conn, "tok", "w1"); err != nil {
		t.Fatalf("a heartbeat after 100 unauthenticated calls: %v", err)
	}

	held := []<-chan error{idleHeartbeat(ctx, r.conn, "tok"), idleHeartbeat(ctx, r.conn, "tok")}
	untilCode(t, "a heartbeat while two credentialed calls hold both places", codes.ResourceExhausted,
		func() error { return beatWith(r.conn, "tok", "w1") })
	clk.Advance(grpcapi.DefaultRecvTimeout - time.Millisecond)
	for _, h := range held {
		open(h)
	}
	clk.Advance(time.Millisecond)
	for i, h := range held {
		if c := ended(t, "an idle heartbeat at RecvTimeout", h); c != codes.Canceled {
			t.Fatalf("idle heartbeat %d at RecvTimeout: %v, want Canceled", i, c)
		}
	}
	untilCode(t, "a heartbeat once the idle calls ended", codes.OK, func() error { return beatWith(r.conn, "tok", "w1") })
}

// TestStreamsFirstMessageDeadline (R20): a streaming call (reflection) whose first message has
// not come within RecvTimeout is ended; one whose first message came is not ended by the
// deadline (its later messages may wait: reflection is interactive).
func TestStreamsFirstMessageDeadline(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	r := newRigWith(t, grpcapi.Options{Clock: clk}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc := reflectionpb.NewServerReflectionClient(r.conn)
	silent, err := rc.ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	talking, err := rc.ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := talking.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := talking.Recv(); err != nil {
		t.Fatalf("the first answer: %v", err)
	}
	// Both streams' taps have run (the talking one answered; the silent one was opened
	// first on the same connection, and its headers went first).
	clk.Advance(grpcapi.DefaultRecvTimeout)
	if _, err := silent.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("a stream that sent nothing for RecvTimeout: %v, want Canceled", err)
	}
	if err := talking.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := talking.Recv(); err != nil {
		t.Fatalf("a stream whose first message came in time, after RecvTimeout: %v", err)
	}
}

// TestCallsPerPeer (R20): one peer address runs at most MaxCallsPerPeer calls at once; one
// more from it is ResourceExhausted, while another address is served.
func TestCallsPerPeer(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	r := newRigWith(t, grpcapi.Options{MaxCallsPerPeer: 2, Clock: clk}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := dialFrom(t, r.conn.Target(), net.IPv4(127, 0, 0, 1))
	b := dialFrom(t, r.conn.Target(), net.IPv4(127, 0, 0, 2))
	held := []<-chan error{idleHeartbeat(ctx, a, ""), idleHeartbeat(ctx, a, "")}
	untilCode(t, "a third call from one address", codes.ResourceExhausted, func() error { return beatWith(a, "", "w1") })
	if err := healthCheck(a, 5*time.Second); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a health check from the same address: %v, want ResourceExhausted", err)
	}
	if err := beatWith(b, "", "w2"); err != nil {
		t.Fatalf("a heartbeat from another address: %v", err)
	}
	if err := healthCheck(b, 5*time.Second); err != nil {
		t.Fatalf("a health check from another address: %v", err)
	}
	clk.Advance(grpcapi.DefaultRecvTimeout)
	for _, h := range held {
		ended(t, "an idle call at RecvTimeout", h)
	}
	untilCode(t, "a call from the first address once its calls ended", codes.OK, func() error { return beatWith(a, "", "w1") })
}

// TestConnectionsPerPeer (R20): the listener holds at most MaxConnectionsPerPeer connections
// from one address; one more is closed as it is accepted, another address is served, and the
// place comes back when a connection closes.
func TestConnectionsPerPeer(t *testing.T) {
	r := newRigWith(t, grpcapi.Options{MaxConnectionsPerPeer: 1}, nil)
	target := r.conn.Target()
	a := dialFrom(t, target, net.IPv4(127, 0, 0, 1))
	if err := healthCheck(a, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	extra, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}).Dial("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("a second connection from one address: read %v, want it closed", err)
	}
	if err := healthCheck(dialFrom(t, target, net.IPv4(127, 0, 0, 2)), 5*time.Second); err != nil {
		t.Fatalf("a connection from another address: %v", err)
	}
	a.Close()
	untilCode(t, "a new connection from the first address once its connection closed", codes.OK,
		func() error {
			c := dialFrom(t, target, net.IPv4(127, 0, 0, 1))
			defer c.Close()
			return healthCheck(c, time.Second)
		})
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
