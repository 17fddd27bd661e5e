package cluster

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/rollout"
)

// applied records what a store applied, for the test to wait on.
type applied struct {
	mu           sync.Mutex
	routeRev     uint64
	routes       []config.Route
	static       uint64
	ws           []config.StaticWorker
	poolRev      uint64
	pools        []config.EnginePool
	drains       []string
	replicas     int
	pushes       int // calls into the applier, of every kind
	drainsPushed int
	canary       [32]byte
	canaries     int // CanaryKey calls
	rolloutVer   uint64
	decider      string
	states       map[string]rollout.Stored
	changed      chan struct{}
}

func newApplied() *applied { return &applied{changed: make(chan struct{}, 1)} }

func (a *applied) poke() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

func (a *applied) applier() Applier {
	return Applier{
		Routes: func(rev uint64, r []config.Route) {
			a.mu.Lock()
			a.routeRev, a.routes = rev, r
			a.pushes++
			a.mu.Unlock()
			a.poke()
		},
		Static: func(rev uint64, ws []config.StaticWorker) {
			a.mu.Lock()
			a.static, a.ws = rev, ws
			a.pushes++
			a.mu.Unlock()
			a.poke()
		},
		Pools: func(rev uint64, ps []config.EnginePool) {
			a.mu.Lock()
			a.poolRev, a.pools = rev, ps
			a.pushes++
			a.mu.Unlock()
			a.poke()
		},
		Drains: func(m []string) {
			a.mu.Lock()
			a.drains = m
			a.pushes++
			a.drainsPushed++
			a.mu.Unlock()
			a.poke()
		},
		Replicas: func(n int) {
			a.mu.Lock()
			a.replicas = n
			a.pushes++
			a.mu.Unlock()
			a.poke()
		},
		CanaryKey: func(k [32]byte) {
			a.mu.Lock()
			a.canary = k
			a.canaries++
			a.pushes++
			a.mu.Unlock()
			a.poke()
		},
		Rollouts: func(v uint64, decider string, states map[string]rollout.Stored) {
			a.mu.Lock()
			a.rolloutVer, a.decider, a.states = v, decider, states
			a.pushes++
			a.mu.Unlock()
			a.poke()
		},
	}
}

// keyOf is the canary key a test replica brings: its id's bytes.
func keyOf(id string) [32]byte {
	var k [32]byte
	copy(k[:], id)
	return k
}

// await polls cond (under the lock) until it holds or d passes.
func (a *applied) await(t *testing.T, d time.Duration, what string, cond func(a *applied) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		a.mu.Lock()
		ok := cond(a)
		a.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-a.changed:
		case <-tick.C:
		case <-deadline.C:
			a.mu.Lock()
			defer a.mu.Unlock()
			t.Fatalf("%s: not within %v (routes rev %d %v, drains %v, replicas %d)", what, d, a.routeRev, a.routes, a.drains, a.replicas)
		}
	}
}

func route(model string) config.Route { return config.Route{Model: model, Aliases: []string{}} }

type replica struct {
	*Store
	got *applied
	reg *prometheus.Registry
}

func startReplica(t *testing.T, endpoint, id string, seed []config.Route) replica {
	t.Helper()
	return startReplicaWith(t, config.Cluster{Enabled: true, EtcdEndpoints: []string{endpoint}, Prefix: "/test/", LeaseTTL: 2 * time.Second}, id, seed)
}

func startReplicaWith(t *testing.T, cc config.Cluster, id string, seed []config.Route) replica {
	t.Helper()
	return startReplicaOp(t, cc, id, seed, 500*time.Millisecond)
}

// startReplicaOp is startReplicaWith with the bound on each etcd call.
func startReplicaOp(t *testing.T, cc config.Cluster, id string, seed []config.Route, op time.Duration) replica {
	t.Helper()
	got := newApplied()
	reg := prometheus.NewRegistry()
	s, err := Start(Config{
		Cluster:    cc,
		Self:       Replica{ID: id, HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2", StartedAt: time.Unix(1700000000, 0).UTC()},
		SeedRoutes: config.NormalizeRoutes(seed), Apply: got.applier(), Registerer: reg, CanaryKey: keyOf(id),
		OpTimeout: op, ProbeInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return replica{Store: s, got: got, reg: reg}
}

func rawClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func routeModels(rs []config.Route) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Model)
	}
	return out
}

