package vllmkv

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"
)

// mp encodes v with the msgpack library (the way an engine's encoder would write it).
func mp(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeArrayShape: vLLM's array-like batch, its events with their trailing defaults
// omitted, a parent nil and a bytes hash (its last 8 bytes), an unknown trailing field skipped.
func TestDecodeArrayShape(t *testing.T) {
	digest := append(bytes.Repeat([]byte{0xff}, 24), 0, 0, 0, 0, 0, 0, 1, 2)
	payload := mp(t, []any{1.5, []any{
		[]any{"BlockStored", []any{uint64(7), digest}, nil, []any{1, 2, 3, 4}, 2, nil, "GPU", nil, "future"},
		[]any{"BlockStored", []any{uint64(9)}, uint64(7), []any{5, 6}, 2},
		[]any{"BlockRemoved", []any{uint64(7)}},
		[]any{"AllBlocksCleared"},
	}, 3})
	b, err := DecodePayload(payload, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 1.5, Rank: 3, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{7, 0x0102}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
		{Kind: BlockStored, Hashes: []uint64{9}, Parent: 7, HasParent: true, Tokens: []uint32{5, 6}, BlockSize: 2},
		{Kind: BlockRemoved, Hashes: []uint64{7}},
		{Kind: AllBlocksCleared},
	}}
	if d := cmp.Diff(want, b); d != "" {
		t.Fatal(d)
	}
}

// TestDecodeMapShape: newer engines' map events, with named fields in any order, lora fields
// and unknown keys skipped.
func TestDecodeMapShape(t *testing.T) {
	payload := mp(t, []any{2.0, []any{
		map[string]any{"token_ids": []any{1, 2}, "type": "BlockStored", "block_hashes": []any{uint64(1)}, "block_size": 2,
			"parent_block_hash": nil, "lora_id": 4, "lora_name": "sql", "extra_keys": map[string]any{"x": []any{1, 2}}},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(1)}, "medium": nil},
	}})
	b, err := DecodePayload(payload, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 2, Rank: -1, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{1}, Tokens: []uint32{1, 2}, BlockSize: 2, LoRAID: 4, HasLoRA: true, LoRAName: "sql"},
		{Kind: BlockRemoved, Hashes: []uint64{1}},
	}}
	if d := cmp.Diff(want, b); d != "" {
		t.Fatal(d)
	}
}

