package kvzmq

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/internal/zmtpguard"
)

// TestOptionsDefaults: unset (zero or negative) options take their defaults; set ones stay, at
// the smallest value; MaxBackoff below MinBackoff becomes max(10 s, MinBackoff).
func TestOptionsDefaults(t *testing.T) {
	type got struct {
		MaxBlocks, MaxConns, Buffer, PieceIDs         int
		Handshake, Dial, Replay, Answer, MinBO, MaxBO time.Duration
	}
	const s, ms = time.Second, time.Millisecond
	for _, c := range []struct {
		name string
		in   Options
		want got
	}{
		{"zero", Options{}, got{65536, 4096, 256, 128, 5 * s, 5 * s, 5 * s, 5 * s, 100 * ms, 10 * s}},
		{"negative", Options{MaxBlocks: -1, MaxConns: -1, Buffer: -1, PieceIDs: -1, Handshake: -1, DialTimeout: -1,
			ReplayTimeout: -1, AnswerTimeout: -1, MinBackoff: -1, MaxBackoff: -1},
			got{65536, 4096, 256, 128, 5 * s, 5 * s, 5 * s, 5 * s, 100 * ms, 10 * s}},
		{"ones", Options{MaxBlocks: 1, MaxConns: 1, Buffer: 1, PieceIDs: 1, Handshake: 1, DialTimeout: 1,
			ReplayTimeout: 1, AnswerTimeout: 1, MinBackoff: 1, MaxBackoff: 1},
			got{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{"min set", Options{MinBackoff: s}, got{65536, 4096, 256, 128, 5 * s, 5 * s, 5 * s, 5 * s, s, 10 * s}},
		{"min over 10 s", Options{MinBackoff: 20 * s}, got{65536, 4096, 256, 128, 5 * s, 5 * s, 5 * s, 5 * s, 20 * s, 20 * s}},
		{"max at min", Options{MinBackoff: 2 * s, MaxBackoff: 2 * s}, got{65536, 4096, 256, 128, 5 * s, 5 * s, 5 * s, 5 * s, 2 * s, 2 * s}},
		{"max under min", Options{MinBackoff: 2 * s, MaxBackoff: 2*s - 1}, got{65536, 4096, 256, 128, 5 * s, 5 * s, 5 * s, 5 * s, 2 * s, 10 * s}},
	} {
		o := c.in
		o.defaults()
		g := got{o.MaxBlocks, o.MaxConns, o.Buffer, o.PieceIDs, o.Handshake, o.DialTimeout, o.ReplayTimeout, o.AnswerTimeout, o.MinBackoff, o.MaxBackoff}
		if d := cmp.Diff(c.want, g); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, d)
		}
		if o.Clock == nil || o.Logger == nil {
			t.Errorf("%s: no clock or logger", c.name)
		}
	}
}

// TestGuardLimits: a connection's frame bound is the payload bound (its default when unset),
// never under a topic's; four frames a message; the handshake deadline is the option's.
func TestGuardLimits(t *testing.T) {
	for _, c := range []struct {
		payload int
		frame   uint64
	}{{0, vllmkv.DefaultPayloadBytes}, {-1, vllmkv.DefaultPayloadBytes}, {1, vllmkv.MaxString}, {100000, 100000}} {
		o := Options{Limits: vllmkv.Limits{PayloadBytes: c.payload}, Handshake: 3 * time.Second}
		want := zmtpguard.Limits{MaxFrame: c.frame, MaxCommand: 4096, MaxFrames: 4, Handshake: 3 * time.Second}
		if g := o.guard(); g != want {
			t.Errorf("payload %d: %+v, want %+v", c.payload, g, want)
		}
	}
}

// owners is s's owners by id, its topics and its hosts' counts, read under its lock.
func owners(s *Subscriber) (map[string]*owner, map[topicKey]*owner, map[netip.Addr]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, b, h := map[string]*owner{}, map[topicKey]*owner{}, map[netip.Addr]int{}
	for k, v := range s.owners {
		o[k] = v
	}
	for k, v := range s.byTopic {
		b[k] = v
	}
	for k, v := range s.hosts {
		h[k] = v
	}
	return o, b, h
}