// TestFirstReplicaSeedsLaterOnesFollow: the first replica stores its configured tables; a
// later replica with other configured routes takes the stored ones, at the same ETag.
func TestFirstReplicaSeedsLaterOnesFollow(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", []config.Route{route("alpha")})
	a.got.await(t, 5*time.Second, "a applies its seed", func(x *applied) bool { return x.routeRev > 0 })
	b := startReplica(t, etcd.Endpoint(), "b", []config.Route{route("beta")})
	b.got.await(t, 5*time.Second, "b applies the stored table", func(x *applied) bool { return x.routeRev > 0 })
	a.got.mu.Lock()
	b.got.mu.Lock()
	defer a.got.mu.Unlock()
	defer b.got.mu.Unlock()
	if a.got.routeRev != b.got.routeRev || !slices.Equal(routeModels(b.got.routes), []string{"alpha"}) {
		t.Fatalf("a at %d %v, b at %d %v", a.got.routeRev, routeModels(a.got.routes), b.got.routeRev, routeModels(b.got.routes))
	}
	if a.got.static == 0 || a.got.static != b.got.static {
		t.Fatalf("static worker table revisions %d and %d", a.got.static, b.got.static)
	}
}

// TestPutIsCompareAndSwapAndEveryReplicaApplies: a PUT on one replica is applied on the other
// within 1 s at the same ETag; a stale If-Match is ErrEtagMismatch and changes nothing.
func TestPutIsCompareAndSwapAndEveryReplicaApplies(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", []config.Route{route("alpha")})
	b := startReplica(t, etcd.Endpoint(), "b", nil)
	b.got.await(t, 5*time.Second, "b up", func(x *applied) bool { return x.routeRev > 0 })
	a.got.await(t, 5*time.Second, "a up", func(x *applied) bool { return x.routeRev > 0 })
	awaitUp(t, a.Store)
	a.got.mu.Lock()
	etag := a.got.routeRev
	a.got.mu.Unlock()
	next, err := a.PutRoutes(etag, config.NormalizeRoutes([]config.Route{route("gamma")}))
	if err != nil || next <= etag {
		t.Fatalf("put: %d %v", next, err)
	}
	b.got.await(t, time.Second, "b applies the PUT within 1 s", func(x *applied) bool {
		return x.routeRev == next && slices.Equal(routeModels(x.routes), []string{"gamma"})
	})
	if _, err := b.PutRoutes(etag, nil); !errors.Is(err, errs.ErrEtagMismatch) || !strings.Contains(err.Error(), fmt.Sprintf("at revision %d,", next)) {
		t.Fatalf("stale put: %v, want etag mismatch naming revision %d", err, next)
	}
	b.got.mu.Lock()
	rev := b.got.routeRev
	b.got.mu.Unlock()
	if rev != next {
		t.Fatalf("a refused put moved the table to %d", rev)
	}
}

// TestConcurrentPutsExactlyOneWins: replicas PUT with the same If-Match at once; exactly one
// wins, the others get ErrEtagMismatch, and all end on the winner's table.
func TestConcurrentPutsExactlyOneWins(t *testing.T) {
	etcd := etcdtest.Start(t)
	var rs []replica
	for i := range 3 {
		rs = append(rs, startReplica(t, etcd.Endpoint(), fmt.Sprintf("r%d", i), []config.Route{route("base")}))
	}
	for _, r := range rs {
		r.got.await(t, 5*time.Second, "up", func(x *applied) bool { return x.routeRev > 0 })
		awaitUp(t, r.Store)
	}
	for round := range 10 {
		rs[0].got.mu.Lock()
		etag := rs[0].got.routeRev
		rs[0].got.mu.Unlock()
		var wg sync.WaitGroup
		res := make([]error, len(rs))
		revs := make([]uint64, len(rs))
		for i, r := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				revs[i], res[i] = r.PutRoutes(etag, config.NormalizeRoutes([]config.Route{route(fmt.Sprintf("m%d-%d", round, i))}))
			}()
		}
		wg.Wait()
		winner, wins := -1, 0
		for i, err := range res {
			switch {
			case err == nil:
				winner, wins = i, wins+1
			case !errors.Is(err, errs.ErrEtagMismatch):
				t.Fatalf("round %d replica %d: %v", round, i, err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d winners (%v)", round, wins, res)
		}
		want := fmt.Sprintf("m%d-%d", round, winner)
		for _, r := range rs {
			r.got.await(t, time.Second, "converge on the winner", func(x *applied) bool {
				return x.routeRev == revs[winner] && slices.Equal(routeModels(x.routes), []string{want})
			})
		}
	}
}

func awaitUp(t *testing.T, s *Store) {
	t.Helper()
	awaitCond(t, 5*time.Second, "store up", s.Up)
}

func awaitCond(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		<-tick.C
	}
}

