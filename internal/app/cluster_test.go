package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/gwtest"
)

type replicasView struct {
	Cluster  bool `json:"cluster"`
	StoreUp  bool `json:"config_store_up"`
	Replicas []struct {
		ID          string `json:"id"`
		HTTPAddress string `json:"http_address"`
		Self        bool   `json:"self"`
	} `json:"replicas"`
}

func getReplicas(t *testing.T, a *app.App) replicasView {
	t.Helper()
	resp, err := http.Get("http://" + a.HTTPAddr + "/admin/v1/replicas")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v replicasView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 200 {
		t.Fatalf("replicas: %d %v", resp.StatusCode, err)
	}
	return v
}

// TestReplicasWithoutCluster: without [cluster] the gateway is one process: the replicas view
// lists it alone, and nothing is registered for a store.
func TestReplicasWithoutCluster(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	v := getReplicas(t, a)
	if v.Cluster || v.StoreUp || len(v.Replicas) != 1 || !v.Replicas[0].Self || v.Replicas[0].HTTPAddress != a.HTTPAddr {
		t.Fatalf("replicas %+v", v)
	}
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tlgw_config_store_up" {
			t.Fatal("tlgw_config_store_up registered without a cluster")
		}
	}
}

// TestClusterReplicaStartsAndStopsClean: two in-process replicas over an embedded etcd list
// each other; a shutdown revokes the lease (the other sees one replica at once) and leaves no
// goroutine behind (goleak in TestMain).
func TestClusterReplicaStartsAndStopsClean(t *testing.T) {
	etcd := etcdtest.Start(t)
	start := func(id string) *app.App {
		cfg := config.Default()
		cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Cluster = config.Cluster{Enabled: true, EtcdEndpoints: []string{etcd.Endpoint()}, Prefix: "/app/", ReplicaID: id, LeaseTTL: 2 * time.Second}
		a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a, b := start("a"), start("b")
	defer a.Shutdown(context.Background())
	gwtest.Eventually(t, "a sees two replicas", func() bool {
		v := getReplicas(t, a)
		return v.Cluster && v.StoreUp && len(v.Replicas) == 2
	})
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	gwtest.Eventually(t, "a sees b leave", func() bool { return len(getReplicas(t, a).Replicas) == 1 })
}
