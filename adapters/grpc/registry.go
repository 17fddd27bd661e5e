// Package grpcapi is tlgw's gRPC surface: the WorkerRegistry service engines heartbeat to
// (SPEC B1), next to gRPC reflection and the standard health service on the same listener.
// Heartbeats are authenticated by registry tokens and/or client certificates (auth.go, R13.1)
// and validated before any state changes (ValidateWorkerStatus, R13.2).
package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// Registry is what the heartbeat handler needs of the actor tree (*gateway.Gateway has it).
type Registry interface {
	// HeartbeatAs registers or refreshes a worker for credential; a refusal wraps
	// registry.ErrIDTaken or registry.ErrTooManyWorkers.
	HeartbeatAs(ctx context.Context, credential string, info router.WorkerInfo, quotas ...registry.Quota) (*registry.Ack, error)
	HeartbeatInterval() time.Duration
}

// Limits of the registry's gRPC server (R13.2). A heartbeat is well under 1 KiB; an engine
// sends one at a time per gateway, so 100 concurrent streams per connection (the HTTP/2
// recommended minimum) leaves room for health checks and reflection.
const (
	MaxRecvMsgSize       = 64 << 10
	MaxConcurrentStreams = 100
)

// MaxOpenStreams bounds the streaming calls open at once on the listener, across all its
// connections; one more is refused with ResourceExhausted. Health's Watch and reflection are
// the only streaming calls here (Heartbeat is unary), neither asks for a credential, and each
// holds a goroutine and its buffers for as long as the peer keeps it open: without a bound, a
// peer could open 100 per connection on as many connections as it liked. An engine opens none,
// a health probe calls Check, and grpcurl needs one at a time.
const MaxOpenStreams = 64

// probeRoom is the calls and connections the registry listener keeps beyond what its engines
// need: health probes, grpcurl, bursts.
const probeRoom = 1024

// CallLimit is the calls the gateway's registry listener runs at once for max_workers engines
// (Options.MaxCalls): an engine sends one heartbeat at a time, and probeRoom more leave room
// for probes and bursts.
func CallLimit(maxWorkers int) int { return maxWorkers + probeRoom }

// ConnectionLimit is the connections the gateway's registry listener holds at once for
// max_workers engines (Options.MaxConnections): two per engine, since an engine that reconnects
// after its network dropped opens a new connection while the gateway may still hold the old one
// (a peer that vanished is noticed by the idle bound, up to 5 minutes later), and probeRoom for
// probes and grpcurl.
func ConnectionLimit(maxWorkers int) int { return 2*maxWorkers + probeRoom }

// Options configure the WorkerRegistry service.
type Options struct {
	// Auth is the registry's authentication; nil = open.
	Auth *Auth
	// Addresses are the host rules for heartbeated addresses ([registry] engine_cidrs).
	Addresses engineaddr.Rules
	// HandshakeTimeout bounds a new connection's TLS and HTTP/2 handshake (default
	// DefaultHandshakeTimeout): a client that connects and sends nothing is closed then.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes (GOAWAY) a connection that has run no call for this long (default
	// DefaultMaxConnectionIdle). An engine heartbeats every heartbeat_interval, so its
	// connection is idle that long only if it stopped; one that did comes back with a new one.
	MaxConnectionIdle time.Duration
	// MaxConnections bounds the connections the listener holds at once (0: no bound; the
	// gateway uses ConnectionLimit(max_workers)). One more waits in the kernel's accept
	// queue until a held connection closes (netutil.LimitListener): a flood of connections
	// can keep new ones waiting, but cannot make the gateway hold goroutines and buffers for
	// more than the bound. The handshake and idle bounds free a slot that a peer holds without
	// calling anything.
	MaxConnections int
	// MaxCalls bounds the Heartbeat calls the listener runs at once, across its connections
	// (0: no bound; the gateway uses CallLimit(max_workers)); one more is ResourceExhausted
	// before a byte of its message is read. A call holds its place from its headers to its
	// end, also while its message has not arrived: gRPC reads a request before any
	// interceptor runs, so without the bound a peer could stall 100 calls on each connection,
	// each a goroutine and its buffers. A heartbeat takes a place only once its credential is
	// checked (see gate), and its message must come within RecvTimeout.
	MaxCalls int
	// MaxProbeCalls bounds every other call at once (health, reflection, an unknown method; 0:
	// no bound; the gateway uses ProbeLimit): they need no credential, and have places of
	// their own so that they cannot take the heartbeats'.
	MaxProbeCalls int
	// MaxCallsPerPeer bounds the calls of one peer address at once, of either kind (0: no
	// bound; the gateway uses [registry] max_calls_per_peer).
	MaxCallsPerPeer int
	// MaxConnectionsPerPeer bounds the connections held from one peer address (0: no bound;
	// the gateway uses [registry] max_connections_per_peer); one more is closed as it is
	// accepted.
	MaxConnectionsPerPeer int
	// RecvTimeout is how long after its headers a call's first message may arrive (default
	// DefaultRecvTimeout); a call whose message has not come by then is ended (Canceled).
	RecvTimeout time.Duration
	// Clock times RecvTimeout (default clock.Real).
	Clock clock.Clock
}

