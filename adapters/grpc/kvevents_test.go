package grpcapi

import (
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/tlgw/tlgw/actors/router"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/clock"
)

// fakeKV is an in-process KvEvents server: each Subscribe takes the next script, sends its
// events and then holds the stream open until the client leaves (or ends it when end is set).
type fakeKV struct {
	kvv1.UnimplementedKvEventsServer
	scripts chan kvScript
	subs    chan struct{} // one value per Subscribe call
	gone    chan struct{} // one value per stream whose client left
}

type kvScript struct {
	events []*kvv1.KvEvent
	end    bool
	more   chan *kvv1.KvEvent // sent after events, as they come, until the client leaves
}

func (f *fakeKV) Subscribe(_ *kvv1.SubscribeRequest, st grpc.ServerStreamingServer[kvv1.KvEvent]) error {
	f.subs <- struct{}{}
	var sc kvScript
	select {
	case sc = <-f.scripts:
	case <-st.Context().Done():
		f.gone <- struct{}{}
		return nil
	}
	for _, ev := range sc.events {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	if sc.end {
		return nil
	}
	for {
		select {
		case ev := <-sc.more:
			if err := st.Send(ev); err != nil {
				return err
			}
		case <-st.Context().Done():
			f.gone <- struct{}{}
			return nil
		}
	}
}

func startFakeKV(t testing.TB) (*fakeKV, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeKV{scripts: make(chan kvScript, 16), subs: make(chan struct{}, 16), gone: make(chan struct{}, 16)}
	gs := grpc.NewServer()
	kvv1.RegisterKvEventsServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return f, lis.Addr().String()
}

// sinkRec records what the subscriber sends; it answers each message that asks with
// accept's next value (true once it runs out). A stream's messages share one answer channel,
// so a handshake is the first message on a channel not seen before.
type sinkRec struct {
	got    chan *router.KVEvents
	accept chan bool

	mu     sync.Mutex
	seen   map[chan<- bool]bool
	shakes map[*router.KVEvents]bool
}

func (s *sinkRec) KVEvents(ev *router.KVEvents) {
	if ev.Reply != nil {
		s.mu.Lock()
		if !s.seen[ev.Reply] {
			s.seen[ev.Reply], s.shakes[ev] = true, ev.Clear
		}
		s.mu.Unlock()
		ok := true
		select {
		case ok = <-s.accept:
		default:
		}
		ev.Reply <- ok
	}
	s.got <- ev
}

// handshake reports whether ev opened its stream: a Clear, the first on its answer channel.
func (s *sinkRec) handshake(ev *router.KVEvents) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shakes[ev]
}

func (s *sinkRec) next(t *testing.T) *router.KVEvents {
	t.Helper()
	return recv(t, s.got)
}

// recv is the next message a sink got, within 5 s.
func recv(t *testing.T, got chan *router.KVEvents) *router.KVEvents {
	t.Helper()
	select {
	case ev := <-got:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event reached the sink")
		return nil
	}
}