// TestDrainsFollowEveryReplica: a drain on one replica is applied on the other; an undrain
// lifts it; model ids with "/" stay inside drained/.
func TestDrainsFollowEveryReplica(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", nil)
	b := startReplica(t, etcd.Endpoint(), "b", nil)
	awaitUp(t, a.Store)
	awaitUp(t, b.Store)
	for _, m := range []string{"llama", "org/model:8b"} {
		if err := a.SetDrained(m, true); err != nil {
			t.Fatal(err)
		}
	}
	b.got.await(t, time.Second, "b drains both", func(x *applied) bool { return slices.Equal(x.drains, []string{"llama", "org/model:8b"}) })
	if err := b.SetDrained("llama", false); err != nil {
		t.Fatal(err)
	}
	a.got.await(t, time.Second, "a undrains", func(x *applied) bool { return slices.Equal(x.drains, []string{"org/model:8b"}) })
	cli := rawClient(t, etcd.Endpoint())
	resp, err := cli.Get(context.Background(), "/test/drained/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != "/test/drained/org%2Fmodel:8b" {
		t.Fatalf("drained keys %v %v", resp, err)
	}
	// A third replica starting now takes the set from its first read.
	c := startReplica(t, etcd.Endpoint(), "c", nil)
	c.got.await(t, 5*time.Second, "c reads the drains", func(x *applied) bool { return slices.Equal(x.drains, []string{"org/model:8b"}) })
	if err := a.SetDrained("", true); !errors.Is(err, errs.ErrModelNotFound) {
		t.Fatalf("empty model: %v", err)
	}
}

// TestReplicasLeaseMembership: replicas list each other; a closed replica leaves at once, and
// one whose lease stops being renewed leaves within the TTL.
func TestReplicasLeaseMembership(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", nil)
	b := startReplica(t, etcd.Endpoint(), "b", nil)
	a.got.await(t, 5*time.Second, "a sees two", func(x *applied) bool { return x.replicas == 2 })
	list := a.Replicas()
	if len(list) != 2 || list[0].ID != "a" || !list[0].Self || list[1].ID != "b" || list[1].Self || list[1].HTTPAddress != "127.0.0.1:1" {
		t.Fatalf("replicas %+v", list)
	}
	if v := testutil.ToFloat64(metricGauge(t, a.reg, "tlgw_cluster_replicas")); v != 2 {
		t.Fatalf("tlgw_cluster_replicas %v", v)
	}
	b.Close()
	a.got.await(t, time.Second, "a sees b leave", func(x *applied) bool { return x.replicas == 1 })

	// A replica cut off from etcd stops renewing: the others drop it within the TTL (2 s).
	p := etcdtest.NewProxy(t, etcd.Endpoint())
	c := startReplica(t, p.Addr(), "c", nil)
	a.got.await(t, 5*time.Second, "a sees c", func(x *applied) bool { return x.replicas == 2 })
	p.Cut()
	start := time.Now()
	a.got.await(t, 5*time.Second, "a drops c", func(x *applied) bool { return x.replicas == 1 })
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("c left after %v, lease TTL 2s", d)
	}
	awaitCond(t, 5*time.Second, "c down", func() bool { return !c.Up() })
	p.Restore()
	a.got.await(t, 10*time.Second, "c back", func(x *applied) bool { return x.replicas == 2 })
}

func metricGauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gathered{reg: reg, name: name}
}

// gathered exposes one gathered gauge as a collector for testutil.ToFloat64.
type gathered struct {
	reg  *prometheus.Registry
	name string
}

func (g gathered) Describe(chan<- *prometheus.Desc) {}
func (g gathered) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == g.name {
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.GaugeValue, mf.Metric[0].GetGauge().GetValue())
		}
	}
}

