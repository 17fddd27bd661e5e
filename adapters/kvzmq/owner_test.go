package kvzmq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// The owner's seq, replay and message-building logic, driven on the test's goroutine without
// sockets: batches go straight to owner.batch, the sink answers each message at once, and
// replays come from a source kept by the rig (Subscriber.fetch).

const rigTopicAddr, rigModel = "127.0.0.1:8001", "m"

// msg is what the router is told in one message.
type msg struct {
	Clear     bool
	BlockSize int
	Stored    []uint64
	Removed   []uint64
}

type ownerRig struct {
	t  *testing.T
	s  *Subscriber
	ow *owner
	sk *sink
	// retained is what the replay endpoint holds, handed over in this order whatever the
	// request's from (the owner skips what it did not ask for); asked is each request's from;
	// fail is the error a replay ends with.
	retained []vllmkv.Batch
	asked    []uint64
	fail     error
	seen     int // messages already returned by step
}

// newOwnerRig is an owner of worker "w" with a replay endpoint (when replayEP is set) and
// o's options.
func newOwnerRig(t *testing.T, o Options, replayEP string) *ownerRig {
	t.Helper()
	sk := newSink()
	o.Sink = sk
	if o.Clock == nil {
		o.Clock = clock.NewFake(time.Now()) // timers never fire: answers come at once
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	r := &ownerRig{t: t, s: s, sk: sk}
	s.fetch = func(ctx context.Context, endpoint string, from uint64, f func(vllmkv.Batch) bool) error {
		if endpoint != replayEP {
			t.Errorf("replay asked of %q, want %q", endpoint, replayEP)
		}
		r.asked = append(r.asked, from)
		for _, b := range r.retained {
			if !f(b) {
				return nil
			}
		}
		return r.fail
	}
	_, cancel := context.WithCancel(s.ctx)
	t.Cleanup(cancel)
	r.ow = newOwner(s, "w", 1, topicKey{rigTopicAddr, rigModel},
		vllmkv.Endpoint{Events: "tcp://127.0.0.1:1", Replay: replayEP}, cancel)
	return r
}

// step applies b and returns the messages it sent.
func (r *ownerRig) step(b vllmkv.Batch) []msg {
	r.t.Helper()
	r.ow.batch(r.s.ctx, b)
	r.sk.mu.Lock()
	defer r.sk.mu.Unlock()
	var out []msg
	for _, ev := range r.sk.got[r.seen:] {
		if ev.WorkerID != "w" || !ev.Engine || ev.Reg != 1 {
			r.t.Fatalf("a message %+v", ev)
		}
		out = append(out, msg{ev.Clear, ev.BlockSize, ev.Stored, ev.Removed})
	}
	r.seen = len(r.sk.got)
	return out
}

func (r *ownerRig) want(what string, got, want []msg) {
	r.t.Helper()
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		r.t.Fatalf("%s: messages (-want +got):\n%s", what, d)
	}
}

// counts is the owner's metrics: batches, gaps, resyncs by how, replay errors.
type counts struct{ Batches, Gaps, Replay, Kept, Clear, Restart, ReplayErrors, Orphans, Dropped float64 }

func (r *ownerRig) counts() counts {
	m := r.s.m
	return counts{testutil.ToFloat64(m.batches), testutil.ToFloat64(m.gaps),
		testutil.ToFloat64(m.resyncs.WithLabelValues("replay")), testutil.ToFloat64(m.resyncs.WithLabelValues("kept")),
		testutil.ToFloat64(m.resyncs.WithLabelValues("clear")),
		testutil.ToFloat64(m.resyncs.WithLabelValues("restart")), testutil.ToFloat64(m.replayErrors),
		testutil.ToFloat64(m.orphans), testutil.ToFloat64(m.dropped)}
}

func (r *ownerRig) wantCounts(what string, want counts) {
	r.t.Helper()
	if d := cmp.Diff(want, r.counts()); d != "" {
		r.t.Fatalf("%s: metrics (-want +got):\n%s", what, d)
	}
}

// root stores one block with no parent, engine hash h, of tokens unique to h; rootKey is its key.
func root(h uint64) vllmkv.Event { return stored([]uint64{h}, 0, false, toks(int(h)*4, 4), 4) }

func rootKey(h uint64) uint64 { return vllmkv.BlockKeys(nil, toks(int(h)*4, 4), 4, -1)[0] }

func bt(seq uint64, evs ...vllmkv.Event) vllmkv.Batch {
	return vllmkv.Batch{Topic: vllmkv.FormatTopic(rigTopicAddr, rigModel), Seq: seq, Events: evs, Rank: -1}
}

func keyed(hs ...uint64) []uint64 {
	out := make([]uint64, len(hs))
	for i, h := range hs {
		out[i] = rootKey(h)
	}
	return out
}