func wait(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func ev(seq uint64, kind kvv1.KvEvent_Kind, ids ...uint64) *kvv1.KvEvent {
	return &kvv1.KvEvent{Seq: seq, Kind: kind, BlockIds: ids}
}

func newTestSubscriber(t *testing.T) (*KVSubscriber, *sinkRec, *Engines) {
	t.Helper()
	sink := &sinkRec{got: make(chan *router.KVEvents, 64), accept: make(chan bool, 4),
		seen: map[chan<- bool]bool{}, shakes: map[*router.KVEvents]bool{}}
	engines := NewEngines(EnginesOptions{})
	s := NewKVSubscriber(KVSubscriberOptions{Sink: sink, Engines: engines, MinBackoff: time.Millisecond,
		MaxBackoff: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return s, sink, engines
}

func expect(t *testing.T, got *router.KVEvents, want router.KVEvents) {
	t.Helper()
	if got.WorkerID != want.WorkerID || got.Reg != want.Reg || got.Clear != want.Clear || !slices.Equal(got.Stored, want.Stored) ||
		!slices.Equal(got.Removed, want.Removed) {
		t.Fatalf("got %+v, want %+v", *got, want)
	}
}

// TestKVSubscriberTranslates: CLEARED (handshake), the snapshot and live events become
// router.KVEvents in order; a sequence gap clears and resubscribes; so does an event with too
// many ids and a stream that ends; Forget stops the stream and Close leaves no goroutine.
func TestKVSubscriberTranslates(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	f, addr := startFakeKV(t)
	s, sink, engines := newTestSubscriber(t)
	defer engines.Close()
	defer s.Close()

	f.scripts <- kvScript{events: []*kvv1.KvEvent{
		ev(7, kvv1.KvEvent_CLEARED), ev(8, kvv1.KvEvent_STORED, 1, 2, 3), ev(9, kvv1.KvEvent_REMOVED, 2),
		ev(10, kvv1.KvEvent_CLEARED), ev(11, kvv1.KvEvent_STORED, 4),
		ev(13, kvv1.KvEvent_STORED, 5), // a gap: 12 is missing
	}}
	follow(s, router.WorkerInfo{ID: "e1", GRPCAddress: addr, KVEvents: true})
	follow(s, router.WorkerInfo{ID: "e1", GRPCAddress: addr, KVEvents: true}) // a heartbeat: no change
	wait(t, f.subs, "the first subscription")
	hs := sink.next(t)
	if !sink.handshake(hs) {
		t.Fatalf("first message %+v is not the handshake", *hs)
	}
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Stored: []uint64{1, 2, 3}})
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Removed: []uint64{2}})
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Clear: true})
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Stored: []uint64{4}})
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Clear: true}) // the gap
	wait(t, f.subs, "the resubscription after the gap")

	// An event over the id bound: cleared and resubscribed.
	tooMany := make([]uint64, router.MaxKVEventIDs+1)
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, tooMany...)}}
	if m := sink.next(t); !sink.handshake(m) {
		t.Fatalf("%+v is not a handshake", *m)
	}
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Clear: true})
	wait(t, f.subs, "the resubscription after an oversized event")

	// The engine restarts: the stream ends, the index is cleared, the next stream resyncs.
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, 9)}, end: true}
	if m := sink.next(t); !sink.handshake(m) {
		t.Fatalf("%+v is not a handshake", *m)
	}
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Stored: []uint64{9}})
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e1", Clear: true})
	wait(t, f.subs, "the resubscription after the stream ended")

	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED)}}
	sink.next(t) // handshake
	s.Forget("e1")
	wait(t, f.gone, "the stream to end after Forget")
	if s.Len() != 0 {
		t.Fatalf("%d subscriptions after Forget", s.Len())
	}
	select {
	case m := <-sink.got:
		t.Fatalf("sent %+v after Forget", *m)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestKVSubscriberWaitsForTheRouter: a handshake the router refuses (it does not know the
// worker yet) forwards nothing and subscribes again; a first event that is not CLEARED is a
// protocol error; a worker that stops reporting kv_events is unsubscribed.
func TestKVSubscriberWaitsForTheRouter(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	f, addr := startFakeKV(t)
	s, sink, engines := newTestSubscriber(t)
	defer engines.Close()
	defer s.Close()

	sink.accept <- false
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, 1)}}
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(5, kvv1.KvEvent_STORED, 1)}} // no CLEARED first
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(3, kvv1.KvEvent_CLEARED), ev(4, kvv1.KvEvent_STORED, 2)}}
	follow(s, router.WorkerInfo{ID: "e2", GRPCAddress: addr, KVEvents: true})
	if m := sink.next(t); !sink.handshake(m) {
		t.Fatalf("%+v is not a handshake", *m)
	}
	// Refused: nothing of that stream is forwarded; the next (bad) stream forwards nothing
	// either; the third is accepted.
	if m := sink.next(t); !sink.handshake(m) {
		t.Fatalf("%+v forwarded after a refused handshake", *m)
	}
	expect(t, sink.next(t), router.KVEvents{WorkerID: "e2", Stored: []uint64{2}})

	follow(s, router.WorkerInfo{ID: "e2", GRPCAddress: addr}) // kv_events off
	wait(t, f.gone, "the stream to end")
	if s.Len() != 0 {
		t.Fatal("still subscribed")
	}
	s.Close()
	follow(s, router.WorkerInfo{ID: "e3", GRPCAddress: addr, KVEvents: true})
	if s.Len() != 0 {
		t.Fatal("subscribed after Close")
	}
}

