package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/clock"
)

// KVSink takes the subscriber's translated events: the router, through
// (*gateway.Gateway).KVEvents, in production.
type KVSink interface {
	KVEvents(ev *router.KVEvents)
}

// KVPieceIDs bounds the ids of one message to the router: an event with more is delivered in
// pieces, each waiting for the router's answer before the next. The router applies the exact
// index's ids in its own mailbox, in turn with the picks, at about 0.4 µs an id at 1,000 full
// workers; with one message at most waiting per subscription, a pick waits behind at most
// subscriptions × KVPieceIDs ids. Measured with 1,000 workers each sending one event at once
// (a gateway's start, a network blip; tests/bench: BenchmarkPickBehindKVEvents), a pick waited
// 1.7 s behind whole events of 4,096 ids, and 0.11 s, 0.05 s and 0.03 s behind pieces of 256,
// 128 and 64. 128 keeps the wait near 50 ms while a typical prompt's STORED (a few hundred
// blocks) stays within two or three messages.
const KVPieceIDs = 128

// MaxKVEventBytes bounds one KvEvent on the wire: 4,096 ids of at most 10 bytes each, plus
// the seq, the kind and framing.
const MaxKVEventBytes = 48 << 10

// KVSubscriberOptions configure a KVSubscriber.
type KVSubscriberOptions struct {
	Sink KVSink
	// Engines holds the connections: a subscription dials through its registration's
	// (request.Endpoint), shared with its EngineControl and KvTransferService calls.
	Engines *Engines
	Clock   clock.Clock
	Logger  *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before resubscribing after a stream ends
	// (doubling from Min, with up to half again of jitter; defaults 100 ms and 10 s). A stream
	// that got past its handshake and then held for MaxBackoff resets it.
	MinBackoff, MaxBackoff time.Duration
	// AnswerTimeout bounds the wait for the router's answer to each message (default 5 s): the
	// handshake's, refused until the router knows the worker, and each event's, which a router
	// that lost the message (a crash in its handler) would never send. A wait that runs out
	// ends the stream, and the next one resyncs. A stream's watchdog checks the wait every
	// quarter of it, so a lost answer ends the stream within 1.25 AnswerTimeout.
	AnswerTimeout time.Duration
	// Jitter returns a float in [0, 1) (default math/rand/v2's).
	Jitter func() float64
}

// KVSubscriber keeps one tl.kv.v1.KvEvents subscription per registered worker that reports
// kv_events (R18.3) and turns the events into router.KVEvents for the exact prefix index of
// precise_prefix:
//
//   - A stream's first event must be CLEARED: the subscriber sends the router a Clear and waits
//     for it to acknowledge the worker (KVEvents.Reply) before it forwards anything, so the
//     snapshot is never sent before the router knows the worker (its registration reaches the
//     router from the worker actor, on another path). A refusal ends the stream and retries.
//   - STORED and REMOVED become Stored and Removed, in pieces of at most KVPieceIDs ids; a
//     later CLEARED becomes Clear.
//   - Each message waits for the router's answer (KVEvents.Reply) before the next is read, so a
//     subscription has at most one message in the router's mailbox: an engine that sends faster
//     than the router applies waits in its own stream (gRPC's flow control), not in the
//     router's memory or in front of its picks. A message the router refuses (the worker is
//     not live any more, or not registered under the subscription's registration) ends the
//     stream, since what the engine holds is unknown from then on; the router forgets a
//     worker's holdings when it stops being live.
//   - A sequence gap, an event with more than router.MaxKVEventIDs ids, a message over
//     MaxKVEventBytes, an unknown kind or a stream that ends: the router is told Clear (what the
//     engine holds is unknown now: a restart empties it) and the subscriber subscribes again
//     after a backoff.
//
// Watch starts, moves (a new grpc_address) or stops a worker's subscription as its heartbeats
// say; Forget stops it when the worker is evicted; Close stops everything and waits. Nothing
// is sent to the sink for a subscription once Forget, Close or a Watch that replaced it has
// returned. Each subscription is one goroutine.
//
// A subscription belongs to one registration of its worker (router.WorkerInfo.Reg): every
// message it sends names it (router.KVEvents.Reg), and a Watch of another registration of the
// id starts a new subscription even at the same address, so the router never applies an
// earlier registration's engine's events to a later one. Watch and Forget are called from the
// registry's goroutine (registry.Config.OnAccepted, OnEvict), in the order it registered and
// evicted, so no registration's Watch comes after its eviction's Forget.
type KVSubscriber struct {
	o      KVSubscriberOptions
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// subs: one subscription (and its goroutine) per registered worker that reports kv_events
	// on a grpc_address; Watch replaces or stops it as heartbeats say, Forget drops it at
	// eviction, so it is bounded by the live workers ([registry] max_workers).
	subs   map[string]*kvSub // by worker id
	closed bool
}

