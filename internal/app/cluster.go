package app

import (
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/adapters/cluster"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/rollout"
)

// replicaID is [cluster] replica_id, or hostname:http port when it is not set.
func replicaID(cfg *config.Config, httpAddr string) (string, error) {
	if id := cfg.Cluster.ReplicaID; id != "" {
		return id, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("cluster: replica_id is not set and the hostname is unknown: %w", err)
	}
	_, port, _ := net.SplitHostPort(httpAddr)
	id := net.JoinHostPort(host, port)
	if !config.ValidReplicaID(id) {
		return "", fmt.Errorf("cluster: hostname:port %q cannot name a replica; set cluster.replica_id", id)
	}
	return id, nil
}

// startCluster connects this replica to the control plane (R16): etcd's tables drive the
// router, the registry's drains, the static scrapers, the engine pools (R23), and the rate
// limits' replica count and the replicas' exchanged per-key usage (each replica's share
// follows its traffic).
func (a *App) startCluster(self cluster.Replica) error {
	gw, static, api := a.Gateway, a.static, a.HTTP
	s, err := cluster.Start(cluster.Config{
		Cluster: a.cfg.Cluster, Self: self,
		SeedRoutes: a.cfg.Gateway.Routes, SeedStatic: a.cfg.Gateway.StaticWorkers, SeedPools: a.cfg.Gateway.EnginePools,
		CanaryKey: a.canary,
		Apply: cluster.Applier{
			Routes:    gw.InstallRoutes,
			Static:    static.install,
			Pools:     a.pools.install,
			Drains:    gw.SyncDrains,
			Replicas:  api.SetReplicas,
			CanaryKey: gw.SetCanaryKey,
			Rollouts:  gw.SetRolloutStates,
		},
		Rates: api.RateLimits(), RateKeys: cluster.RateKeysFingerprint(a.cfg.Auth.Keys),
		Clock: a.clock, Logger: a.log, Registerer: a.Registry,
	})
	if err != nil {
		return err
	}
	a.store = s
	a.storeRef.Store(s)
	return nil
}

// rolloutWindows is the router's RolloutWindows with [cluster] (R25): each closed window's
// counts go to the store, which publishes them for the replica that decides. A window that
// closes before the store has started (the first closes one step interval, at least 1 s, after
// the router starts) is dropped: the decider waits out its grace for it.
func rolloutWindows(clustered bool, store *atomic.Pointer[cluster.Store]) func(string, time.Time, rollout.Tally, rollout.Tally) {
	if !clustered {
		return nil
	}
	return func(route string, window time.Time, canary, baseline rollout.Tally) {
		if s := store.Load(); s != nil {
			s.CloseWindow(route, window, canary, baseline)
		}
	}
}

// replicas answers GET /admin/v1/replicas: the store's view, or this process alone.
func (a *App) replicas() httpapi.Replicas {
	if a.store == nil {
		return httpapi.Replicas{List: []httpapi.Replica{{ID: a.self.ID, HTTPAddress: a.self.HTTPAddress,
			GRPCAddress: a.self.GRPCAddress, StartedAt: a.self.StartedAt, Self: true}}}
	}
	out := httpapi.Replicas{Cluster: true, StoreUp: a.store.Up()}
	for _, r := range a.store.Replicas() {
		out.List = append(out.List, httpapi.Replica{ID: r.ID, HTTPAddress: r.HTTPAddress, GRPCAddress: r.GRPCAddress,
			StartedAt: r.StartedAt, Self: r.Self})
	}
	return out
}

// clusterCore is the HTTP surface's Core in a cluster: the writes go to etcd (a PUT is a
// compare-and-swap on the key's mod revision; a drain is a key), everything else to the
// local actor tree.
type clusterCore struct {
	*gateway.Gateway
	app *App // its store is set before the listeners serve
}

func (c clusterCore) PutRoutes(ifMatch uint64, routes []config.Route) (*router.RouteTable, error) {
	rev, err := c.app.store.PutRoutes(ifMatch, routes)
	if err != nil {
		return nil, err
	}
	return &router.RouteTable{Epoch: rev, Routes: routes}, nil
}

// Drain answers 404 for a model no worker here serves, as one process does; otherwise the
// drain is stored and every replica applies it.
func (c clusterCore) Drain(model string, drained bool) (*registry.DrainResult, error) {
	list, err := c.Workers()
	if err != nil {
		return nil, err
	}
	n := 0
	for _, w := range list.Workers {
		if w.Info.Model == model {
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("no registered worker serves the model %s: %w", errs.Echo(model), errs.ErrModelNotFound)
	}
	if err := c.app.store.SetDrained(model, drained); err != nil {
		return nil, err
	}
	return &registry.DrainResult{Workers: n}, nil
}

// RolloutAction stores the operator's action for every replica (R25); the answer is this
// replica's view once it has applied it.
func (c clusterCore) RolloutAction(route, action string, ifMatch *uint64) (*router.RolloutView, error) {
	if err := c.app.store.RolloutAction(route, action, ifMatch); err != nil {
		return nil, err
	}
	v, err := c.Rollouts() // asked after the store's push of the new state: it is in the view
	if err != nil {
		return nil, err
	}
	for i := range v.Rollouts {
		if v.Rollouts[i].Route == route {
			return &v.Rollouts[i], nil
		}
	}
	return nil, fmt.Errorf("no rollout on route %s: %w", errs.Echo(route), errs.ErrNotFound)
}

// clusterStatic is the static worker table in a cluster: PUTs go to etcd.
type clusterStatic struct {
	*staticWorkers
	app *App
}

func (c clusterStatic) PutStaticWorkers(ifMatch uint64, ws []config.StaticWorker) (uint64, error) {
	if err := c.poolConflict(ws); err != nil {
		return 0, err
	}
	return c.app.store.PutStatic(ifMatch, ws)
}

func startedAt(now time.Time) time.Time { return now.UTC().Truncate(time.Second) }
