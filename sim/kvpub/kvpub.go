// Package kvpub is tlengine's publisher of vLLM-format KV-cache events (SPEC R22, ENGINES.md §1):
// a ZMQ PUB that binds (subscribers dial it) or connects (to one consumer's SUB, redialled while
// the consumer is absent), sending each batch as three frames — topic, seq (8 bytes,
// big-endian), msgpack payload — and, optionally, a replay ROUTER answering a DEALER's
// [empty, start_seq] with every retained batch whose seq ≥ start_seq, then a sentinel
// (seq 2^64−1, empty payload).
//
// Publish never waits: it numbers the batch and queues it for the publisher's goroutine, which
// encodes it, keeps it for replay and hands it to each subscribed connection's own bounded
// queue. A batch that finds the queue full is dropped whole, its seq consumed, so subscribers see
// a gap (and a replay cannot fill it: it was never retained); a subscriber whose queue is full
// misses that batch alone (a gap a replay can fill). Withhold makes the next batch skip the live
// connections while it is still retained: a gap on demand, for tests.
//
// Connections are handled one by one with the ZMQ library's ZMTP codec (github.com/go-zeromq/zmq4
// v0.17.0: zmq4.Open) over connections this package accepts and dials itself, each read through
// internal/zmtpguard (a subscriber may only send short subscription messages, a replay client
// two-frame requests; a handshake has a deadline) and each write bounded by WriteTimeout, so a
// peer can neither make the engine allocate nor stall it. Peers are not expected to send ZMTP
// PINGs (zmq4 answers one from the reading goroutine, which could interleave with a message
// being written; neither the gateway nor libzmq without heartbeat options sends them).
package kvpub

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/internal/zmtpguard"
)

// Options configure a Publisher. Zero values take the defaults named.
type Options struct {
	// Addr is where the PUB binds (Bind: host:port, "*" for every interface, port 0 for any
	// free port) or connects (!Bind: the consumer's fixed host:port).
	Addr string
	Bind bool
	// Topic is every batch's topic (kv@HOST:PORT@MODEL).
	Topic  string
	Format vllmkv.Format
	// Replay is the replay ROUTER's bind address ("" = none), as Addr when binding.
	Replay string
	// ReplayTopic: replay answers are [empty, topic, seq, payload] (sentinel [empty, "", seq,
	// ""]); without it vLLM's [empty, seq, payload] (sentinel [empty, seq, ""]).
	ReplayTopic bool
	// Retain bounds the batches kept for replay (1024) and RetainBytes their payloads (64 MiB).
	Retain, RetainBytes int
	// Queue bounds the batches waiting for the publisher's goroutine (1024), ConnQueue the
	// messages waiting for one subscriber (256).
	Queue, ConnQueue int
	// MaxConns bounds the subscribers (bind) and, separately, the replay clients (64 each).
	MaxConns int
	// Redial is the wait between dials when connecting (500 ms); WriteTimeout bounds one
	// message's write to a peer and a handshake (5 s).
	Redial, WriteTimeout time.Duration
	Clock                clock.Clock
	Logger               *slog.Logger
}

// maxTopics bounds the subscriptions one subscriber may hold.
const maxTopics = 64

