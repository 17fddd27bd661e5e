package cluster

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/etcdtest"
)

// TestPeerSecretReplicasRacingAgree: on a prefix with no secret, replicas asking at once all
// get the one secret that was stored (32 bytes, stored as its 64 hex digits), and asking again
// answers it again. Each round is a fresh prefix, so each round is a race to create.
func TestPeerSecretReplicasRacingAgree(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := rawClient(t, etcd.Endpoint())
	seen := map[string]bool{}
	for round := range 5 {
		cc := config.Cluster{Enabled: true, EtcdEndpoints: []string{etcd.Endpoint()}, Prefix: fmt.Sprintf("/secret%d/", round), LeaseTTL: 2 * time.Second}
		var rs []replica
		for i := range 3 {
			r := startReplicaWith(t, cc, fmt.Sprintf("r%d", i), nil)
			awaitUp(t, r.Store)
			rs = append(rs, r)
		}
		const askers = 4 // per replica
		got := make([][]byte, len(rs)*askers)
		fails := make([]error, len(got))
		var wg sync.WaitGroup
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], fails[i] = rs[i%len(rs)].PeerSecret(context.Background())
			}()
		}
		wg.Wait()
		for i := range got {
			if fails[i] != nil || len(got[i]) != 32 || !bytes.Equal(got[i], got[0]) {
				t.Fatalf("round %d asker %d: %x %v, asker 0 got %x", round, i, got[i], fails[i], got[0])
			}
		}
		resp, err := raw.Get(context.Background(), cc.Prefix+KeyPeerSecret)
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != hex.EncodeToString(got[0]) {
			t.Fatalf("round %d: stored %v %v, want %x", round, resp, err, got[0])
		}
		again, err := rs[1].PeerSecret(context.Background())
		if err != nil || !bytes.Equal(again, got[0]) {
			t.Fatalf("round %d: asked again %x %v, want %x", round, again, err, got[0])
		}
		if seen[string(got[0])] {
			t.Fatalf("round %d: the secret %x was made before", round, got[0])
		}
		seen[string(got[0])] = true
	}
}

// TestPeerSecretStoredValue: a secret an operator stored is taken as it is (either hex case);
// a value that is not 64 hex digits is an error naming the key and is left in place; a
// deleted secret is made anew.
func TestPeerSecretStoredValue(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := rawClient(t, etcd.Endpoint())
	r := startReplica(t, etcd.Endpoint(), "a", nil)
	awaitUp(t, r.Store)
	k := "/test/" + KeyPeerSecret
	ctx := context.Background()
	want := bytes.Repeat([]byte{0xab}, 32)
	if _, err := raw.Put(ctx, k, strings.ToUpper(hex.EncodeToString(want))); err != nil {
		t.Fatal(err)
	}
	if got, err := r.PeerSecret(ctx); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("an operator's secret: %x %v", got, err)
	}
	for _, bad := range []string{"", "ab", strings.Repeat("a", 63), strings.Repeat("a", 65), strings.Repeat("g", 64)} {
		if _, err := raw.Put(ctx, k, bad); err != nil {
			t.Fatal(err)
		}
		got, err := r.PeerSecret(ctx)
		if err == nil || got != nil || !strings.Contains(err.Error(), k) || !strings.Contains(err.Error(), "64 hex digits") {
			t.Fatalf("stored %q: %x %v, want an error naming %s", bad, got, err, k)
		}
		resp, err := raw.Get(ctx, k)
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != bad {
			t.Fatalf("stored %q: now %v %v, want it left in place", bad, resp, err)
		}
	}
	if _, err := raw.Delete(ctx, k); err != nil {
		t.Fatal(err)
	}
	got, err := r.PeerSecret(ctx)
	if err != nil || len(got) != 32 || bytes.Equal(got, want) {
		t.Fatalf("after a delete: %x %v, want a new secret", got, err)
	}
}

// TestPeerSecretUnavailable: without etcd the secret is ErrUnavailable: before the store ever
// connected, and when etcd stops answering.
func TestPeerSecretUnavailable(t *testing.T) {
	if _, err := offline(t, newApplied()).PeerSecret(context.Background()); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("never connected: %v", err)
	}
	etcd := etcdtest.Start(t)
	r := startReplica(t, etcd.Endpoint(), "a", nil)
	awaitUp(t, r.Store)
	etcd.Stop()
	if _, err := r.PeerSecret(context.Background()); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("etcd stopped: %v", err)
	}
}
