package router

import (
	"slices"
	"time"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// Prefix warm-ups (Config.WarmupMinBytes; the rule is policy.Warmer's). A prompt prefix held
// by one worker is routed there until that worker reaches the bounded-load cap; the request
// after that spills to a worker that holds nothing and pays the whole prefill, and for a long
// shared prompt those spills are the tail of the time to first token. When a prefix pick
// leaves every holder of the matched prefix at the cap, the router also reserves the least
// loaded worker of the pool for a warm-up: the requester sends it a one-token request of the
// matched prefix (oai.WarmupBody: the request's own kind, its prompt or leading messages cut
// at the prefix's end), off the client's path, so that the next spill finds the prefix cached.
//
// Warm-ups go to pools whose every member reports kv_events: those engines key their cache on
// the rendered prompt (R18.3), so a warm-up whose render agrees with the request's fills the
// blocks the request's prompt needs. They go too to pools keyed by their engines' own events
// (R22) for picks that carry token ids: there the warm-up is the matched blocks' token ids
// (Warmup.Tokens), sent as a completions prompt, which fills exactly those blocks. A warm-up costs the target what the spill would
// have (the prefix's prefill) and counts in its load like a request.
//
// Bounds: at most one warm-up for every warmPicks prefix picks (after a first burst of
// warmBurst); one warm-up per prefix (named by the chunk hash at the matched depth) until its
// target holds the prefix or warmPending has passed, and at most MaxWarmPending of them
// pending; a pick that would go beyond any of these warms nothing. The table is a fixed array,
// so a client who crafts colliding chunk hashes can at most delay another prefix's warm-up.

const (
	// warmPicks and warmBurst bound warm-ups to a share of the picks made for a prefix: each
	// such pick adds one to a credit of at most warmBurst·warmPicks, and a warm-up spends
	// warmPicks (one warm-up per 10 such picks, after a first burst of about 64). A copy costs
	// its target a prefill and evicts as much of its cache, so a workload whose prefixes each
	// serve one request at a time (a conversation's history, an agent's context) must not turn
	// every full holder into a copy: on the simulator's agentic trace, unbounded warm-ups were
	// 35% of the requests and cost 14 points of hit rate; one per 10 picks, 11% and 5.5 points
	// for a p99 9–11% lower (docs/simulate.md).
	warmPicks = 10
	warmBurst = 64
	// MaxWarmPending bounds the warm-ups the router waits to see held; the gateway runs at most
	// as many at once (request.DefaultMaxWarmups).
	MaxWarmPending = 64
	// warmPending is how long a warm-up's prefix stays claimed if its target never comes to
	// hold it (the warm-up failed, or the engine evicted it at once).
	warmPending = 10 * time.Second
)

// warmClaim is one pending warm-up: the prefix's chunk hash, the worker it went to, and when
// the claim lapses. The claims are a fixed array (MaxWarmPending): a lapsed one, even of a
// worker gone since, is cleared by the next claim, so at most that many slots stay referenced.
type warmClaim struct {
	id     uint64
	target *slot
	until  time.Time
}

// warmMinChunks is Config.WarmupMinBytes in whole chunks (0: off).
func warmMinChunks(minBytes int) int {
	if minBytes <= 0 {
		return 0
	}
	return (minBytes + prefixindex.ChunkBytes - 1) / prefixindex.ChunkBytes
}

// warmSlack is how many of a copied prefix's last chunks its target may not hold (see
// policy.Warmer): the chunk the copy ends in and those of the engine's last, partial block,
// at about 4 bytes a token (blockSize tokens; 16 when the engine does not say).
func warmSlack(blockSize int64) int {
	if blockSize <= 0 {
		blockSize = 16
	}
	return 1 + int((min(blockSize, 1<<16)*4+prefixindex.ChunkBytes-1)/prefixindex.ChunkBytes)
}

// warmBlocks is how many of a pool's blocks of bs tokens make Config.WarmupMinBytes (minChunks
// chunks of about chunkTokens tokens), at least one: the least an engine-keyed pool's matched
// prefix must be to be warmed.
func warmBlocks(minChunks, bs int) int {
	return max((minChunks*chunkTokens+bs-1)/bs, 1)
}

// warm reserves a prefix warm-up for the pick just made into out, when the pool's policy asks
// for one (policy.Warmer) and a claim is free.
//
// A pool keyed by its engines' own events (R22, kvBlockSize > 0) matched the pick's block keys,
// cut from its token ids: its warm-up is cut in blocks. Those engines cache whole blocks of the
// tokens they are given, so a copy of the matched blocks' tokens (Warmup.Tokens, sent as a
// completions prompt of token ids) holds every one of them (no slack), and its target must
// serve completions. Such a pool without the pick's token ids (the approximate index's
// fallback) warms nothing: its chunks follow the rendered prompt, its engines' caches do not.
func (v *workerView) warm(ch choice, s *slot, out *Picked, fx effects) {
	if v.warmCredit = min(v.warmCredit+1, warmBurst*warmPicks); v.warmCredit < warmPicks {
		return
	}
	pl := v.pools[ch.key]
	if pl == nil {
		return
	}
	w, ok := pl.p.(policy.Warmer)
	if !ok {
		return
	}
	// The rule: the least depth, the slack, and the most the pick allows (in chunks of
	// rendered bytes, or in the pool's blocks of tokens).
	bs := pl.kvBlockSize
	var minDepth, slack, most int
	exclude := ch.exclude
	switch {
	case bs > 0:
		if len(ch.tokens) < bs {
			return
		}
		minDepth, most = warmBlocks(v.warmMin, bs), len(ch.tokens)/bs
		// Sent as a completions request: a member that does not serve one is no target
		// (a copy of exclude plus at most the pool's members, only when some is restricted).
		exclude, _ = v.endpointExclude(pl, oai.Completions, exclude)
	case pl.kvMembers == len(pl.members):
		minDepth, slack, most = v.warmMin, warmSlack(s.info.BlockSize), len(ch.hashes)
	default:
		return
	}
	m, depth, id := w.Warm(minDepth, slack, exclude)
	if m == nil || depth > most {
		return
	}
	t := m.Ref.(*slot)
	if !v.claimWarm(id, t) {
		return
	}
	v.warmCredit -= warmPicks
	out.Warm = &Warmup{PickedWorker: PickedWorker{Ticket: v.reserve(t, ch.requester, fx), Worker: t.pid, Reg: t.info.Reg,
		WorkerID: t.info.ID, HTTPAddress: t.info.HTTPAddress, GRPCAddress: t.info.GRPCAddress}}
	switch {
	case bs > 0:
		// The target's own events tell the exact index when its engine has stored the copy;
		// the approximate index (chunks of rendered bytes) learns nothing of it.
		out.Warm.Tokens = depth * bs
	default:
		out.Warm.Bytes = depth * prefixindex.ChunkBytes
		if v.pidx != nil {
			// The index learns the copy when the requester has sent it (warmupSent). The
			// pick's hashes are its requester's, which may reuse them: a copy (the prefix's
			// chunks, held while the requester holds the answer).
			out.Warm.Hashes = slices.Clone(ch.hashes[:depth])
		}
	}
	v.warmups.Inc()
}

// warmupSent records that the warm-up's target holds its prefix now that it has been sent
// (WarmupSent), in the approximate index; under the worker's current registration only.
func (v *workerView) warmupSent(m *WarmupSent) {
	if v.pidx == nil || len(m.Hashes) == 0 {
		return
	}
	if s := v.registered(m.WorkerID, m.Reg); s != nil && s.live {
		v.pidx.RecordWithin(s.info.ID, kvChunks(s.info), m.Hashes) // its engine will hold this prefix now
	}
}

// claimWarm claims prefix id for a warm-up to t: false when the prefix is claimed already
// (its target does not hold it yet and the claim has not lapsed) or every claim is taken.
func (v *workerView) claimWarm(id uint64, t *slot) bool {
	now := v.clk.Now()
	free := -1
	for i := range v.warming {
		c := &v.warming[i]
		if c.target != nil && (!now.Before(c.until) || v.holds(c.target, c.id)) {
			*c = warmClaim{} // lapsed, or done: the index shows the prefix held
		}
		switch {
		case c.target == nil:
			free = i
		case c.id == id:
			return false
		}
	}
	if free < 0 {
		return false
	}
	v.warming[free] = warmClaim{id: id, target: t, until: now.Add(warmPending)}
	return true
}

// holds reports whether the index the pools read says s holds chunk id.
func (v *workerView) holds(s *slot, id uint64) bool {
	if v.kidx != nil {
		return v.kidx.Holds(&s.member, id)
	}
	return v.pidx != nil && v.pidx.Holds(s.info.ID, id)
}
