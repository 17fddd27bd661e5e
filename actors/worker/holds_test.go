package worker

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// TestHolds: the in-flight count is the number of tickets held; a requester is watched once,
// from its first hold; a ticket released twice, an unknown ticket or one released after its
// requester stopped changes nothing; a stopped requester's holds all end.
func TestHolds(t *testing.T) {
	var h holds
	a, b := actor.NewPID("local", "req/a"), actor.NewPID("local", "req/b")
	if !h.add(1, a) || h.add(2, a) || !h.add(3, b) || h.add(4, nil) {
		t.Fatal("a requester must be watched exactly once, from its first hold; nil never")
	}
	if h.add(1, b) {
		t.Fatal("a ticket added twice")
	}
	if h.count() != 4 {
		t.Fatalf("count %d, want 4", h.count())
	}
	if !h.release(2) || h.release(2) || h.release(99) {
		t.Fatal("release: a held ticket once, nothing else")
	}
	if h.count() != 3 {
		t.Fatalf("count %d after one release", h.count())
	}
	if n := h.stopped(a); n != 1 || h.count() != 2 {
		t.Fatalf("a stopped: ended %d, count %d", n, h.count())
	}
	if h.release(1) || h.stopped(a) != 0 {
		t.Fatal("a's ticket after a stopped")
	}
	if !h.add(5, a) {
		t.Fatal("a requester seen again after it stopped is watched again")
	}
	if !h.release(4) || !h.release(3) || !h.release(5) || h.count() != 0 {
		t.Fatalf("count %d at the end", h.count())
	}
	if n := h.stopped(b); n != 0 {
		t.Fatalf("b had released everything: ended %d", n)
	}
}
