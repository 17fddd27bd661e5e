package kvpub

import (
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/internal/vllmkv"
)

const topic = "kv@127.0.0.1:8000@smol"

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

// noLeaks checks, after every other cleanup of the test, that its goroutines have ended.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

func start(t *testing.T, o Options) *Publisher {
	t.Helper()
	if o.Topic == "" {
		o.Topic = topic
	}
	p, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// subscriber is a SUB end of one connection, read by hand.
type subscriber struct {
	t  *testing.T
	c  net.Conn
	zc *zmq4.Conn
}

// openSub runs a SUB's handshake on c and subscribes to prefix.
func openSub(t *testing.T, c net.Conn, server bool, prefix string) *subscriber {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	zc, err := zmq4.Open(c, null.Security(), zmq4.Sub, nil, server, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, prefix...))); err != nil {
		t.Fatal(err)
	}
	return &subscriber{t: t, c: c, zc: zc}
}

func dialSub(t *testing.T, addr, prefix string) *subscriber {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return openSub(t, c, false, prefix)
}

func (s *subscriber) recv() vllmkv.Batch {
	s.t.Helper()
	msg, err := s.zc.RecvMsg()
	if err != nil {
		s.t.Fatal(err)
	}
	b, err := vllmkv.DecodeMessage(msg.Frames, vllmkv.Limits{})
	if err != nil {
		s.t.Fatal(err)
	}
	return b
}

func stored(h uint64, toks ...uint32) []vllmkv.Event {
	return []vllmkv.Event{{Kind: vllmkv.BlockStored, Hashes: []uint64{h}, Tokens: toks, BlockSize: len(toks), Medium: "GPU"}}
}

// TestBindPublishesInOrder: a subscriber that dialled the bound PUB receives every batch, in
// seq order from 0, decodable in either format; a subscriber to another prefix receives none.
func TestBindPublishesInOrder(t *testing.T) {
	noLeaks(t)
	for _, f := range []vllmkv.Format{vllmkv.Array, vllmkv.Map} {
		p := start(t, Options{Addr: "127.0.0.1:0", Bind: true, Format: f})
		s := dialSub(t, p.EventsAddr(), "kv@")
		other := dialSub(t, p.EventsAddr(), "kv@10.0.0.1")
		eventually(t, "one subscriber", func() bool { return p.Subscribers() == 1 })
		for i := range 3 {
			p.Publish(stored(uint64(100+i), 1, 2, 3, 4))
		}
		for i := range 3 {
			b := s.recv()
			if b.Seq != uint64(i) || b.Topic != topic || b.Rank != -1 || len(b.Events) != 1 || b.Events[0].Hashes[0] != uint64(100+i) || b.Events[0].Medium != "GPU" {
				t.Fatalf("format %d: batch %d is %+v", f, i, b)
			}
		}
		_ = other.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := other.zc.RecvMsg(); err == nil {
			t.Fatal("a subscriber to another topic received a batch")
		}
		if st := p.Stats(); st.Published != 3 || st.Dropped != 0 {
			t.Fatalf("stats %+v", st)
		}
		p.Close()
	}
}

// dealer is a replay client's DEALER end of one connection.
type dealer struct {
	t  *testing.T
	zc *zmq4.Conn
}

func dialDealer(t *testing.T, addr string) *dealer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	zc, err := zmq4.Open(c, null.Security(), zmq4.Dealer, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &dealer{t: t, zc: zc}
}

// request sends one replay request and returns the answers' frames up to and including the
// sentinel (at most 2048 messages).
func (d *dealer) request(from uint64) [][][]byte {
	d.t.Helper()
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], from)
	if err := d.zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seq[:])); err != nil {
		d.t.Fatal(err)
	}
	var out [][][]byte
	for range 2048 {
		msg, err := d.zc.RecvMsg()
		if err != nil {
			d.t.Fatal(err)
		}
		out = append(out, msg.Frames)
		n := len(msg.Frames)
		if n >= 2 && len(msg.Frames[n-2]) == 8 && binary.BigEndian.Uint64(msg.Frames[n-2]) == vllmkv.ReplaySentinelSeq {
			return out
		}
	}
	d.t.Fatal("no sentinel")
	return nil
}