// gateSink answers nothing by itself: the test answers each message that asks, and the sink
// records the most messages that waited for an answer at once.
type gateSink struct {
	got     chan *router.KVEvents
	mu      sync.Mutex
	waiting int
	most    int
}

func (g *gateSink) KVEvents(ev *router.KVEvents) {
	if ev.Reply != nil {
		g.mu.Lock()
		g.waiting++
		g.most = max(g.most, g.waiting)
		g.mu.Unlock()
	}
	g.got <- ev
}

func (g *gateSink) next(t *testing.T) *router.KVEvents {
	t.Helper()
	return recv(t, g.got)
}

// gateSubscriber is a subscriber with o's timing over a gateSink and a fake engine; the test
// ends with no goroutine left.
func gateSubscriber(t *testing.T, o KVSubscriberOptions) (*fakeKV, string, *gateSink, *KVSubscriber) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	f, addr := startFakeKV(t)
	sink := &gateSink{got: make(chan *router.KVEvents, 64)}
	engines := NewEngines(EnginesOptions{})
	t.Cleanup(engines.Close)
	o.Sink, o.Engines, o.Logger = sink, engines, slog.New(slog.NewTextHandler(io.Discard, nil))
	s := NewKVSubscriber(o)
	t.Cleanup(s.Close)
	return f, addr, sink, s
}

func (g *gateSink) answer(ev *router.KVEvents, ok bool) {
	g.mu.Lock()
	g.waiting--
	g.mu.Unlock()
	ev.Reply <- ok
}

// TestKVSubscriberWaitsForEachAnswer: a subscription has at most one message in the router's
// mailbox: every message asks for the router's answer and the next is sent only after it, so
// an engine that sends faster than the router applies is held back in its own stream. A
// message the router refuses (the worker stopped being live) ends the stream: a Clear without
// a question follows, then a new subscription.
func TestKVSubscriberWaitsForEachAnswer(t *testing.T) {
	f, addr, sink, s := gateSubscriber(t, KVSubscriberOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	next := func() *router.KVEvents { t.Helper(); return sink.next(t) }

	const n = 50
	burst := []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED)}
	for k := range uint64(n) {
		burst = append(burst, ev(k+2, kvv1.KvEvent_STORED, k))
	}
	f.scripts <- kvScript{events: burst, end: true}
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, 7)}}
	follow(s, router.WorkerInfo{ID: "e4", GRPCAddress: addr, KVEvents: true})
	hs := next()
	if !hs.Clear || hs.Reply == nil {
		t.Fatalf("%+v is not a handshake", *hs)
	}
	sink.answer(hs, true)
	for k := range uint64(n) {
		m := next()
		expect(t, m, router.KVEvents{WorkerID: "e4", Stored: []uint64{k}})
		if m.Reply == nil {
			t.Fatalf("event %d asks for no answer", k)
		}
		sink.answer(m, true)
	}
	if sink.most != 1 {
		t.Fatalf("%d messages waited for the router at once, want 1", sink.most)
	}
	if c := next(); !c.Clear || c.Reply != nil { // the stream ended
		t.Fatalf("after the stream ended %+v, want a Clear that asks nothing", *c)
	}

	// The next stream's events are refused: it ends, and the one after resyncs.
	wait(t, f.subs, "the first subscription")
	wait(t, f.subs, "the second subscription")
	sink.answer(next(), true) // its handshake
	m := next()
	expect(t, m, router.KVEvents{WorkerID: "e4", Stored: []uint64{7}})
	sink.answer(m, false)
	if c := next(); !c.Clear || c.Reply != nil {
		t.Fatalf("after a refusal %+v, want a Clear that asks nothing", *c)
	}
	wait(t, f.gone, "the refused stream to end")
	wait(t, f.subs, "a new subscription")
}