// TestOutageServesLastStateAndCatchesUp: a replica cut off from etcd keeps its last state,
// refuses writes with ErrUnavailable and reports down; changes made meanwhile by another
// replica are all applied when it is back (no update lost).
func TestOutageServesLastStateAndCatchesUp(t *testing.T) {
	etcd := etcdtest.Start(t)
	p := etcdtest.NewProxy(t, etcd.Endpoint())
	a := startReplica(t, etcd.Endpoint(), "a", []config.Route{route("alpha")})
	b := startReplica(t, p.Addr(), "b", nil)
	awaitUp(t, a.Store)
	awaitUp(t, b.Store)
	b.got.await(t, 5*time.Second, "b has the table", func(x *applied) bool { return x.routeRev > 0 })
	if err := a.SetDrained("old", true); err != nil {
		t.Fatal(err)
	}
	b.got.await(t, time.Second, "b drains old", func(x *applied) bool { return slices.Equal(x.drains, []string{"old"}) })
	if v := testutil.ToFloat64(metricGauge(t, b.reg, "tlgw_config_store_up")); v != 1 {
		t.Fatalf("up %v", v)
	}
	p.Cut()
	awaitCond(t, 5*time.Second, "b notices", func() bool { return !b.Up() })
	if v := testutil.ToFloat64(metricGauge(t, b.reg, "tlgw_config_store_up")); v != 0 {
		t.Fatalf("up %v while cut off", v)
	}
	b.got.mu.Lock()
	old := b.got.routeRev
	b.got.mu.Unlock()
	if _, err := b.PutRoutes(old, nil); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("put while cut off: %v", err)
	}
	if err := b.SetDrained("m", true); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("drain while cut off: %v", err)
	}
	// Meanwhile a changes the table twice and drains a model.
	rev1, err := a.PutRoutes(old, config.NormalizeRoutes([]config.Route{route("one")}))
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := a.PutRoutes(rev1, config.NormalizeRoutes([]config.Route{route("two")}))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetDrained("m", true); err != nil {
		t.Fatal(err)
	}
	if err := a.SetDrained("old", false); err != nil { // undrained while b is away
		t.Fatal(err)
	}
	b.got.mu.Lock()
	still := b.got.routeRev
	b.got.mu.Unlock()
	if still != old {
		t.Fatalf("b moved to %d while cut off", still)
	}
	p.Restore()
	b.got.await(t, 10*time.Second, "b catches up", func(x *applied) bool {
		return x.routeRev == rev2 && slices.Equal(routeModels(x.routes), []string{"two"}) && slices.Equal(x.drains, []string{"m"})
	})
	awaitUp(t, b.Store)
	if _, err := b.PutRoutes(rev2, config.NormalizeRoutes([]config.Route{route("three")})); err != nil {
		t.Fatalf("put after coming back: %v", err)
	}
}

// TestEtcdRestartAllConverge: etcd itself stops: writes fail on every replica, requests are
// not their business; after a restart a PUT goes through and every replica converges.
func TestEtcdRestartAllConverge(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", []config.Route{route("alpha")})
	b := startReplica(t, etcd.Endpoint(), "b", nil)
	awaitUp(t, a.Store)
	awaitUp(t, b.Store)
	etcd.Stop()
	awaitCond(t, 5*time.Second, "both down", func() bool { return !a.Up() && !b.Up() })
	a.got.mu.Lock()
	etag := a.got.routeRev
	a.got.mu.Unlock()
	if _, err := a.PutRoutes(etag, nil); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("put with etcd stopped: %v", err)
	}
	etcd.Restart()
	awaitCond(t, 15*time.Second, "both back", func() bool { return a.Up() && b.Up() })
	rev, err := a.PutRoutes(etag, config.NormalizeRoutes([]config.Route{route("after")}))
	if err != nil {
		t.Fatal(err)
	}
	b.got.await(t, time.Second, "b converges", func(x *applied) bool { return x.routeRev == rev })
}

// TestInvalidStoredTableKeepsLastGood: garbage written to the routes key by hand is not
// applied; the last good table serves under the stored revision, so a PUT can replace it.
// A deleted table is put back.
func TestInvalidStoredTableKeepsLastGood(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", []config.Route{route("alpha")})
	awaitUp(t, a.Store)
	cli := rawClient(t, etcd.Endpoint())
	for _, bad := range []string{`{"routes":[{"model":""}]}`, `not json`, `{"routes":[],"x":1}`, `{}`} {
		resp, err := cli.Put(context.Background(), "/test/routes", bad)
		if err != nil {
			t.Fatal(err)
		}
		rev := uint64(resp.Header.Revision)
		a.got.await(t, time.Second, "bad value seen", func(x *applied) bool {
			return x.routeRev == rev && slices.Equal(routeModels(x.routes), []string{"alpha"})
		})
	}
	a.got.mu.Lock()
	etag := a.got.routeRev
	a.got.mu.Unlock()
	rev, err := a.PutRoutes(etag, config.NormalizeRoutes([]config.Route{route("fixed")}))
	if err != nil {
		t.Fatalf("put over a bad value: %v", err)
	}
	if _, err := cli.Delete(context.Background(), "/test/routes"); err != nil {
		t.Fatal(err)
	}
	a.got.await(t, 2*time.Second, "deleted table put back", func(x *applied) bool {
		return x.routeRev > rev && slices.Equal(routeModels(x.routes), []string{"fixed"})
	})
	a.got.mu.Lock()
	ws := a.got.ws
	a.got.mu.Unlock()
	resp, err := cli.Put(context.Background(), "/test/static_workers", `{"static_workers":[{"id":""}]}`)
	if err != nil {
		t.Fatal(err)
	}
	a.got.await(t, time.Second, "a bad static table keeps the last good one", func(x *applied) bool {
		return x.static == uint64(resp.Header.Revision) && len(x.ws) == len(ws)
	})
}

