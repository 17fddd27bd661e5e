package kv

// Block events: what a vLLM engine publishes about its prefix cache (ENGINES.md §1) —
// BlockStored when full blocks enter the cache, BlockRemoved when cached blocks are evicted.
// tlengine's --kv-events publisher and the simulator's vLLM event path read them from
// Pool.OnBlocks. A pool made by NewSeededPool names its blocks by a seeded chained hash, so
// (as with a real engine, whose hash depends on its own seed) a consumer cannot recompute
// them and must key blocks by their token ids.

// StoredRun is a run of consecutive blocks of one sequence that entered the cache: Hashes[i]
// names block i, Parent names the block before Hashes[0] (0 when the run starts the
// sequence), Tokens are the runs' tokens, BlockSize per block.
type StoredRun struct {
	Parent uint64
	Hashes []uint64
	Tokens []uint32
}

// BlockEvents is what one pool call changed in the cache: Removed (evicted blocks' hashes)
// happened before Stored.
type BlockEvents struct {
	Removed []uint64
	Stored  []StoredRun
}

// NewSeededPool is NewPool whose blocks' hashes also cover seed (seed 0 is NewPool's hash).
func NewSeededPool(totalBlocks, blockSize int, seed uint64) *Pool {
	p := NewPool(totalBlocks, blockSize)
	p.seed = seed
	return p
}

// OnBlocks sets f, which a pool call that stored or evicted cached blocks (Allocate, Import,
// Append) calls once before it returns. f runs inside the pool call: it must not call the pool
// and must not block. It may keep the slices (each call's are its own).
func (p *Pool) OnBlocks(f func(BlockEvents)) { p.onBlocks = f }

// noteStored records block id, just registered under h after parent (events on only).
func (p *Pool) noteStored(id int32, h, parent uint64) {
	if p.onBlocks == nil {
		return
	}
	bs := p.blockSize
	toks := p.slab[int(id)*bs : int(id+1)*bs]
	ev := &p.pending
	if n := len(ev.Stored); n > 0 {
		if r := &ev.Stored[n-1]; r.Hashes[len(r.Hashes)-1] == parent {
			r.Hashes = append(r.Hashes, h)
			r.Tokens = append(r.Tokens, toks...)
			return
		}
	}
	ev.Stored = append(ev.Stored, StoredRun{Parent: parent, Hashes: []uint64{h}, Tokens: append([]uint32(nil), toks...)})
}

// noteRemoved records the eviction of the block cached under h (events on only).
func (p *Pool) noteRemoved(h uint64) {
	if p.onBlocks != nil {
		p.pending.Removed = append(p.pending.Removed, h)
	}
}

// flushBlocks hands the call's events to OnBlocks' f; pending is bounded by one call's blocks.
func (p *Pool) flushBlocks() {
	if len(p.pending.Removed) == 0 && len(p.pending.Stored) == 0 {
		return
	}
	ev := p.pending
	p.pending = BlockEvents{}
	if p.onBlocks != nil {
		p.onBlocks(ev)
	}
}