type kvSub struct {
	id, addr string
	reg      uint64 // the registration it was opened for (router.WorkerInfo.Reg)
	cancel   context.CancelFunc
	mu       sync.Mutex // held while sending, so stop() returns after the last send
	stopped  bool
	cur      atomic.Pointer[answers] // the current stream's (read by tests: does a message wait?)
}

// NewKVSubscriber returns a subscriber with no subscriptions.
func NewKVSubscriber(o KVSubscriberOptions) *KVSubscriber {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(10*time.Second, o.MinBackoff)
	}
	if o.AnswerTimeout <= 0 {
		o.AnswerTimeout = 5 * time.Second
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &KVSubscriber{o: o, ctx: ctx, cancel: cancel, subs: make(map[string]*kvSub)}
}

// Watch applies a worker's registration or heartbeat: it subscribes to a worker that reports
// kv_events on a grpc_address, resubscribes when that address or the registration changed,
// and stops the subscription of a worker that no longer reports them. It returns at once.
func (s *KVSubscriber) Watch(info router.WorkerInfo) {
	want := info.KVEvents && info.GRPCAddress != ""
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	cur := s.subs[info.ID]
	if cur != nil && want && cur.addr == info.GRPCAddress && cur.reg == info.Reg {
		return // the common case: every heartbeat of a subscribed worker
	}
	if cur != nil {
		cur.stop()
		delete(s.subs, info.ID)
	}
	if !want {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	sub := &kvSub{id: info.ID, addr: info.GRPCAddress, reg: info.Reg, cancel: cancel}
	s.subs[info.ID] = sub
	s.wg.Add(1)
	go s.run(ctx, sub)
}

// Forget stops the subscription of worker id (evicted). Unknown ids are ignored.
func (s *KVSubscriber) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sub := s.subs[id]; sub != nil {
		sub.stop()
		delete(s.subs, id)
	}
}

// Len is the number of subscriptions.
func (s *KVSubscriber) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs)
}

