package worker

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
)

// TestDeadlineFollowsHeartbeats: the worker is expired exactly at its last heartbeat + TTL on
// the injected clock, though a heartbeat sets no timer of its own (the pending one is set again
// for the rest when it fires early); a nearer deadline (a shorter TTL) takes effect at once; and
// a worker that expired while a newer heartbeat was on its way is timed again from it.
func TestDeadlineFollowsHeartbeats(t *testing.T) {
	sys := actor.NewActorSystem()
	expired := make(chan *Expired, 16)
	probe := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*Expired); ok {
			expired <- m
		}
	}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	const ttl = 6 * time.Second
	info := router.WorkerInfo{ID: "w1", Model: "smol", LastHeartbeat: clk.Now()}
	w := sys.Root.Spawn(Props(Config{Clock: clk, Router: probe, Registry: probe, TTL: ttl}, Status{Info: info, Seq: 1, TTL: ttl}))
	defer func() { _ = sys.Root.StopFuture(w).Wait() }()
	barrier := func() {
		t.Helper()
		if err := sys.Root.RequestFuture(w, &actor.Touch{}, 5*time.Second).Wait(); err != nil {
			t.Fatal(err)
		}
		if err := sys.Root.RequestFuture(probe, &actor.Touch{}, 5*time.Second).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	advance := func(d time.Duration) {
		t.Helper()
		clk.Advance(d)
		barrier()
	}
	beat := func(seq uint64, ttl time.Duration) {
		t.Helper()
		info.LastHeartbeat = clk.Now()
		sys.Root.Send(w, &Status{Info: info, Seq: seq, TTL: ttl})
		barrier()
	}
	none := func(when string) {
		t.Helper()
		select {
		case m := <-expired:
			t.Fatalf("%s: expired %+v", when, m)
		default:
		}
	}
	expect := func(seq uint64) {
		t.Helper()
		select {
		case m := <-expired:
			if m.ID != "w1" || m.Seq != seq {
				t.Fatalf("expired %+v, want seq %d", m, seq)
			}
		default:
			t.Fatalf("not expired at %v", clk.Now().Sub(start))
		}
	}
	barrier()
	advance(4 * time.Second)
	beat(2, ttl) // t = 4 s: the deadline moves to 10 s
	advance(4 * time.Second)
	none("t = 8 s, 4 s after the last heartbeat") // the 6 s timer fired and was set again
	advance(2*time.Second - time.Nanosecond)
	none("t = 10 s - 1 ns")
	advance(time.Nanosecond)
	expect(2) // t = 10 s
	if clk.Pending() != 0 {
		t.Fatalf("%d timers pending after expiry", clk.Pending())
	}

	beat(3, ttl) // a heartbeat that was on its way: live again, timed from now (t = 10 s)
	advance(ttl - time.Nanosecond)
	none("revived, 1 ns before its deadline")
	advance(time.Nanosecond)
	expect(3)

	beat(4, ttl)
	advance(time.Second)
	beat(5, time.Second) // a shorter TTL brings the deadline nearer at once
	advance(time.Second)
	expect(5)

	beat(6, time.Second)
	beat(7, 0) // a status without a TTL keeps the last one
	advance(time.Second - time.Nanosecond)
	none("1 ns before the kept TTL")
	advance(time.Nanosecond)
	expect(7)
}

// TestStopCancelsTheDeadline: a stopped worker leaves no timer behind on the clock.
func TestStopCancelsTheDeadline(t *testing.T) {
	sys := actor.NewActorSystem()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	probe := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	info := router.WorkerInfo{ID: "w1", Model: "smol", LastHeartbeat: clk.Now()}
	w := sys.Root.Spawn(Props(Config{Clock: clk, Router: probe, Registry: probe, TTL: time.Minute}, Status{Info: info, Seq: 1, TTL: time.Minute}))
	if err := sys.Root.RequestFuture(w, &actor.Touch{}, 5*time.Second).Wait(); err != nil {
		t.Fatal(err)
	}
	if n := clk.Pending(); n != 1 {
		t.Fatalf("%d timers pending while live, want 1", n)
	}
	if err := sys.Root.StopFuture(w).Wait(); err != nil {
		t.Fatal(err)
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d timers pending after the stop", n)
	}
}
