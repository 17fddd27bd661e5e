package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"math/big"
	"net"
	"path/filepath"
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
func TestReplicasShareTheirLoad(t *testing.T) { shareLoad(t, nil) }

// TestReplicasShareTheirLoadOverMTLS: the same with the registry on mutual TLS ([registry]
// tls_cert and client_ca): the replicas verify one another against client_ca and present their
// registry certificate (server and client authentication) to one another.
func TestReplicasShareTheirLoadOverMTLS(t *testing.T) {
	p := newPKI(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(99), Subject: pkix.Name{CommonName: "tlgw replica"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, keyFile := p.write("replica.pem", "CERTIFICATE", der), p.write("replica-key.pem", "PRIVATE KEY", kd)
	shareLoad(t, func(cfg *config.Config) {
		cfg.Registry.TLSCert, cfg.Registry.TLSKey, cfg.Registry.ClientCA = cert, keyFile, filepath.Join(p.dir, "ca.pem")
	})
}

func shareLoad(t *testing.T, edit func(*config.Config)) {
	etcd := etcdtest.Start(t)
	start := func(id string) *app.App {
		cfg := config.Default()
		cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
		if edit != nil {
			edit(cfg)
		}
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