// TestDrainRevisionsStayBounded: undrained models are forgotten once the watch has passed
// them (swept when more than 64 pile up), so a long-lived replica's drain table holds the
// drained models and little else.
func TestDrainRevisionsStayBounded(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", nil)
	awaitUp(t, a.Store)
	cli := rawClient(t, etcd.Endpoint())
	for i := range 200 {
		k := fmt.Sprintf("/test/drained/m%d", i)
		if _, err := cli.Put(context.Background(), k, "1"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(context.Background(), "/test/drained/kept", "1"); err != nil {
		t.Fatal(err)
	}
	a.got.await(t, 2*time.Second, "only kept drained", func(x *applied) bool { return slices.Equal(x.drains, []string{"kept"}) })
	a.mu.Lock()
	n := len(a.drained)
	a.mu.Unlock()
	if n > 1+64+1 { // the drained model, the tombstones left before a sweep, the last one
		t.Fatalf("%d drain revisions kept for one drained model after 200 drains and undrains", n)
	}
}

// TestReconnectWaits: the waits between sessions as a replica lives them, on a fake clock
// against a real etcd behind a proxy. Sessions that cannot get up wait 100 ms, then twice as
// long each time up to 2 s; a session that held for 2 s and then lost etcd is followed by
// 100 ms again; one that got up but did not hold keeps doubling. A cut session ends by itself
// (its watch or lease keep-alive fails, in real time; the probe is an hour away on the fake
// clock), so the clock moves only where the test says and never into a wait it has not read.
func TestReconnectWaits(t *testing.T) {
	etcd := etcdtest.Start(t)
	p := etcdtest.NewProxy(t, etcd.Endpoint())
	p.Cut()
	clk := clock.NewFake(time.Unix(1000, 0))
	s, err := Start(Config{
		Cluster: config.Cluster{Enabled: true, EtcdEndpoints: []string{p.Addr()}, Prefix: "/test/", LeaseTTL: 2 * time.Second},
		Self:    Replica{ID: "r", HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2"},
		Apply:   newApplied().applier(), Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OpTimeout: 500 * time.Millisecond, ProbeInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// waiting is the backoff the store waits on once a session has ended: then the probe's
	// timer is stopped and the backoff's is the only one.
	waiting := func(what string) time.Duration {
		t.Helper()
		var d time.Duration
		awaitCond(t, 10*time.Second, what, func() bool {
			if s.Up() || clk.Pending() != 1 {
				return false
			}
			d, _ = clk.Next()
			return true
		})
		return d
	}
	// reconnect lets etcd back in and takes the waits of the sessions that still fail (the
	// client may need a few to reconnect), each twice the one before, until one gets up. It
	// returns the last wait.
	reconnect := func(last time.Duration) time.Duration {
		t.Helper()
		p.Restore()
		for !s.Up() {
			clk.Advance(last)
			awaitCond(t, 10*time.Second, "up, or waiting again", func() bool {
				if s.Up() {
					return true
				}
				if clk.Pending() != 1 {
					return false
				}
				d, _ := clk.Next()
				if d != min(2*last, 2*time.Second) {
					t.Fatalf("after a failed session that waited %v: %v", last, d)
				}
				last = d
				return true
			})
		}
		return last
	}

	if d := waiting("the first wait"); d != 100*time.Millisecond {
		t.Fatalf("first wait %v, want 100ms", d)
	}
	clk.Advance(100 * time.Millisecond)
	if d := waiting("the second wait"); d != 200*time.Millisecond {
		t.Fatalf("second wait %v, want 200ms", d)
	}
	reconnect(200 * time.Millisecond)
	clk.Advance(2 * time.Second) // up for 2 s: this session held
	p.Cut()
	if d := waiting("the wait after a session that held"); d != 100*time.Millisecond {
		t.Fatalf("after a session that held: %v, want 100ms", d)
	}
	last := reconnect(100 * time.Millisecond)
	p.Cut() // up for no time at all on the clock
	if d, want := waiting("the wait after a session that did not hold"), min(2*last, 2*time.Second); d != want {
		t.Fatalf("after a session that did not hold, the last wait %v: %v, want %v", last, d, want)
	}
}

// logBuf is a log a test can search while the store writes it.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) has(s string) bool { return l.count(s) > 0 }

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// TestReadBounded: a session reads only what the store follows (the tables, replicas/ and
// the keys of drained/), so what else is under the prefix, or in a drain's value, costs it
// nothing; an answer over the store's bound ends the session with a log that says so, the
// replica keeps its last state, and it is back once the prefix is within the bound again.
func TestReadBounded(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := rawClient(t, etcd.Endpoint())
	ctx := context.Background()
	fat := strings.Repeat("x", 200<<10)
	for i := range 4 { // 800 KiB where the store looks at nothing
		if _, err := cli.Put(ctx, fmt.Sprintf("/test/junk/%d", i), fat); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []string{"a", "b", "c", "d"} { // 800 KiB of drain values; the keys are what count
		if _, err := cli.Put(ctx, "/test/drained/"+m, fat); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"x1", "x2", "x3"} {
		if _, err := cli.Put(ctx, "/test/replicas/"+id, replicaJSON(id)); err != nil {
			t.Fatal(err)
		}
	}
	// Past each directory's bound, keys of 65 KiB: 325 KiB in each directory, which a read of
	// more than one entry past the bound would take.
	for i := range 5 {
		long := "y" + strings.Repeat("z", 65<<10) + fmt.Sprint(i)
		for _, dir := range []string{"/test/drained/", "/test/replicas/"} {
			if _, err := cli.Put(ctx, dir+long, "1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, logs := newApplied(), &logBuf{}
	s, err := Start(Config{
		Cluster: config.Cluster{Enabled: true, EtcdEndpoints: []string{etcd.Endpoint()}, Prefix: "/test/", LeaseTTL: 2 * time.Second},
		Self:    Replica{ID: "r", HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2"},
		Apply:   got.applier(), Logger: slog.New(slog.NewTextHandler(logs, nil)),
		OpTimeout: 500 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
		maxAnswer: 256 << 10, maxDrained: 3, maxReplicas: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	awaitUp(t, s)
	// Each directory is read to one past its bound: the first entries are kept.
	got.await(t, 2*time.Second, "drains read", func(x *applied) bool { return slices.Equal(x.drains, []string{"a", "b", "c"}) })
	if n := logs.count("more entries under a directory than the store's bound"); n != 2 ||
		!logs.has("directory=replicas/ bound=2") || !logs.has("directory=drained/ bound=3") {
		t.Fatalf("%d directories over their bound logged, want 2 (drained/, replicas/)", n)
	}
	if ids := replicaIDs(s.Replicas()); !slices.Equal(ids, []string{"r", "x1", "x2"}) {
		t.Fatalf("replicas %v", ids)
	}

	// Two replicas/ entries of 200 KiB: each is one watch answer within the bound (and an
	// invalid entry), but the next session's read of replicas/ is 400 KiB.
	for i, id := range []string{"f1", "f2"} {
		if _, err := cli.Put(ctx, "/test/replicas/"+id, fat); err != nil {
			t.Fatal(err)
		}
		awaitCond(t, 2*time.Second, "invalid entry seen", func() bool { return logs.count("ignored an invalid replicas/ entry") == i+1 })
	}
	if !s.Up() {
		t.Fatal("a watch answer within the bound ended the session")
	}
	etcd.Stop()
	etcd.Restart()
	awaitCond(t, 10*time.Second, "the read over the bound logged", func() bool {
		return logs.has("over the store's bound of 262144 bytes")
	})
	if s.Up() {
		t.Fatal("up on a read over the bound")
	}
	got.mu.Lock()
	drains := got.drains
	got.mu.Unlock()
	if !slices.Equal(drains, []string{"a", "b", "c"}) {
		t.Fatalf("the last state was dropped: drains %v", drains)
	}
	if _, err := cli.Delete(ctx, "/test/replicas/f", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	awaitCond(t, 10*time.Second, "up again within the bound", s.Up)
}

// TestEventsOfOneTransactionPushOnce: 100 drains put in one transaction reach the gateway as
// one drained set, not 100.
func TestEventsOfOneTransactionPushOnce(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", nil)
	awaitUp(t, a.Store)
	a.got.mu.Lock()
	before := a.got.drainsPushed
	a.got.mu.Unlock()
	var ops []clientv3.Op
	var want []string
	for i := range 100 {
		m := fmt.Sprintf("m%03d", i)
		ops, want = append(ops, clientv3.OpPut("/test/drained/"+m, "1")), append(want, m)
	}
	if _, err := rawClient(t, etcd.Endpoint()).Txn(context.Background()).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	a.got.await(t, 2*time.Second, "the drains applied", func(x *applied) bool { return slices.Equal(x.drains, want) })
	a.got.mu.Lock()
	defer a.got.mu.Unlock()
	if n := a.got.drainsPushed - before; n != 1 {
		t.Fatalf("%d pushes for one transaction of 100 drains", n)
	}
}

// TestTableWriteBounds: a table over the bound every replica reads with is refused before it
// is written (this replica would apply what the others refuse), and one etcd refuses as over
// its request limit (1.5 MiB unless etcd is told otherwise) is a 413, not an unavailable store.
func TestTableWriteBounds(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", []config.Route{route("alpha")})
	awaitUp(t, a.Store)
	a.got.mu.Lock()
	etag := a.got.routeRev
	a.got.mu.Unlock()
	for _, c := range []struct {
		size int
		why  string
	}{{MaxTableBytes, "over the cluster's bound"}, {2 << 20, "etcd refused"}, {1700 << 10, "etcd refused"}} {
		_, err := a.PutRoutes(etag, []config.Route{route(strings.Repeat("m", c.size))})
		if !errors.Is(err, errs.ErrBodyTooLarge) || errors.Is(err, errs.ErrConfigStoreUnavailable) || !strings.Contains(err.Error(), c.why) {
			t.Fatalf("a %d-byte table: %v", c.size, err)
		}
	}
	if _, err := a.PutStatic(etag, []config.StaticWorker{{ID: strings.Repeat("w", MaxTableBytes)}}); !errors.Is(err, errs.ErrBodyTooLarge) {
		t.Fatalf("a static table over the bound: %v", err)
	}
	if !a.Up() {
		t.Fatal("a refused write took the store down")
	}
	if _, err := a.PutRoutes(etag, []config.Route{route(strings.Repeat("m", 1<<20))}); err != nil {
		t.Fatalf("a 1 MiB table: %v", err)
	}
	a.got.await(t, time.Second, "the 1 MiB table applied", func(x *applied) bool {
		return x.routeRev > etag && len(x.routes[0].Model) == 1<<20
	})

	// An etcd told to take larger requests takes a table up to the store's bound.
	big := etcdtest.StartMaxRequest(t, MaxTableBytes+64<<10)
	// A 4 MiB write takes longer than the other tests' 500 ms bound on a loaded machine.
	b := startReplicaOp(t, config.Cluster{Enabled: true, EtcdEndpoints: []string{big.Endpoint()}, Prefix: "/test/", LeaseTTL: 2 * time.Second},
		"b", nil, 10*time.Second)
	awaitUp(t, b.Store)
	b.got.mu.Lock()
	etag = b.got.routeRev
	b.got.mu.Unlock()
	overhead, err := marshal(routesDoc{Routes: []config.Route{route("")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PutRoutes(etag, []config.Route{route(strings.Repeat("m", MaxTableBytes-len(overhead)))}); err != nil {
		t.Fatalf("a table of exactly MaxTableBytes on an etcd that takes more: %v", err)
	}
}

// TestReadAtTheBoundsFits: the largest state the store accepts, with every key as long as its
// bounds allow, is read within MaxAnswer: the three tables of MaxTableBytes, MaxReplicas entries
// of MaxReplicaBytes, MaxDrained drained models of MaxModelIDLen bytes that escape to
// three times that, and config.MaxRollouts stored rollouts of rollout.MaxStoredBytes, under a
// prefix of 256 bytes.
func TestReadAtTheBoundsFits(t *testing.T) {
	etcd := etcdtest.StartMaxRequest(t, 2*MaxTableBytes)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: 2 * MaxTableBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	prefix := "/" + strings.Repeat("p", 254) + "/"
	ctx := context.Background()
	commit := func(ops []clientv3.Op) {
		t.Helper()
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	model := func(i int) string { // 256 bytes, each escaped as %XX
		return strings.Repeat("\u00e9", MaxModelIDLen/2-3) + fmt.Sprintf("%06d", i)
	}
	var ops []clientv3.Op
	var want []string
	for i := range MaxDrained {
		m := model(i)
		if len(m) != MaxModelIDLen || len(url.PathEscape(m)) != 3*MaxModelIDLen-12 {
			t.Fatalf("model %d: %d bytes, %d escaped", i, len(m), len(url.PathEscape(m)))
		}
		want = append(want, m)
		if ops = append(ops, clientv3.OpPut(prefix+DirDrained+url.PathEscape(m), "1")); len(ops) == 128 {
			commit(ops)
			ops = nil
		}
	}
	for i := range MaxReplicas {
		id := fmt.Sprintf("%0*d", config.MaxReplicaIDLen, i)
		val := fmt.Sprintf(`{"id":%q,"http_address":%q,"grpc_address":%q}`, id, strings.Repeat("h", 256), strings.Repeat("g", 256))
		val += strings.Repeat(" ", MaxReplicaBytes-len(val))
		if ops = append(ops, clientv3.OpPut(prefix+DirReplicas+id, val)); len(ops) == 128 {
			commit(ops)
			ops = nil
		}
	}
	commit(ops)
	table := func(doc string) string { return doc + strings.Repeat(" ", MaxTableBytes-len(doc)) }
	commit([]clientv3.Op{clientv3.OpPut(prefix+KeyRoutes, table(`{"routes":[{"model":"big"}]}`))})
	commit([]clientv3.Op{clientv3.OpPut(prefix+KeyStaticWorkers, table(`{"static_workers":[]}`))})
	commit([]clientv3.Op{clientv3.OpPut(prefix+KeyEnginePools, table(`{"engine_pools":[{"name":"big","model":"m","dns":"big.svc:8000","metrics":"vllm"}]}`))})
	// config.MaxRollouts stored rollouts of rollout.MaxStoredBytes under route ids that escape
	// to three times their 256 bytes, and rollout_leader.
	st, err := rollout.Stored{Spec: strings.Repeat("0", 32), State: rollout.State{Status: rollout.Paused}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	stored := string(st) + strings.Repeat(" ", rollout.MaxStoredBytes-len(st))
	for i := range config.MaxRollouts {
		ops = append(ops, clientv3.OpPut(prefix+DirRollouts+url.PathEscape(model(i)), stored))
	}
	commit(append(ops, clientv3.OpPut(prefix+KeyRolloutLeader, strings.Repeat("r", config.MaxReplicaIDLen))))
	got := newApplied()
	s, err := Start(Config{
		Cluster: config.Cluster{Enabled: true, EtcdEndpoints: []string{etcd.Endpoint()}, Prefix: prefix, LeaseTTL: 2 * time.Second},
		Self:    Replica{ID: "r", HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2"},
		Apply:   got.applier(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OpTimeout: 10 * time.Second, ProbeInterval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	awaitCond(t, 20*time.Second, "store up", s.Up)
	slices.Sort(want)
	got.await(t, 5*time.Second, "everything read", func(x *applied) bool {
		return slices.Equal(x.drains, want) && x.replicas == MaxReplicas+1 && slices.Equal(routeModels(x.routes), []string{"big"}) &&
			slices.Equal(poolNames(x.pools), []string{"big"}) && len(x.states) == config.MaxRollouts &&
			x.decider == strings.Repeat("r", config.MaxReplicaIDLen)
	})
}

// TestCanaryKeyShared (R20): the first replica stores its canary key and every replica draws
// with it; a deleted key is put back by a replica and all take that one; a stored value that
// is not 64 hex digits is ignored and the last key applied stays.
func TestCanaryKeyShared(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startReplica(t, etcd.Endpoint(), "a", nil)
	a.got.await(t, 5*time.Second, "a applies its own key", func(x *applied) bool { return x.canary == keyOf("a") })
	b := startReplica(t, etcd.Endpoint(), "b", nil)
	b.got.await(t, 5*time.Second, "b applies a's stored key", func(x *applied) bool { return x.canary == keyOf("a") })

	cli := rawClient(t, etcd.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Delete(ctx, "/test/"+KeyCanary); err != nil {
		t.Fatal(err)
	}
	var k [32]byte
	a.got.await(t, 5*time.Second, "a replica puts a key back", func(*applied) bool {
		resp, err := cli.Get(ctx, "/test/"+KeyCanary)
		if err != nil || len(resp.Kvs) != 1 {
			return false
		}
		_, err = hex.Decode(k[:], resp.Kvs[0].Value)
		return err == nil
	})
	if k != keyOf("a") && k != keyOf("b") {
		t.Fatalf("the key put back is %x, neither replica's", k)
	}
	for _, r := range []replica{a, b} {
		r.got.await(t, 5*time.Second, "both replicas apply the key put back", func(x *applied) bool { return x.canary == k })
	}

	a.got.mu.Lock()
	n := a.got.canaries
	a.got.mu.Unlock()
	for _, bad := range []string{"zz", strings.Repeat("g", 64), strings.Repeat("0", 66)} {
		if _, err := cli.Put(ctx, "/test/"+KeyCanary, bad); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "/test/routes", `{"routes":[]}`); err != nil { // a later event to wait on
		t.Fatal(err)
	}
	a.got.await(t, 5*time.Second, "a applies the later table", func(x *applied) bool { return len(x.routes) == 0 && x.routeRev > 0 })
	a.got.mu.Lock()
	defer a.got.mu.Unlock()
	if a.got.canaries != n || a.got.canary != k {
		t.Fatalf("invalid stored keys were applied: %d pushes (was %d), key %x", a.got.canaries, n, a.got.canary)
	}
}