// replayClient sends one replay request on a connection of its own.
func replayClient(t *testing.T, addr string, from uint64) [][][]byte {
	t.Helper()
	return dialDealer(t, addr).request(from)
}

// TestWithheldBatchIsAGapThatReplayFills: a withheld batch's seq is skipped on the live stream;
// the replay endpoint answers every retained batch from the asked seq, the withheld one
// included, then the sentinel — with the topic frame, and in vLLM's shape without it.
func TestWithheldBatchIsAGapThatReplayFills(t *testing.T) {
	noLeaks(t)
	for _, withTopic := range []bool{true, false} {
		p := start(t, Options{Addr: "127.0.0.1:0", Bind: true, Replay: "127.0.0.1:0", ReplayTopic: withTopic})
		s := dialSub(t, p.EventsAddr(), "")
		eventually(t, "the subscriber", func() bool { return p.Subscribers() == 1 })
		p.Publish(stored(1, 1))
		p.Withhold()
		p.Publish(stored(2, 2))
		p.Publish(stored(3, 3))
		if a, b := s.recv(), s.recv(); a.Seq != 0 || b.Seq != 2 {
			t.Fatalf("live seqs %d, %d; want 0 then 2 (1 withheld)", a.Seq, b.Seq)
		}
		got := replayClient(t, p.ReplayAddr(), 1)
		if len(got) != 3 {
			t.Fatalf("replay from 1: %d messages, want 2 batches and the sentinel", len(got))
		}
		for i, frames := range got {
			want := 3
			if withTopic {
				want = 4
			}
			if len(frames) != want || len(frames[0]) != 0 {
				t.Fatalf("topic %v: answer %d has %d frames (want %d, the first empty)", withTopic, i, len(frames), want)
			}
			if i == 2 {
				if len(frames[want-1]) != 0 || (withTopic && len(frames[1]) != 0) {
					t.Fatalf("the sentinel %q", frames)
				}
				continue
			}
			body := frames[1:]
			if !withTopic {
				body = append([][]byte{[]byte(topic)}, body...)
			} else if string(body[0]) != topic {
				t.Fatalf("replay topic %q", body[0])
			}
			b, err := vllmkv.DecodeMessage(body, vllmkv.Limits{})
			if err != nil || b.Seq != uint64(i+1) || b.Events[0].Hashes[0] != uint64(i+2) {
				t.Fatalf("replayed batch %d: %+v, %v", i, b, err)
			}
		}
		if st := p.Stats(); st.Withheld != 1 || st.Published != 3 {
			t.Fatalf("stats %+v", st)
		}
		p.Close()
	}
}

// TestRetainBounds: the ring keeps the latest Retain batches and at most RetainBytes.
func TestRetainBounds(t *testing.T) {
	r := newRing(4, 10)
	for i := range 6 {
		r.add(retained{seq: uint64(i), payload: []byte{1, 2}})
	}
	if got := r.from(0); len(got) != 4 || got[0].seq != 2 || got[3].seq != 5 {
		t.Fatalf("kept %+v", got)
	}
	r.add(retained{seq: 6, payload: make([]byte, 9)})
	if got := r.from(0); len(got) != 1 || got[0].seq != 6 || r.bytes != 9 {
		t.Fatalf("after a large batch kept %+v (%d bytes)", got, r.bytes)
	}
	r.add(retained{seq: 7, payload: make([]byte, 20)}) // over the bound alone: kept alone
	if got := r.from(7); len(got) != 1 {
		t.Fatalf("the newest batch was not kept: %+v", got)
	}
}

// TestFullQueueDropsAndConsumesTheSeq: Publish never waits; a batch that finds the queue full
// is dropped and its seq is still consumed.
func TestFullQueueDropsAndConsumesTheSeq(t *testing.T) {
	p := &Publisher{in: make(chan pending, 1)}
	p.o.defaults()
	p.Publish(stored(1, 1))
	p.Publish(stored(2, 2))
	if p.Stats().Dropped != 1 || p.NextSeq() != 2 {
		t.Fatalf("dropped %d, next seq %d", p.Stats().Dropped, p.NextSeq())
	}
	if b := <-p.in; b.seq != 0 {
		t.Fatalf("queued seq %d", b.seq)
	}
	p.Publish(stored(3, 3)) // a place again: seq 1 stays a gap
	if b := <-p.in; b.seq != 2 || p.Stats().Dropped != 1 || p.NextSeq() != 3 {
		t.Fatalf("after the drop: queued seq %d, dropped %d, next %d", b.seq, p.Stats().Dropped, p.NextSeq())
	}
}

