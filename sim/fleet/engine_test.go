package fleet

import (
	"bytes"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/internal/oai"
)

// TestScaledEngine: a heterogeneous engine's speed divides both per-token times and its
// memory multiplies the KV blocks, never below one block.
func TestScaledEngine(t *testing.T) {
	m := EngineModel{KVBlocks: 100, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 10 * time.Millisecond}
	for _, c := range []struct {
		speed, mem float64
		want       EngineModel
	}{
		{2, 2, EngineModel{KVBlocks: 200, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 5 * time.Millisecond}},
		{0.5, 0.5, EngineModel{KVBlocks: 50, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 200 * time.Microsecond, DecodePerToken: 20 * time.Millisecond}},
		{1, 0.001, EngineModel{KVBlocks: 1, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 10 * time.Millisecond}},
	} {
		if got := m.scaled(c.speed, c.mem); got != c.want {
			t.Errorf("scaled(%v, %v) = %+v, want %+v", c.speed, c.mem, got, c.want)
		}
	}
	o := Options{Workers: 4, Heterogeneous: true, Engine: m}
	ms := o.models()
	if ms[0] != m.scaled(0.5, 0.5) || ms[1] != m || ms[2] != m.scaled(2, 2) || ms[3] != ms[0] {
		t.Fatalf("heterogeneous fleet %+v", ms)
	}
}

// TestEngineSlots: an engine runs at most MaxRunning requests; its in-flight count is the
// running and the queued ones; a prompt fits when its blocks and one more token's do (as
// tlengine's errTooLong).
func TestEngineSlots(t *testing.T) {
	e := newEngine("e0", EngineModel{KVBlocks: 64, BlockSize: 16, MaxRunning: 2})
	prompt := func(first uint32) []uint32 {
		p := make([]uint32, 20)
		for i := range p {
			p[i] = first + uint32(i)
		}
		return p
	}
	for i := range 2 {
		if _, _, ok := e.tryStart(prompt(uint32(100 * i))); !ok {
			t.Fatalf("start %d refused with %d running", i, e.run)
		}
	}
	if _, _, ok := e.tryStart(prompt(1000)); ok {
		t.Fatal("a third request started on an engine of 2 slots")
	}
	e.queue = append(e.queue, 7, 8, 9)
	e.head = 1
	if got := e.inFlight(); got != 4 {
		t.Fatalf("inFlight = %d with 2 running and 2 waiting", got)
	}
	small := newEngine("e1", EngineModel{KVBlocks: 4, BlockSize: 16, MaxRunning: 1})
	if !small.fits(63) || small.fits(64) {
		t.Fatalf("4 blocks of 16: fits(63) = %v, fits(64) = %v; want true, false", small.fits(63), small.fits(64))
	}
}

// TestFinishCachesTheAnswer: a finished request's answer joins its KV, so the next turn of a
// conversation (prompt + answer + more) finds both cached.
func TestFinishCachesTheAnswer(t *testing.T) {
	e := newEngine("e0", EngineModel{KVBlocks: 64, BlockSize: 16, MaxRunning: 4})
	turn := make([]uint32, 0, 80)
	for i := range 32 {
		turn = append(turn, uint32(i+1))
	}
	seq, _, ok := e.tryStart(turn)
	if !ok {
		t.Fatal("not started")
	}
	answer := make([]uint32, 32)
	for i := range answer {
		answer[i] = uint32(1000 + i)
	}
	e.finish(e.pool, seq, answer)
	if e.run != 0 {
		t.Fatalf("%d running after finish", e.run)
	}
	next := append(append(turn, answer...), 5, 6, 7)
	_, cached, ok := e.tryStart(next)
	if !ok {
		t.Fatal("next turn not started")
	}
	if cached != 64 {
		t.Fatalf("next turn found %d tokens cached, want 64 (its prompt and answer)", cached)
	}
}

// TestEventsOrder: events pop by time, and events at one time in the order they were pushed.
func TestEventsOrder(t *testing.T) {
	var q events
	type ev struct {
		at  int64
		idx int32
	}
	in := []ev{{5, 0}, {3, 1}, {5, 2}, {3, 3}, {1, 4}, {5, 5}, {3, 6}, {9, 7}, {1, 8}}
	for _, e := range in {
		q.push(e.at, evArrive, e.idx)
	}
	want := []int32{4, 8, 1, 3, 6, 0, 2, 5, 7}
	for i, w := range want {
		if len(q.h) == 0 {
			t.Fatalf("empty after %d pops", i)
		}
		if got := q.pop(); got.idx != w {
			t.Fatalf("pop %d = event %d at %d, want %d", i, got.idx, got.at, w)
		}
	}
	if len(q.h) != 0 {
		t.Fatalf("%d events left", len(q.h))
	}
}

// TestOfferedRate: each result reports the arrival rate its run offered, Load × the fleet's
// estimated capacity.
func TestOfferedRate(t *testing.T) {
	o := Options{Trace: TraceSharedPrefix, Workers: 3, Requests: 200, Load: 0.5, Seed: 4, Policies: []string{"round_robin", "least_outstanding"}}
	rep, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	tr, err := genTrace(o.Trace, o.Requests, o.Workers, o.Seed)
	if err != nil {
		t.Fatal(err)
	}
	want := round(0.5*capacity(o.models(), tr), 2)
	for _, r := range rep.Results {
		if r.OfferedRPS != want || want <= 0 {
			t.Errorf("%s: offered %v req/s, want %v", r.Policy, r.OfferedRPS, want)
		}
	}
}

// TestShortBodyGivesTheSameKey: the body a pick without a prefix index writes (only as much
// as the prefix key reads) gives the key of the whole body, for messages of every length
// around the key's 64 bytes.
func TestShortBodyGivesTheSameKey(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "messages")
		msgs := make([]message, n)
		for i := range msgs {
			msgs[i] = message{
				role: role(rapid.IntRange(0, 2).Draw(t, "role")),
				seg:  rapid.Uint64().Draw(t, "seg"),
				n:    int32(rapid.IntRange(0, 40).Draw(t, "tokens")),
			}
		}
		seed := rapid.Uint64().Draw(t, "seed")
		whole, err := oai.PrefixKey(oai.Chat, chatBody(nil, seed, msgs, true))
		if err != nil {
			t.Fatal(err)
		}
		short := chatBody(nil, seed, msgs, false)
		key, err := oai.PrefixKey(oai.Chat, short)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(key, whole) {
			t.Fatalf("messages %+v: short body's key %q, whole body's %q", msgs, key, whole)
		}
		if long := chatBody(nil, seed, msgs, true); len(short) > len(long) {
			t.Fatalf("the short body (%d bytes) is longer than the whole one (%d)", len(short), len(long))
		}
	})
}