// TestWatchKeepsOwnerOnHeartbeat: a heartbeat of the same registration keeps the owner; a
// change of registration, model, address or endpoint replaces it (the old one stopped); a
// worker that may not publish has none.
func TestWatchKeepsOwnerOnHeartbeat(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s, err := New(Options{Sink: newSink(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ep := vllmkv.Endpoint{Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558"}.String()
	info := router.WorkerInfo{ID: "a", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8000", KVEventsEndpoint: ep}
	s.Watch(info)
	cur := func() *owner { o, _, _ := owners(s); return o["a"] }
	first := cur()
	if first == nil {
		t.Fatal("no owner")
	}
	s.Watch(info)
	if cur() != first || first.stopped {
		t.Fatal("a heartbeat replaced the owner")
	}
	prev := first
	for _, change := range []func(*router.WorkerInfo){
		func(i *router.WorkerInfo) { i.Reg = 2 },
		func(i *router.WorkerInfo) { i.Model = "m2" },
		func(i *router.WorkerInfo) { i.HTTPAddress = "127.0.0.1:8002" },
		func(i *router.WorkerInfo) {
			i.KVEventsEndpoint = vllmkv.Endpoint{Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5559"}.String()
		},
	} {
		change(&info)
		s.Watch(info)
		ow := cur()
		if ow == prev || !prev.stopped || ow.reg != info.Reg || ow.topic != (topicKey{info.HTTPAddress, info.Model}) {
			t.Fatalf("after a change to %+v: owner %p (was %p, stopped %v)", info, ow, prev, prev.stopped)
		}
		s.Watch(info)
		if cur() != ow {
			t.Fatalf("a heartbeat of %+v replaced the owner", info)
		}
		prev = ow
	}
	info.HTTPAddress = ""
	s.Watch(info)
	if o, b, h := owners(s); len(o)+len(b)+len(h) != 0 || !prev.stopped {
		t.Fatalf("a worker with no address kept %v %v %v", o, b, h)
	}
}

// TestForgetReleasesTopicsAndHosts: Forget drops a worker's topic and its share of its host; the
// host goes when its last worker does; a newer worker on the same address and model replaces the
// older.
func TestForgetReleasesTopicsAndHosts(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s, err := New(Options{Sink: newSink(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	local, far := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.1")
	s.Watch(router.WorkerInfo{ID: "a", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8000"})
	s.Watch(router.WorkerInfo{ID: "b", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8001"})
	s.Watch(router.WorkerInfo{ID: "c", Reg: 1, Model: "m", HTTPAddress: "10.0.0.1:8000"})
	s.Watch(router.WorkerInfo{ID: "d", Reg: 1, Model: "m", HTTPAddress: "engine:8000"}) // no IP: no host
	check := func(what string, ids []string, hosts map[netip.Addr]int) {
		t.Helper()
		o, b, h := owners(s)
		if len(o) != len(ids) || len(b) != len(ids) {
			t.Fatalf("%s: owners %v, topics %v, want %v", what, o, b, ids)
		}
		for _, id := range ids {
			if ow := o[id]; ow == nil || b[ow.topic] != ow {
				t.Fatalf("%s: %s's owner or topic is missing", what, id)
			}
		}
		if d := cmp.Diff(hosts, h); d != "" {
			t.Fatalf("%s: hosts (-want +got):\n%s", what, d)
		}
	}
	check("four", []string{"a", "b", "c", "d"}, map[netip.Addr]int{local: 2, far: 1})
	s.Forget("a")
	check("a forgotten", []string{"b", "c", "d"}, map[netip.Addr]int{local: 1, far: 1})
	s.Forget("nobody")
	check("an unknown id", []string{"b", "c", "d"}, map[netip.Addr]int{local: 1, far: 1})
	s.Watch(router.WorkerInfo{ID: "b2", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8001"})
	check("b's address taken by b2", []string{"b2", "c", "d"}, map[netip.Addr]int{local: 1, far: 1})
	s.Forget("b2")
	check("b2 forgotten", []string{"c", "d"}, map[netip.Addr]int{far: 1})
	s.Forget("c")
	s.Forget("d")
	check("none", nil, map[netip.Addr]int{})
}

// logRecorder keeps the messages of the records at Warn or above.
type logRecorder struct {
	mu    sync.Mutex
	warns []string
}

func (l *logRecorder) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.warns = append(l.warns, r.Message)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.warns...)
}

// TestAcceptEnds: Close ends the accept loop quietly; a listener that fails otherwise ends it
// with a warning.
func TestAcceptEnds(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	rec := &logRecorder{}
	s, err := New(Options{Sink: newSink(), Listen: "127.0.0.1:0", Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if w := rec.got(); len(w) != 0 {
		t.Fatalf("Close logged %q", w)
	}

	s, err = New(Options{Sink: newSink(), Listen: "127.0.0.1:0", Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.ln.Close()
	eventually(t, "the warning", func() bool {
		w := rec.got()
		return len(w) == 1 && strings.Contains(w[0], "accept failed")
	})
}

// TestAcceptAtMaxConns: with MaxConns 1, the second connection is refused while the first is
// open, and taken once it closed.
func TestAcceptAtMaxConns(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sk := newSink()
	s, err := New(Options{Sink: sk, Listen: "127.0.0.1:0", MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Watch(router.WorkerInfo{ID: "a", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8000"})
	topic := vllmkv.FormatTopic("127.0.0.1:8000", "m")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c1 := dial()
	p1 := openPub(t, c1, false, topic)
	p1.send(root(1))
	eventually(t, "the first connection's key", func() bool { return len(sk.held("a")) == 1 })

	c2 := dial()
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a second connection over MaxConns 1 was read: %v", err)
	}
	if n := testutil.ToFloat64(s.m.refused); n != 1 {
		t.Fatalf("refused %v, want 1", n)
	}

	c1.Close()
	eventually(t, "the first connection gone", func() bool { _, n := s.Len(); return n == 0 })
	p3 := openPub(t, dial(), false, topic)
	p3.seq = p1.seq
	p3.send(root(2))
	eventually(t, "the third connection's key", func() bool { return len(sk.held("a")) == 2 })
	if n := testutil.ToFloat64(s.m.refused); n != 1 {
		t.Fatalf("refused %v, want 1", n)
	}
}

// TestRedialBackoff: a dialled connection that fails is redialled after MinBackoff, doubling to
// MaxBackoff; one that lasted MaxBackoff (not one that lasted a nanosecond less) starts over at
// MinBackoff. The waits are read off a fake clock.
func TestRedialBackoff(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, ep := engineListener(t)
	fc := clock.NewFake(time.Now())
	s, err := New(Options{Sink: newSink(), Connect: true, Clock: fc, MinBackoff: time.Second, MaxBackoff: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Watch(router.WorkerInfo{ID: "b", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8001", KVEventsEndpoint: ep})
	topic := vllmkv.FormatTopic("127.0.0.1:8001", "m")
	waits := func(d time.Duration) {
		t.Helper()
		eventually(t, "a wait of "+d.String(), func() bool { n, ok := fc.Next(); return ok && n == d })
		if n := fc.Pending(); n != 1 {
			t.Fatalf("%d timers pending, want the backoff's alone", n)
		}
		fc.Advance(d)
	}
	lasting := func(d time.Duration) {
		t.Helper()
		c := accept(t, ln)
		openPub(t, c, true, topic)
		if n := fc.Pending(); n != 0 {
			t.Fatalf("%d timers pending while connected", n)
		}
		fc.Advance(d)
		c.Close()
	}
	for _, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		accept(t, ln).Close()
		waits(d)
	}
	lasting(4*time.Second - 1)
	waits(4 * time.Second)
	lasting(4 * time.Second)
	waits(time.Second)
	accept(t, ln).Close()
	waits(2 * time.Second)
}
