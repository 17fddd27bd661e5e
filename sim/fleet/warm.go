package fleet

import (
	"slices"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/sim/kv"
)

// Prefix warm-ups (router.Warmup): when a pick asks for one, the engine it names gets a
// one-token request whose prompt is the picked request's rendered prompt cut to the warm-up's
// bytes — the tokens that lie wholly within them — or, cut in tokens (--kv-events vllm), the
// first Warmup.Tokens of the prompt's token ids. It queues and runs as any request (a
// running slot, its prompt's KV, the prefill of what it does not hold, one decode step), its
// chunks are reported as a request's are, and the router's ticket is released when it ends.
// It is not a client request: it adds nothing to the TTFT, tokens or SLO figures, but its
// prompt tokens count in the engines' hit rate, as an engine counts them.

// warmJob is one warm-up's life in a run.
type warmJob struct {
	w    *router.Warmup
	req  int32 // the request whose prompt it copies
	eng  int32
	toks []uint32
	seq  *kv.Seq
	pool *kv.Pool
	// When it started and how much of its prompt the engine held (for the audit).
	start  int64
	cached int
}

// queued entries: a request's index, or ^k for warm-up k.
func warmEntry(k int32) int32 { return ^k }

// warmup starts request i's warm-up w (sent, as the gateway's requester says to the router).
func (r *runner) warmup(i int32, w *router.Warmup) {
	r.routerOf(i).WarmupSent(w)
	k := int32(len(r.warms))
	eng := r.byID[w.WorkerID]
	var toks []uint32
	if w.Tokens > 0 {
		// Cut in tokens (an engine-keyed pool): the pick's first token ids, as the request
		// actor sends them (oai.TokenWarmupBody); the router never asks for more than it had.
		toks = slices.Clone(r.prompt(i)[:w.Tokens])
	} else {
		toks = warmTokens(nil, r.o.Seed, r.tr.reqs[i].msgs, w.Bytes)
	}
	r.warms = append(r.warms, warmJob{w: w, req: i, eng: eng, toks: toks})
	r.warmLive++
	r.audit.placed(eng, warmEntry(k))
	e := r.engines[eng]
	if e.waiting() == 0 {
		seq, cached, ok := e.tryStart(r.warms[k].toks)
		r.flushKV(eng)
		if ok {
			r.startWarm(k, seq, cached)
			return
		}
	}
	e.queue = append(e.queue, warmEntry(k))
}

// warmTokens appends the tokens of msgs' rendered prompt that lie wholly within its first n
// bytes ("role\n", 4 bytes a token, "\n" per message: see chatBody).
func warmTokens(dst []uint32, seed uint64, msgs []message, n int) []uint32 {
	at := 0
	for _, m := range msgs {
		at += len(roleNames[m.role]) + 1
		fit := min(int(m.n), max((n-at)/4, 0))
		if fit < int(m.n) {
			m.n = int32(fit)
			return appendTokens(dst, seed, m)
		}
		dst = appendTokens(dst, seed, m)
		at += 4*int(m.n) + 1
	}
	return dst
}

// startWarm runs warm-up k: it ends after the prefill of what the engine did not hold and one
// decode step.
func (r *runner) startWarm(k int32, seq *kv.Seq, cached int) {
	wj := &r.warms[k]
	e := r.engines[wj.eng]
	wj.seq, wj.pool, wj.start, wj.cached = seq, e.pool, r.now, cached
	r.audit.started(wj.eng, warmEntry(k))
	if r.precise && !r.vllm {
		r.tagWarm(k, seq)
	}
	end := r.now + int64(len(wj.toks)-cached)*int64(e.model.PrefillPerToken) + int64(e.model.DecodePerToken)
	r.q.push(end, evWarmDone, k)
}

// tagWarm reports the chunks of warm-up k's prompt that seq's blocks now hold, as tag does a
// request's.
func (r *runner) tagWarm(k int32, seq *kv.Seq) {
	wj := &r.warms[k]
	e := r.engines[wj.eng]
	req := &r.tr.reqs[wj.req]
	r.body = chatBody(r.body, r.o.Seed, req.msgs, true)
	r.hashes = prefixindex.Hashes(r.hashes, oai.RenderPrompt(oai.Chat, r.body, len(r.body)))
	chunks := min(wj.w.Bytes/prefixindex.ChunkBytes, len(r.hashes))
	r.blocks = chunkBlocks(r.blocks[:0], req.msgs, chunks, e.model.BlockSize)
	var stored []uint64
	for c, b := range r.blocks {
		if b >= 0 {
			stored = e.pool.Tag(seq, b, r.hashes[c:c+1], stored)
		}
	}
	r.sendKV(e, nil, stored)
	r.audit.warmHeld(e.pool, r.hashes[:chunks])
}

// warmDone ends warm-up k: its KV is freed (its blocks stay cached) and its ticket released.
func (r *runner) warmDone(k int32) {
	wj := &r.warms[k]
	eng := wj.eng
	m := r.engines[eng].model
	r.audit.warmEnded(r.now, wj.start+int64(len(wj.toks)-wj.cached)*int64(m.PrefillPerToken)+int64(m.DecodePerToken))
	r.engines[eng].finish(wj.pool, wj.seq, nil)
	r.flushKV(eng)
	r.routerOf(wj.req).ReleaseWarm(wj.w, router.OutcomeSuccess)
	wj.w, wj.toks, wj.seq, wj.pool = nil, nil, nil, nil
	r.warmLive--
	r.drain(eng)
}
