// Package etcdtest runs a real etcd server inside a test process (go.etcd.io/etcd/server/v3
// embed) on loopback, for the cluster tests (R16): no mock. A server can be stopped and
// started again on the same address and data, which is how the tests make etcd go away and
// come back.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is one single-member etcd cluster. Clients reach it through a loopback relay, so a
// Stop cuts their connections at once (etcd's own graceful stop waits seconds for open
// watches) and the address stays the same across restarts.
type Server struct {
	t          testing.TB
	dir        string
	clientAddr string
	peerAddr   string
	front      *Proxy
	etcd       *embed.Etcd
	maxRequest uint // etcd's --max-request-bytes; 0: etcd's default (1.5 MiB)
}

// Start runs a fresh etcd on two free loopback ports; it is stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartMaxRequest(t, 0)
}

// StartMaxRequest is Start with etcd's --max-request-bytes set to n (0: etcd's default,
// 1.5 MiB).
func StartMaxRequest(t testing.TB, n uint) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), clientAddr: freeAddr(t), peerAddr: freeAddr(t), maxRequest: n}
	s.front = NewProxy(t, s.clientAddr)
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Endpoint is the client address (host:port).
func (s *Server) Endpoint() string { return s.front.Addr() }

// Running reports whether the server is up.
func (s *Server) Running() bool { return s.etcd != nil }

// Stop stops the server (its data stays for Restart). Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.etcd == nil {
		return
	}
	s.front.Cut()
	s.etcd.Close()
	<-s.etcd.Server.StopNotify()
	s.etcd = nil
}

// Restart starts the server (again) on its address and data, and waits until it serves.
func (s *Server) Restart() {
	s.t.Helper()
	if s.etcd != nil {
		return
	}
	cfg := embed.NewConfig()
	cfg.Name = "tlgw-test"
	cfg.Dir = s.dir
	// Quiet: a stopped server logs its closed listeners as errors.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cu := url.URL{Scheme: "http", Host: s.clientAddr}
	pu := url.URL{Scheme: "http", Host: s.peerAddr}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.SocketOpts.ReuseAddress = true
	// A restarted single member elects itself at once, and small timeouts keep tests short.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	if s.maxRequest > 0 {
		cfg.MaxRequestBytes = s.maxRequest
	}
	// The previous run's listeners are closed (Stop waits for the server to stop) and the
	// sockets reuse their addresses, so a restart binds at once.
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		s.t.Fatalf("etcdtest: start: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		s.t.Fatal("etcdtest: etcd not ready within 30s")
	}
	s.etcd = e
	s.front.Restore()
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr())
}
