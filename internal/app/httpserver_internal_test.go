package app

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
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
	if s := newHTTPServer(http.NotFoundHandler(), config.Default().Gateway); s.ReadHeaderTimeout != maxHeaderWait || s.IdleTimeout != 120*time.Second || s.MaxHeaderBytes != 64<<10 {
		t.Fatalf("defaults: read header %v, idle %v, header bytes %d", s.ReadHeaderTimeout, s.IdleTimeout, s.MaxHeaderBytes)
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

// TestRegistryConnectionLimit: the registry's listener holds two connections per engine that
// max_workers allows (an old one and its replacement), plus 1,024, and runs one call per
// engine, plus 1,024.
func TestRegistryConnectionLimit(t *testing.T) {
	for n, want := range map[int]int{1: 1026, 10000: 21024} {
		cfg := config.Default()
		cfg.Registry.MaxWorkers = n
		o, _, err := registryOptions(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if o.MaxConnections != want || grpcapi.ConnectionLimit(n) != want {
			t.Fatalf("max_workers %d: MaxConnections %d, want %d", n, o.MaxConnections, want)
		}
		if calls := n + 1024; o.MaxCalls != calls || grpcapi.CallLimit(n) != calls {
			t.Fatalf("max_workers %d: MaxCalls %d, want %d", n, o.MaxCalls, calls)
		}
	}
}

// TestHTTPServerHeaderBound: request headers larger than maxHeaderBytes are refused with 431
// before any handler runs; headers of a usual size are served.
func TestHTTPServerHeaderBound(t *testing.T) {
	served := 0
	s := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { served++ }), config.Default().Gateway)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	defer func() {
		// Shutdown, not Close: it also waits for the connection the 431 closes, which net/http
		// lingers on for half a second.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		<-done
	}()
	for _, c := range []struct {
		size, want int
	}{{8 << 10, http.StatusOK}, {maxHeaderBytes - 1024, http.StatusOK}, {maxHeaderBytes + 8<<10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, err := http.NewRequest("GET", "http://"+lis.Addr().String()+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Padding", strings.Repeat("p", c.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%d bytes of header: %v", c.size, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("%d bytes of header: %d, want %d", c.size, resp.StatusCode, c.want)
		}
	}
	if served != 2 {
		t.Fatalf("the handler ran %d times, want 2", served)
	}
}
