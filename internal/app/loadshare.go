package app

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/adapters/cluster"
	"github.com/tlgw/tlgw/adapters/replicaload"
	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
	"github.com/tlgw/tlgw/internal/config"
)

// Load sharing between replicas (R23, [cluster] load_share_interval): each replica streams its
// own in-flight requests per worker to every other live replica's registry port
// (adapters/replicaload.Sharer) and serves theirs (replicaload.Server), and its router counts
// them in the workers' loads (actors/router/replicas.go). The streams carry the fleet's peer
// secret, kept in etcd (cluster.Store.PeerSecret); until this replica has read it (etcd away
// at start), its service refuses streams with Unavailable and it shares nothing, and it tries
// again every secretRetry.

// secretRetry is how often a replica that could not read the peer secret tries again.
const secretRetry = 2 * time.Second

// tieSalt is the router's TieSalt: a random one per process with [cluster] (each replica its
// own order among equally loaded workers), 0 without.
func tieSalt(cluster bool) uint64 {
	if !cluster {
		return 0
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 1 // any salt still differs from id order; only replicas alike would share it
	}
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// shareRouter is the router as the exchange sees it.
type shareRouter struct{ gw *gateway.Gateway }

func (r shareRouter) OwnLoad(context.Context) ([]replicaload.WorkerLoad, error) {
	own, err := r.gw.OwnLoad()
	if err != nil {
		return nil, err
	}
	out := make([]replicaload.WorkerLoad, len(own.Loads))
	for i, l := range own.Loads {
		out[i] = replicaload.WorkerLoad{ID: l.ID, InFlight: l.InFlight}
	}
	return out, nil
}

func (r shareRouter) SetReplicaLoad(replica string, loads []replicaload.WorkerLoad) {
	out := make([]router.WorkerLoad, len(loads))
	for i, l := range loads {
		out[i] = router.WorkerLoad{ID: l.ID, InFlight: l.InFlight}
	}
	r.gw.ReplicaLoad(replica, out)
}

func (r shareRouter) ForgetReplica(replica string) { r.gw.ForgetReplica(replica) }

// lazyShare is the ReplicaLoad service registered on the registry's gRPC server before it
// serves: it answers Unavailable until the Server (which needs the peer secret) is set.
type lazyShare struct {
	replicav1.UnimplementedReplicaLoadServer
	srv atomic.Pointer[replicaload.Server]
}

func (l *lazyShare) Share(stream replicav1.ReplicaLoad_ShareServer) error {
	s := l.srv.Load()
	if s == nil {
		return status.Error(codes.Unavailable, "this replica has not read the peer secret yet")
	}
	return s.Share(stream)
}

// loadShare is this replica's side of the exchange: the service, and the sharer's goroutine
// once the secret is known (one goroutine in all: it reads the secret, then runs the sharer).
type loadShare struct {
	svc    *lazyShare
	cancel context.CancelFunc
	done   chan struct{}
}

// newLoadShare registers the service on gs; start begins the exchange.
func newLoadShare(gs *grpc.Server) *loadShare {
	ls := &loadShare{svc: &lazyShare{}}
	replicav1.RegisterReplicaLoadServer(gs, ls.svc)
	return ls
}

// start reads the peer secret (again every secretRetry until it is read or the exchange
// stops), then serves and shares.
func (ls *loadShare) start(a *App, store *cluster.Store) error {
	dial, err := peerDialOptions(a.cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	ls.cancel, ls.done = cancel, make(chan struct{})
	self := a.self.ID
	live := func(id string) bool {
		for _, r := range store.Replicas() {
			if r.ID == id {
				return true
			}
		}
		return false
	}
	peers := func() []replicaload.Peer {
		rs := store.Replicas()
		out := make([]replicaload.Peer, 0, len(rs))
		for _, r := range rs {
			if r.ID != self && r.GRPCAddress != "" {
				out = append(out, replicaload.Peer{ID: r.ID, Address: r.GRPCAddress})
			}
		}
		return out
	}
	rt := shareRouter{gw: a.Gateway}
	go func() {
		defer close(ls.done)
		var secret []byte
		for {
			s, err := store.PeerSecret(ctx)
			if err == nil {
				secret = s
				break
			}
			if ctx.Err() != nil {
				return
			}
			a.log.Warn("load sharing waits for the peer secret", "err", err, "retry", secretRetry)
			if !sleepOn(ctx, a, secretRetry) {
				return
			}
		}
		ls.svc.srv.Store(replicaload.NewServer(replicaload.Options{
			Self: self, Secret: secret, Live: live, Router: rt,
			Clock: a.clock, Logger: a.log, Registerer: a.Registry,
		}))
		replicaload.NewSharer(replicaload.SharerOptions{
			Self: self, Secret: secret, Router: rt, Peers: peers, DialOptions: dial,
			Interval: a.cfg.Cluster.LoadShareInterval,
			Clock:    a.clock, Logger: a.log, Registerer: a.Registry,
		}).Run(ctx)
	}()
	return nil
}

// stop ends the exchange and waits for its goroutine (its streams closed).
func (ls *loadShare) stop() {
	if ls == nil || ls.cancel == nil {
		return
	}
	ls.cancel()
	<-ls.done
}

// sleepOn waits d on the app's clock; false when ctx ended first.
func sleepOn(ctx context.Context, a *App, d time.Duration) bool {
	var once sync.Once
	wake := make(chan struct{})
	t := a.clock.AfterFunc(d, func() { once.Do(func() { close(wake) }) })
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-ctx.Done():
		return false
	}
}

// peerDialOptions is how a replica dials the others' registry ports: plaintext when the registry
// has no TLS; else TLS verified against the system roots and [registry] client_ca (one internal
// CA usually signs both), presenting this replica's registry certificate when the registry asks
// engines for one (client_ca set).
func peerDialOptions(cfg *config.Config) ([]grpc.DialOption, error) {
	r := cfg.Registry
	if r.TLSCert == "" {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if r.ClientCA != "" {
		pem, err := os.ReadFile(r.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("config: registry.client_ca: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, errors.New("config: registry.client_ca holds no PEM certificate")
		}
		cert, err := tls.LoadX509KeyPair(r.TLSCert, r.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("config: registry.tls_cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}, nil
}
