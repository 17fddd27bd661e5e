package vllmkv

import (
	"errors"
	"slices"
	"testing"
)

func seq(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(100 + i)
	}
	return out
}

// TestTrackerKeysMatchARequestsBlocks: blocks an engine reports in two events (the second
// chained to the first by its parent hash) get the keys BlockKeys computes from the request's
// token ids, whatever the engine's own hashes; a partial last block has no key; an adapter's
// blocks are keyed apart; a removal returns the keys it knew; a clear forgets all.
func TestTrackerKeysMatchARequestsBlocks(t *testing.T) {
	tokens := seq(10)
	want := BlockKeys(nil, tokens, 4, -1)
	if len(want) != 2 {
		t.Fatalf("%d keys for 10 tokens in blocks of 4", len(want))
	}
	tr := NewTracker(16)
	got, _, err := tr.Apply(&Event{Kind: BlockStored, Hashes: []uint64{0xaaa}, Tokens: tokens[:4], BlockSize: 4})
	if err != nil || !slices.Equal(got, want[:1]) {
		t.Fatalf("first block: %v %v, want %v", got, err, want[:1])
	}
	got, _, err = tr.Apply(&Event{Kind: BlockStored, Hashes: []uint64{0xbbb}, Parent: 0xaaa, HasParent: true, Tokens: tokens[4:8], BlockSize: 4})
	if err != nil || !slices.Equal(got, want[1:]) {
		t.Fatalf("second block: %v %v, want %v", got, err, want[1:])
	}
	if lora := BlockKeys(nil, tokens, 4, 3); lora[0] == want[0] || lora[1] == want[1] {
		t.Fatal("an adapter's blocks share the base model's keys")
	}
	if other := BlockKeys(nil, seq(8)[1:], 4, -1); other[0] == want[0] {
		t.Fatal("other tokens, the same key")
	}
	got, _, _ = tr.Apply(&Event{Kind: BlockRemoved, Hashes: []uint64{0xbbb, 0xccc}})
	if !slices.Equal(got, want[1:]) || tr.Len() != 1 {
		t.Fatalf("removed %v, %d left", got, tr.Len())
	}
	if _, cleared, _ := tr.Apply(&Event{Kind: AllBlocksCleared}); !cleared || tr.Len() != 0 {
		t.Fatalf("cleared %v, %d left", cleared, tr.Len())
	}
}

// TestTrackerRefuses: an orphan (parent unknown), a store past the limit and a malformed store
// are errors that change nothing.
func TestTrackerRefuses(t *testing.T) {
	tr := NewTracker(2)
	if _, _, err := tr.Apply(&Event{Kind: BlockStored, Hashes: []uint64{1}, Parent: 9, HasParent: true, Tokens: seq(2), BlockSize: 2}); !errors.Is(err, ErrOrphan) {
		t.Fatalf("orphan: %v", err)
	}
	if _, _, err := tr.Apply(&Event{Kind: BlockStored, Hashes: []uint64{1, 2}, Tokens: seq(4), BlockSize: 2}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Apply(&Event{Kind: BlockStored, Hashes: []uint64{3}, Parent: 2, HasParent: true, Tokens: seq(2), BlockSize: 2}); !errors.Is(err, ErrOverLimit) {
		t.Fatalf("over the limit: %v", err)
	}
	// The same blocks stored again are not new.
	if _, _, err := tr.Apply(&Event{Kind: BlockStored, Hashes: []uint64{1, 2}, Tokens: seq(4), BlockSize: 2}); err != nil {
		t.Fatalf("a repeated store: %v", err)
	}
	if _, _, err := tr.Apply(&Event{Kind: BlockStored, Hashes: []uint64{4}, Tokens: seq(3), BlockSize: 2}); err == nil {
		t.Fatal("tokens short of the blocks accepted")
	}
	if _, _, err := tr.Apply(&Event{}); err == nil {
		t.Fatal("an event of no kind accepted")
	}
	if tr.Len() != 2 {
		t.Fatalf("%d tracked after the refusals, want 2", tr.Len())
	}
	if k, ok := tr.Key(2); !ok || k != BlockKeys(nil, seq(4), 2, -1)[1] {
		t.Fatalf("Key(2) = %x %v", k, ok)
	}
}

// TestBlockKeysEdges: no key without a whole block, none for a block size ≤ 0, and keys are
// appended to dst.
func TestBlockKeysEdges(t *testing.T) {
	if k := BlockKeys(nil, seq(3), 4, -1); len(k) != 0 {
		t.Fatalf("%v for 3 tokens in blocks of 4", k)
	}
	if k := BlockKeys(nil, seq(8), 0, -1); len(k) != 0 {
		t.Fatalf("%v for block size 0", k)
	}
	if k := BlockKeys([]uint64{7}, seq(4), 4, -1); len(k) != 2 || k[0] != 7 {
		t.Fatalf("appended: %v", k)
	}
	long := seq(200) // more than one 64-token chunk of the hash's buffer
	if a, b := BlockKey(rootKey, -1, long), BlockKey(rootKey, -1, append(seq(199), 1)); a == b {
		t.Fatal("the last token of a long block changed nothing")
	}
}

// An event naming its adapter is keyed as a request naming it is; one with only a numeric id
// is keyed by the id; the base model by -1.
func TestLoRAKeyByName(t *testing.T) {
	toks := []uint32{1, 2, 3, 4}
	for _, c := range []struct {
		ev   Event
		lora int64
	}{
		{Event{Kind: BlockStored, Hashes: []uint64{7}, Tokens: toks, BlockSize: 4, LoRAName: "sql", HasLoRA: true, LoRAID: 3}, LoRAKey("sql")},
		{Event{Kind: BlockStored, Hashes: []uint64{7}, Tokens: toks, BlockSize: 4, HasLoRA: true, LoRAID: 3}, 3},
		{Event{Kind: BlockStored, Hashes: []uint64{7}, Tokens: toks, BlockSize: 4}, -1},
	} {
		tr := NewTracker(10)
		keys, _, err := tr.Apply(&c.ev)
		if err != nil || len(keys) != 1 || keys[0] != BlockKeys(nil, toks, 4, c.lora)[0] {
			t.Errorf("%+v: keys %v, %v", c.ev, keys, err)
		}
	}
	if LoRAKey("a") == LoRAKey("b") || LoRAKey("a") < 0 {
		t.Error("LoRAKey: equal keys for two names, or a negative key")
	}
}
