package router

import (
	"fmt"
	"slices"
	"time"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/errs"
)

// LoRA adapters (R21). A model id that no worker serves as its base model but some serve as an
// adapter (WorkerInfo.LoRAAdapters) is routed to those workers, in the pool of their base
// model and the route's role, by policy.PickLoRA: the workers with the adapter loaded first.
// The router's belief of what is loaded on a worker is what the engine reports running (a
// scraped vLLM's lora_requests_info) and the last max_loras adapters the router sent it
// (slot.loras): vLLM keeps recently used adapters in its slots and evicts the least recently
// used one for a new adapter, so while the gateway is the engine's only client the two agree.
// Config.LoRAUnaware (the simulator's baseline) hides that belief from PickLoRA, which then
// picks the least loaded worker serving the adapter.
//
// Bounds (R19): loraIdx holds one entry per adapter a registered worker lists, each with the
// workers listing it (at most max_workers × MaxLoRAAdapters in all), kept in step with the
// workers' reports and removed with them; slot.loras at most the worker's max_loras (≤
// MaxLoRAAdapters); cands is scratch, as long as the largest adapter set picked from.

// setLoRAs moves s's entries in the adapter index from its old adapter list to its new one;
// both are sorted without repeats (a validated report, servedLoRAs), so one merge pass finds
// what left and what came.
func (v *workerView) setLoRAs(s *slot, old, now []string) {
	i, j := 0, 0
	for i < len(old) || j < len(now) {
		switch {
		case j == len(now) || i < len(old) && old[i] < now[j]:
			v.dropLoRA(old[i], s)
			i++
		case i == len(old) || now[j] < old[i]:
			v.loraIdx[now[j]] = append(v.loraIdx[now[j]], s)
			j++
		default:
			i++
			j++
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
// none serves the endpoint, v.lastMissing whether some were passed over because their engine
// answered 404 for the adapter (LoRAMissing).
func (v *workerView) pickLoRA(ch choice) (*slot, policy.Reason) {
	v.lastUnserved, v.lastMissing = false, false
	now := v.clk.Now()
	v.cands = v.cands[:0]
	unserved, missing := 0, 0
	for _, s := range v.loraIdx[ch.adapter] {
		if s.pool == nil || s.pool.key != ch.key || slices.Contains(ch.exclude, s.info.ID) {
			continue
		}
		if !s.serves(ch.endpoint, now) {
			unserved++
			continue
		}
		if s.loraMissing(ch.adapter, now) {
			missing++
			continue
		}
		c := policy.LoRACandidate{M: &s.member}
		if !v.loraUnaware {
			running := s.info.RunningLoRAs
			c.Loaded = slices.Contains(s.loras, ch.adapter) || slices.Contains(running, ch.adapter)
			inUse := len(s.loras)
			if running != nil {
				inUse = len(running)
			}
			c.Free = inUse < s.info.MaxLoRAs
		}
		v.cands = append(v.cands, c)
	}
	m, reason := policy.PickLoRA(v.cands, ch.prefixHash, v.loadFactor)
	clear(v.cands) // keep no member alive through the scratch
	if m == nil {
		v.lastUnserved = unserved > 0
		v.lastMissing = missing > 0
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

// Loading adapters on demand (R21, gateway.lora_load_on_demand): a request for an adapter of
// [[gateway.lora_adapters]] that no worker serves goes to the least loaded worker of its base
// model, and its pick asks the requester to load the adapter there first (Picked.LoadLoRA,
// vLLM's POST /v1/load_lora_adapter). From that pick on the worker counts as serving the
// adapter (slot.onDemand), so the requests that follow go there too, each asking for the load
// until one has reported it done (LoRALoaded): a load is idempotent on the engine (an adapter
// already loaded answers so), and no request reaches the engine before its adapter. A failed
// load takes the adapter off the worker again. slot.onDemand holds at most the configured
// adapters, kept while the worker lives (a scrape or heartbeat that does not list it yet does
// not drop it).

// LoRALoad asks the requester to load an adapter on the picked worker before its attempt.
type LoRALoad struct {
	Name, Path string
}

// LoRALoaded reports a requester's load of adapter Name on the worker (ID, registration): OK,
// or failed. No reply.
type LoRALoaded struct {
	WorkerID string
	Reg      uint64
	Name     string
	OK       bool
}

// IgnoreDeadLetterLogging: the router may be stopping.
func (*LoRALoaded) IgnoreDeadLetterLogging() {}

// onDemandLoRA is an adapter loaded on demand on a worker; pending until a load reported OK.
type onDemandLoRA struct {
	name    string
	pending bool
}

// servedLoRAs is the adapters s serves: its engine's, and those loaded on demand.
func (s *slot) servedLoRAs(engine []string) []string {
	if len(s.onDemand) == 0 {
		return engine
	}
	out := slices.Clone(engine)
	for _, d := range s.onDemand {
		if i, found := slices.BinarySearch(out, d.name); !found {
			out = slices.Insert(out, i, d.name)
		}
	}
	return out
}

// pendingLoRA reports whether adapter a is being loaded on s on demand.
func (s *slot) pendingLoRA(a string) bool {
	for _, d := range s.onDemand {
		if d.name == a {
			return d.pending
		}
	}
	return false
}

// pickToLoad picks the least loaded routable worker of ch's pool (serving ch.endpoint, not
// excluded) to load ch.adapter on, and counts it as serving the adapter from now.
func (v *workerView) pickToLoad(ch choice) *slot {
	pl := v.pools[ch.key]
	if pl == nil {
		return nil
	}
	now := v.clk.Now()
	var best *slot
	for _, id := range pl.memberIDs() {
		s := pl.members[id]
		if slices.Contains(ch.exclude, id) || !s.serves(ch.endpoint, now) {
			continue
		}
		if best == nil || s.load() < best.load() {
			best = s
		}
	}
	if best != nil {
		v.addOnDemand(best, ch.adapter)
	}
	return best
}

// addOnDemand counts s as serving adapter a, pending its load.
func (v *workerView) addOnDemand(s *slot, a string) {
	if s.pendingLoRA(a) || s.info.ServesLoRA(a) {
		return
	}
	old := s.servedLoRAs(s.info.LoRAAdapters)
	s.onDemand = append(s.onDemand, onDemandLoRA{name: a, pending: true})
	v.setLoRAs(s, old, s.servedLoRAs(s.info.LoRAAdapters))
}

// loraLoaded applies a requester's report of an on-demand load.
func (v *workerView) loraLoaded(m *LoRALoaded) {
	s := v.registered(m.WorkerID, m.Reg)
	if s == nil {
		return
	}
	i := slices.IndexFunc(s.onDemand, func(d onDemandLoRA) bool { return d.name == m.Name })
	if i < 0 {
		return
	}
	if m.OK {
		s.onDemand[i].pending = false
		return
	}
	old := s.servedLoRAs(s.info.LoRAAdapters)
	s.onDemand = slices.Delete(s.onDemand, i, i+1)
	if s.live {
		v.setLoRAs(s, old, s.servedLoRAs(s.info.LoRAAdapters))
	}
}

// LoRAMissing tells the router that the engine of a worker it sent adapter Name to answered
// 404 (it does not have the model): the engine was restarted without it, or unloaded it. The
// worker loses the adapter: an on-demand one is forgotten (the next request loads it again,
// lora_load_on_demand), one its engine lists gets no request for UnsupportedFor (its list is
// stale until the next report), and neither counts as loaded there. Reg is the registration
// the attempt went to; a report about an earlier one changes nothing. No reply.
type LoRAMissing struct {
	WorkerID string
	Reg      uint64
	Name     string
}

// IgnoreDeadLetterLogging: the router may be stopping.
func (*LoRAMissing) IgnoreDeadLetterLogging() {}

// loraMark is an adapter a worker's engine lists but refused, until a time.
type loraMark struct {
	name  string
	until time.Time
}

// loraMissing reports whether s's engine refused adapter a and the mark holds at now.
func (s *slot) loraMissing(a string, now time.Time) bool {
	for _, m := range s.loraGone {
		if m.name == a {
			return now.Before(m.until)
		}
	}
	return false
}

// loraMissing applies a LoRAMissing.
func (v *workerView) loraMissing(m *LoRAMissing) {
	s := v.registered(m.WorkerID, m.Reg)
	if s == nil {
		return
	}
	if i := slices.Index(s.loras, m.Name); i >= 0 {
		s.loras = slices.Delete(s.loras, i, i+1)
	}
	if i := slices.IndexFunc(s.onDemand, func(d onDemandLoRA) bool { return d.name == m.Name }); i >= 0 {
		old := s.servedLoRAs(s.info.LoRAAdapters)
		s.onDemand = slices.Delete(s.onDemand, i, i+1)
		if s.live {
			v.setLoRAs(s, old, s.servedLoRAs(s.info.LoRAAdapters))
		}
	}
	if !s.info.ServesLoRA(m.Name) {
		return
	}
	now := v.clk.Now()
	s.loraGone = slices.DeleteFunc(s.loraGone, func(g loraMark) bool { return g.name == m.Name || !now.Before(g.until) })
	s.loraGone = append(s.loraGone, loraMark{name: m.Name, until: now.Add(UnsupportedFor)})
}

// loraNotLoaded is a pick's error when every worker of model that lists adapter a has refused
// it lately: a 404 like an unknown model's, saying why.
func loraNotLoaded(a, model string) error {
	return fmt.Errorf("the LoRA adapter %s is not loaded on any worker of %s: %w", errs.Echo(a), errs.Echo(model), errs.ErrModelNotFound)
}

// loraExclude is exclude plus the members of pool pk that do not serve adapter a (a new slice
// only when some do not): a disaggregated adapter request's prefill worker must run it too.
func (v *workerView) loraExclude(pk poolKey, a string, exclude []string) []string {
	pl := v.pools[pk]
	if pl == nil {
		return exclude
	}
	out, now := slices.Clip(exclude), v.clk.Now() // clipped: the first append copies
	for _, id := range pl.memberIDs() {
		if s := pl.members[id]; !s.servesLoRA(a, now) {
			out = append(out, id)
		}
	}
	return out
}

// servesLoRA reports whether s serves adapter a at now: its engine lists it or it was loaded
// there on demand, and its engine has not refused it lately.
func (s *slot) servesLoRA(a string, now time.Time) bool {
	if s.loraMissing(a, now) {
		return false
	}
	return s.info.ServesLoRA(a) || slices.ContainsFunc(s.onDemand, func(d onDemandLoRA) bool { return d.name == a })
}