func (o *Options) defaults() {
	if o.Retain <= 0 {
		o.Retain = 1024
	}
	if o.RetainBytes <= 0 {
		o.RetainBytes = 64 << 20
	}
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	if o.ConnQueue <= 0 {
		o.ConnQueue = 256
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 64
	}
	if o.Redial <= 0 {
		o.Redial = 500 * time.Millisecond
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Stats count what the publisher did.
type Stats struct {
	Published uint64 // batches encoded and retained
	Dropped   uint64 // batches dropped whole: the queue was full (their seqs were consumed)
	Withheld  uint64 // batches kept from the live connections by Withhold
	Lagged    uint64 // messages one subscriber missed: its own queue was full
}

// Publisher is a running PUB (and replay ROUTER).
type Publisher struct {
	o      Options
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ln     net.Listener // bind mode
	rln    net.Listener // replay

	mu       sync.Mutex // next, withhold, closed; a send on in never waits
	next     uint64
	withhold int
	closed   bool
	// in: batches numbered but not yet encoded, at most o.Queue.
	in chan pending

	published, dropped, withheld, lagged atomic.Uint64

	connMu sync.Mutex
	// subs: the live subscriber connections (bind: at most o.MaxConns; connect: one); replays
	// the replay clients' connections (at most o.MaxConns).
	subs    map[*sub]struct{}
	replays map[net.Conn]struct{}

	ring ring
}

type pending struct {
	seq      uint64
	ts       float64
	events   []vllmkv.Event
	withhold bool
}

// Start opens the publisher: it binds (or starts dialling) and binds the replay endpoint.
func Start(o Options) (*Publisher, error) {
	o.defaults()
	if _, err := vllmkv.ParseTopic(o.Topic); err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	if err := CheckAddr(o.Addr, o.Bind); err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	p := &Publisher{o: o, in: make(chan pending, o.Queue), subs: map[*sub]struct{}{},
		replays: map[net.Conn]struct{}{}, ring: newRing(o.Retain, o.RetainBytes)}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	var err error
	if o.Bind {
		if p.ln, err = net.Listen("tcp", listenAddr(o.Addr)); err != nil {
			return nil, fmt.Errorf("kv events: listen %s: %w", o.Addr, err)
		}
	}
	if o.Replay != "" {
		if err = CheckAddr(o.Replay, true); err == nil {
			p.rln, err = net.Listen("tcp", listenAddr(o.Replay))
		}
		if err != nil {
			if p.ln != nil {
				p.ln.Close()
			}
			return nil, fmt.Errorf("kv events replay: %w", err)
		}
	}
	p.wg.Add(1)
	go p.run()
	if o.Bind {
		p.wg.Add(1)
		go p.accept(p.ln, false)
	} else {
		p.wg.Add(1)
		go p.dialLoop()
	}
	if p.rln != nil {
		p.wg.Add(1)
		go p.accept(p.rln, true)
	}
	return p, nil
}

// CheckAddr checks a bind (host or "*", port 0–65535) or connect (a host, port 1–65535) address.
func CheckAddr(addr string, bind bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not HOST:PORT", addr)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || host == "" || strings.ContainsAny(host, "/@?# ") {
		return fmt.Errorf("%q is not HOST:PORT", addr)
	}
	if !bind && (host == "*" || n == 0) {
		return fmt.Errorf("%q: a connect address needs a host (not *) and a fixed port", addr)
	}
	return nil
}

func listenAddr(addr string) string {
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "*" {
		return net.JoinHostPort("", port)
	}
	return addr
}

// EventsAddr is the PUB's bound address ("" when connecting).
func (p *Publisher) EventsAddr() string {
	if p.ln == nil {
		return ""
	}
	return p.ln.Addr().String()
}

// ReplayAddr is the replay ROUTER's bound address ("" when none).
func (p *Publisher) ReplayAddr() string {
	if p.rln == nil {
		return ""
	}
	return p.rln.Addr().String()
}

// Subscribers is how many live connections subscribe to the topic.
func (p *Publisher) Subscribers() int {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	n := 0
	for s := range p.subs {
		if s.subscribed(p.o.Topic) {
			n++
		}
	}
	return n
}

// Stats reads the counters.
func (p *Publisher) Stats() Stats {
	return Stats{Published: p.published.Load(), Dropped: p.dropped.Load(), Withheld: p.withheld.Load(), Lagged: p.lagged.Load()}
}

// Publish numbers a batch of events and queues it; it never waits (it runs inside the engine's
// pool calls). A full queue drops the batch, its seq consumed. events are kept.
func (p *Publisher) Publish(events []vllmkv.Event) {
	ts := float64(p.o.Clock.Now().UnixNano()) / 1e9
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	b := pending{seq: p.next, ts: ts, events: events}
	p.next++
	if p.withhold > 0 {
		p.withhold--
		b.withhold = true
	}
	select {
	case p.in <- b:
	default:
		p.dropped.Add(1)
	}
}

// NextSeq is the seq the next batch will take: every batch numbered so far is below it.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// Withhold keeps the next batch from the live connections (it is still retained for replay):
// subscribers see its seq skipped. Calls add up.
func (p *Publisher) Withhold() {
	p.mu.Lock()
	p.withhold++
	p.mu.Unlock()
}

// Close stops everything and waits for every goroutine; later Publishes do nothing.
func (p *Publisher) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel() // closes every connection (context.AfterFunc where each was taken)
	if p.ln != nil {
		p.ln.Close()
	}
	if p.rln != nil {
		p.rln.Close()
	}
	p.wg.Wait()
}

