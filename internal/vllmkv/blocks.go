package vllmkv

import (
	"encoding/binary"
	"errors"

	"github.com/cespare/xxhash/v2"
)

// The router's own block keys (R22). An engine's block hashes depend on its own seed and
// algorithm, so the gateway does not recompute them: it keys a block by its own chained hash
// over token ids — the parent block's key, the LoRA id, and this block's block_size tokens —
// which it can compute both from a BlockStored event and from a request's token ids. A Tracker
// per worker maps the engine's hashes to these keys, to apply BlockRemoved.

// rootKey is the parent key of a sequence's first block.
const rootKey uint64 = 0x9e3779b97f4a7c15

// BlockKey is the key of one block of tokens after the block keyed parent (rootKey-chained:
// use BlockKeys for a sequence). lora is the adapter's id, -1 for the base model.
func BlockKey(parent uint64, lora int64, tokens []uint32) uint64 {
	var d xxhash.Digest
	d.Reset()
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], parent)
	binary.LittleEndian.PutUint64(buf[8:], uint64(lora))
	_, _ = d.Write(buf[:])
	var tb [4 * 64]byte
	for len(tokens) > 0 {
		n := min(len(tokens), 64)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(tb[4*i:], t)
		}
		_, _ = d.Write(tb[:4*n])
		tokens = tokens[n:]
	}
	return d.Sum64()
}

// LoRAKey is the LoRA component of a block key for an adapter named name: a request names its
// adapter, not the engine's numeric lora_id, so an event that carries lora_name is keyed by the
// name (an event with only a lora_id is keyed by the id, which a request cannot match: such
// adapter blocks are indexed but never found, an under-report).
func LoRAKey(name string) int64 { return int64(xxhash.Sum64String(name) >> 1) }

// BlockKeys appends to dst the keys of the whole blocks of tokens (blockSize tokens each; a
// partial last block has no key, as an engine caches whole blocks only), for adapter lora (-1:
// the base model).
func BlockKeys(dst []uint64, tokens []uint32, blockSize int, lora int64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	parent := rootKey
	for len(tokens) >= blockSize {
		parent = BlockKey(parent, lora, tokens[:blockSize])
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

// Tracker is one worker's map from its engine's block hashes to the router's keys. It is
// owned by one goroutine or actor (not safe for concurrent use). Bounds: at most Max entries
// (the worker's max_blocks_per_worker); an event that would pass it is refused with
// ErrOverLimit, and the caller clears the worker (its state is no longer known).
type Tracker struct {
	Max     int
	byHash  map[uint64]uint64
	scratch []uint64
}

// Errors of Apply. Neither changes the tracker.
var (
	// ErrOrphan: a BlockStored whose parent hash the tracker does not know (an event was
	// lost): the chain cannot be keyed.
	ErrOrphan = errors.New("vllmkv: a stored block's parent is unknown")
	// ErrOverLimit: the worker would hold more than Max blocks.
	ErrOverLimit = errors.New("vllmkv: the worker's blocks are over the limit")
)

// NewTracker returns an empty tracker of at most max entries.
func NewTracker(max int) *Tracker {
	return &Tracker{Max: max, byHash: make(map[uint64]uint64)}
}

// Len is the blocks tracked.
func (t *Tracker) Len() int { return len(t.byHash) }

// Key is the router's key of the engine's block hash h.
func (t *Tracker) Key(h uint64) (uint64, bool) {
	k, ok := t.byHash[h]
	return k, ok
}

// Apply applies one event: the keys the worker now holds (BlockStored) or no longer holds
// (BlockRemoved: the keys of the hashes it knew), and whether the worker dropped everything
// (AllBlocksCleared). The returned slice is the tracker's scratch, valid until the next call.
// On an error nothing changed.
func (t *Tracker) Apply(e *Event) (keys []uint64, cleared bool, err error) {
	t.scratch = t.scratch[:0]
	switch e.Kind {
	case BlockStored:
		if e.BlockSize <= 0 || len(e.Tokens) != len(e.Hashes)*e.BlockSize {
			return nil, false, errors.New("vllmkv: a stored event's tokens are not its blocks'")
		}
		parent := rootKey
		if e.HasParent {
			p, ok := t.byHash[e.Parent]
			if !ok {
				return nil, false, ErrOrphan
			}
			parent = p
		}
		lora := int64(-1)
		switch {
		case e.LoRAName != "":
			lora = LoRAKey(e.LoRAName)
		case e.HasLoRA:
			lora = e.LoRAID
		}
		added := 0
		for i, h := range e.Hashes {
			parent = BlockKey(parent, lora, e.Tokens[i*e.BlockSize:(i+1)*e.BlockSize])
			t.scratch = append(t.scratch, parent)
			if _, ok := t.byHash[h]; !ok {
				added++
			}
		}
		if len(t.byHash)+added > t.Max {
			return nil, false, ErrOverLimit
		}
		for i, h := range e.Hashes {
			t.byHash[h] = t.scratch[i]
		}
		return t.scratch, false, nil
	case BlockRemoved:
		for _, h := range e.Hashes {
			if k, ok := t.byHash[h]; ok {
				t.scratch = append(t.scratch, k)
				delete(t.byHash, h)
			}
		}
		return t.scratch, false, nil
	case AllBlocksCleared:
		t.Clear()
		return nil, true, nil
	}
	return nil, false, errors.New("vllmkv: an event of no known kind")
}

// Clear forgets every block (AllBlocksCleared, a gap without replay, a worker that left).
func (t *Tracker) Clear() {
	t.byHash = make(map[uint64]uint64) // not clear(): a map that grew keeps its buckets
}
