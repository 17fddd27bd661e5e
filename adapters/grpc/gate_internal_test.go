package grpcapi

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/clock"
)

// acker accepts every heartbeat.
type acker struct{}

func (acker) HeartbeatAs(context.Context, string, router.WorkerInfo, ...registry.Quota) (*registry.Ack, error) {
	return &registry.Ack{}, nil
}
func (acker) HeartbeatInterval() time.Duration { return time.Second }

// TestGateHoldsNothingAfterTheCalls (R20, nothing grows): after heartbeats answered, refused
// for their credential or for the per-peer bound, idle calls ended at RecvTimeout, health
// checks, and connections from two addresses closed, the gate's per-address table, both place
// pools and the listener's per-address connection table are empty.
func TestGateHoldsNothingAfterTheCalls(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	l := NewListener(acker{}, Options{
		Auth: NewAuth([]Token{{Secret: "tok"}}, false), Clock: clk,
		MaxCalls: 8, MaxProbeCalls: 8, MaxCallsPerPeer: 3, MaxConnectionsPerPeer: 2,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = l.Serve(lis) }()
	defer func() { l.Stop(context.Background()); <-served }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok")
	var idle []grpc.ClientStream
	var ccs []*grpc.ClientConn
	for _, from := range []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 2)} {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: from}}
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
		if err != nil {
			t.Fatal(err)
		}
		rc := controlv1.NewWorkerRegistryClient(cc)
		st := &controlv1.WorkerStatus{WorkerId: "w", Model: "m", HttpAddress: "127.0.0.1:1"}
		for range 5 {
			if _, err := rc.Heartbeat(authed, st); err != nil {
				t.Fatal(err)
			}
			if _, err := rc.Heartbeat(ctx, st); err == nil {
				t.Fatal("a heartbeat without a token was answered")
			}
			if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		for range 4 { // the fourth is over the per-peer bound
			cs, err := cc.NewStream(authed, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, heartbeatMethod)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, cs)
		}
		ccs = append(ccs, cc)
	}
	// Every idle call has taken its place or been refused before the clock moves.
	poll(t, "3 calls held per address", func() bool { return l.gate.held() == 6 })
	clk.Advance(DefaultRecvTimeout)
	for _, cs := range idle {
		if err := cs.RecvMsg(new(controlv1.HeartbeatAck)); err == nil {
			t.Fatal("an idle call was answered")
		}
	}
	poll(t, "no call held, no place taken", func() bool {
		return l.gate.held() == 0 && len(l.gate.heartbeats) == 0 && len(l.gate.probes) == 0
	})
	for _, cc := range ccs {
		cc.Close()
	}
	poll(t, "no connection held", func() bool {
		l.peers.mu.Lock()
		defer l.peers.mu.Unlock()
		return len(l.peers.conns) == 0
	})
}

// poll waits for cond within 5 s.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("not within 5 s: %s", what)
		case <-tick.C:
		}
	}
}

func (g *gate) held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, c := range g.peers {
		n += c
	}
	return n
}