// TestDecodeRefuses: what an engine must not send is an error naming it, and nothing else.
func TestDecodeRefuses(t *testing.T) {
	stored := func(fields ...any) []byte {
		return mp(t, []any{1.0, []any{append([]any{"BlockStored"}, fields...)}})
	}
	for _, c := range []struct {
		name    string
		payload []byte
		l       Limits
		want    string
	}{
		{"not an array", mp(t, "x"), Limits{}, "batch"},
		{"short batch", mp(t, []any{1.0}), Limits{}, "want [ts"},
		{"NaN ts", mp(t, []any{math.NaN(), []any{}}), Limits{}, "finite"},
		{"unknown type", mp(t, []any{1.0, []any{[]any{"BlockMoved"}}}), Limits{}, "unknown event type"},
		{"tokens short of the blocks", stored([]any{1, 2}, nil, []any{1, 2, 3}, 2), Limits{}, "token ids"},
		{"block size 0", stored([]any{1}, nil, []any{}, 0), Limits{}, "block_size"},
		{"negative token", stored([]any{1}, nil, []any{-1}, 1), Limits{}, "token id"},
		{"too many events", mp(t, []any{1.0, []any{[]any{"AllBlocksCleared"}, []any{"AllBlocksCleared"}}}), Limits{Events: 1}, "events"},
		{"too many hashes", stored([]any{1, 2, 3}, nil, []any{1, 2, 3}, 1), Limits{Hashes: 2}, "block_hashes"},
		{"too many tokens", stored([]any{1, 2}, nil, []any{1, 2, 3, 4}, 2), Limits{Tokens: 3}, "token_ids"},
		{"payload too big", stored([]any{1}, nil, []any{1}, 1), Limits{PayloadBytes: 8}, "payload"},
		{"long medium", stored([]any{1}, nil, []any{1}, 1, nil, strings.Repeat("m", MaxString+1)), Limits{}, "medium"},
		{"trailing bytes", append(mp(t, []any{1.0, []any{}}), 0xc0), Limits{}, "after the batch"},
		{"map without type", mp(t, []any{1.0, []any{map[string]any{"block_hashes": []any{}}}}), Limits{}, "type"},
		{"array header beyond the bytes", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}, Limits{}, "events"},
	} {
		if _, err := DecodePayload(c.payload, c.l); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

// TestDecodeMessage: three frames with an 8-byte big-endian seq; anything else is ErrFrames.
func TestDecodeMessage(t *testing.T) {
	msg, err := EncodeMessage(Batch{Topic: "kv@10.0.0.1:8000@m", Seq: 258, TS: 1, Rank: -1, Events: []Event{{Kind: AllBlocksCleared}}}, Array)
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodeMessage(msg, Limits{})
	if err != nil || b.Topic != "kv@10.0.0.1:8000@m" || b.Seq != 258 || len(b.Events) != 1 {
		t.Fatalf("%+v %v", b, err)
	}
	for _, frames := range [][][]byte{msg[:2], {msg[0], msg[1][:7], msg[2]}, append(msg, nil)} {
		if _, err := DecodeMessage(frames, Limits{}); err != ErrFrames {
			t.Fatalf("%d frames: %v", len(frames), err)
		}
	}
	if _, err := DecodeMessage([][]byte{bytes.Repeat([]byte("t"), MaxString+1), msg[1], msg[2]}, Limits{}); err == nil {
		t.Fatal("a long topic accepted")
	}
}

// TestRoundTrip: whatever valid batch is encoded, in either shape, decodes to itself.
func TestRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var b Batch
		b.TS = rapid.Float64Range(0, 1e9).Draw(t, "ts")
		b.Rank = rapid.IntRange(-1, 8).Draw(t, "rank")
		for range rapid.IntRange(0, 5).Draw(t, "events") {
			e := Event{Kind: Kind(rapid.IntRange(1, 3).Draw(t, "kind"))}
			if e.Kind != AllBlocksCleared {
				e.Hashes = rapid.SliceOfN(rapid.Uint64(), 1, 6).Draw(t, "hashes")
				e.Medium = rapid.SampledFrom([]string{"", "GPU", "CPU"}).Draw(t, "medium")
			}
			if e.Kind == BlockStored {
				e.BlockSize = rapid.IntRange(1, 4).Draw(t, "bs")
				e.Tokens = rapid.SliceOfN(rapid.Uint32(), len(e.Hashes)*e.BlockSize, len(e.Hashes)*e.BlockSize).Draw(t, "tokens")
				if e.HasParent = rapid.Bool().Draw(t, "hasParent"); e.HasParent {
					e.Parent = rapid.Uint64().Draw(t, "parent")
				}
				if e.HasLoRA = rapid.Bool().Draw(t, "hasLoRA"); e.HasLoRA {
					e.LoRAID = rapid.Int64Range(0, 1<<40).Draw(t, "lora")
					e.LoRAName = rapid.SampledFrom([]string{"", "sql"}).Draw(t, "loraName")
				}
			}
			b.Events = append(b.Events, e)
		}
		for _, f := range []Format{Array, Map} {
			p, err := EncodePayload(b, f)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodePayload(p, Limits{})
			if err != nil {
				t.Fatalf("format %d: %v", f, err)
			}
			if d := cmp.Diff(b, got); d != "" {
				t.Fatalf("format %d: %s", f, d)
			}
		}
	})
}

// FuzzDecodePayload: any bytes decode to a batch or an error, never a panic, within the
// limits; a decoded batch re-encodes and decodes to itself.
func FuzzDecodePayload(f *testing.F) {
	for _, fm := range []Format{Array, Map} {
		p, _ := EncodePayload(Batch{TS: 1, Rank: 0, Events: []Event{
			{Kind: BlockStored, Hashes: []uint64{1, 2}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2, HasParent: true, Parent: 9, Medium: "GPU"},
			{Kind: BlockRemoved, Hashes: []uint64{1}}, {Kind: AllBlocksCleared}}}, fm)
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		l := Limits{Events: 64, Hashes: 64, Tokens: 1024}
		b, err := DecodePayload(payload, l)
		if err != nil {
			return
		}
		if len(b.Events) > l.Events {
			t.Fatalf("%d events", len(b.Events))
		}
		for _, e := range b.Events {
			if len(e.Hashes) > l.Hashes || len(e.Tokens) > l.Tokens {
				t.Fatalf("an event over the limits: %d hashes, %d tokens", len(e.Hashes), len(e.Tokens))
			}
		}
		p, err := EncodePayload(b, Map)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodePayload(p, Limits{})
		if err != nil || !cmp.Equal(b, again) {
			t.Fatalf("re-encoded: %v %s", err, cmp.Diff(b, again))
		}
	})
}