// DefaultRecvTimeout: a heartbeat is under 1 KiB, sent at once after its headers; a second is
// room for a congested link, and bounds how long a peer can hold a place with a call whose
// message it never sends.
const DefaultRecvTimeout = time.Second

// ProbeLimit is the calls other than heartbeats the gateway's registry listener runs at once
// (Options.MaxProbeCalls): health probes, grpcurl, reflection.
const ProbeLimit = probeRoom

// The listener's connection bounds (R13.3) when Options leaves them zero. gRPC's own defaults
// are a 120 s handshake and no idle limit: a peer could hold connections that do nothing for
// as long as it likes.
const (
	DefaultHandshakeTimeout  = 10 * time.Second
	DefaultMaxConnectionIdle = 5 * time.Minute
)

// bounds is o's handshake and idle bounds, defaults filled in.
func (o Options) bounds() (handshake, idle time.Duration) {
	handshake, idle = o.HandshakeTimeout, o.MaxConnectionIdle
	if handshake <= 0 {
		handshake = DefaultHandshakeTimeout
	}
	if idle <= 0 {
		idle = DefaultMaxConnectionIdle
	}
	return handshake, idle
}

// connectionBounds is the server options for o's connection bounds.
func (o Options) connectionBounds() []grpc.ServerOption {
	hs, idle := o.bounds()
	return []grpc.ServerOption{grpc.ConnectionTimeout(hs), grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle})}
}

// Server implements controlv1.WorkerRegistryServer over the registry actor.
type Server struct {
	controlv1.UnimplementedWorkerRegistryServer
	reg Registry
	o   Options
}

var _ controlv1.WorkerRegistryServer = (*Server)(nil)

// NewServer returns the WorkerRegistry service.
func NewServer(reg Registry, o Options) *Server { return &Server{reg: reg, o: o} }

// Heartbeat authenticates the caller (Unauthenticated), validates the status
// (InvalidArgument), checks the token's grant (PermissionDenied) and hands it to the registry
// actor, which refuses an id bound to another credential (PermissionDenied) or a new id
// beyond max_workers (ResourceExhausted). A refused heartbeat changes nothing.
func (s *Server) Heartbeat(ctx context.Context, st *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	who, ok := ctx.Value(callerKey{}).(caller) // the listener's tap checked it
	if !ok {
		var err error
		if who, err = s.o.Auth.authenticate(ctx); err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
	}
	info, err := ValidateWorkerStatus(st, s.o.Addresses)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := who.permit(info.ID, info.Model, info.LoRAAdapters); err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	ack, err := s.reg.HeartbeatAs(ctx, who.credential, info, who.quotas...)
	if err != nil {
		return nil, status.Error(heartbeatCode(err), err.Error())
	}
	return &controlv1.HeartbeatAck{
		Drain:               ack.Drain,
		Epoch:               ack.Epoch,
		HeartbeatIntervalMs: uint32(s.reg.HeartbeatInterval() / time.Millisecond),
	}, nil
}

// heartbeatCode maps the registry's refusals to gRPC codes.
func heartbeatCode(err error) codes.Code {
	switch {
	case errors.Is(err, registry.ErrIDTaken):
		return codes.PermissionDenied
	case errors.Is(err, registry.ErrTooManyWorkers):
		return codes.ResourceExhausted
	default:
		return codes.Unavailable
	}
}

// MaxField is the longest worker_id or model accepted, in bytes.
const MaxField = 256

// MaxBlockSize is the largest block_size (tokens per KV block) a heartbeat may report; 0 means
// unknown and is accepted.
const MaxBlockSize = 1 << 20

