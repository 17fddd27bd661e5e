package gateway_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestInstallRoutesSetsEpochForAcks: a table from the cluster store is installed at the
// store's revision, which GET shows and heartbeat acks carry (R16); a later, lower revision
// (a rebuilt etcd) is taken as given.
func TestInstallRoutesSetsEpochForAcks(t *testing.T) {
	h := gwtest.New(t)
	h.Beat(gwtest.Worker("w1", "smol", 0))
	h.GW.InstallRoutes(57, config.NormalizeRoutes([]config.Route{{Model: "chat", Backends: []config.Backend{{Model: "smol", Weight: 1}}}}))
	h.Eventually("epoch 57 in acks", func() bool { return h.Beat(gwtest.Worker("w1", "smol", 0)).Epoch == 57 })
	rt, err := h.GW.Routes()
	if err != nil || rt.Epoch != 57 || len(rt.Routes) != 1 || rt.Routes[0].Model != "chat" {
		t.Fatalf("routes %+v %v", rt, err)
	}
	if got := h.MustPick("chat"); got != "w1" {
		t.Fatalf("chat went to %s", got)
	}
	h.GW.InstallRoutes(3, nil)
	h.Eventually("epoch 3 in acks", func() bool { return h.Beat(gwtest.Worker("w1", "smol", 0)).Epoch == 3 })
	if _, err := h.Pick(router.Pick{Model: "chat", RequestID: "x"}); err == nil {
		t.Fatal("a removed route still resolves")
	}
}

// TestSyncDrainsFollowsTheSet: drains from the store drain exactly the listed models, also
// for workers that register later and for models no worker serves yet; leaving the set
// undrains.
func TestSyncDrainsFollowsTheSet(t *testing.T) {
	h := gwtest.New(t)
	h.Beat(gwtest.Worker("a1", "alpha", 0))
	h.Beat(gwtest.Worker("b1", "beta", 0))
	h.GW.SyncDrains([]string{"alpha", "gamma"})
	drained := func(id string) bool { v, ok := h.View(id); return ok && v.Info.AdminDrained && !v.Routable }
	h.Eventually("a1 drained", func() bool { return drained("a1") })
	if v, _ := h.View("b1"); v.Info.AdminDrained || !v.Routable {
		t.Fatalf("b1 %+v", v)
	}
	if ack := h.Beat(gwtest.Worker("g1", "gamma", 0)); !ack.Drain {
		t.Fatal("a gamma worker registering after the drain is not told to drain")
	}
	h.GW.SyncDrains([]string{"gamma"})
	h.Eventually("a1 undrained", func() bool { v, ok := h.View("a1"); return ok && !v.Info.AdminDrained && v.Routable })
	if ack := h.Beat(gwtest.Worker("a1", "alpha", 0)); ack.Drain {
		t.Fatal("a1's ack still says drain")
	}
}

// TestAffinityOwnerSameOnEveryReplica: three replicas with the same route table and the same
// live workers, registered in different orders (and one after a worker came and went), pick
// the same affinity owner for every prefix (R16: the ring hashes stable worker ids only).
func TestAffinityOwnerSameOnEveryReplica(t *testing.T) {
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = fmt.Sprintf("engine-%02d", i)
	}
	routes := config.NormalizeRoutes([]config.Route{{Model: "chat", Backends: []config.Backend{{Model: "smol", Weight: 1}}}})
	var replicas []*gwtest.Harness
	for r := range 3 {
		h := gwtest.New(t, gwtest.WithPolicy("affinity"), gwtest.WithRoutes(routes...))
		order := append([]string(nil), ids...)
		rand.New(rand.NewPCG(uint64(r), 7)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		if r == 2 {
			h.Beat(gwtest.Worker("gone", "smol", 0)) // joined and left this replica only
		}
		for _, id := range order {
			h.Beat(gwtest.Worker(id, "smol", 0))
		}
		if r == 2 {
			h.Clock.Advance(h.GW.HeartbeatInterval())
			for _, id := range order {
				h.Beat(gwtest.Worker(id, "smol", 0))
			}
			h.Clock.Advance(time.Duration(h.GW.MissLimit()-1) * h.GW.HeartbeatInterval())
			h.WaitIDs(ids...)
		}
		replicas = append(replicas, h)
	}
	owners := map[string]int{}
	for i := range 500 {
		hash := prefixHash(t, fmt.Sprintf("system prompt %d", i), "hello")
		var first string
		for r, h := range replicas {
			res, err := h.GW.Pick(&router.Pick{Model: "chat", RequestID: fmt.Sprint(r, "-", i), PrefixHash: hash})
			if err != nil {
				t.Fatal(err)
			}
			h.GW.Release(res)
			h.InFlight(res.WorkerID, 0) // idle again: the bounded-load cap never deflects here
			if r == 0 {
				first = res.WorkerID
				owners[first]++
			} else if res.WorkerID != first {
				t.Fatalf("prefix %d: replica 0 picked %s, replica %d picked %s", i, first, r, res.WorkerID)
			}
		}
	}
	if len(owners) < len(ids)/2 {
		t.Fatalf("500 prefixes used only %d owners: %v", len(owners), owners)
	}
}