// TestKVSubscriberDeliversInPieces: an event of more than KVPieceIDs ids reaches the router
// in pieces of at most that many, in order, each sent only after the router answered the one
// before; an empty event sends nothing.
func TestKVSubscriberDeliversInPieces(t *testing.T) {
	f, addr, sink, s := gateSubscriber(t, KVSubscriberOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	ids := make([]uint64, 3*KVPieceIDs+5)
	for i := range ids {
		ids[i] = uint64(i) + 1
	}
	f.scripts <- kvScript{events: []*kvv1.KvEvent{
		ev(1, kvv1.KvEvent_CLEARED),
		ev(2, kvv1.KvEvent_STORED, ids...),
		ev(3, kvv1.KvEvent_STORED),                                     // empty: nothing sent
		ev(4, kvv1.KvEvent_REMOVED, ids[:KVPieceIDs]...),               // exactly one piece
		ev(5, kvv1.KvEvent_REMOVED, ids[KVPieceIDs:2*KVPieceIDs+1]...), // one piece and one id
		ev(6, kvv1.KvEvent_CLEARED),
	}}
	follow(s, router.WorkerInfo{ID: "e9", GRPCAddress: addr, KVEvents: true})
	sink.answer(sink.next(t), true) // the handshake
	want := []router.KVEvents{
		{Stored: ids[:KVPieceIDs]}, {Stored: ids[KVPieceIDs : 2*KVPieceIDs]}, {Stored: ids[2*KVPieceIDs : 3*KVPieceIDs]},
		{Stored: ids[3*KVPieceIDs:]},
		{Removed: ids[:KVPieceIDs]},
		{Removed: ids[KVPieceIDs : 2*KVPieceIDs]}, {Removed: ids[2*KVPieceIDs : 2*KVPieceIDs+1]},
		{Clear: true},
	}
	for i, w := range want {
		m := sink.next(t)
		w.WorkerID = "e9"
		expect(t, m, w)
		if m.Reply == nil {
			t.Fatalf("message %d asks for no answer", i)
		}
		select {
		case extra := <-sink.got:
			t.Fatalf("message %d sent before message %d was answered: %+v", i+1, i, *extra)
		default:
		}
		sink.answer(m, true)
	}
	if sink.most != 1 {
		t.Fatalf("%d messages waited for the router at once, want 1", sink.most)
	}
}

// TestKVSubscriberGivesUpOnASilentRouter: an event the router never answers (a router that
// lost it) holds the stream at most AnswerTimeout: then the stream ends with a Clear that asks
// nothing, and the subscriber subscribes again after its backoff. Nothing waits forever.
func TestKVSubscriberGivesUpOnASilentRouter(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	f, addr, sink, s := gateSubscriber(t, KVSubscriberOptions{Clock: clk, AnswerTimeout: time.Second,
		MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Jitter: func() float64 { return 0 }})
	next := func() *router.KVEvents { t.Helper(); return sink.next(t) }
	// armed waits until the subscriber has scheduled exactly one timer: the stream's watchdog,
	// or after the stream the backoff.
	armed := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for clk.Pending() != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			runtime.Gosched()
		}
	}

	more := make(chan *kvv1.KvEvent, 1)
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, 2)}, more: more}
	follow(s, router.WorkerInfo{ID: "e5", GRPCAddress: addr, KVEvents: true})
	sink.answer(next(), true) // the handshake
	m := next()
	expect(t, m, router.KVEvents{WorkerID: "e5", Stored: []uint64{2}})
	sink.answer(m, true)
	// Answered, the stream is idle: however long it stays so, it is not ended.
	s.mu.Lock()
	sub := s.subs["e5"]
	s.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for sub.cur.Load() == nil || sub.cur.Load().since.Load() != idle {
		if time.Now().After(deadline) {
			t.Fatal("the answered message is still waiting")
		}
		runtime.Gosched()
	}
	clk.Advance(10 * time.Second)
	if clk.Pending() != 1 {
		t.Fatalf("%d timers after 10 s idle, want the watchdog's (the stream ended?)", clk.Pending())
	}
	more <- ev(3, kvv1.KvEvent_STORED, 3)
	lost := next()
	expect(t, lost, router.KVEvents{WorkerID: "e5", Stored: []uint64{3}})
	// The watchdog looks every 250 ms: the wait has lasted less than AnswerTimeout until 1 s.
	armed("the stream's watchdog")
	clk.Advance(time.Second - time.Nanosecond)
	select {
	case m := <-sink.got:
		t.Fatalf("%+v sent before the answer's timeout", *m)
	default:
	}
	clk.Advance(time.Nanosecond)
	if c := next(); !c.Clear || c.Reply != nil {
		t.Fatalf("after no answer %+v, want a Clear that asks nothing", *c)
	}
	wait(t, f.gone, "the stream to end")
	armed("the backoff")
	clk.Advance(time.Millisecond)
	wait(t, f.subs, "the first subscription")
	wait(t, f.subs, "a new subscription")
}

