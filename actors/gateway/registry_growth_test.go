package gateway_test

import (
	"runtime"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestSpawnsLeaveNoRegistryGrowth (R19): actors that come and go (a request actor per
// request) leave the process registry as it was. protoactor's registry is 1,024 buckets of 32
// shard maps, and a Go map keeps the slot group of its first insert after its entries are
// deleted: every new actor id landed in one of 32,768 shards, so the heap grew by a group
// (~280 bytes) per shard first touched — 0.56 objects a request over the first 35,000, up to
// ~9 MiB. With the gateway's registry of fewer buckets the shards are all touched after a
// warm-up, and further actors add nothing.
func TestSpawnsLeaveNoRegistryGrowth(t *testing.T) {
	h := gwtest.New(t)
	sys := h.GW.System
	props := actor.PropsFromFunc(func(actor.Context) {})
	live := func() int {
		n := 0
		for _, m := range sys.ProcessRegistry.LocalPIDs.LocalPIDs {
			n += m.Count()
		}
		return n
	}
	base := live()
	churn := func(n int) {
		for range n {
			sys.Root.Stop(sys.Root.Spawn(props))
		}
		gwtest.Eventually(t, "the actors stopped", func() bool { return live() == base })
	}
	objects := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapObjects
	}
	churn(20000) // the warm-up: the shards the actors' ids land in get their first group
	before := objects()
	const n = 50000
	churn(n)
	after := objects()
	grown := int64(after) - int64(before)
	t.Logf("%d actors came and went: %+d heap objects", n, grown)
	if grown > 1000 {
		t.Fatalf("%d actors came and went: the heap holds %d more objects (%.3f an actor)", n, grown, float64(grown)/n)
	}
}