// TestOwnerSeqEdges walks the seq logic through its edges: first contact (a replay from 0 that
// may skip seqs), seq+1, seq+2 (a gap filled by replay), the same seq and a seq back (a restart,
// never replayed), each with its metrics.
func TestOwnerSeqEdges(t *testing.T) {
	r := newOwnerRig(t, Options{Replay: true}, "tcp://127.0.0.1:2")
	// First contact at seq 5: the engine retains 2 and 4 (3 is gone); both fill in, in order.
	r.retained = []vllmkv.Batch{bt(2, root(2)), bt(4, root(4)), bt(5, root(5)), bt(6, root(6))}
	r.want("first contact", r.step(bt(5, root(5))), []msg{
		{Clear: true}, {BlockSize: 4, Stored: keyed(2)}, {BlockSize: 4, Stored: keyed(4)}, {BlockSize: 4, Stored: keyed(5)}})
	if !cmp.Equal(r.asked, []uint64{0}) {
		t.Fatalf("replays asked from %v, want [0]", r.asked)
	}
	r.wantCounts("first contact", counts{Batches: 1})

	r.want("seq+1", r.step(bt(6, root(6))), []msg{{BlockSize: 4, Stored: keyed(6)}})
	r.wantCounts("seq+1", counts{Batches: 2})

	// seq+2: 7 was missed and is replayed; 8 comes live only.
	r.retained = []vllmkv.Batch{bt(7, root(7)), bt(8, root(8))}
	r.want("seq+2", r.step(bt(8, root(8))), []msg{{BlockSize: 4, Stored: keyed(7)}, {BlockSize: 4, Stored: keyed(8)}})
	if !cmp.Equal(r.asked, []uint64{0, 7}) {
		t.Fatalf("replays asked from %v, want [0 7]", r.asked)
	}
	r.wantCounts("seq+2", counts{Batches: 3, Gaps: 1, Replay: 1})

	// The same seq again, then one further back: a restarted engine each time, cleared and not
	// replayed (only a first contact replays from 0).
	r.want("the same seq", r.step(bt(8, root(9))), []msg{{Clear: true, BlockSize: 4}, {BlockSize: 4, Stored: keyed(9)}})
	r.wantCounts("the same seq", counts{Batches: 4, Gaps: 1, Replay: 1, Restart: 1})
	r.want("a seq back", r.step(bt(3, root(10))), []msg{{Clear: true, BlockSize: 4}, {BlockSize: 4, Stored: keyed(10)}})
	r.wantCounts("a seq back", counts{Batches: 5, Gaps: 1, Replay: 1, Restart: 2})
	if len(r.asked) != 2 {
		t.Fatalf("replays asked from %v after restarts", r.asked)
	}
	if h := r.sk.held("w"); len(h) != 1 || !h[rootKey(10)] {
		t.Fatalf("held %v, want the restart's key alone", h)
	}
}

// TestOwnerGapReplayRange: a gap [from, to) takes exactly the replayed batches from..to-1: older
// ones are skipped, the live batch's seq ends the replay (the live batch is applied once, live).
func TestOwnerGapReplayRange(t *testing.T) {
	r := newOwnerRig(t, Options{Replay: true}, "tcp://127.0.0.1:2")
	r.step(bt(1, root(1)))
	r.step(bt(2, root(2)))
	r.retained = []vllmkv.Batch{bt(1, root(1)), bt(2, root(2)), bt(3, root(3)), bt(4, root(4)), bt(5, root(5)), bt(6, root(6))}
	r.want("gap 3..4", r.step(bt(5, root(5))), []msg{
		{BlockSize: 4, Stored: keyed(3)}, {BlockSize: 4, Stored: keyed(4)}, {BlockSize: 4, Stored: keyed(5)}})
	r.wantCounts("gap 3..4", counts{Batches: 3, Gaps: 1, Replay: 1})
	if h := r.sk.held("w"); len(h) != 5 {
		t.Fatalf("held %d keys, want 5", len(h))
	}
	// The replay ends at the live batch's seq: what the endpoint does after it (here, fail)
	// does not matter.
	r.retained, r.fail = []vllmkv.Batch{bt(6, root(6)), bt(7, root(7))}, errors.New("connection reset")
	r.want("gap 6", r.step(bt(7, root(7))), []msg{{BlockSize: 4, Stored: keyed(6)}, {BlockSize: 4, Stored: keyed(7)}})
	r.wantCounts("gap 6", counts{Batches: 4, Gaps: 2, Replay: 2})
}

