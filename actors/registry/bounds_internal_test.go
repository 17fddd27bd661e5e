package registry

import (
	"fmt"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
)

// TestEntriesFollowLiveWorkers (R19): the registry's entries are its registered workers. After
// n workers registered, heartbeated and went (evicted at their deadline, or their actor stopped
// elsewhere) it holds none; only the drained model set, an operator's decision, is kept.
func TestEntriesFollowLiveWorkers(t *testing.T) {
	f := newFixture(t, nil)
	const n = 40
	for round := range 2 {
		for i := range n {
			id := fmt.Sprintf("w%d-%d", round, i)
			f.beat(id, fmt.Sprintf("m%d", i%4), "", 0)
			f.state()
			f.beat(id, fmt.Sprintf("m%d", i%4), "", 0)
			f.state()
		}
		if round == 0 {
			f.drainModel("m1", true)
		}
		f.settle()
		if len(f.st.entries) != n {
			t.Fatalf("round %d: %d entries for %d live workers", round, len(f.st.entries), n)
		}
		if round == 1 {
			// Half stop elsewhere (their supervisor gave up), the rest miss their deadline.
			for i := range n / 2 {
				pid := f.pids[fmt.Sprintf("w%d-%d", round, i)]
				if err := f.sys.Root.StopFuture(pid).Wait(); err != nil {
					t.Fatal(err)
				}
				f.evict()
			}
		}
		f.clk.Advance(ttl)
		for range n - n/2*round {
			f.evict()
		}
		for id := range f.pids {
			delete(f.pids, id)
		}
		f.settle()
		if len(f.st.entries) != 0 {
			t.Fatalf("round %d: %d entries left after every worker went", round, len(f.st.entries))
		}
		drainStates(f)
	}
	if len(f.st.drained) != 1 || !f.st.drained["m1"] {
		t.Fatalf("drained models %v, want the one drained", f.st.drained)
	}
}

// drainStates empties the worker states reported so far.
func drainStates(f *fixture) {
	for {
		select {
		case <-f.states:
		default:
			return
		}
	}
}

// drainModel drains or undrains model through the registry and waits for the answer.
func (f *fixture) drainModel(model string, drained bool) {
	f.t.Helper()
	res, err := f.sys.Root.RequestFuture(f.reg, &DrainModel{Model: model, Drained: drained}, 5*time.Second).Result()
	if err != nil {
		f.t.Fatal(err)
	}
	if e, ok := res.(error); ok {
		f.t.Fatal(e)
	}
}

// TestMovedAddressesAreTold: a heartbeat that changes a live worker's gRPC or KV address tells
// OnMoved the info it replaced (the gateway closes the connections to the addresses left);
// an unchanged heartbeat, or a change of its HTTP address or model only, tells nothing.
func TestMovedAddressesAreTold(t *testing.T) {
	type move struct{ old, cur router.WorkerInfo }
	moves := make(chan move, 16)
	f := newFixture(t, func(c *Config) {
		c.OnMoved = func(old, cur router.WorkerInfo) { moves <- move{old, cur} }
	})
	beat := func(info router.WorkerInfo) {
		t.Helper()
		reply := make(chan Ack, 1)
		f.sys.Root.Send(f.reg, &Heartbeat{Info: info, Reply: reply})
		if a := <-reply; a.Err != nil {
			t.Fatal(a.Err)
		}
		f.state()
	}
	none := func(what string) {
		t.Helper()
		select {
		case m := <-moves:
			t.Fatalf("%s: told of a move %+v", what, m)
		default:
		}
	}
	base := router.WorkerInfo{ID: "w1", Model: "smol", HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2", KVAddress: "127.0.0.1:3"}
	beat(base)
	beat(base)
	none("a registration and a heartbeat")
	other := base
	other.HTTPAddress, other.Model = "127.0.0.1:9", "big"
	beat(other)
	none("an HTTP address and model change")
	for _, change := range []func(*router.WorkerInfo){
		func(w *router.WorkerInfo) { w.GRPCAddress = "127.0.0.1:8" },
		func(w *router.WorkerInfo) { w.KVAddress = "127.0.0.1:8" },
	} {
		cur := other
		change(&cur)
		beat(cur)
		select {
		case m := <-moves:
			if m.old.GRPCAddress != other.GRPCAddress || m.old.KVAddress != other.KVAddress ||
				m.cur.GRPCAddress != cur.GRPCAddress || m.cur.KVAddress != cur.KVAddress {
				t.Fatalf("told %+v", m)
			}
		default:
			t.Fatalf("not told of the move to %+v", cur)
		}
		beat(other)
		if m := <-moves; m.cur.GRPCAddress != other.GRPCAddress || m.cur.KVAddress != other.KVAddress {
			t.Fatalf("the move back: told %+v", m)
		}
	}
}