// run encodes the queued batches in seq order, retains them and fans them out.
func (p *Publisher) run() {
	defer p.wg.Done()
	for {
		select {
		case <-p.ctx.Done():
			return
		case b := <-p.in:
			frames, err := vllmkv.EncodeMessage(vllmkv.Batch{Topic: p.o.Topic, Seq: b.seq, TS: b.ts, Events: b.events, Rank: -1}, p.o.Format)
			if err != nil {
				p.dropped.Add(1)
				p.o.Logger.Warn("kv events: a batch could not be encoded", "seq", b.seq, "err", err)
				continue
			}
			p.ring.add(retained{seq: b.seq, payload: frames[2]})
			p.published.Add(1)
			if b.withhold {
				p.withheld.Add(1)
				continue
			}
			p.fanout(frames)
		}
	}
}

func (p *Publisher) fanout(frames [][]byte) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	for s := range p.subs {
		if !s.subscribed(p.o.Topic) {
			continue
		}
		select {
		case s.out <- frames:
		default:
			p.lagged.Add(1)
		}
	}
}

// accept takes subscribers (replay false) or replay clients, at most MaxConns of each at once
// (counting those still in their handshake); one past the bound is closed at once.
func (p *Publisher) accept(ln net.Listener, replay bool) {
	defer p.wg.Done()
	slots := make(chan struct{}, p.o.MaxConns) // one per connection being served
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.ctx.Err() == nil {
				p.o.Logger.Warn("kv events: accept failed; no more connections are taken", "err", err)
			}
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-slots }()
			stop := context.AfterFunc(p.ctx, func() { c.Close() }) // Close cuts a handshake too
			defer stop()
			defer c.Close()
			if replay {
				p.serveReplay(c)
			} else {
				p.serveSub(c, true)
			}
		}()
	}
}

// dialLoop keeps one connection to the consumer, redialling every Redial while it is absent.
func (p *Publisher) dialLoop() {
	defer p.wg.Done()
	for p.ctx.Err() == nil {
		d := net.Dialer{Timeout: p.o.WriteTimeout}
		c, err := d.DialContext(p.ctx, "tcp", p.o.Addr)
		if err == nil {
			stop := context.AfterFunc(p.ctx, func() { c.Close() })
			p.serveSub(c, false)
			stop()
			c.Close()
		}
		if !p.wait(p.o.Redial) {
			return
		}
	}
}

func (p *Publisher) wait(d time.Duration) bool {
	done := make(chan struct{})
	t := p.o.Clock.AfterFunc(d, func() { close(done) })
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-p.ctx.Done():
		return false
	}
}

// sub is one subscriber connection.
type sub struct {
	raw net.Conn
	zc  *zmq4.Conn
	// out: messages waiting for this subscriber, at most Options.ConnQueue.
	out chan [][]byte
	mu  sync.Mutex
	// topics: the subscribed prefixes, at most maxTopics.
	topics map[string]struct{}
}

func (s *sub) subscribed(topic string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.topics {
		if strings.HasPrefix(topic, k) {
			return true
		}
	}
	return false
}

// register adds a live connection: s when a subscriber, c when a replay client. It refuses past
// MaxConns and after Close.
func (p *Publisher) register(s *sub, c net.Conn) bool {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.ctx.Err() != nil {
		return false
	}
	if s != nil {
		if len(p.subs) >= p.o.MaxConns {
			return false
		}
		p.subs[s] = struct{}{}
		return true
	}
	if len(p.replays) >= p.o.MaxConns {
		return false
	}
	p.replays[c] = struct{}{}
	return true
}

