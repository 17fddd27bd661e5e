package app

import (
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	"github.com/tlgw/tlgw/internal/config"
)

// TestHTTPServerTimeouts: the server closes idle keep-alives after idle_timeout, waits for
// headers no longer than body_read_timeout (nor 10 s), and has no ReadTimeout or WriteTimeout,
// which would cut long streams.
func TestHTTPServerTimeouts(t *testing.T) {
	g := config.Default().Gateway
	g.IdleTimeout, g.BodyReadTimeout = 7*time.Second, 3*time.Second
	s := newHTTPServer(http.NotFoundHandler(), g)
	if s.IdleTimeout != 7*time.Second || s.ReadHeaderTimeout != 3*time.Second || s.ReadTimeout != 0 || s.WriteTimeout != 0 {
		t.Fatalf("idle %v, read header %v, read %v, write %v", s.IdleTimeout, s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout)
	}
	if s := newHTTPServer(http.NotFoundHandler(), config.Default().Gateway); s.ReadHeaderTimeout != maxHeaderWait || s.IdleTimeout != 120*time.Second {
		t.Fatalf("defaults: read header %v, idle %v", s.ReadHeaderTimeout, s.IdleTimeout)
	}
	// A Gateway built in code without body_read_timeout (the config file refuses 0) still bounds
	// the headers: a zero ReadHeaderTimeout would mean no bound at all.
	g.BodyReadTimeout = 0
	if s := newHTTPServer(http.NotFoundHandler(), g); s.ReadHeaderTimeout != maxHeaderWait {
		t.Fatalf("no body_read_timeout: read header %v, want %v", s.ReadHeaderTimeout, maxHeaderWait)
	}
}

// TestReplicaID: [cluster] replica_id names the replica when set; otherwise its hostname and
// HTTP port do.
func TestReplicaID(t *testing.T) {
	cfg := config.Default()
	cfg.Cluster.ReplicaID = "gw-a"
	if id, err := replicaID(cfg, "127.0.0.1:8080"); err != nil || id != "gw-a" {
		t.Fatalf("set: %q, %v; want gw-a", id, err)
	}
	cfg.Cluster.ReplicaID = ""
	host, err := os.Hostname()
	if err != nil {
		if _, err := replicaID(cfg, "127.0.0.1:8080"); err == nil {
			t.Fatal("no hostname here, and no error")
		}
		return
	}
	want := net.JoinHostPort(host, "8080")
	if !config.ValidReplicaID(want) {
		if _, err := replicaID(cfg, "127.0.0.1:8080"); err == nil {
			t.Fatalf("hostname:port %q cannot name a replica, and no error", want)
		}
		return
	}
	if id, err := replicaID(cfg, "127.0.0.1:8080"); err != nil || id != want {
		t.Fatalf("unset: %q, %v; want %q", id, err, want)
	}
}

// TestRegistryConnectionLimit: the registry's listener holds one connection per engine that
// max_workers allows, plus grpcapi.ConnectionHeadroom.
func TestRegistryConnectionLimit(t *testing.T) {
	for _, n := range []int{1, 10000} {
		cfg := config.Default()
		cfg.Registry.MaxWorkers = n
		o, _, err := registryOptions(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if want := n + grpcapi.ConnectionHeadroom; o.MaxConnections != want {
			t.Fatalf("max_workers %d: MaxConnections %d, want %d", n, o.MaxConnections, want)
		}
	}
}