// TestKVSubscriberBacksOffAFlappingEngine: an engine whose streams end right after their
// handshake is subscribed to again after a doubling wait (1, 2, 4, 4 s here), not every
// MinBackoff; a stream that held for MaxBackoff starts the wait afresh.
func TestKVSubscriberBacksOffAFlappingEngine(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	f, addr, sink, s := gateSubscriber(t, KVSubscriberOptions{Clock: clk, AnswerTimeout: time.Hour,
		MinBackoff: time.Second, MaxBackoff: 4 * time.Second, Jitter: func() float64 { return 0 }})
	next := func() *router.KVEvents { t.Helper(); return sink.next(t) }
	// backoff waits for the stream's end (a Clear that asks nothing) and then for the backoff
	// timer, the one timer left, and checks its length.
	backoff := func(want time.Duration) {
		t.Helper()
		if c := next(); !c.Clear || c.Reply != nil {
			t.Fatalf("after the stream ended %+v, want a Clear that asks nothing", *c)
		}
		deadline := time.Now().Add(5 * time.Second)
		for clk.Pending() != 1 {
			if time.Now().After(deadline) {
				t.Fatal("timed out waiting for the backoff")
			}
			runtime.Gosched()
		}
		if d, _ := clk.Next(); d != want {
			t.Fatalf("backoff %v, want %v", d, want)
		}
		clk.Advance(want)
	}

	flap := kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED)}, end: true}
	for range 4 {
		f.scripts <- flap
	}
	held := make(chan *kvv1.KvEvent, 1)
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED)}, more: held}
	f.scripts <- flap
	follow(s, router.WorkerInfo{ID: "e6", GRPCAddress: addr, KVEvents: true})
	for _, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		sink.answer(next(), true) // the handshake; then the engine ends the stream
		backoff(want)
	}
	// This stream stays up for 4 s, then breaks (a sequence gap): the wait is back to 1 s,
	// and the next stream that flaps doubles it again.
	sink.answer(next(), true)
	clk.Advance(4 * time.Second)
	held <- ev(5, kvv1.KvEvent_STORED, 1)
	backoff(time.Second)
	sink.answer(next(), true)
	backoff(2 * time.Second)
}

// TestKVSubscriberFollowsTheRegistration: every message of a subscription names the
// registration it was opened for; a Watch of the id's next registration (evicted and
// registered again, here at the same address: the engine restarted) ends the old stream and
// subscribes afresh, so nothing the old stream reads after that Watch reaches the router, and
// the router gets the new registration's snapshot under its own number.
func TestKVSubscriberFollowsTheRegistration(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	f, addr := startFakeKV(t)
	s, sink, engines := newTestSubscriber(t)
	defer engines.Close()
	defer s.Close()

	more := make(chan *kvv1.KvEvent, 4)
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, 1)}, more: more}
	follow(s, router.WorkerInfo{ID: "e7", Reg: 1, GRPCAddress: addr, KVEvents: true})
	wait(t, f.subs, "the first registration's subscription")
	if m := sink.next(t); !sink.handshake(m) || m.Reg != 1 {
		t.Fatalf("%+v: want the handshake of registration 1", *m)
	}
	if m := sink.next(t); m.Reg != 1 || !slices.Equal(m.Stored, []uint64{1}) {
		t.Fatalf("%+v: want registration 1's STORED", *m)
	}
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, 2)}}
	follow(s, router.WorkerInfo{ID: "e7", Reg: 2, GRPCAddress: addr, KVEvents: true})
	wait(t, f.gone, "the first registration's stream to end")
	more <- ev(3, kvv1.KvEvent_STORED, 99) // read by nobody: its stream is gone
	wait(t, f.subs, "the second registration's subscription")
	if m := sink.next(t); !sink.handshake(m) || m.Reg != 2 {
		t.Fatalf("%+v: want the handshake of registration 2", *m)
	}
	if m := sink.next(t); m.Reg != 2 || !slices.Equal(m.Stored, []uint64{2}) {
		t.Fatalf("%+v: want registration 2's STORED", *m)
	}
	if s.Len() != 1 {
		t.Fatalf("%d subscriptions, want 1", s.Len())
	}
}

// follow is the app's wiring of a heartbeat: the connections follow the registration, and the
// subscription the addresses they follow.
func follow(s *KVSubscriber, info router.WorkerInfo) { s.o.Engines.Accept(info, s.Watch) }

