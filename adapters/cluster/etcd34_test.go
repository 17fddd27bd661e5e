package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/etcdtest"
)

// TestStoreOnDebianEtcd34 runs the store against the machine's etcd binary (Debian 12's
// etcd-server 3.4.23): the product must work with etcd's 3.4 API. Seed, CAS, watch, drains,
// leases, and an outage with catch-up.
func TestStoreOnDebianEtcd34(t *testing.T) {
	etcd := etcdtest.StartSystem(t, nil)
	a := startReplica(t, etcd.Endpoint(), "a", []config.Route{route("alpha")})
	awaitUp(t, a.Store) // the first replica up brings its table
	b := startReplica(t, etcd.Endpoint(), "b", []config.Route{route("beta")})
	awaitUp(t, b.Store)
	b.got.await(t, 5*time.Second, "b has a's table and sees two replicas", func(x *applied) bool {
		return slices.Equal(routeModels(x.routes), []string{"alpha"}) && x.replicas == 2
	})
	b.got.mu.Lock()
	etag := b.got.routeRev
	b.got.mu.Unlock()
	rev, err := b.PutRoutes(etag, config.NormalizeRoutes([]config.Route{route("gamma")}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutRoutes(etag, nil); !errors.Is(err, errs.ErrEtagMismatch) {
		t.Fatalf("stale put: %v", err)
	}
	a.got.await(t, time.Second, "a applies b's put", func(x *applied) bool { return x.routeRev == rev })
	if err := a.SetDrained("smol", true); err != nil {
		t.Fatal(err)
	}
	b.got.await(t, time.Second, "b drains", func(x *applied) bool { return slices.Equal(x.drains, []string{"smol"}) })

	etcd.Stop()
	awaitCond(t, 5*time.Second, "both down", func() bool { return !a.Up() && !b.Up() })
	if _, err := a.PutRoutes(rev, nil); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("put with etcd down: %v", err)
	}
	etcd.Restart()
	awaitCond(t, 15*time.Second, "both back", func() bool { return a.Up() && b.Up() })
	next, err := a.PutRoutes(rev, config.NormalizeRoutes([]config.Route{route("after")}))
	if err != nil {
		t.Fatal(err)
	}
	b.got.await(t, time.Second, "b converges", func(x *applied) bool { return x.routeRev == next })
	b.Close()
	a.got.await(t, time.Second, "b's lease revoked", func(x *applied) bool { return x.replicas == 1 })
}

// TestStoreOnDebianEtcd34WithTLSAndAuth: etcd 3.4 serving TLS with client certificates and
// auth enabled; the store connects with [cluster] tls_ca, tls_cert, tls_key, username and a
// password, and a user granted only the prefix is enough.
func TestStoreOnDebianEtcd34WithTLSAndAuth(t *testing.T) {
	files := etcdtest.NewTLS(t)
	etcd := etcdtest.StartSystem(t, files)
	cc := config.Cluster{Enabled: true, EtcdEndpoints: []string{etcd.Endpoint()}, Prefix: "/test/", LeaseTTL: 2 * time.Second,
		TLSCA: files.CA, TLSCert: files.ClientCert, TLSKey: files.ClientKey}
	tc, err := tlsConfig(cc)
	if err != nil {
		t.Fatal(err)
	}
	enableAuth(t, etcd.Endpoint(), tc)

	cc.Username, cc.Password = "tlgw", "tlgw-password"
	a := startReplicaWith(t, cc, "a", []config.Route{route("alpha")})
	awaitUp(t, a.Store)
	b := startReplicaWith(t, cc, "b", nil)
	awaitUp(t, b.Store)
	b.got.await(t, 5*time.Second, "b has the table and two replicas", func(x *applied) bool {
		return slices.Equal(routeModels(x.routes), []string{"alpha"}) && x.replicas == 2
	})
	b.got.mu.Lock()
	etag := b.got.routeRev
	b.got.mu.Unlock()
	rev, err := b.PutRoutes(etag, config.NormalizeRoutes([]config.Route{route("secure")}))
	if err != nil {
		t.Fatal(err)
	}
	a.got.await(t, time.Second, "a applies it", func(x *applied) bool { return x.routeRev == rev })

	// Without TLS the server refuses; with a wrong password the store never comes up and
	// writes answer 503.
	bad := cc
	bad.Password = "wrong"
	c := startReplicaWith(t, bad, "c", nil)
	if _, err := c.PutRoutes(rev, nil); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("wrong password: %v", err)
	}
	if c.Up() {
		t.Fatal("up with a wrong password")
	}
}

// enableAuth creates root and a tlgw user with read-write on /test/ only, then turns auth on.
func enableAuth(t *testing.T, endpoint string, tc *tls.Config) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "tlgw", "tlgw-password"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "tlgw"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "tlgw", "/test/", clientv3.GetPrefixRangeEnd("/test/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserGrantRole(ctx, "tlgw", "tlgw"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth set-up step %d: %v", i, err)
		}
	}
}