// handshake runs the ZMTP handshake of a socket of type typ on c, reading through a guard
// that lets the peer send at most maxFrames frames of maxFrame bytes per message.
func (p *Publisher) handshake(c net.Conn, typ zmq4.SocketType, server bool, maxFrame uint64, maxFrames int) (*zmq4.Conn, error) {
	now := p.o.Clock.Now()
	g := zmtpguard.Wrap(c, zmtpguard.Limits{MaxFrame: maxFrame, MaxCommand: 4096, MaxFrames: maxFrames, Handshake: p.o.WriteTimeout}, now)
	_ = c.SetWriteDeadline(now.Add(p.o.WriteTimeout))
	zc, err := zmq4.Open(g, null.Security(), typ, nil, server, nil)
	_ = c.SetWriteDeadline(time.Time{})
	return zc, err
}

// serveSub runs one subscriber connection until it fails: its subscriptions are read here,
// its messages written by a goroutine of its own.
func (p *Publisher) serveSub(c net.Conn, server bool) {
	// A subscription is one frame: 1 or 0, then a topic prefix of at most MaxString bytes.
	zc, err := p.handshake(c, zmq4.Pub, server, vllmkv.MaxString+1, 1)
	if err != nil {
		p.o.Logger.Debug("kv events: a subscriber's handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	s := &sub{raw: c, zc: zc, out: make(chan [][]byte, p.o.ConnQueue), topics: map[string]struct{}{}}
	if !p.register(s, nil) {
		return
	}
	defer func() {
		p.connMu.Lock()
		delete(p.subs, s)
		p.connMu.Unlock()
	}()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.write(s, done)
	}()
	defer wg.Wait()
	defer close(done)
	defer c.Close() // ends a write in flight
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue
		}
		f := msg.Frames[0]
		s.mu.Lock()
		switch {
		case f[0] == 0:
			delete(s.topics, string(f[1:]))
		case f[0] == 1 && len(s.topics) < maxTopics:
			s.topics[string(f[1:])] = struct{}{}
		}
		s.mu.Unlock()
	}
}

// write sends s's queued messages, each within WriteTimeout (a slower peer is cut), until done.
func (p *Publisher) write(s *sub, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case frames := <-s.out:
			_ = s.raw.SetWriteDeadline(p.o.Clock.Now().Add(p.o.WriteTimeout))
			if err := s.zc.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
				s.raw.Close()
				return
			}
		}
	}
}

// serveReplay answers one replay client's requests until its connection fails.
func (p *Publisher) serveReplay(c net.Conn) {
	if !p.register(nil, c) {
		return
	}
	defer func() {
		p.connMu.Lock()
		delete(p.replays, c)
		p.connMu.Unlock()
	}()
	// A request is [empty delimiter, start_seq (8 bytes)].
	zc, err := p.handshake(c, zmq4.Router, true, 8, 2)
	if err != nil {
		return
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if len(msg.Frames) != 2 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
			p.o.Logger.Debug("kv events: a replay request that is not [empty, start_seq]", "frames", len(msg.Frames))
			continue
		}
		if err := p.answer(c, zc, binary.BigEndian.Uint64(msg.Frames[1])); err != nil {
			return
		}
	}
}

// answer sends every retained batch with seq ≥ from, then the sentinel.
func (p *Publisher) answer(c net.Conn, zc *zmq4.Conn, from uint64) error {
	send := func(seq uint64, payload []byte) error {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		frames := [][]byte{{}, s[:], payload}
		if p.o.ReplayTopic {
			topic := []byte(p.o.Topic)
			if seq == vllmkv.ReplaySentinelSeq {
				topic = []byte{}
			}
			frames = [][]byte{{}, topic, s[:], payload}
		}
		_ = c.SetWriteDeadline(p.o.Clock.Now().Add(p.o.WriteTimeout))
		return zc.SendMsg(zmq4.NewMsgFrom(frames...))
	}
	for _, r := range p.ring.from(from) {
		if err := send(r.seq, r.payload); err != nil {
			return err
		}
	}
	return send(vllmkv.ReplaySentinelSeq, []byte{})
}
