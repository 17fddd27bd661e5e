package router

import (
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// kvEvents applies one worker's prefix-cache events to the exact index (R18.3) and reports
// whether it did: only for a live worker that reports kv_events, registered under the
// registration the subscription was opened for (KVEvents.Reg), keyed by the slot's own member,
// so an engine's events can only ever touch its own registration's entries.
// An oversized message is dropped, and what the index knew of the worker with it.
func (st *state) kvEvents(m *KVEvents) bool {
	v := st.view
	if v.kidx == nil {
		return false
	}
	s := v.registered(m.WorkerID, m.Reg)
	if s == nil || !s.live || !(s.info.KVEvents || m.Engine) {
		return false
	}
	if m.Engine && v.pidx == nil && v.fallbackBlocks > 0 {
		v.pidx = prefixindex.New(v.fallbackBlocks)
	}
	if m.BlockSize > 0 {
		s.kvBlockSize = m.BlockSize
		if s.pool != nil {
			s.pool.kvBlockSize = m.BlockSize
		}
	}
	if len(m.Stored)+len(m.Removed) > MaxKVEventIDs {
		v.kidx.Forget(&s.member)
		st.log.Warn("prefix-cache events dropped: too many ids in one message; the worker's holdings are forgotten",
			"worker", m.WorkerID, "ids", len(m.Stored)+len(m.Removed), "max", MaxKVEventIDs)
		return false
	}
	if m.Clear {
		v.kidx.Forget(&s.member)
	}
	v.kidx.Remove(&s.member, m.Removed)
	v.kidx.Store(&s.member, m.Stored)
	return true
}

// setHeld hands a precise_prefix pool — or a predicted_latency pool whose every member reports
// kv_events — the exact index and the pick's chunk hashes for the Pick that follows (the policy
// clears them). A predicted_latency pool with a member that does not report keeps the
// approximate index: the exact one would say that member holds nothing.
//
// A pool whose engines report their own (vLLM-format) events (R22: a block size seen) is keyed
// by the router's block keys: with the request's token ids it gets their keys, cut by the
// pool's block size (vllmkv.BlockKeys; the base model's, since an adapter's pick does not read
// the index); without, nothing: the policy picks on the approximate index, which the router
// turns on for this (Config.FallbackIndexBlocks) when the first such events arrive.
func (v *workerView) setHeld(ch choice) {
	if v.kidx == nil {
		return
	}
	pl := v.pools[ch.key]
	if pl == nil {
		return
	}
	hs, ok := pl.p.(policy.HeldScorer)
	if !ok {
		return
	}
	if pl.kvBlockSize > 0 {
		if len(ch.tokens) >= pl.kvBlockSize {
			v.blockKeys = vllmkv.BlockKeys(v.blockKeys[:0], ch.tokens, pl.kvBlockSize, -1)
			hs.SetHeld(v.kidx, v.blockKeys)
		}
		return // without token ids: the approximate index, if on (the policy's fallback)
	}
	if len(ch.hashes) > 0 && (!v.predicted || pl.kvMembers == len(pl.members)) {
		hs.SetHeld(v.kidx, ch.hashes)
	}
}

// renderTarget answers RenderTarget: the least loaded routable member of the request's pool
// when its pick reads token ids (a HeldScorer policy over engines that reported a block size),
// else an empty reply. It walks the pool's members (bounded by the live workers); it is asked
// only with gateway.tokenizer = "engine".
func (v *workerView) renderTarget(t *routeTable, m *RenderTarget) *RenderTargetReply {
	out := &RenderTargetReply{}
	if v.kidx == nil {
		return out
	}
	tg := t.resolve(&Pick{Model: m.Model, RequestID: m.RequestID, Endpoint: m.Endpoint}, v)
	if tg.out.Err != nil || tg.adapter != "" {
		return out
	}
	pl := v.pools[tg.key]
	if pl == nil || pl.kvBlockSize == 0 {
		return out
	}
	if _, ok := pl.p.(policy.HeldScorer); !ok {
		return out
	}
	var best *slot
	for _, s := range pl.members {
		if s.routable() && s.info.HTTPAddress != "" && (best == nil || s.load() < best.load()) {
			best = s
		}
	}
	if best != nil {
		out.Address, out.ServedModel = best.info.HTTPAddress, tg.key.model
	}
	return out
}
