package kvpub

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// TestDefaults: a zero or negative option takes its default; a positive one is kept, 1 included.
func TestDefaults(t *testing.T) {
	for _, v := range []int{0, -1} {
		o := Options{Retain: v, RetainBytes: v, Queue: v, ConnQueue: v, MaxConns: v,
			Redial: time.Duration(v), WriteTimeout: time.Duration(v)}
		o.defaults()
		if o.Retain != 1024 || o.RetainBytes != 64<<20 || o.Queue != 1024 || o.ConnQueue != 256 || o.MaxConns != 64 ||
			o.Redial != 500*time.Millisecond || o.WriteTimeout != 5*time.Second || o.Clock == nil || o.Logger == nil {
			t.Fatalf("options of %d took %+v", v, o)
		}
	}
	o := Options{Retain: 1, RetainBytes: 1, Queue: 1, ConnQueue: 1, MaxConns: 1, Redial: 1, WriteTimeout: 1}
	o.defaults()
	if o.Retain != 1 || o.RetainBytes != 1 || o.Queue != 1 || o.ConnQueue != 1 || o.MaxConns != 1 || o.Redial != 1 || o.WriteTimeout != 1 {
		t.Fatalf("options of 1 became %+v", o)
	}
}

// TestListenAddr: "*" binds every interface; any other host is kept as it is.
func TestListenAddr(t *testing.T) {
	for in, want := range map[string]string{"*:5557": ":5557", "*:0": ":0", "127.0.0.1:0": "127.0.0.1:0", "h:1": "h:1", "nope": "nope"} {
		if got := listenAddr(in); got != want {
			t.Errorf("listenAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStartReplayFailureClosesTheListener: a replay endpoint that cannot be bound fails Start,
// and the PUB listener already bound is closed again (its port can be bound at once); a
// connecting publisher has none to close.
func TestStartReplayFailureClosesTheListener(t *testing.T) {
	noLeaks(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	if _, err := Start(Options{Addr: addr, Bind: true, Topic: topic, Replay: busy.Addr().String()}); err == nil || !strings.Contains(err.Error(), "replay") {
		t.Fatalf("a replay address in use: %v", err)
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the PUB's port was left bound: %v", err)
	}
	again.Close()
	if _, err := Start(Options{Addr: "127.0.0.1:1", Topic: topic, Replay: "nope"}); err == nil || !strings.Contains(err.Error(), "replay") {
		t.Fatalf("a connecting publisher with a bad replay address: %v", err)
	}
}

// TestPublishTimestamp: a batch's ts is the clock's reading in seconds.
func TestPublishTimestamp(t *testing.T) {
	p := &Publisher{in: make(chan pending, 1), o: Options{Clock: clock.NewFake(time.Unix(1_700_000_000, 250_000_000))}}
	p.o.defaults()
	p.Publish(stored(1, 1))
	if b := <-p.in; math.Abs(b.ts-1_700_000_000.25) > 1e-3 {
		t.Fatalf("ts %f, want 1700000000.25", b.ts)
	}
}

// syncBuffer is a log sink written by the publisher's goroutines and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAcceptFailureIsLogged: a listener that fails while the publisher runs is logged; the
// listeners Close shuts are not.
func TestAcceptFailureIsLogged(t *testing.T) {
	noLeaks(t)
	var quiet syncBuffer
	p := start(t, Options{Addr: "127.0.0.1:0", Bind: true, Replay: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(&quiet, nil))})
	p.Close()
	if strings.Contains(quiet.String(), "accept failed") {
		t.Fatalf("Close logged %q", quiet.String())
	}
	var log syncBuffer
	p = start(t, Options{Addr: "127.0.0.1:0", Bind: true, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	p.ln.Close()
	eventually(t, "the accept failure logged", func() bool { return strings.Contains(log.String(), "accept failed") })
	p.Close()
}

// TestRegisterBound: MaxConns subscribers and, apart, MaxConns replay clients are registered;
// one past either is refused, a freed place is taken again, and nothing is after Close.
func TestRegisterBound(t *testing.T) {
	p := &Publisher{o: Options{MaxConns: 2}, subs: map[*sub]struct{}{}, replays: map[net.Conn]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	a, b, c := &sub{}, &sub{}, &sub{}
	if !p.register(a, nil) || !p.register(b, nil) || p.register(c, nil) {
		t.Fatalf("subscribers: %d registered of 3 with MaxConns 2", len(p.subs))
	}
	delete(p.subs, a)
	if !p.register(c, nil) {
		t.Fatal("a freed place was not taken")
	}
	var conns []net.Conn
	for range 2 {
		x, y := net.Pipe()
		t.Cleanup(func() { x.Close(); y.Close() })
		conns = append(conns, x, y)
	}
	if !p.register(nil, conns[0]) || !p.register(nil, conns[1]) || p.register(nil, conns[2]) {
		t.Fatalf("replay clients: %d registered of 3 with MaxConns 2", len(p.replays))
	}
	delete(p.replays, conns[0])
	p.cancel()
	if p.register(nil, conns[3]) || p.register(a, nil) {
		t.Fatal("registered after Close")
	}
}

// subConns is how many subscriber connections are registered, subscribed or not.
func subConns(p *Publisher) int {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	return len(p.subs)
}

// onlyTopics is the subscriptions of the publisher's one subscriber connection.
func onlyTopics(t *testing.T, p *Publisher) map[string]bool {
	t.Helper()
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if len(p.subs) != 1 {
		t.Fatalf("%d subscriber connections, want 1", len(p.subs))
	}
	out := map[string]bool{}
	for s := range p.subs {
		s.mu.Lock()
		for k := range s.topics {
			out[k] = true
		}
		s.mu.Unlock()
	}
	return out
}

func (s *subscriber) send(frame []byte) {
	s.t.Helper()
	if err := s.zc.SendMsg(zmq4.NewMsg(frame)); err != nil {
		s.t.Fatal(err)
	}
}

// TestSubscriptionFrameBound: a subscription of MaxString+1 bytes (the flag and a prefix of
// MaxString) is taken; one of MaxString+2 cuts the connection.
func TestSubscriptionFrameBound(t *testing.T) {
	noLeaks(t)
	p := start(t, Options{Addr: "127.0.0.1:0", Bind: true})
	s := dialSub(t, p.EventsAddr(), "zzz")
	eventually(t, "the connection registered", func() bool { return subConns(p) == 1 })
	s.send(append([]byte{1}, strings.Repeat("x", vllmkv.MaxString)...))
	s.send(append([]byte{1}, "kv@"...))
	eventually(t, "the subscription or the cut", func() bool { return p.Subscribers() == 1 || subConns(p) == 0 })
	if p.Subscribers() != 1 || !onlyTopics(t, p)[strings.Repeat("x", vllmkv.MaxString)] {
		t.Fatal("a subscription of MaxString+1 bytes cut the connection or was not kept")
	}
	s.send(append([]byte{1}, strings.Repeat("x", vllmkv.MaxString+1)...))
	eventually(t, "the cut", func() bool { return subConns(p) == 0 })
	if _, err := s.zc.RecvMsg(); err == nil {
		t.Fatal("a subscriber that sent MaxString+2 bytes was not cut")
	}
}

// TestSubscriptionsBound: a subscriber holds at most maxTopics prefixes (one past is ignored)
// and an unsubscription frees its place.
func TestSubscriptionsBound(t *testing.T) {
	noLeaks(t)
	p := start(t, Options{Addr: "127.0.0.1:0", Bind: true})
	s := dialSub(t, p.EventsAddr(), "x0")
	for i := 1; i < maxTopics-1; i++ {
		s.send(append([]byte{1}, "x"+strconv.Itoa(i)...))
	}
	s.send(append([]byte{1}, "kv@"...)) // the maxTopics-th
	eventually(t, "the subscriptions", func() bool { return p.Subscribers() == 1 })
	if got := onlyTopics(t, p); len(got) != maxTopics {
		t.Fatalf("%d subscriptions, want %d", len(got), maxTopics)
	}
	s.send([]byte{1})                   // one past: "" is ignored
	s.send(append([]byte{0}, "kv@"...)) // unsubscribed: maxTopics-1 are left
	eventually(t, "the unsubscription", func() bool { return !onlyTopics(t, p)["kv@"] })
	if got := onlyTopics(t, p); len(got) != maxTopics-1 || got[""] || p.Subscribers() != 0 {
		t.Fatalf("subscriptions %v (%d subscribed), want x0..x%d", got, p.Subscribers(), maxTopics-2)
	}
	s.send([]byte{1}) // a freed place is taken
	eventually(t, "a subscription in the freed place", func() bool { return p.Subscribers() == 1 })
}

// TestReplayRanges: with Retain 2 and batches 0..3 published, a replay answers the retained
// batches from the asked seq (an evicted start gives the oldest retained, a start past the
// newest only the sentinel), every request on one connection answered in turn.
func TestReplayRanges(t *testing.T) {
	noLeaks(t)
	p := start(t, Options{Addr: "127.0.0.1:0", Bind: true, Replay: "127.0.0.1:0", Retain: 2})
	for i := range 4 {
		p.Publish(stored(uint64(10+i), 1))
	}
	eventually(t, "4 batches retained", func() bool { return p.Stats().Published == 4 })
	d := dialDealer(t, p.ReplayAddr())
	for _, c := range []struct {
		from uint64
		want []uint64
	}{{0, []uint64{2, 3}}, {2, []uint64{2, 3}}, {3, []uint64{3}}, {4, nil}, {vllmkv.ReplaySentinelSeq - 1, nil}} {
		got := d.request(c.from)
		if len(got) != len(c.want)+1 {
			t.Fatalf("from %d: %d answers, want %d batches and the sentinel", c.from, len(got), len(c.want))
		}
		for i, seq := range c.want {
			b, err := vllmkv.DecodeMessage(append([][]byte{[]byte(topic)}, got[i][1:]...), vllmkv.Limits{})
			if err != nil || b.Seq != seq || b.Events[0].Hashes[0] != 10+seq {
				t.Fatalf("from %d: answer %d is %+v, %v; want seq %d", c.from, i, b, err, seq)
			}
		}
	}
}

// TestRingBytesBound: payloads summing to exactly maxBytes are all kept; one byte past drops
// the oldest.
func TestRingBytesBound(t *testing.T) {
	r := newRing(8, 10)
	for i := range 5 {
		r.add(retained{seq: uint64(i), payload: []byte{1, 2}})
	}
	if got := r.from(0); len(got) != 5 || r.bytes != 10 {
		t.Fatalf("at the bound kept %d batches, %d bytes", len(got), r.bytes)
	}
	r.add(retained{seq: 5, payload: []byte{1}})
	if got := r.from(0); len(got) != 5 || got[0].seq != 1 || r.bytes != 9 {
		t.Fatalf("one past the bound kept %+v, %d bytes", got, r.bytes)
	}
}