// Close stops every subscription and waits for their goroutines; later Watches do nothing.
func (s *KVSubscriber) Close() {
	s.mu.Lock()
	s.closed = true
	for id, sub := range s.subs {
		sub.stop()
		delete(s.subs, id)
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

func (sub *kvSub) stop() {
	sub.cancel()
	sub.mu.Lock()
	sub.stopped = true
	sub.mu.Unlock()
}

// send hands ev to the sink unless the subscription was stopped.
func (s *KVSubscriber) send(sub *kvSub, ev *router.KVEvents) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.stopped {
		return false
	}
	s.o.Sink.KVEvents(ev)
	return true
}

// run keeps sub's stream up until its context ends.
func (s *KVSubscriber) run(ctx context.Context, sub *kvSub) {
	defer s.wg.Done()
	backoff := s.o.MinBackoff
	for {
		began := s.o.Clock.Now()
		synced, err := s.stream(ctx, sub)
		if ctx.Err() != nil {
			return
		}
		if synced {
			// What the engine holds is unknown until the next snapshot (a restart empties it).
			s.send(sub, &router.KVEvents{WorkerID: sub.id, Reg: sub.reg, Clear: true})
			// A stream that held for MaxBackoff starts the wait afresh. One that ends sooner
			// after its snapshot keeps doubling it, so an engine that keeps dropping its streams
			// cannot have the router apply a snapshot every MinBackoff.
			if s.o.Clock.Now().Sub(began) >= s.o.MaxBackoff {
				backoff = s.o.MinBackoff
			}
		}
		s.o.Logger.Debug("kv events stream ended; subscribing again", "worker", sub.id, "address", sub.addr,
			"err", err, "backoff", backoff)
		if !s.sleep(ctx, backoff+time.Duration(s.o.Jitter()*float64(backoff)/2)) {
			return
		}
		backoff = min(2*backoff, s.o.MaxBackoff)
	}
}

// sleep waits d on the clock; false when ctx ended first.
func (s *KVSubscriber) sleep(ctx context.Context, d time.Duration) bool {
	done := make(chan struct{})
	t := s.o.Clock.AfterFunc(d, func() { close(done) })
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// Protocol errors: each ends the stream.
var (
	errKVNotCleared = errors.New("the stream's first event is not CLEARED")
	errKVGap        = errors.New("sequence gap")
	errKVTooMany    = errors.New("too many block ids in one event")
	errKVKind       = errors.New("unknown event kind")
	errKVRefused    = errors.New("the router refused the worker's events (this registration of it is not registered, or not live)")
	errKVNoAnswer   = errors.New("no answer from the router in time")
)

// stream runs one subscription until it fails; synced reports whether it got past its
// handshake (the router then holds what it forwarded).
func (s *KVSubscriber) stream(ctx context.Context, sub *kvSub) (synced bool, err error) {
	conn, err := s.o.Engines.conn(request.Endpoint{WorkerID: sub.id, Reg: sub.reg, Addr: sub.addr})
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a := s.answers(cancel)
	defer a.stop()
	sub.cur.Store(a)
	st, err := kvv1.NewKvEventsClient(conn.cc).Subscribe(ctx, &kvv1.SubscribeRequest{},
		grpc.MaxCallRecvMsgSize(MaxKVEventBytes))
	if err != nil {
		return false, conn.callErr(err)
	}
	ev, err := st.Recv()
	if err != nil {
		return false, err
	}
	if ev.GetKind() != kvv1.KvEvent_CLEARED {
		return false, errKVNotCleared
	}
	seq := ev.GetSeq()
	if err := a.deliver(ctx, s, sub, &router.KVEvents{WorkerID: sub.id, Reg: sub.reg, Clear: true}); err != nil {
		return false, err
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return true, err
		}
		if ev.GetSeq() != seq+1 {
			return true, fmt.Errorf("%w: %d after %d", errKVGap, ev.GetSeq(), seq)
		}
		seq = ev.GetSeq()
		ids := ev.GetBlockIds()
		if len(ids) > router.MaxKVEventIDs {
			return true, fmt.Errorf("%w: %d", errKVTooMany, len(ids))
		}
		kind := ev.GetKind()
		switch kind {
		case kvv1.KvEvent_STORED, kvv1.KvEvent_REMOVED:
			for len(ids) > 0 {
				n := min(len(ids), KVPieceIDs)
				out := &router.KVEvents{WorkerID: sub.id, Reg: sub.reg}
				if kind == kvv1.KvEvent_STORED {
					out.Stored = ids[:n:n]
				} else {
					out.Removed = ids[:n:n]
				}
				if err := a.deliver(ctx, s, sub, out); err != nil {
					return true, err
				}
				ids = ids[n:]
			}
		case kvv1.KvEvent_CLEARED:
			if err := a.deliver(ctx, s, sub, &router.KVEvents{WorkerID: sub.id, Reg: sub.reg, Clear: true}); err != nil {
				return true, err
			}
		default:
			return true, fmt.Errorf("%w: %d", errKVKind, kind)
		}
	}
}

// answers is one stream's wait for the router's answers: one answer channel for all its
// messages (an answer that comes after its stream gave up can only land there, never in a
// later stream's) and a watchdog that ends the stream when a wait has lasted AnswerTimeout.
// One timer per stream rather than one per message: the wait costs two atomic stores and a
// clock read.
type answers struct {
	reply   chan bool
	since   atomic.Int64 // when the pending message was sent (UnixNano); idle when none
	clock   clock.Clock
	timeout time.Duration
	cancel  context.CancelCauseFunc

	mu      sync.Mutex
	t       clock.Timer
	stopped bool
}

// idle is answers.since while no message waits.
const idle = math.MinInt64

func (s *KVSubscriber) answers(cancel context.CancelCauseFunc) *answers {
	a := &answers{reply: make(chan bool, 1), clock: s.o.Clock, timeout: s.o.AnswerTimeout, cancel: cancel}
	a.since.Store(idle)
	a.mu.Lock()
	a.arm()
	a.mu.Unlock()
	return a
}

// arm schedules the watchdog's next look, a quarter of AnswerTimeout from now (a.mu held).
func (a *answers) arm() { a.t = a.clock.AfterFunc(a.timeout/4, a.check) }

// check is the watchdog: it ends the stream (cause errKVNoAnswer) once a message has waited
// AnswerTimeout, else looks again a quarter of it later.
func (a *answers) check() {
	if w := a.since.Load(); w != idle && a.clock.Now().UnixNano()-w >= int64(a.timeout) {
		a.cancel(errKVNoAnswer)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.stopped {
		a.arm()
	}
}

func (a *answers) stop() {
	a.mu.Lock()
	a.stopped = true
	a.t.Stop()
	a.mu.Unlock()
}

// deliver hands ev to the sink and waits for the router's answer: nil when the router applied
// it; errKVRefused when it did not (the worker is not registered or not live); errKVNoAnswer
// when none came within AnswerTimeout (the watchdog); context.Canceled when the subscription
// stopped (Forget, Close, a moved address) first.
func (a *answers) deliver(ctx context.Context, s *KVSubscriber, sub *kvSub, ev *router.KVEvents) error {
	ev.Reply = a.reply
	a.since.Store(a.clock.Now().UnixNano())
	defer a.since.Store(idle)
	if !s.send(sub, ev) {
		return context.Canceled
	}
	select {
	case ok := <-a.reply:
		if !ok {
			return errKVRefused
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx) // errKVNoAnswer from the watchdog, else context.Canceled
	}
}