// TestLimitsAtTheirBounds: every bound takes exactly its value and refuses one more: events,
// hashes, tokens, payload bytes, block size, string bytes, a digest's bytes, a topic's bytes,
// the event map's keys, a rank; a negative (signed) hash is its two's complement bits; a
// digest shorter than 8 bytes is zero-extended.
func TestLimitsAtTheirBounds(t *testing.T) {
	cleared := []any{"AllBlocksCleared"}
	events := func(n int) []byte {
		ev := make([]any, n)
		for i := range ev {
			ev[i] = cleared
		}
		return mp(t, []any{1.0, ev})
	}
	stored := func(hashes, tokens []any, bs int, rest ...any) []byte {
		return mp(t, []any{1.0, []any{append([]any{"BlockStored", hashes, nil, tokens, bs}, rest...)}})
	}
	ints := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = uint64(i + 1)
		}
		return out
	}
	ok := func(name string, p []byte, l Limits) {
		t.Helper()
		if _, err := DecodePayload(p, l); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := func(name string, p []byte, l Limits) {
		t.Helper()
		if _, err := DecodePayload(p, l); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok("3 events of 3", events(3), Limits{Events: 3})
	bad("4 events of 3", events(4), Limits{Events: 3})
	ok("3 hashes of 3", stored(ints(3), ints(3), 1), Limits{Hashes: 3})
	bad("4 hashes of 3", stored(ints(4), ints(4), 1), Limits{Hashes: 3})
	ok("4 tokens of 4", stored(ints(2), ints(4), 2), Limits{Tokens: 4})
	bad("6 tokens of 4", stored(ints(3), ints(6), 2), Limits{Tokens: 4})
	p := events(1)
	ok("payload at its limit", p, Limits{PayloadBytes: len(p)})
	bad("payload a byte over", p, Limits{PayloadBytes: len(p) - 1})
	ok("block size at its limit", stored(ints(0), ints(0), MaxBlockSize), Limits{})
	bad("block size over", stored(ints(0), ints(0), MaxBlockSize+1), Limits{})
	ok("medium at its limit", stored(ints(1), ints(1), 1, nil, strings.Repeat("m", MaxString)), Limits{})
	bad("medium over", stored(ints(1), ints(1), 1, nil, strings.Repeat("m", MaxString+1)), Limits{})
	digest := func(n int) []any { return []any{bytes.Repeat([]byte{1}, n)} }
	ok("a digest at its limit", stored(digest(maxHashBytes), ints(1), 1), Limits{})
	bad("a digest over", stored(digest(maxHashBytes+1), ints(1), 1), Limits{})
	keys := map[string]any{"type": "AllBlocksCleared"}
	for i := len(keys); i < 64; i++ {
		keys[strings.Repeat("k", i)] = 1
	}
	ok("64 event keys", mp(t, []any{1.0, []any{keys}}), Limits{})
	keys["one-more"] = 1
	bad("65 event keys", mp(t, []any{1.0, []any{keys}}), Limits{})
	bad("a negative rank", mp(t, []any{1.0, []any{}, -1}), Limits{})
	bad("a rank too large", mp(t, []any{1.0, []any{}, int64(math.MaxInt32) + 1}), Limits{})
	if b, err := DecodePayload(mp(t, []any{1.0, []any{}, math.MaxInt32}), Limits{}); err != nil || b.Rank != math.MaxInt32 {
		t.Errorf("the largest rank: %+v %v", b, err)
	}
	if b, err := DecodePayload(mp(t, []any{1.0, []any{}, nil}), Limits{}); err != nil || b.Rank != -1 {
		t.Errorf("a nil rank: %+v %v", b, err)
	}
	b, err := DecodePayload(stored([]any{int64(-2), []byte{1, 2}}, ints(2), 1), Limits{})
	if err != nil || b.Events[0].Hashes[0] != math.MaxUint64-1 || b.Events[0].Hashes[1] != 0x0102 {
		t.Fatalf("signed and short hashes: %+v %v", b, err)
	}
	if _, err := DecodeMessage([][]byte{bytes.Repeat([]byte("t"), MaxString), make([]byte, 8), events(0)}, Limits{}); err != nil {
		t.Errorf("a topic at its limit: %v", err)
	}
}

// TestUnknownValuesAreBounded: unknown fields and keys of any shape are skipped, up to maxSkip
// values in a batch; past it, or with a length beyond the bytes left, the batch is refused.
func TestUnknownValuesAreBounded(t *testing.T) {
	with := func(extra any) []byte {
		return mp(t, []any{1.0, []any{map[string]any{"type": "AllBlocksCleared", "extra": extra}}})
	}
	if _, err := DecodePayload(with(map[string]any{"a": []any{"x", []byte{1}, 2.5, true, nil}}), Limits{}); err != nil {
		t.Fatalf("a nested unknown value: %v", err)
	}
	if _, err := DecodePayload(with(ints(maxSkip-1)), Limits{}); err != nil {
		t.Fatalf("%d unknown values: %v", maxSkip, err)
	}
	if _, err := DecodePayload(with(ints(maxSkip)), Limits{}); err == nil {
		t.Fatal("more unknown values than maxSkip accepted")
	}
	for name, raw := range map[string][]byte{
		"a string beyond the bytes": {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0xa1, 'x', 0xdb, 0, 0, 1, 0},
		"a map beyond the bytes":    {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0xa1, 'x', 0xde, 0, 9},
		"an extension":              {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0xa1, 'x', 0xd4, 1, 1},
	} {
		if _, err := DecodePayload(raw, Limits{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func ints(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = i
	}
	return out
}
