package app_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// countingListener counts the connections it accepted that are still open on the server's
// side (closed when their peer goes).
type countingListener struct {
	net.Listener
	open atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// countedKVServer serves kv on loopback and counts its open connections.
func countedKVServer(t *testing.T, kv *heldKV) (string, *countingListener) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := &countingListener{Listener: inner}
	gs := grpc.NewServer()
	kvv1.RegisterKvEventsServer(gs, kv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return inner.Addr().String(), lis
}

// TestMovedEngineConnectionCloses: a live engine whose heartbeat moves its grpc_address (an
// engine restarted at a new address within its TTL, so it is never evicted) leaves no
// connection to its old address behind. Before, the gateway's per-address gRPC connections
// were closed only on eviction: every move of a live engine kept one open for good.
func TestMovedEngineConnectionCloses(t *testing.T) {
	oldKV, newKV := &heldKV{}, &heldKV{}
	oldAddr, oldLis := countedKVServer(t, oldKV)
	newAddr, _ := countedKVServer(t, newKV)
	a := startGateway(t, config.PolicyPrecisePrefix)
	conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := controlv1.NewWorkerRegistryClient(conn)
	beat := func(grpcAddr string) {
		t.Helper()
		st := &controlv1.WorkerStatus{WorkerId: "w1", Model: "smol", Role: controlv1.Role_ROLE_UNIFIED,
			HttpAddress: "127.0.0.1:1", GrpcAddress: grpcAddr, KvEvents: true}
		if _, err := reg.Heartbeat(context.Background(), st); err != nil {
			t.Fatal(err)
		}
	}
	beat(oldAddr)
	gwtest.Eventually(t, "subscribed at the old address", func() bool { return oldKV.subs.Load() > 0 && oldLis.open.Load() > 0 })
	beat(newAddr)
	gwtest.Eventually(t, "subscribed at the new address", func() bool { return newKV.subs.Load() > 0 })
	gwtest.Eventually(t, "no connection left to the old address", func() bool { return oldLis.open.Load() == 0 })
}
