package app_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestReplicasShareTheirLoad (R23): two replicas over etcd, one engine heartbeating to both. A
// request held on replica a counts on b as a's (replicas_in_flight), not as b's own; its
// release takes it away, and so does a's shutdown with one still held, and b keeps no peer table after a left.
func TestReplicasShareTheirLoad(t *testing.T) {
	etcd := etcdtest.Start(t)
	start := func(id string) *app.App {
		cfg := config.Default()
		cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Cluster = config.Cluster{Enabled: true, EtcdEndpoints: []string{etcd.Endpoint()}, Prefix: "/share/", ReplicaID: id,
			LeaseTTL: 2 * time.Second, LoadShareInterval: 20 * time.Millisecond}
		a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a, b := start("a"), start("b")
	defer b.Shutdown(context.Background())
	aDown := false
	defer func() {
		if !aDown {
			_ = a.Shutdown(context.Background())
		}
	}()
	w := gwtest.Worker("w1", "smol", 0)
	beat := func() {
		for _, r := range []*app.App{a, b} {
			if _, err := r.Gateway.Heartbeat(w); err != nil {
				t.Fatal(err)
			}
		}
	}
	beat()
	view := func(r *app.App) router.WorkerView {
		ws, err := r.Gateway.Workers()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range ws.Workers {
			if v.Info.ID == "w1" {
				return v
			}
		}
		return router.WorkerView{}
	}
	for _, r := range []*app.App{a, b} {
		gwtest.Eventually(t, "w1 routable", func() bool { return view(r).Routable })
	}
	p, err := a.Gateway.Pick(&router.Pick{Model: "smol", RequestID: "held-on-a"})
	if err != nil || p.Err != nil {
		t.Fatalf("pick on a: %v %+v", err, p)
	}
	gwtest.Eventually(t, "b counts a's request", func() bool {
		v := view(b)
		return v.ReplicasInFlight == 1 && v.InFlight == 0
	})
	if v := view(a); v.InFlight != 1 || v.ReplicasInFlight != 0 {
		t.Fatalf("a's own view: %+v", v)
	}
	a.Gateway.Release(p)
	gwtest.Eventually(t, "b sees it end", func() bool { return view(b).ReplicasInFlight == 0 })

	p, err = a.Gateway.Pick(&router.Pick{Model: "smol", RequestID: "held-at-shutdown"})
	if err != nil || p.Err != nil {
		t.Fatalf("pick on a: %v %+v", err, p)
	}
	gwtest.Eventually(t, "b counts it", func() bool { return view(b).ReplicasInFlight == 1 })
	gwtest.Eventually(t, "b holds one peer table", func() bool { return gaugeValue(t, b, "tlgw_replica_load_peers") == 1 })
	aDown = true // a stops with the request still held: b forgets a's table as its stream ends
	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	gwtest.Eventually(t, "b forgets a", func() bool {
		return view(b).ReplicasInFlight == 0 && gaugeValue(t, b, "tlgw_replica_load_peers") == 0
	})
}

// gaugeValue is a gauge's value in r's registry (-1 when absent).
func gaugeValue(t *testing.T, r *app.App, name string) float64 {
	t.Helper()
	mfs, err := r.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
