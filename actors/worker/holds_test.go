package worker

import (
	"strconv"
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

// TestHoldsForgetReleasedRequesters: a requester whose every hold was released leaves no entry
// behind, even though no Terminated ever comes for it (a finished request unwatches its workers
// itself). Before, byReq kept one empty entry per request served: the gateway's heap grew by
// every request.
func TestHoldsForgetReleasedRequesters(t *testing.T) {
	var h holds
	const n = 1000
	for i := range n {
		r := actor.NewPID("local", "req/"+strconv.Itoa(i))
		if !h.add(uint64(2*i), r) || h.add(uint64(2*i+1), r) {
			t.Fatalf("request %d: watched on its first hold only", i)
		}
		if !h.release(uint64(2*i)) || !h.release(uint64(2*i+1)) {
			t.Fatalf("request %d: release", i)
		}
	}
	if h.count() != 0 || len(h.byTicket) != 0 || len(h.byReq) != 0 {
		t.Fatalf("after %d requests released everything: count %d, byTicket %d, byReq %d entries",
			n, h.count(), len(h.byTicket), len(h.byReq))
	}
	// A requester that holds again after releasing everything is watched again.
	a := actor.NewPID("local", "req/again")
	if !h.add(1, a) || !h.release(1) || !h.add(2, a) {
		t.Fatal("a requester holding again after its last release must be watched again")
	}
	if h.stopped(a) != 1 || len(h.byReq) != 0 || h.count() != 0 {
		t.Fatal("stopped must end the hold and forget the requester")
	}
}
