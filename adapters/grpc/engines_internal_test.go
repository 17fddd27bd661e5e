package grpcapi

import (
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/tlgw/tlgw/actors/router"
)

// TestForgetClosesEvictedConnections (R13.4): Forget closes and drops the connections to an
// evicted engine's addresses and leaves the others; a later call dials afresh.
func TestForgetClosesEvictedConnections(t *testing.T) {
	e := NewEngines()
	defer e.Close()
	gone, kept := "127.0.0.1:1", "127.0.0.1:2"
	c1, err := e.conn(gone)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.conn(kept); err != nil {
		t.Fatal(err)
	}
	if again, _ := e.conn(gone); again != c1 || e.Len() != 2 {
		t.Fatalf("the cache: same conn %v, %d conns", again == c1, e.Len())
	}
	e.Forget(gone, "", "127.0.0.1:3")
	if e.Len() != 1 || c1.GetState() != connectivity.Shutdown {
		t.Fatalf("after Forget: %d conns, evicted conn %v", e.Len(), c1.GetState())
	}
	if fresh, _ := e.conn(gone); fresh == c1 || e.Len() != 2 {
		t.Fatal("a later call to the address did not dial afresh")
	}
}

// TestConnectionBoundsDefaults: a zero Options bounds the handshake at 10 s and idleness at
// 5 min; values given are kept, and a negative one is the default.
func TestConnectionBoundsDefaults(t *testing.T) {
	if hs, idle := (Options{}).bounds(); hs != 10*time.Second || idle != 5*time.Minute {
		t.Fatalf("defaults: handshake %v, idle %v", hs, idle)
	}
	if hs, idle := (Options{HandshakeTimeout: time.Second, MaxConnectionIdle: time.Minute}).bounds(); hs != time.Second || idle != time.Minute {
		t.Fatalf("set: handshake %v, idle %v", hs, idle)
	}
	if hs, idle := (Options{HandshakeTimeout: -1, MaxConnectionIdle: -1}).bounds(); hs != DefaultHandshakeTimeout || idle != DefaultMaxConnectionIdle {
		t.Fatalf("negative: handshake %v, idle %v", hs, idle)
	}
}

// TestMovedClosesLeftAddresses (R19): a live engine that moves its gRPC or KV address loses
// the connection to the address it left; an address it still uses, in either role, stays.
func TestMovedClosesLeftAddresses(t *testing.T) {
	e := NewEngines()
	defer e.Close()
	a, b, c := "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	ca, _ := e.conn(a)
	cb, _ := e.conn(b)
	if e.Len() != 2 {
		t.Fatalf("%d conns", e.Len())
	}
	// The KV address moves to the gRPC one: b is left, a stays.
	e.Moved(router.WorkerInfo{GRPCAddress: a, KVAddress: b}, router.WorkerInfo{GRPCAddress: a, KVAddress: a})
	if e.Len() != 1 || cb.GetState() != connectivity.Shutdown || ca.GetState() == connectivity.Shutdown {
		t.Fatalf("after the KV move: %d conns, b %v, a %v", e.Len(), cb.GetState(), ca.GetState())
	}
	// Both move: a is left.
	e.Moved(router.WorkerInfo{GRPCAddress: a, KVAddress: a}, router.WorkerInfo{GRPCAddress: c, KVAddress: c})
	if e.Len() != 0 || ca.GetState() != connectivity.Shutdown {
		t.Fatalf("after the move: %d conns, a %v", e.Len(), ca.GetState())
	}
}