// TestOwnerGapReplayFailures: a gap replay (3..5, before the live 6) that does not fill the
// whole gap — a hole in it, an end before the live batch, a batch of another worker's topic, an
// error — keeps what the worker had and what the replay gave; either way nothing is cleared.
func TestOwnerGapReplayFailures(t *testing.T) {
	other := bt(3, root(3))
	other.Topic = vllmkv.FormatTopic("127.0.0.1:9999", rigModel)
	noTopic := bt(3, root(3))
	noTopic.Topic = ""
	st := func(h uint64) msg { return msg{BlockSize: 4, Stored: keyed(h)} }
	for _, c := range []struct {
		name     string
		retained []vllmkv.Batch
		fail     error
		filled   bool
		msgs     []msg // after the first contact's
	}{
		{"whole", []vllmkv.Batch{bt(3, root(3)), bt(4, root(4)), bt(5, root(5))}, nil, true,
			[]msg{st(3), st(4), st(5), st(6)}},
		{"no topic", []vllmkv.Batch{noTopic, bt(4, root(4)), bt(5, root(5))}, nil, true,
			[]msg{st(3), st(4), st(5), st(6)}},
		{"a hole", []vllmkv.Batch{bt(3, root(3)), bt(5, root(5))}, nil, false,
			[]msg{st(3), st(6)}},
		{"ends early", []vllmkv.Batch{bt(3, root(3)), bt(4, root(4))}, nil, false,
			[]msg{st(3), st(4), st(6)}},
		{"another topic", []vllmkv.Batch{other, bt(4, root(4)), bt(5, root(5))}, nil, false,
			[]msg{st(6)}},
		{"an error", []vllmkv.Batch{bt(3, root(3)), bt(4, root(4)), bt(5, root(5))}, errors.New("connection reset"), false,
			[]msg{st(3), st(4), st(5), st(6)}},
		{"nothing", nil, nil, false,
			[]msg{st(6)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newOwnerRig(t, Options{Replay: true}, "tcp://127.0.0.1:2")
			r.step(bt(2, root(2)))
			r.retained, r.fail = c.retained, c.fail
			r.want("the gap", r.step(bt(6, root(6))), c.msgs)
			want := counts{Batches: 2, Gaps: 1, Replay: 1}
			if !c.filled {
				want.Replay, want.Kept = 0, 1
			}
			if c.fail != nil {
				want.ReplayErrors = 1
			}
			r.wantCounts("the gap", want)
			if !cmp.Equal(r.asked, []uint64{0, 3}) {
				t.Fatalf("replays asked from %v, want [0 3]", r.asked)
			}
		})
	}
}

// TestOwnerFirstContactReplayFailure: a first contact whose replay fails starts clean from the
// live batch; nothing more is cleared.
func TestOwnerFirstContactReplayFailure(t *testing.T) {
	r := newOwnerRig(t, Options{Replay: true}, "tcp://127.0.0.1:2")
	r.retained, r.fail = []vllmkv.Batch{bt(1, root(1))}, errors.New("refused")
	r.want("first contact", r.step(bt(4, root(4))), []msg{{Clear: true}, {BlockSize: 4, Stored: keyed(1)}, {BlockSize: 4, Stored: keyed(4)}})
	r.wantCounts("first contact", counts{Batches: 1, ReplayErrors: 1})
}

// TestOwnerNoReplay: without replay (off, or no endpoint) a gap keeps the worker's entries and
// nothing is asked; a
// lost connection or a dropped batch followed by seq+1 missed nothing, so nothing is cleared.
func TestOwnerNoReplay(t *testing.T) {
	for _, c := range []struct {
		name     string
		replay   bool
		endpoint string
	}{{"off", false, "tcp://127.0.0.1:2"}, {"no endpoint", true, ""}, {"on", true, "tcp://127.0.0.1:2"}} {
		t.Run(c.name, func(t *testing.T) {
			r := newOwnerRig(t, Options{Replay: c.replay, Buffer: 1}, c.endpoint)
			r.step(bt(1, root(1)))
			r.ow.connLost()
			r.want("lost, then seq+1", r.step(bt(2, root(2))), []msg{{BlockSize: 4, Stored: keyed(2)}})
			// A full buffer drops the second batch: seq+1 after it still missed nothing.
			r.ow.deliver(bt(3, root(3)))
			r.ow.deliver(bt(4, root(4)))
			r.want("dropped, then seq+1", r.step(<-r.ow.in), []msg{{BlockSize: 4, Stored: keyed(3)}})
			if c := r.counts(); c.Dropped != 1 || c.Clear != 0 || c.Restart != 0 {
				t.Fatalf("metrics %+v", c)
			}
			if h := r.sk.held("w"); len(h) != 3 {
				t.Fatalf("held %v, want 3 keys", h)
			}
			if c.replay && c.endpoint != "" {
				if !cmp.Equal(r.asked, []uint64{0}) {
					t.Fatalf("replays asked from %v, want the first contact's only", r.asked)
				}
				return
			}
			r.want("a gap", r.step(bt(5, root(5))), []msg{{BlockSize: 4, Stored: keyed(5)}})
			if c := r.counts(); c.Kept != 1 || c.Clear != 0 {
				t.Fatalf("metrics %+v", c)
			}
			if h := r.sk.held("w"); len(h) != 4 {
				t.Fatalf("held %v after the gap, want 4 keys", h)
			}
			if len(r.asked) != 0 {
				t.Fatalf("replays asked from %v without replay", r.asked)
			}
		})
	}
}

