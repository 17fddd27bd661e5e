package fleet

import (
	"errors"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/sim/kv"
)

// precise_prefix on the engines' own events (R22, Options.KVEvents = KVEventsVLLM): each
// engine's pool names its blocks by a chained hash over a seed of its own (kv.NewSeededPool;
// a restart draws a new one), as a vLLM engine does, and every pool call that changed its cache
// publishes one batch of vLLM-format events (kv.Pool.OnBlocks: BlockRemoved, then a BlockStored
// per run of blocks; a restart publishes AllBlocksCleared), numbered by the engine's own seq.
// The gateway's side is adapters/kvzmq's owner of the worker, replayed here step for step: a
// vllmkv.Tracker maps the engine's hashes to the router's block keys, and the keys reach the
// router in router.KVEvents{Engine: true, BlockSize} of at most kvPiece ids (removals before
// the stores that followed them), a Clear first after every clear. A pick carries the prompt's
// token ids as the engine tokenizes it (what tlengine's render endpoint answers), which the
// router cuts into block keys by the pool's block size.
//
// Options.KVGap loses each batch on its way with that probability (the run's own seeded RNG):
// the subscriber sees a seq gap at the next batch that arrives, and as kvzmq does it either
// replays the lost batches from the engine (Options.KVReplay) or keeps the worker's entries:
// the blocks a lost batch stored are then unknown (their children are orphans, not indexed)
// until the engine stores them again, and those it removed stay in the index (stale) until the
// engine stores them again or the worker's bound clears it. The simulated engines heartbeat as
// a vLLM worker is seen (no tl.kv stream: WorkerInfo.KVEvents false), so prefix warm-ups are
// cut in tokens on this path (router.Warmup.Tokens: the matched blocks' token ids, warm.go).

// The event formats of Options.KVEvents.
const (
	KVEventsTL   = "tl"   // tlengine's tl.kv.v1 chunk ids (precise.go), the default
	KVEventsVLLM = "vllm" // vLLM's BlockStored / BlockRemoved / AllBlocksCleared (this file)
)

// MaxKVGap bounds Options.KVGap, the fraction of event batches lost.
const MaxKVGap = 0.5

const (
	// kvPiece bounds the ids of one message to the router (kvzmq's default PieceIDs).
	kvPiece = 128
	// kvMaxBlocks bounds a worker's tracker ([gateway.kv_events] max_blocks_per_worker's
	// default); a simulated engine caches at most its KVBlocks, far fewer.
	kvMaxBlocks = 65536
	// kvReplayBatches bounds the lost batches an engine keeps for a replay (its replay
	// buffer); a longer run of lost batches cannot be replayed and the worker is cleared.
	kvReplayBatches = 1024
)

// vllmKV is one engine's event publisher and the gateway's subscriber of it.
type vllmKV struct {
	// The engine's side: the last batch's seq, its restarts (each draws a new hash seed), the
	// batches lost since the last one delivered (kept with KVReplay only, at most
	// kvReplayBatches; overflow: more were lost, so a replay cannot fill the gap).
	seq      uint64
	restarts uint64
	lost     []vllmkv.Batch
	overflow bool
	// The subscriber's side, as kvzmq's owner: last is the seq of the last batch applied
	// (have: one was since the last clear; started: one was ever seen); needClear: the router
	// must hear Clear with the next message; stored and removed: the message being built, at
	// most kvPiece ids between them.
	tr        *vllmkv.Tracker
	last      uint64
	have      bool
	started   bool
	needClear bool
	blockSize int
	stored    []uint64
	removed   []uint64
}

// kvStats are a run's counts of the vLLM event path (Result's kv_* fields).
type kvStats struct {
	batches, lost, gaps, replays, kept, clears, orphans int
}

// vllmSeed is engine i's hash seed after restarts restarts (never 0, NewPool's own hash).
func vllmSeed(seed uint64, i int32, restarts uint64) uint64 {
	s := splitmix(seed ^ splitmix(0x766c6c6d<<32|uint64(uint32(i))) ^ splitmix(restarts+1)) // "vllm"
	return max(s, 1)
}

// newVLLMPool is engine i's pool on the vLLM path, publishing its batches to the subscriber.
func (r *runner) newVLLMPool(i int32) *kv.Pool {
	e := r.engines[i]
	p := kv.NewSeededPool(e.model.KVBlocks, e.model.BlockSize, vllmSeed(r.o.Seed, i, e.vk.restarts))
	bs := e.model.BlockSize
	p.OnBlocks(func(ev kv.BlockEvents) { r.publish(e, blockEvents(ev, bs)) })
	return p
}

// blockEvents is one pool call's events as a vLLM engine publishes them: the evictions, then
// each stored run.
func blockEvents(ev kv.BlockEvents, bs int) []vllmkv.Event {
	out := make([]vllmkv.Event, 0, 1+len(ev.Stored)) // one pool call's
	if len(ev.Removed) > 0 {
		out = append(out, vllmkv.Event{Kind: vllmkv.BlockRemoved, Hashes: ev.Removed})
	}
	for _, s := range ev.Stored {
		out = append(out, vllmkv.Event{Kind: vllmkv.BlockStored, Hashes: s.Hashes, Parent: s.Parent,
			HasParent: s.Parent != 0, Tokens: s.Tokens, BlockSize: bs})
	}
	return out
}

