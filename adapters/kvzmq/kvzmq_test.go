package kvzmq

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// sink records the router's messages and answers each with ok.
type sink struct {
	mu  sync.Mutex
	got []router.KVEvents
	ok  bool
	ch  chan struct{}
}

func newSink() *sink { return &sink{ok: true, ch: make(chan struct{}, 1024)} }

func (s *sink) KVEvents(ev *router.KVEvents) {
	s.mu.Lock()
	s.got = append(s.got, *ev)
	ok := s.ok
	s.mu.Unlock()
	if ev.Reply != nil {
		ev.Reply <- ok
	}
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// held replays the messages as the router would: the keys a worker holds now.
func (s *sink) held(id string) map[uint64]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := map[uint64]bool{}
	for _, ev := range s.got {
		if ev.WorkerID != id {
			continue
		}
		if ev.Clear {
			h = map[uint64]bool{}
		}
		for _, k := range ev.Removed {
			delete(h, k)
		}
		for _, k := range ev.Stored {
			h[k] = true
		}
	}
	return h
}

func (s *sink) clears(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ev := range s.got {
		if ev.WorkerID == id && ev.Clear {
			n++
		}
	}
	return n
}

// eventually polls cond every millisecond for at most 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// pub is an engine's PUB end of one connection, driven by hand.
type pub struct {
	t     *testing.T
	zc    *zmq4.Conn
	c     net.Conn
	topic string
	seq   uint64
	f     vllmkv.Format
}

// open runs the PUB side's handshake on c and waits for the subscriber's SUBSCRIBE, so what
// is sent next is received.
func openPub(t *testing.T, c net.Conn, server bool, topic string) *pub {
	t.Helper()
	zc, err := zmq4.Open(c, null.Security(), zmq4.Pub, zmq4.SocketIdentity("engine"), server, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := zc.RecvMsg()
	if err != nil || len(msg.Frames) != 1 || len(msg.Frames[0]) != 1 || msg.Frames[0][0] != 1 {
		t.Fatalf("want a SUBSCRIBE to every topic, got %v, %v", msg, err)
	}
	return &pub{t: t, zc: zc, c: c, topic: topic}
}

func (p *pub) send(evs ...vllmkv.Event) {
	p.t.Helper()
	p.seq++
	p.sendSeq(p.seq, evs...)
}

func (p *pub) sendSeq(seq uint64, evs ...vllmkv.Event) {
	p.t.Helper()
	frames, err := vllmkv.EncodeMessage(vllmkv.Batch{Topic: p.topic, Seq: seq, Events: evs, Rank: -1}, p.f)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.zc.SendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
		p.t.Fatal(err)
	}
}

func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func stored(hashes []uint64, parent uint64, hasParent bool, tokens []uint32, bs int) vllmkv.Event {
	return vllmkv.Event{Kind: vllmkv.BlockStored, Hashes: hashes, Parent: parent, HasParent: hasParent, Tokens: tokens, BlockSize: bs, Medium: "GPU"}
}

// engineListener is an engine that binds its PUB: the gateway dials it.
func engineListener(t *testing.T) (net.Listener, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, "tcp://" + ln.Addr().String()
}