// ValidateWorkerStatus turns a WorkerStatus into the registry's form (R13.2), rejecting an
// empty or over-long (> 256 bytes) id or model, an http_address (required), grpc_address or
// kv_address (optional) that breaks the engine address rules of engineaddr (host:port, no
// scheme, path, query, userinfo or unix:, no link-local or unspecified IP, inside
// engine_cidrs), negative counts, more free KV blocks than total, a block_size over
// MaxBlockSize (0 = unknown is accepted), and unknown roles.
// ROLE_UNSPECIFIED is read as unified: an engine that predates roles serves both phases.
func ValidateWorkerStatus(st *controlv1.WorkerStatus, rules engineaddr.Rules) (router.WorkerInfo, error) {
	var errs []error
	for _, f := range []struct{ name, v string }{{"worker_id", st.GetWorkerId()}, {"model", st.GetModel()}} {
		switch {
		case f.v == "":
			errs = append(errs, fmt.Errorf("%s is empty", f.name))
		case len(f.v) > MaxField:
			errs = append(errs, fmt.Errorf("%s is longer than %d bytes", f.name, MaxField))
		}
	}
	for _, a := range []struct {
		name, v  string
		required bool
	}{
		{"http_address", st.GetHttpAddress(), true},
		{"grpc_address", st.GetGrpcAddress(), false},
		{"kv_address", st.GetKvAddress(), false},
	} {
		if a.v == "" && !a.required {
			continue
		}
		if err := rules.HostPort(a.v); err != nil {
			errs = append(errs, fmt.Errorf("%s %w", a.name, err))
		}
	}
	for _, c := range []struct {
		name string
		v    int32
	}{
		{"queue_depth", st.GetQueueDepth()}, {"running", st.GetRunning()},
		{"kv_free_blocks", st.GetKvFreeBlocks()}, {"kv_total_blocks", st.GetKvTotalBlocks()},
	} {
		if c.v < 0 {
			errs = append(errs, fmt.Errorf("%s is negative (%d)", c.name, c.v))
		}
	}
	if st.GetKvTotalBlocks() > 0 && st.GetKvFreeBlocks() > st.GetKvTotalBlocks() {
		errs = append(errs, fmt.Errorf("kv_free_blocks (%d) exceeds kv_total_blocks (%d)", st.GetKvFreeBlocks(), st.GetKvTotalBlocks()))
	}
	if st.GetBlockSize() > MaxBlockSize {
		errs = append(errs, fmt.Errorf("block_size (%d) exceeds %d tokens per KV block", st.GetBlockSize(), MaxBlockSize))
	}
	adapters, err := ValidateLoRAAdapters(st.GetLoraAdapters(), st.GetModel())
	if err != nil {
		errs = append(errs, err)
	}
	if st.GetMaxLoras() > router.MaxLoRAAdapters {
		errs = append(errs, fmt.Errorf("max_loras (%d) exceeds %d", st.GetMaxLoras(), router.MaxLoRAAdapters))
	}
	endpoints, _, err := oai.ParseEndpoints(st.GetEndpoints())
	if err != nil {
		errs = append(errs, err)
	}
	if _, err := vllmkv.ParseEndpoint(st.GetKvEventsEndpoint()); err != nil {
		errs = append(errs, err)
	}
	var role router.Role
	switch st.GetRole() {
	case controlv1.Role_ROLE_UNSPECIFIED, controlv1.Role_ROLE_UNIFIED:
		role = router.RoleUnified
	case controlv1.Role_ROLE_PREFILL:
		role = router.RolePrefill
	case controlv1.Role_ROLE_DECODE:
		role = router.RoleDecode
	default:
		errs = append(errs, fmt.Errorf("role %d is unknown", st.GetRole()))
	}
	if len(errs) > 0 {
		return router.WorkerInfo{}, fmt.Errorf("invalid heartbeat: %w", errors.Join(errs...))
	}
	return router.WorkerInfo{
		ID: st.GetWorkerId(), Model: st.GetModel(), Role: role,
		HTTPAddress: st.GetHttpAddress(), GRPCAddress: st.GetGrpcAddress(), KVAddress: st.GetKvAddress(),
		KVFormat: st.GetKvFormat(), QueueDepth: int64(st.GetQueueDepth()), Running: int64(st.GetRunning()),
		KVFreeBlocks: int64(st.GetKvFreeBlocks()), KVTotalBlocks: int64(st.GetKvTotalBlocks()),
		BlockSize: int64(st.GetBlockSize()), Draining: st.GetDraining(), KVEvents: st.GetKvEvents(),
		LoRAAdapters: adapters, MaxLoRAs: int(st.GetMaxLoras()), Endpoints: endpoints,
		KVEventsEndpoint: st.GetKvEventsEndpoint(),
	}, nil
}

