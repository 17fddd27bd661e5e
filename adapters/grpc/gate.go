package grpcapi

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/clock"
)

// heartbeatMethod is the one call that needs a credential and that engines make.
var heartbeatMethod = "/" + controlv1.WorkerRegistry_ServiceDesc.ServiceName + "/Heartbeat"

// errNoMessage ends a call whose first message did not arrive within Options.RecvTimeout.
var errNoMessage = errors.New("the call's message did not arrive in time")

// gate admits the listener's calls (R20). It runs in the transport's tap, when a call's headers
// have arrived and before a byte of its message is read, so a call that is refused holds
// nothing:
//   - a Heartbeat must carry a credential the registry accepts (Unauthenticated otherwise): a
//     peer without one cannot take the places engines need;
//   - heartbeats and every other call (health, reflection, an unknown method) have places of
//     their own (MaxCalls, MaxProbeCalls), so probes cannot crowd out heartbeats;
//   - one peer address runs at most MaxCallsPerPeer calls of either kind;
//   - a call's first message must arrive within RecvTimeout of its headers, or its context is
//     ended (gRPC reads the message under that context), which frees its place.
//
// A place is given back when the call returns through the interceptors (the common case: the
// context's AfterFunc is stopped, no goroutine runs), else when its context ends: gRPC ends it
// on every way a stream ends (finished, reset, its connection closed, aborted right after the
// tap), which covers a call whose message never came, an unknown method and a malformed
// message. The tap runs under the transport's lock: it does nothing that can wait (one short
// mutex section).
type gate struct {
	auth  *Auth
	clock clock.Clock
	recv  time.Duration
	// heartbeats and probes are the places of Heartbeat calls and of every other call (nil:
	// unbounded).
	heartbeats, probes chan struct{}
	perPeer            int

	mu sync.Mutex
	// peers: the calls each peer address runs now; an address leaves when its last call
	// ends, so the map is bounded by the calls in flight (at most MaxCalls + MaxProbeCalls).
	// The key is the address the connection comes from, which the peer cannot choose beyond
	// the addresses it holds.
	peers map[netip.Addr]int
}

func newGate(o Options) *gate {
	g := &gate{auth: o.Auth, clock: o.Clock, recv: o.RecvTimeout, perPeer: o.MaxCallsPerPeer, peers: map[netip.Addr]int{}}
	if g.clock == nil {
		g.clock = clock.Real{}
	}
	if g.recv <= 0 {
		g.recv = DefaultRecvTimeout
	}
	if o.MaxCalls > 0 {
		g.heartbeats = make(chan struct{}, o.MaxCalls)
	}
	if o.MaxProbeCalls > 0 {
		g.probes = make(chan struct{}, o.MaxProbeCalls)
	}
	return g
}

// callerKey is the context key of an authenticated Heartbeat's caller (set by the tap, read by
// the handler, which so does not check the credential twice).
type callerKey struct{}

// callKey is the context key of a call's *call.
type callKey struct{}

// call is one admitted call's hold on the gate.
type call struct {
	g     *gate
	peer  netip.Addr
	pool  chan struct{}
	timer clock.Timer
	// stop stops the AfterFunc that frees the call when its context ends; true = it had not
	// run, so the caller frees it.
	stop func() bool
}

// free gives the call's places back.
func (c *call) free() {
	c.timer.Stop()
	c.g.mu.Lock()
	if n := c.g.peers[c.peer] - 1; n > 0 {
		c.g.peers[c.peer] = n
	} else {
		delete(c.g.peers, c.peer)
	}
	c.g.mu.Unlock()
	if c.pool != nil {
		<-c.pool
	}
}

// received: the call's first message has arrived (or its read ended); its receive deadline is
// over.
func (c *call) received() { c.timer.Stop() }

// done: the call returned through the interceptors; free it unless its context's end did.
func (c *call) done() {
	if c.stop() {
		c.free()
	}
}

// peerAddr is the address a call's connection comes from (the zero Addr for a transport
// without an IP, which all such calls share).
func peerAddr(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return netip.Addr{}
	}
	return addrOf(p.Addr)
}

func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

func (g *gate) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	hb := info.FullMethodName == heartbeatMethod
	pool := g.probes
	if hb {
		pool = g.heartbeats
		if !g.auth.Open() {
			who, err := g.auth.authenticate(ctx)
			if err != nil {
				return nil, status.Error(codes.Unauthenticated, err.Error())
			}
			ctx = context.WithValue(ctx, callerKey{}, who)
		}
	}
	ip := peerAddr(ctx)
	g.mu.Lock()
	if g.perPeer > 0 && g.peers[ip] >= g.perPeer {
		g.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "too many calls from one address: at most %d at once", g.perPeer)
	}
	if pool != nil {
		select {
		case pool <- struct{}{}:
		default:
			g.mu.Unlock()
			return nil, status.Errorf(codes.ResourceExhausted, "too many calls: at most %d at once", cap(pool))
		}
	}
	g.peers[ip]++
	g.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	c := &call{g: g, peer: ip, pool: pool}
	c.timer = g.clock.AfterFunc(g.recv, func() { cancel(errNoMessage) })
	c.stop = context.AfterFunc(ctx, c.free)
	return context.WithValue(ctx, callKey{}, c), nil
}

func callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// unary runs after gRPC has read the call's message.
func (g *gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if c := callOf(ctx); c != nil {
		c.received()
		defer c.done()
	}
	return h(ctx, req)
}

// stream runs before a streaming call's handler reads its first message: the deadline ends
// when that read does.
func (g *gate) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	c := callOf(ss.Context())
	if c == nil {
		return h(srv, ss)
	}
	defer c.done()
	return h(srv, &firstRecv{ServerStream: ss, c: c})
}

// firstRecv ends its call's receive deadline when its first read returns.
type firstRecv struct {
	grpc.ServerStream
	c    *call
	read bool
}

func (s *firstRecv) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if !s.read {
		s.read = true
		s.c.received()
	}
	return err
}

// peerListener holds at most max connections from one peer address (Options.MaxConnectionsPerPeer):
// one more is closed as it is accepted.
type peerListener struct {
	net.Listener
	max int
	mu  sync.Mutex
	// conns: the connections held from each address; an address leaves with its last
	// connection, so the map is bounded by the connections held (Options.MaxConnections).
	conns map[netip.Addr]int
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := addrOf(c.RemoteAddr())
		l.mu.Lock()
		if l.conns[ip] >= l.max {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.conns[ip]++
		l.mu.Unlock()
		return &peerConn{Conn: c, l: l, ip: ip}, nil
	}
}

// peerConn gives its place back on its first Close.
type peerConn struct {
	net.Conn
	l    *peerListener
	ip   netip.Addr
	once sync.Once
}

func (c *peerConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		if n := c.l.conns[c.ip] - 1; n > 0 {
			c.l.conns[c.ip] = n
		} else {
			delete(c.l.conns, c.ip)
		}
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
