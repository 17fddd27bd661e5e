// Package kvzmq consumes engines' own KV-cache events (SPEC R22): vLLM's ZMQ PUB stream of
// msgpack batches (internal/vllmkv), from engines that bind (the gateway connects to each
// worker's advertised kv_events_endpoint) and from engines that connect (to [gateway.kv_events]
// listen), and turns them into router.KVEvents of the router's own block keys for
// precise_prefix's exact index.
//
// Connections are handled one by one with the ZMQ library's ZMTP codec
// (github.com/go-zeromq/zmq4 v0.17.0: zmq4.Open, Conn.RecvMsg) over connections this package
// dials and accepts itself, each guarded by internal/zmtpguard (bounded frames, frames per
// message, a handshake deadline), so that every message is known to come from one peer:
//
//   - Dialled (connect = true): the connection belongs to one worker; a batch whose topic does
//     not name that worker's HTTP address and model is refused.
//   - Accepted (listen): only from a live worker's host (its HTTP address's IP), at most
//     Options.MaxConns at once; a batch's topic must name a live worker whose HTTP host is the
//     connection's own remote IP, so an engine can only speak for workers on its own host.
//
// One owner per worker (a goroutine, owner.go) applies its batches in seq order through a
// vllmkv.Tracker (engine hash → router key, bounded by max_blocks_per_worker), behind a buffer
// of Options.Buffer batches: a batch that finds it full is dropped and the owner resyncs (as on
// a gap). A seq gap is filled from the worker's replay endpoint when it advertises one and
// replay is on; otherwise, or when the replay fails, the router forgets the worker's entries
// and they are rebuilt from new events. A seq that goes back (a restarted engine) clears too.
// A worker that leaves is forgotten (Forget: its owner and its connection stop).
package kvzmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/internal/zmtpguard"
)

// Sink takes the translated events: the router, through (*gateway.Gateway).KVEvents.
type Sink interface {
	KVEvents(ev *router.KVEvents)
}

// Options configure a Subscriber.
type Options struct {
	Sink      Sink
	Listen    string // host:port to accept engines on; "" = none
	Connect   bool   // dial each worker's advertised endpoint
	Replay    bool   // fill gaps from a worker's replay endpoint
	MaxBlocks int    // per worker (default 65536)
	Limits    vllmkv.Limits
	Clock     clock.Clock
	Logger    *slog.Logger
	// Registerer takes the metrics (nil: none registered).
	Registerer prometheus.Registerer
	// MaxConns bounds the accepted connections (default 4096).
	MaxConns int
	// Buffer is the batches waiting per worker (default 256).
	Buffer int
	// PieceIDs bounds the ids of one message to the router (default 128, as the gRPC events').
	PieceIDs int
	// Handshake bounds a connection's ZMTP handshake (default 5 s); DialTimeout a dial (5 s);
	// ReplayTimeout a whole replay (5 s); AnswerTimeout the router's answer to a message (5 s).
	Handshake, DialTimeout, ReplayTimeout, AnswerTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before redialling (100 ms, 10 s).
	MinBackoff, MaxBackoff time.Duration
}

// maxReplayBatches bounds the batches one replay may return (the sentinel aside).
const maxReplayBatches = 1 << 16

func (o *Options) defaults() {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxBlocks <= 0 {
		o.MaxBlocks = 65536
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 4096
	}
	if o.Buffer <= 0 {
		o.Buffer = 256
	}
	if o.PieceIDs <= 0 {
		o.PieceIDs = 128
	}
	for _, d := range []*time.Duration{&o.Handshake, &o.DialTimeout, &o.ReplayTimeout, &o.AnswerTimeout} {
		if *d <= 0 {
			*d = 5 * time.Second
		}
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(10*time.Second, o.MinBackoff)
	}
}

func (o *Options) guard() zmtpguard.Limits {
	payload := o.Limits.PayloadBytes
	if payload <= 0 {
		payload = vllmkv.DefaultPayloadBytes
	}
	return zmtpguard.Limits{
		MaxFrame: uint64(max(payload, vllmkv.MaxString, 8)), MaxCommand: 4096, MaxFrames: 4,
		Handshake: o.Handshake,
	}
}