// TestConnectRedials: a connecting PUB reaches the consumer's SUB, and dials again when that
// connection is gone.
func TestConnectRedials(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := start(t, Options{Addr: ln.Addr().String(), Redial: 5 * time.Millisecond})
	for round := range 2 {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		s := openSub(t, c, true, "")
		eventually(t, "the subscription", func() bool { return p.Subscribers() == 1 })
		p.Publish(stored(uint64(round), 1))
		if b := s.recv(); b.Seq != uint64(round) {
			t.Fatalf("round %d: seq %d", round, b.Seq)
		}
		c.Close()
		eventually(t, "the connection dropped", func() bool { return p.Subscribers() == 0 })
	}
	p.Close()
}

// TestHostilePeers: a subscriber that sends a frame over the bound is cut; a malformed replay
// request is ignored and a well-formed one on the same connection still answered; connections
// past MaxConns are closed.
func TestHostilePeers(t *testing.T) {
	noLeaks(t)
	p := start(t, Options{Addr: "127.0.0.1:0", Bind: true, Replay: "127.0.0.1:0", ReplayTopic: true})
	s := dialSub(t, p.EventsAddr(), "")
	eventually(t, "the subscriber", func() bool { return p.Subscribers() == 1 })
	if err := s.zc.SendMsg(zmq4.NewMsg(make([]byte, 4096))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.zc.RecvMsg(); err == nil {
		t.Fatal("a subscriber that sent a 4 KiB frame was not cut")
	}
	eventually(t, "the subscriber gone", func() bool { return p.Subscribers() == 0 })

	// Past MaxConns: the second subscriber is closed at once.
	one := start(t, Options{Addr: "127.0.0.1:0", Bind: true, MaxConns: 1})
	first := dialSub(t, one.EventsAddr(), "")
	eventually(t, "the first subscriber", func() bool { return one.Subscribers() == 1 })
	c2, err := net.Dial("tcp", one.EventsAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second))
	if zc2, err := zmq4.Open(c2, null.Security(), zmq4.Sub, nil, false, nil); err == nil {
		if _, err := zc2.RecvMsg(); err == nil {
			t.Fatal("a connection past MaxConns was served")
		}
	}
	if one.Subscribers() != 1 {
		t.Fatalf("%d subscribers, want the first alone", one.Subscribers())
	}
	_ = first

	p.Publish(stored(9, 9))
	c, err := net.Dial("tcp", p.ReplayAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	zc, err := zmq4.Open(c, null.Security(), zmq4.Dealer, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, []byte{1, 2, 3})); err != nil { // a 3-byte seq
		t.Fatal(err)
	}
	var seq [8]byte
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seq[:])); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the batch retained", func() bool { return p.Stats().Published == 1 })
	msg, err := zc.RecvMsg()
	if err != nil || len(msg.Frames) != 4 {
		t.Fatalf("the answer to the good request: %v, %v", msg.Frames, err)
	}
	// A request of three frames is over the bound: the connection is cut.
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seq[:], []byte("x"))); err != nil {
		t.Fatal(err)
	}
	for range 4 { // the sentinel may still be read
		if _, err = zc.RecvMsg(); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatal("a replay client that sent three frames was not cut")
	}
}

func TestCheckAddr(t *testing.T) {
	for _, c := range []struct {
		addr string
		bind bool
		ok   bool
	}{
		{"127.0.0.1:0", true, true}, {"*:5557", true, true}, {"h:5557", false, true},
		{"*:5557", false, false}, {"h:0", false, false}, {"h", true, false}, {":5557", true, false},
		{"h:99999", true, false}, {"a/b:1", true, false},
	} {
		if err := CheckAddr(c.addr, c.bind); (err == nil) != c.ok {
			t.Errorf("CheckAddr(%q, bind %v) = %v", c.addr, c.bind, err)
		}
	}
	if _, err := Start(Options{Addr: "127.0.0.1:0", Bind: true, Topic: "nope"}); err == nil || !strings.Contains(err.Error(), "topic") {
		t.Fatalf("a bad topic: %v", err)
	}
}