// publish numbers one batch of engine e's events and sends it to the subscriber, or loses it
// (Options.KVGap).
func (r *runner) publish(e *engine, events []vllmkv.Event) {
	v := e.vk
	v.seq++
	b := vllmkv.Batch{Seq: v.seq, Events: events}
	r.kv.batches++
	if r.o.KVGap > 0 && r.gap.Float64() < r.o.KVGap {
		r.kv.lost++
		if r.o.KVReplay {
			if len(v.lost) < kvReplayBatches {
				v.lost = append(v.lost, b)
			} else {
				v.overflow = true
			}
		}
		return
	}
	r.receive(e, b)
	v.lost, v.overflow = v.lost[:0], false
}

// receive applies one batch that reached the subscriber in seq order, resyncing first when
// batches were lost (kvzmq's owner.batch).
func (r *runner) receive(e *engine, b vllmkv.Batch) {
	v := e.vk
	switch {
	case !v.have:
		// The first batch, or the first since a clear: what came before is unknown.
		r.kvClear(e)
		if !v.started {
			v.started = true
			r.kvReplay(e, 0, b.Seq)
		}
	case b.Seq == v.last+1:
	default:
		r.kv.gaps++
		if r.kvReplay(e, v.last+1, b.Seq) {
			r.kv.replays++
		} else {
			r.kv.kept++ // as kvzmq: the worker's entries stay (see the package comment)
		}
	}
	r.kvApply(e, b)
}

// kvReplay applies the engine's batches with seq in [from, to), the lost ones, when replay is
// on; it reports whether it filled the gap (a first contact, from 0, always counts as filled).
func (r *runner) kvReplay(e *engine, from, to uint64) bool {
	v := e.vk
	if !r.o.KVReplay || from >= to {
		return from >= to
	}
	lost := v.lost
	if from != 0 && (v.overflow || uint64(len(lost)) != to-from || lost[0].Seq != from) {
		return false // the engine no longer has them all
	}
	for i := range lost {
		if lost[i].Seq >= from && lost[i].Seq < to {
			r.kvApply(e, lost[i])
		}
	}
	return true
}

// kvClear forgets everything known of engine e's blocks, in the tracker and (with the message
// it sends now) in the router.
func (r *runner) kvClear(e *engine) {
	v := e.vk
	v.tr.Clear()
	v.stored, v.removed = v.stored[:0], v.removed[:0]
	v.needClear, v.have = true, false
	r.kvSend(e)
}

// kvApply runs b's events through e's tracker and sends the router their keys, in order.
func (r *runner) kvApply(e *engine, b vllmkv.Batch) {
	v := e.vk
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind == vllmkv.BlockStored && ev.BlockSize > 0 {
			v.blockSize = ev.BlockSize
		}
		keys, cleared, err := v.tr.Apply(ev)
		switch {
		case errors.Is(err, vllmkv.ErrOrphan):
			r.kv.orphans++ // its chain is unknown: not indexed
			continue
		case err != nil:
			r.kv.clears++
			r.kvClear(e)
			continue
		case cleared:
			v.stored, v.removed = v.stored[:0], v.removed[:0]
			v.needClear = true
			continue
		}
		if ev.Kind == vllmkv.BlockRemoved {
			if len(v.stored) > 0 {
				r.kvSend(e) // the stores before this removal go first
			}
			r.kvAdd(e, &v.removed, keys)
		} else {
			r.kvAdd(e, &v.stored, keys)
		}
	}
	r.kvSend(e)
	v.last, v.have = b.Seq, true
}

// kvAdd appends keys to the message being built (dst: its stored or removed), sending it each
// time it holds kvPiece ids.
func (r *runner) kvAdd(e *engine, dst *[]uint64, keys []uint64) {
	v := e.vk
	for len(keys) > 0 {
		room := kvPiece - len(v.stored) - len(v.removed)
		if room <= 0 {
			r.kvSend(e)
			continue
		}
		n := min(room, len(keys))
		*dst = append(*dst, keys[:n]...)
		keys = keys[n:]
	}
}

// kvSend hands the router the message being built; a refusal (the worker is not live there)
// makes the next message start with Clear, as kvzmq's owner does.
func (r *runner) kvSend(e *engine) {
	v := e.vk
	if len(v.stored) == 0 && len(v.removed) == 0 && !v.needClear {
		return
	}
	ok := r.kvToRouters(&router.KVEvents{WorkerID: e.id, Clear: v.needClear, Engine: true, BlockSize: v.blockSize,
		Stored: v.stored, Removed: v.removed}) // applied before it returns: the buffers are reused
	v.stored, v.removed = v.stored[:0], v.removed[:0]
	v.needClear = false
	if !ok {
		v.needClear, v.have = true, false
		v.tr.Clear()
	}
}

// restartVLLM is a restart on the vLLM path: the old pool's events stop with its engine, the
// new one hashes under a new seed, and the engine's first batch is AllBlocksCleared.
func (r *runner) restartVLLM(i int32) {
	e := r.engines[i]
	e.pool.OnBlocks(nil)
	e.vk.restarts++
	e.pool = r.newVLLMPool(i)
	r.publish(e, []vllmkv.Event{{Kind: vllmkv.AllBlocksCleared}})
}
