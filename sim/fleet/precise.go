package fleet

import (
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/sim/kv"
)

// precise_prefix's engines report what their prefix caches hold, as tlengine's KvEvents
// stream does (SPEC R18.3), delivered to the router at once (router.Sim.KVEvents): when a
// request starts, each 64-byte chunk of its rendered prompt is tagged on the KV block holding
// the token that covers the chunk's last byte (sim/kv Pool.Tag), and ids first held are
// STORED; ids whose last carrying block is evicted are REMOVED (Pool.OnUntag). A restart
// (Options.RestartEvery) replaces the engine's pool with an empty one — requests already
// running finish on the old one, so for a while the engine holds more KV than its model says —
// and the router hears CLEARED, as the gateway's subscriber does when an engine's stream
// breaks. The worker keeps heartbeating under its id, so the router keeps its slot and the
// approximate index of prefix_aware is not told.

// watch hooks engine i's pool's evictions, for precise_prefix.
func (r *runner) watch(i int32) {
	if !r.precise || r.vllm {
		return
	}
	e := r.engines[i]
	e.pool.OnUntag(func(ids []uint64) { e.removed = append(e.removed, ids...) })
}

// tag reports the chunks of request i's prompt that seq's blocks now hold.
func (r *runner) tag(i, eng int32, seq *kv.Seq) {
	if !r.precise || r.vllm {
		return
	}
	e := r.engines[eng]
	req := &r.tr.reqs[i]
	r.body = chatBody(r.body, r.o.Seed, req.msgs, true)
	r.hashes = prefixindex.Hashes(r.hashes, oai.RenderPrompt(oai.Chat, r.body, len(r.body)))
	var stored []uint64
	r.blocks = chunkBlocks(r.blocks[:0], req.msgs, len(r.hashes), e.model.BlockSize)
	for k, b := range r.blocks {
		if b >= 0 {
			stored = e.pool.Tag(seq, b, r.hashes[k:k+1], stored)
		}
	}
	r.sendKV(e, nil, stored)
}

// chunkBlocks appends, for each of the n 64-byte chunks of msgs' rendered prompt ("role\n",
// 4 bytes a token, "\n" per message), the index of the KV block of bs tokens that holds the
// last token starting before the chunk's end: the block whose eviction loses the chunk. A
// chunk before the first token has -1.
func chunkBlocks(dst []int, msgs []message, n, bs int) []int {
	block := func(tokens int) int {
		if tokens == 0 {
			return -1
		}
		return (tokens - 1) / bs
	}
	k, tokens, at := 0, 0, 0 // tokens: those starting before chunk k's end
	for _, m := range msgs {
		at += len(roleNames[m.role]) + 1
		for range m.n {
			for k < n && at >= (k+1)*prefixindex.ChunkBytes {
				dst = append(dst, block(tokens))
				k++
			}
			tokens++
			at += 4
		}
		at++
	}
	for ; k < n; k++ {
		dst = append(dst, block(tokens))
	}
	return dst
}

// flushKV reports the ids engine eng's pool evicted since the last flush.
func (r *runner) flushKV(eng int32) {
	if e := r.engines[eng]; len(e.removed) > 0 {
		r.sendKV(e, e.removed, nil)
		e.removed = e.removed[:0]
	}
}

// sendKV delivers REMOVED then STORED in messages of at most router.MaxKVEventIDs ids.
func (r *runner) sendKV(e *engine, removed, stored []uint64) {
	for kind, ids := range [2][]uint64{removed, stored} {
		for len(ids) > 0 {
			n := min(len(ids), router.MaxKVEventIDs)
			ev := &router.KVEvents{WorkerID: e.id}
			if kind == 0 {
				ev.Removed = ids[:n]
			} else {
				ev.Stored = ids[:n]
			}
			r.kvToRouters(ev)
			ids = ids[n:]
		}
	}
}

// restart empties engine i's prefix cache (see above).
func (r *runner) restart(i int32) {
	e := r.engines[i]
	st := e.pool.Stats()
	e.oldHit += st.HitTokens
	e.oldLook += st.LookupTokens
	if r.vllm {
		r.restartVLLM(i)
		return
	}
	e.pool.OnUntag(nil)
	e.removed = e.removed[:0]
	e.pool = kv.NewPool(e.model.KVBlocks, e.model.BlockSize)
	r.watch(i)
	if r.precise {
		r.kvToRouters(&router.KVEvents{WorkerID: e.id, Clear: true})
	}
}