type topicKey struct{ addr, model string }

// Subscriber keeps the owners and connections. Watch and Forget are called from the
// registry's goroutine (registry.Config.OnAccepted, OnEvict), as the gRPC subscriber's.
type Subscriber struct {
	o      Options
	m      *metrics
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ln     net.Listener

	mu sync.Mutex
	// owners: one per live worker that may publish (connect with an endpoint, or a listen
	// address), by id; byTopic the same owners by their topic's address and model, and hosts
	// the live workers' host IPs (a count each): all bounded by the live workers.
	owners  map[string]*owner
	byTopic map[topicKey]*owner
	hosts   map[netip.Addr]int
	// conns: accepted connections, at most o.MaxConns.
	conns  map[net.Conn]struct{}
	closed bool

	// fetch is the replay source the owners ask to fill a gap: replayFrom over the worker's
	// replay endpoint (tests of the owner's seq logic put a source without sockets here).
	fetch func(ctx context.Context, endpoint string, from uint64, f func(vllmkv.Batch) bool) error
}

// New returns a Subscriber, listening when o.Listen is set.
func New(o Options) (*Subscriber, error) {
	o.defaults()
	s := &Subscriber{o: o, m: newMetrics(o.Registerer), owners: map[string]*owner{},
		byTopic: map[topicKey]*owner{}, hosts: map[netip.Addr]int{}, conns: map[net.Conn]struct{}{}}
	s.fetch = func(ctx context.Context, endpoint string, from uint64, f func(vllmkv.Batch) bool) error {
		return replayFrom(ctx, s.o, endpoint, from, maxReplayBatches, f)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if o.Listen != "" {
		ln, err := net.Listen("tcp", o.Listen)
		if err != nil {
			return nil, fmt.Errorf("kv_events listen: %w", err)
		}
		s.ln = ln
		s.wg.Add(1)
		go s.accept()
	}
	return s, nil
}

// Addr is the listen address (nil when not listening).
func (s *Subscriber) Addr() net.Addr {
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Watch applies a worker's registration or heartbeat: it makes sure the worker has an owner
// (and, with connect, a connection to its advertised endpoint) when it may publish, and
// replaces it when its registration, address, model or endpoint changed.
func (s *Subscriber) Watch(info router.WorkerInfo) {
	ep, err := vllmkv.ParseEndpoint(info.KVEventsEndpoint)
	if err != nil {
		ep = vllmkv.Endpoint{} // validated at registration; never reached
	}
	dial := s.o.Connect && ep.Events != ""
	want := info.HTTPAddress != "" && (dial || s.ln != nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	cur := s.owners[info.ID]
	key := topicKey{info.HTTPAddress, info.Model}
	if cur != nil && want && cur.reg == info.Reg && cur.topic == key && cur.ep == ep {
		return // every heartbeat of a watched worker
	}
	if cur != nil {
		s.dropLocked(cur)
	}
	if !want {
		return
	}
	if other := s.byTopic[key]; other != nil {
		// Another id claims the same address and model (a stale registration): the newer wins.
		s.dropLocked(other)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	ow := newOwner(s, info.ID, info.Reg, key, ep, cancel)
	s.owners[info.ID], s.byTopic[key] = ow, ow
	if ip, ok := hostIP(info.HTTPAddress); ok {
		ow.host, ow.hasHost = ip, true
		s.hosts[ip]++
	}
	s.wg.Add(1)
	go ow.run(ctx)
	if dial {
		s.wg.Add(1)
		go s.dialLoop(ctx, ow)
	}
}

// Forget stops worker id's owner (evicted). Unknown ids are ignored.
func (s *Subscriber) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ow := s.owners[id]; ow != nil {
		s.dropLocked(ow)
	}
}

func (s *Subscriber) dropLocked(ow *owner) {
	ow.stop()
	delete(s.owners, ow.id)
	if s.byTopic[ow.topic] == ow {
		delete(s.byTopic, ow.topic)
	}
	if ow.hasHost {
		if s.hosts[ow.host]--; s.hosts[ow.host] <= 0 {
			delete(s.hosts, ow.host)
		}
	}
}

// Len is the owners and the accepted connections.
func (s *Subscriber) Len() (owners, conns int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owners), len(s.conns)
}

// Close stops everything and waits for every goroutine; later Watches do nothing.
func (s *Subscriber) Close() {
	s.mu.Lock()
	s.closed = true
	for _, ow := range s.owners {
		s.dropLocked(ow)
	}
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	if s.ln != nil {
		_ = s.ln.Close()
	}
	s.wg.Wait()
}

// hostIP is the IP of an HTTP address host:port whose host is an IP literal.
func hostIP(addr string) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

func remoteIP(c net.Conn) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// accept takes engines' connections to the listen address: only from a live worker's host,
// at most MaxConns at once; each is read by its own goroutine.
func (s *Subscriber) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.o.Logger.Warn("kv_events listen: accept failed; no more engine connections are taken", "err", err)
			return
		}
		ip, ok := remoteIP(c)
		s.mu.Lock()
		allowed := ok && s.hosts[ip] > 0 && len(s.conns) < s.o.MaxConns && !s.closed
		if allowed {
			s.conns[c] = struct{}{}
		}
		s.mu.Unlock()
		if !allowed {
			s.m.refused.Inc()
			_ = c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
			s.read(c, true, nil, ip)
		}()
	}
}

