package router

import (
	"slices"

	"github.com/tlgw/tlgw/actors/router/policy"
)

// LoRA adapters (R21). A model id that no worker serves as its base model but some serve as an
// adapter (WorkerInfo.LoRAAdapters) is routed to those workers, in the pool of their base
// model and the route's role, by policy.PickLoRA: the workers with the adapter loaded first.
// The router's belief of what is loaded on a worker is what the engine reports running (a
// scraped vLLM's lora_requests_info) and the last max_loras adapters the router sent it
// (slot.loras): vLLM keeps recently used adapters in its slots and evicts the least recently
// used one for a new adapter, so while the gateway is the engine's only client the two agree.
//
// Bounds (R19): loraIdx holds one entry per adapter a registered worker lists, each with the
// workers listing it (at most max_workers × MaxLoRAAdapters in all), kept in step with the
// workers' reports and removed with them; slot.loras at most the worker's max_loras (≤
// MaxLoRAAdapters); cands is scratch, as long as the largest adapter set picked from.

// setLoRAs moves s's entries in the adapter index from its old adapter list to its new one.
func (v *workerView) setLoRAs(s *slot, old, now []string) {
	if slices.Equal(old, now) {
		return
	}
	for _, a := range old {
		if !slices.Contains(now, a) {
			v.dropLoRA(a, s)
		}
	}
	for _, a := range now {
		if !slices.Contains(old, a) {
			v.loraIdx[a] = append(v.loraIdx[a], s)
		}
	}
}

// dropLoRA removes s from adapter a's workers.
func (v *workerView) dropLoRA(a string, s *slot) {
	ws := v.loraIdx[a]
	if i := slices.Index(ws, s); i >= 0 {
		ws = slices.Delete(ws, i, i+1)
	}
	if len(ws) == 0 {
		delete(v.loraIdx, a)
		return
	}
	v.loraIdx[a] = ws
}

// loraBase is the base model of the workers serving adapter a ("" when none does).
func (v *workerView) loraBase(a string) string {
	if ws := v.loraIdx[a]; len(ws) > 0 {
		return ws[0].info.Model
	}
	return ""
}

// pickLoRA picks among the routable workers of ch's pool that serve ch.adapter and
// ch.endpoint and are not excluded; v.lastUnserved says whether there were such workers but
// none serves the endpoint.
func (v *workerView) pickLoRA(ch choice) (*slot, policy.Reason) {
	v.lastUnserved = false
	now := v.clk.Now()
	v.cands = v.cands[:0]
	unserved := 0
	for _, s := range v.loraIdx[ch.adapter] {
		if s.pool == nil || s.pool.key != ch.key || slices.Contains(ch.exclude, s.info.ID) {
			continue
		}
		if !s.serves(ch.endpoint, now) {
			unserved++
			continue
		}
		running := s.info.RunningLoRAs
		loaded := slices.Contains(s.loras, ch.adapter) || slices.Contains(running, ch.adapter)
		inUse := len(s.loras)
		if running != nil {
			inUse = len(running)
		}
		v.cands = append(v.cands, policy.LoRACandidate{M: &s.member, Loaded: loaded, Free: inUse < s.info.MaxLoRAs})
	}
	m, reason := policy.PickLoRA(v.cands, ch.prefixHash, v.loadFactor)
	clear(v.cands) // keep no member alive through the scratch
	if m == nil {
		v.lastUnserved = unserved > 0
		return nil, reason
	}
	s := m.Ref.(*slot)
	s.touchLoRA(ch.adapter)
	return s, reason
}

// touchLoRA records that adapter a was sent to s: first in its recent adapters, which keep
// at most max_loras (1 when unknown).
func (s *slot) touchLoRA(a string) {
	if i := slices.Index(s.loras, a); i >= 0 {
		copy(s.loras[1:i+1], s.loras[:i])
		s.loras[0] = a
		return
	}
	limit := min(max(s.info.MaxLoRAs, 1), MaxLoRAAdapters)
	if len(s.loras) < limit {
		s.loras = append(s.loras, "")
	}
	copy(s.loras[1:], s.loras)
	s.loras[0] = a
	s.loras = s.loras[:min(len(s.loras), limit)]
}