// TestKVSubscriberDefaults: the options left zero (or out of order) take the documented
// defaults; the ones given are kept.
func TestKVSubscriberDefaults(t *testing.T) {
	s := NewKVSubscriber(KVSubscriberOptions{})
	defer s.Close()
	o := s.o
	if _, ok := o.Clock.(clock.Real); !ok || o.Logger != slog.Default() || o.MinBackoff != 100*time.Millisecond ||
		o.MaxBackoff != 10*time.Second || o.AnswerTimeout != 5*time.Second || o.Jitter == nil {
		t.Fatalf("defaults: %+v", o)
	}
	fc := clock.NewFake(time.Unix(0, 0))
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	given := NewKVSubscriber(KVSubscriberOptions{Clock: fc, Logger: logger, MinBackoff: time.Second,
		MaxBackoff: time.Second, AnswerTimeout: time.Millisecond})
	defer given.Close()
	if o := given.o; o.Clock != fc || o.Logger != logger || o.MinBackoff != time.Second || o.MaxBackoff != time.Second ||
		o.AnswerTimeout != time.Millisecond {
		t.Fatalf("given: %+v", o)
	}
	// A MaxBackoff under MinBackoff is the default, or MinBackoff when that is longer.
	for _, c := range []struct{ min, max, want time.Duration }{
		{time.Second, time.Millisecond, 10 * time.Second},
		{time.Minute, time.Second, time.Minute},
	} {
		s := NewKVSubscriber(KVSubscriberOptions{MinBackoff: c.min, MaxBackoff: c.max})
		if s.o.MaxBackoff != c.want {
			t.Errorf("min %v, max %v: MaxBackoff %v, want %v", c.min, c.max, s.o.MaxBackoff, c.want)
		}
		s.Close()
	}
}

// TestKVSubscriberHeartbeatKeepsTheStream: the heartbeats of a subscribed worker that change
// nothing keep its subscription and its stream: no resubscription (and no snapshot) per
// heartbeat.
func TestKVSubscriberHeartbeatKeepsTheStream(t *testing.T) {
	f, addr := startFakeKV(t)
	s, sink, engines := newTestSubscriber(t)
	defer engines.Close()
	defer s.Close()
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED)}}
	info := router.WorkerInfo{ID: "e8", Reg: 3, GRPCAddress: addr, KVEvents: true}
	follow(s, info)
	wait(t, f.subs, "the subscription")
	if m := sink.next(t); !sink.handshake(m) {
		t.Fatalf("%+v is not the handshake", *m)
	}
	s.mu.Lock()
	sub := s.subs["e8"]
	s.mu.Unlock()
	for range 3 {
		follow(s, info)
	}
	s.mu.Lock()
	same := s.subs["e8"] == sub
	s.mu.Unlock()
	if !same || len(f.gone) != 0 {
		t.Fatalf("a heartbeat that changed nothing replaced the subscription (%v) or ended its stream (%d)", !same, len(f.gone))
	}
}

// TestKVSubscriberTakesTheLargestEvent: an event with exactly router.MaxKVEventIDs ids is
// forwarded whole, in pieces of KVPieceIDs in order (one more id is refused:
// TestKVSubscriberTranslates).
func TestKVSubscriberTakesTheLargestEvent(t *testing.T) {
	f, addr := startFakeKV(t)
	s, sink, engines := newTestSubscriber(t)
	defer engines.Close()
	defer s.Close()
	ids := make([]uint64, router.MaxKVEventIDs)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	f.scripts <- kvScript{events: []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED), ev(2, kvv1.KvEvent_STORED, ids...)}}
	follow(s, router.WorkerInfo{ID: "e9", GRPCAddress: addr, KVEvents: true})
	if m := sink.next(t); !sink.handshake(m) {
		t.Fatalf("%+v is not the handshake", *m)
	}
	var got []uint64
	for len(got) < len(ids) {
		m := sink.next(t)
		if m.Clear || len(m.Stored) != KVPieceIDs {
			t.Fatalf("after %d ids: %+v, want a piece of %d stored ids", len(got), *m, KVPieceIDs)
		}
		got = append(got, m.Stored...)
	}
	if !slices.Equal(got, ids) {
		t.Fatal("the pieces are not the event's ids in order")
	}
}