// dialLoop keeps a connection to ow's advertised endpoint until ctx ends, redialling with a
// doubling backoff.
func (s *Subscriber) dialLoop(ctx context.Context, ow *owner) {
	defer s.wg.Done()
	addr := strings.TrimPrefix(ow.ep.Events, "tcp://")
	backoff := s.o.MinBackoff
	for ctx.Err() == nil {
		d := net.Dialer{Timeout: s.o.DialTimeout}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			stop := context.AfterFunc(ctx, func() { _ = c.Close() })
			began := s.o.Clock.Now()
			s.read(c, false, ow, netip.Addr{})
			stop()
			_ = c.Close()
			if clock.Since(s.o.Clock, began) >= s.o.MaxBackoff {
				backoff = s.o.MinBackoff
			}
		}
		if ctx.Err() != nil {
			return
		}
		ow.connLost()
		if !wait(ctx, s.o.Clock, backoff) {
			return
		}
		backoff = min(2*backoff, s.o.MaxBackoff)
	}
}

// read runs one connection as a SUB: the ZMTP handshake, a subscription to every topic, then
// every message, decoded and handed to its worker's owner, until the connection fails. A
// dialled connection (ow set) only speaks for ow; an accepted one for workers on its host ip.
func (s *Subscriber) read(c net.Conn, server bool, ow *owner, ip netip.Addr) {
	g := zmtpguard.Wrap(c, s.o.guard(), s.o.Clock.Now())
	zc, err := zmq4.Open(g, null.Security(), zmq4.Sub, zmq4.SocketIdentity("tlgw"), server, nil)
	if err != nil {
		s.m.decodeErrors.Inc()
		return
	}
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil { // SUBSCRIBE to every topic
		return
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			if errors.Is(err, zmtpguard.ErrLimit) {
				s.m.decodeErrors.Inc()
				s.o.Logger.Warn("kv events: a connection broke a bound and was closed", "remote", c.RemoteAddr().String(), "err", err)
			}
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		b, err := vllmkv.DecodeMessage(msg.Frames, s.o.Limits)
		if err != nil {
			s.m.decodeErrors.Inc()
			continue
		}
		t, err := vllmkv.ParseTopic(b.Topic)
		if err != nil {
			s.m.decodeErrors.Inc()
			continue
		}
		dst := ow
		if dst == nil {
			tip, ok := hostIP(t.Addr)
			s.mu.Lock()
			dst = s.byTopic[topicKey{t.Addr, t.Model}]
			s.mu.Unlock()
			if !ok || tip != ip {
				dst = nil
			}
		} else if dst.topic != (topicKey{t.Addr, t.Model}) {
			dst = nil
		}
		if dst == nil {
			s.m.unknownTopic.Inc()
			continue
		}
		dst.deliver(b)
	}
}
