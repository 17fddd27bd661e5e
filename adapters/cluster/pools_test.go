package cluster

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/etcdtest"
)

func pool(name string) config.EnginePool {
	return config.EnginePool{Name: name, Model: "m", DNS: name + ".svc:8000", Metrics: "vllm"}
}

func poolNames(ps []config.EnginePool) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// startPoolReplica is startReplica with a configured engine pool table.
func startPoolReplica(t *testing.T, endpoint, id string, seed []config.EnginePool) replica {
	t.Helper()
	got := newApplied()
	s, err := Start(Config{
		Cluster:   config.Cluster{Enabled: true, EtcdEndpoints: []string{endpoint}, Prefix: "/test/", LeaseTTL: 2 * time.Second},
		Self:      Replica{ID: id, HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2"},
		SeedPools: config.NormalizeEnginePools(seed), Apply: got.applier(), CanaryKey: keyOf(id),
		OpTimeout: 500 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return replica{Store: s, got: got}
}

// TestEnginePoolsShared (R23): the first replica stores its configured pool table and a later
// one with another takes the stored one at the same ETag; a PUT on one replica is applied on
// the other; a stale If-Match is ErrEtagMismatch and changes nothing; an invalid stored table
// keeps the last good one; a deleted table is put back as last applied; a table over the
// bound is refused before it is written.
func TestEnginePoolsShared(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startPoolReplica(t, etcd.Endpoint(), "a", []config.EnginePool{pool("alpha")})
	a.got.await(t, 5*time.Second, "a applies its seed", func(x *applied) bool { return x.poolRev > 0 })
	b := startPoolReplica(t, etcd.Endpoint(), "b", []config.EnginePool{pool("beta")})
	b.got.await(t, 5*time.Second, "b applies the stored table", func(x *applied) bool { return x.poolRev > 0 })
	awaitUp(t, a.Store)
	awaitUp(t, b.Store)
	a.got.mu.Lock()
	etag, seeded := a.got.poolRev, a.got.pools
	a.got.mu.Unlock()
	b.got.mu.Lock()
	if b.got.poolRev != etag || !slices.Equal(poolNames(b.got.pools), []string{"alpha"}) {
		t.Fatalf("b at %d %v, a at %d", b.got.poolRev, poolNames(b.got.pools), etag)
	}
	b.got.mu.Unlock()
	if seeded[0].Refresh != config.Duration(config.DefaultPoolRefresh) || seeded[0].Role != "unified" {
		t.Fatalf("the seeded table is not normalized: %+v", seeded[0])
	}

	next, err := a.PutPools(etag, config.NormalizeEnginePools([]config.EnginePool{pool("gamma"), pool("delta")}))
	if err != nil || next <= etag {
		t.Fatalf("put: %d %v", next, err)
	}
	b.got.await(t, time.Second, "b applies the PUT within 1 s", func(x *applied) bool {
		return x.poolRev == next && slices.Equal(poolNames(x.pools), []string{"gamma", "delta"})
	})
	if _, err := b.PutPools(etag, nil); !errors.Is(err, errs.ErrEtagMismatch) {
		t.Fatalf("stale put: %v, want etag mismatch", err)
	}
	if _, err := b.PutPools(next, []config.EnginePool{{Name: strings.Repeat("p", MaxTableBytes)}}); !errors.Is(err, errs.ErrBodyTooLarge) {
		t.Fatalf("a pool table over the bound: %v", err)
	}

	cli := rawClient(t, etcd.Endpoint())
	for _, bad := range []string{`{"engine_pools":[{"name":"x","model":"m","dns":"10.0.0.1:8000","metrics":"vllm"}]}`, `{}`, `not json`} {
		resp, err := cli.Put(context.Background(), "/test/engine_pools", bad)
		if err != nil {
			t.Fatal(err)
		}
		rev := uint64(resp.Header.Revision)
		for _, r := range []replica{a, b} {
			r.got.await(t, time.Second, "a bad stored table keeps the last good one", func(x *applied) bool {
				return x.poolRev == rev && slices.Equal(poolNames(x.pools), []string{"gamma", "delta"})
			})
		}
	}
	if _, err := cli.Delete(context.Background(), "/test/engine_pools"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []replica{a, b} {
		r.got.await(t, 2*time.Second, "a deleted table put back", func(x *applied) bool {
			return x.poolRev > next && slices.Equal(poolNames(x.pools), []string{"gamma", "delta"})
		})
	}
}