// chain is blocks of 4 tokens linked by their engine hashes i+1 (block i's parent is i): st
// stores blocks [i, j) and rm removes blocks; key is block i's router key.
type chain struct{ keys []uint64 }

func newChain(n int) chain { return chain{vllmkv.BlockKeys(nil, toks(1000, 4*n), 4, -1)} }

func (chain) st(i, j int) vllmkv.Event {
	hs := make([]uint64, 0, j-i)
	for k := i; k < j; k++ {
		hs = append(hs, uint64(k+1))
	}
	return stored(hs, uint64(i), i > 0, toks(1000+4*i, 4*(j-i)), 4)
}

func (chain) rm(blocks ...int) vllmkv.Event {
	hs := make([]uint64, len(blocks))
	for k, b := range blocks {
		hs[k] = uint64(b + 1)
	}
	return vllmkv.Event{Kind: vllmkv.BlockRemoved, Hashes: hs}
}

func (c chain) key(blocks ...int) []uint64 {
	out := make([]uint64, len(blocks))
	for k, b := range blocks {
		out[k] = c.keys[b]
	}
	return out
}

// TestOwnerMessageOrder: stored keys go before a removal's, as the engine applied them, and
// consecutive removals share a message.
func TestOwnerMessageOrder(t *testing.T) {
	r := newOwnerRig(t, Options{}, "")
	c := newChain(4)
	r.want("stored", r.step(bt(1, c.st(0, 3))), []msg{{Clear: true}, {BlockSize: 4, Stored: c.key(0, 1, 2)}})
	r.want("two removals", r.step(bt(2, c.rm(0), c.rm(1))), []msg{{BlockSize: 4, Removed: c.key(0, 1)}})
	r.want("stored then removed", r.step(bt(3, c.st(3, 4), c.rm(3))), []msg{
		{BlockSize: 4, Stored: c.key(3)}, {BlockSize: 4, Removed: c.key(3)}})
	if h := r.sk.held("w"); len(h) != 1 || !h[c.keys[2]] {
		t.Fatalf("held %v, want block 2's key alone", h)
	}
}

// TestOwnerSplitsAtPieceIDs: no message carries more than PieceIDs ids, stored and removed
// together; a message is full at exactly PieceIDs.
func TestOwnerSplitsAtPieceIDs(t *testing.T) {
	r := newOwnerRig(t, Options{PieceIDs: 3}, "")
	c := newChain(10)
	r.want("three", r.step(bt(1, c.st(0, 3))), []msg{{Clear: true}, {BlockSize: 4, Stored: c.key(0, 1, 2)}})
	r.want("four", r.step(bt(2, c.st(3, 7))), []msg{{BlockSize: 4, Stored: c.key(3, 4, 5)}, {BlockSize: 4, Stored: c.key(6)}})
	r.want("two removed, two stored", r.step(bt(3, c.rm(0, 1), c.st(7, 8), c.st(8, 9))), []msg{
		{BlockSize: 4, Stored: c.key(7), Removed: c.key(0, 1)}, {BlockSize: 4, Stored: c.key(8)}})
	r.want("four removed", r.step(bt(4, c.rm(2, 3, 4, 5))), []msg{{BlockSize: 4, Removed: c.key(2, 3, 4)}, {BlockSize: 4, Removed: c.key(5)}})
}

// TestOwnerBlockSize: a message carries the last stored event's block size; a malformed event
// (block size 0) clears the worker without changing it.
func TestOwnerBlockSize(t *testing.T) {
	r := newOwnerRig(t, Options{}, "")
	r.want("size 16", r.step(bt(1, stored([]uint64{1}, 0, false, toks(0, 16), 16))), []msg{
		{Clear: true}, {BlockSize: 16, Stored: vllmkv.BlockKeys(nil, toks(0, 16), 16, -1)}})
	r.want("a malformed event", r.step(bt(2, stored([]uint64{2}, 0, false, nil, 0))), []msg{{Clear: true, BlockSize: 16}})
	r.wantCounts("a malformed event", counts{Batches: 2, Clear: 1})
	r.want("size 4", r.step(bt(3, root(3))), []msg{{BlockSize: 4, Stored: keyed(3)}})
	r.want("an orphan", r.step(bt(4, stored([]uint64{5}, 99, true, toks(0, 8), 8))), nil)
	r.wantCounts("an orphan", counts{Batches: 4, Clear: 1, Orphans: 1})
}