// ValidateLoRAAdapters checks a worker's LoRA adapter names (R21): at most
// router.MaxLoRAAdapters, each 1 to MaxField printable ASCII bytes without spaces, none
// repeated and none equal to the base model. It returns them sorted (nil for none), in a new
// slice.
func ValidateLoRAAdapters(names []string, model string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	if len(names) > router.MaxLoRAAdapters {
		return nil, fmt.Errorf("lora_adapters lists %d adapters, more than %d", len(names), router.MaxLoRAAdapters)
	}
	out := slices.Clone(names)
	for _, n := range out {
		if !oai.ValidName(n) {
			return nil, fmt.Errorf("lora_adapters: an adapter name must be 1 to %d printable ASCII bytes without spaces", MaxField)
		}
		if n == model {
			return nil, fmt.Errorf("lora_adapters names the base model %q", n)
		}
	}
	slices.Sort(out)
	for i := 1; i < len(out); i++ {
		if out[i] == out[i-1] {
			return nil, fmt.Errorf("lora_adapters lists %q twice", out[i])
		}
	}
	return out, nil
}

// Listener is the registry's gRPC server: WorkerRegistry, reflection and health.
type Listener struct {
	Server  *grpc.Server
	Health  *health.Server
	conns   int // Options.MaxConnections
	perPeer int // Options.MaxConnectionsPerPeer
	streams *streams
	gate    *gate
	peers   *peerListener // set by Serve when perPeer > 0
}

// NewListener builds the gRPC server with the three services registered and health SERVING,
// capped at MaxRecvMsgSize per message, MaxConcurrentStreams per connection and MaxOpenStreams
// streaming calls in all, with o's handshake and idle bounds on each connection and its
// MaxConnections on the listener. TLS, when
// configured, comes in opts (grpc.Creds). Calls run on a set of stream workers (grpc's
// NumStreamWorkers: a call goes to a new goroutine only when all are busy), so a heartbeat does
// not pay for a fresh goroutine growing its stack: at 5,000 heartbeats a second that growth was
// 8% of the gateway's CPU.
func NewListener(reg Registry, o Options, opts ...grpc.ServerOption) *Listener {
	st := newStreams(MaxOpenStreams)
	g := newGate(o)
	bounds := append(o.connectionBounds(), grpc.InTapHandle(g.tap),
		grpc.ChainUnaryInterceptor(g.unary), grpc.ChainStreamInterceptor(g.stream, st.intercept))
	opts = append(append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize), grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.NumStreamWorkers(uint32(max(8, 4*runtime.GOMAXPROCS(0)))),
	}, bounds...), opts...)
	gs := grpc.NewServer(opts...)
	controlv1.RegisterWorkerRegistryServer(gs, NewServer(reg, o))
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(controlv1.WorkerRegistry_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return &Listener{Server: gs, Health: hs, conns: o.MaxConnections, perPeer: o.MaxConnectionsPerPeer, streams: st, gate: g}
}

// streams are the listener's streaming calls: at most n open at once, and ended when it stops.
type streams struct {
	open    chan struct{}
	stopped context.Context
	stop    context.CancelFunc
}

func newStreams(n int) *streams {
	ctx, cancel := context.WithCancel(context.Background())
	return &streams{open: make(chan struct{}, n), stopped: ctx, stop: cancel}
}

// intercept refuses a streaming call while the bound is reached, and runs it with a context
// that also ends when the listener stops (health's Watch returns then; it would otherwise run
// for as long as its peer likes).
func (s *streams) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	select {
	case s.open <- struct{}{}:
	default:
		return status.Errorf(codes.ResourceExhausted, "too many open streams: at most %d at once", cap(s.open))
	}
	defer func() { <-s.open }()
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	defer context.AfterFunc(s.stopped, cancel)()
	return h(srv, ctxStream{ServerStream: ss, ctx: ctx})
}

// ctxStream is a server stream with its own context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

// Serve serves on lis until Stop, holding at most Options.MaxConnections connections at once,
// and Options.MaxConnectionsPerPeer of them from one address.
func (l *Listener) Serve(lis net.Listener) error {
	if l.perPeer > 0 {
		l.peers = &peerListener{Listener: lis, max: l.perPeer, conns: map[netip.Addr]int{}}
		lis = l.peers
	}
	if l.conns > 0 {
		lis = netutil.LimitListener(lis, l.conns)
	}
	return l.Server.Serve(lis)
}

// Stop stops serving: health turns NOT_SERVING, open streaming calls are ended, calls in
// flight (heartbeats) may finish until ctx ends, and then every connection is closed. It
// returns when the server has stopped. GracefulStop alone waits for every open stream, and a
// peer that keeps one open (a reflection stream whose peer sends nothing more) would hold the
// gateway's shutdown for good.
func (l *Listener) Stop(ctx context.Context) {
	l.Health.Shutdown()
	l.streams.stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Server.GracefulStop()
	}()
	select {
	case <-done:
	case <-ctx.Done():
		l.Server.Stop()
		<-done
	}
}
