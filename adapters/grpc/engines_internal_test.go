package grpcapi

import (
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"
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