func accept(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConnectStoresKeysAndRemoves(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, ep := engineListener(t)
	sk := newSink()
	reg := prometheus.NewRegistry()
	s, err := New(Options{Sink: sk, Connect: true, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Watch(router.WorkerInfo{ID: "b", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8001", KVEventsEndpoint: ep})
	p := openPub(t, accept(t, ln), true, vllmkv.FormatTopic("127.0.0.1:8001", "m"))

	prompt := toks(100, 12) // three blocks of 4
	want := vllmkv.BlockKeys(nil, prompt, 4, -1)
	p.send(stored([]uint64{11, 12}, 0, false, prompt[:8], 4))
	p.f = vllmkv.Map
	p.send(stored([]uint64{13}, 12, true, prompt[8:], 4))
	eventually(t, "three keys", func() bool { return len(sk.held("b")) == 3 })
	for _, k := range want {
		if !sk.held("b")[k] {
			t.Fatalf("key %x of the request's tokens is not held: %v", k, sk.held("b"))
		}
	}
	p.send(vllmkv.Event{Kind: vllmkv.BlockRemoved, Hashes: []uint64{13, 999}})
	eventually(t, "two keys", func() bool { return len(sk.held("b")) == 2 })
	if sk.held("b")[want[2]] {
		t.Fatal("the removed block is still held")
	}
	// A batch naming another worker on this connection is refused.
	other := *p
	other.topic = vllmkv.FormatTopic("127.0.0.1:9999", "m")
	other.sendSeq(p.seq+1, stored([]uint64{77}, 0, false, toks(1, 4), 4))
	eventually(t, "the foreign topic counted", func() bool { return testutil.ToFloat64(s.m.unknownTopic) == 1 })
	// AllBlocksCleared: the router is told to forget.
	p.send(vllmkv.Event{Kind: vllmkv.AllBlocksCleared})
	eventually(t, "nothing held", func() bool { return len(sk.held("b")) == 0 })
	if n := testutil.ToFloat64(s.m.events.WithLabelValues("BlockStored")); n != 2 {
		t.Fatalf("BlockStored events %v, want 2", n)
	}
	s.Forget("b")
	if o, c := s.Len(); o != 0 || c != 0 {
		t.Fatalf("owners %d, conns %d after Forget", o, c)
	}
	for _, ev := range sk.got {
		if !ev.Engine || ev.Reg != 1 || len(ev.Stored)+len(ev.Removed) > 128 {
			t.Fatalf("a message %+v", ev)
		}
	}
}

// An engine that connects to the gateway's listen address may publish only for workers on its
// own host; a host that is no live worker's is refused at accept.
func TestListenBindsTopicsToTheConnectionsHost(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sk := newSink()
	s, err := New(Options{Sink: sk, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()

	// No live worker on 127.0.0.1 yet: the connection is closed at once.
	c0, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c0.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c0.Read(make([]byte, 1)); err == nil {
		t.Fatal("a stranger's connection was read")
	}
	c0.Close()
	eventually(t, "the refusal counted", func() bool { return testutil.ToFloat64(s.m.refused) == 1 })

	s.Watch(router.WorkerInfo{ID: "a", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8000"})
	s.Watch(router.WorkerInfo{ID: "far", Reg: 1, Model: "m", HTTPAddress: "10.1.2.3:8000"})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := openPub(t, c, false, vllmkv.FormatTopic("127.0.0.1:8000", "m"))
	p.send(stored([]uint64{1}, 0, false, toks(5, 16), 16))
	eventually(t, "a's key", func() bool { return len(sk.held("a")) == 1 })
	far := *p
	far.topic = vllmkv.FormatTopic("10.1.2.3:8000", "m")
	far.sendSeq(1, stored([]uint64{2}, 0, false, toks(5, 16), 16))
	bad := *p
	bad.topic = "kv@nonsense"
	bad.sendSeq(2)
	eventually(t, "the other host's topic refused", func() bool { return testutil.ToFloat64(s.m.unknownTopic) == 1 })
	eventually(t, "the bad topic refused", func() bool { return testutil.ToFloat64(s.m.decodeErrors) == 1 })
	if len(sk.held("far")) != 0 {
		t.Fatal("a connection from 127.0.0.1 stored blocks for 10.1.2.3")
	}
}

// TestGapKeptWithoutReplay: a gap that cannot be replayed keeps the worker's entries (only the
// lost batches' blocks are unknown); a seq that goes back clears.
func TestGapKeptWithoutReplay(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, ep := engineListener(t)
	sk := newSink()
	s, _ := New(Options{Sink: sk, Connect: true, Replay: true})
	defer s.Close()
	s.Watch(router.WorkerInfo{ID: "b", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8001", KVEventsEndpoint: ep})
	p := openPub(t, accept(t, ln), true, vllmkv.FormatTopic("127.0.0.1:8001", "m"))
	p.send(stored([]uint64{1}, 0, false, toks(0, 4), 4))
	eventually(t, "a key", func() bool { return len(sk.held("b")) == 1 })
	p.seq += 5 // five batches lost
	p.send(stored([]uint64{2}, 0, false, toks(50, 4), 4))
	eventually(t, "both keys", func() bool {
		h := sk.held("b")
		return len(h) == 2 && h[vllmkv.BlockKeys(nil, toks(50, 4), 4, -1)[0]] && h[vllmkv.BlockKeys(nil, toks(0, 4), 4, -1)[0]]
	})
	if testutil.ToFloat64(s.m.gaps) != 1 || testutil.ToFloat64(s.m.resyncs.WithLabelValues("kept")) != 1 ||
		testutil.ToFloat64(s.m.resyncs.WithLabelValues("clear")) != 0 {
		t.Fatal("the gap, kept, was not counted so")
	}
	// A seq that goes back (a restarted engine) clears too.
	p.seq = 0
	p.send(stored([]uint64{3}, 0, false, toks(90, 4), 4))
	eventually(t, "the restart's key alone", func() bool {
		h := sk.held("b")
		return len(h) == 1 && h[vllmkv.BlockKeys(nil, toks(90, 4), 4, -1)[0]]
	})
}

// Replay answer shapes a replayServer may use.
const (
	shapeTopic  = iota // [empty, topic, seq, payload]; sentinel [empty, "", seq, ""]
	shapeVLLM          // vLLM's [empty, seq, payload]; sentinel [empty, seq, ""]
	shapeBare          // [seq, payload]; sentinel [seq, ""]
	shapeBadSeq        // [empty, topic, a 7-byte seq, payload]: refused
)

// replayServer is an engine's replay ROUTER over retained batches, answering in shape.
func replayServer(t *testing.T, topic string, batches map[uint64][]vllmkv.Event, shape int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := zmq4.NewRouter(ctx, zmq4.WithLogger(nil))
	if err := r.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	answer := func(id []byte, seq uint64, payload []byte) {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		tp := []byte(topic)
		if seq == vllmkv.ReplaySentinelSeq {
			tp = []byte{}
		}
		var frames [][]byte
		switch shape {
		case shapeTopic:
			frames = [][]byte{id, {}, tp, s[:], payload}
		case shapeVLLM:
			frames = [][]byte{id, {}, s[:], payload}
		case shapeBare:
			frames = [][]byte{id, s[:], payload}
		case shapeBadSeq:
			frames = [][]byte{id, {}, tp, s[1:], payload}
		}
		_ = r.Send(zmq4.NewMsgFrom(frames...))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := r.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id, from := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			for seq := from; ; seq++ {
				evs, ok := batches[seq]
				if !ok {
					break
				}
				payload, _ := vllmkv.EncodePayload(vllmkv.Batch{Events: evs, Rank: -1}, vllmkv.Array)
				answer(id, seq, payload)
			}
			answer(id, vllmkv.ReplaySentinelSeq, []byte{})
		}
	}()
	t.Cleanup(func() { cancel(); r.Close(); <-done })
	return "tcp://" + r.Addr().String()
}

// TestGapFilledByReplay: a gap is filled from the replay endpoint, whichever of the answer
// shapes it uses; an answer of no known shape fails the replay and the gap is kept.
func TestGapFilledByReplay(t *testing.T) {
	for _, c := range []struct {
		name  string
		shape int
	}{{"topic", shapeTopic}, {"vllm", shapeVLLM}, {"bare", shapeBare}, {"bad-seq", shapeBadSeq}} {
		t.Run(c.name, func(t *testing.T) { testGapFilledByReplay(t, c.shape) })
	}
}

func testGapFilledByReplay(t *testing.T, shape int) {
	ln, ev := engineListener(t)
	topic := vllmkv.FormatTopic("127.0.0.1:8001", "m")
	prompt := toks(0, 12)
	missed := map[uint64][]vllmkv.Event{
		2: {stored([]uint64{2}, 1, true, prompt[4:8], 4)},
		3: {stored([]uint64{3}, 2, true, prompt[8:12], 4)},
	}
	rep := replayServer(t, topic, missed, shape)
	sk := newSink()
	s, _ := New(Options{Sink: sk, Connect: true, Replay: true})
	defer s.Close()
	s.Watch(router.WorkerInfo{ID: "b", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8001",
		KVEventsEndpoint: vllmkv.Endpoint{Events: ev, Replay: rep}.String()})
	p := openPub(t, accept(t, ln), true, topic)
	p.seq = 1
	p.sendSeq(1, stored([]uint64{1}, 0, false, prompt[:4], 4))
	eventually(t, "a key", func() bool { return len(sk.held("b")) == 1 })
	p.sendSeq(4, vllmkv.Event{Kind: vllmkv.BlockRemoved, Hashes: []uint64{3}})
	want := vllmkv.BlockKeys(nil, prompt, 4, -1)
	if shape == shapeBadSeq {
		eventually(t, "the failed replay's gap kept", func() bool { return testutil.ToFloat64(s.m.resyncs.WithLabelValues("kept")) == 1 })
		if testutil.ToFloat64(s.m.replayErrors) < 1 || len(sk.held("b")) != 1 || sk.clears("b") != 1 {
			t.Fatalf("replay errors %v, held %v, clears %d", testutil.ToFloat64(s.m.replayErrors), sk.held("b"), sk.clears("b"))
		}
		return
	}
	eventually(t, "the replayed keys, then the removal", func() bool {
		h := sk.held("b")
		return len(h) == 2 && h[want[0]] && h[want[1]]
	})
	if testutil.ToFloat64(s.m.resyncs.WithLabelValues("replay")) != 1 || sk.clears("b") != 1 {
		t.Fatalf("replays %v, clears %d (want 1 and only the first contact's)", testutil.ToFloat64(s.m.resyncs.WithLabelValues("replay")), sk.clears("b"))
	}
}

// TestReplayMessageShapes: each known answer shape is read, with its topic or none; anything
// else is refused without a panic or an allocation by its claims.
func TestReplayMessageShapes(t *testing.T) {
	payload, _ := vllmkv.EncodePayload(vllmkv.Batch{Events: []vllmkv.Event{{Kind: vllmkv.AllBlocksCleared}}, Rank: -1}, vllmkv.Map)
	seq := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	end := seq(vllmkv.ReplaySentinelSeq)
	for _, c := range []struct {
		name   string
		frames [][]byte
		topic  string
		end    bool
		err    bool
	}{
		{"topic", [][]byte{{}, []byte("kv@h:1@m"), seq(7), payload}, "kv@h:1@m", false, false},
		{"topic, no delimiter", [][]byte{[]byte("kv@h:1@m"), seq(7), payload}, "kv@h:1@m", false, false},
		{"vllm", [][]byte{{}, seq(7), payload}, "", false, false},
		{"bare", [][]byte{seq(7), payload}, "", false, false},
		{"topic sentinel", [][]byte{{}, {}, end, {}}, "", true, false},
		{"vllm sentinel", [][]byte{{}, end, {}}, "", true, false},
		{"bare sentinel", [][]byte{end, {}}, "", true, false},
		{"one frame", [][]byte{seq(7)}, "", false, true},
		{"five frames", [][]byte{{}, {}, {}, seq(7), payload}, "", false, true},
		{"four frames, no delimiter", [][]byte{{1}, []byte("t"), seq(7), payload}, "", false, true},
		{"a 7-byte seq", [][]byte{seq(7)[1:], payload}, "", false, true},
		{"a 9-byte seq", [][]byte{{}, append(seq(7), 0), payload}, "", false, true},
		{"a payload claiming 2^32 events", [][]byte{seq(7), {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}}, "", false, true},
		{"garbage payload", [][]byte{seq(7), []byte("not msgpack")}, "", false, true},
	} {
		b, isEnd, err := replayMessage(c.frames, vllmkv.Limits{})
		if (err != nil) != c.err || isEnd != c.end {
			t.Errorf("%s: end %v, err %v", c.name, isEnd, err)
			continue
		}
		if !c.err && !c.end && (b.Topic != c.topic || b.Seq != 7 || len(b.Events) != 1) {
			t.Errorf("%s: %+v", c.name, b)
		}
	}
}

// An attacker on the listen address's host declares a 2^62-byte frame: the connection is
// closed and nothing is allocated for it.
func TestHostileFrameOverTheSocket(t *testing.T) {
	sk := newSink()
	s, _ := New(Options{Sink: sk, Listen: "127.0.0.1:0"})
	defer s.Close()
	s.Watch(router.WorkerInfo{ID: "a", Reg: 1, Model: "m", HTTPAddress: "127.0.0.1:8000"})
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	zc, err := zmq4.Open(c, null.Security(), zmq4.Pub, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zc.RecvMsg(); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte{0x02, 0x40, 0, 0, 0, 0, 0, 0, 0})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("the connection was not closed: %v", err)
	}
	eventually(t, "the refusal counted", func() bool { return testutil.ToFloat64(s.m.decodeErrors) >= 1 })
	eventually(t, "the connection dropped", func() bool { _, n := s.Len(); return n == 0 })
}
