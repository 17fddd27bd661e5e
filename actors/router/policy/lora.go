package policy

import "github.com/cespare/xxhash/v2"

// LoRA adapters (R21). A request that names an adapter may go only to workers that serve it,
// and an engine runs at most max_loras adapters at once: sending it an adapter it does not have
// loaded costs a swap (the adapter is loaded into a slot, evicting another), which delays that
// request and may stall the requests of the evicted adapter. PickLoRA keeps each adapter on
// the few workers that have it loaded, spreading it to more only when those are busy.

// LoRACandidate is one routable worker that serves the adapter a request names.
type LoRACandidate struct {
	M *Member
	// Loaded: the adapter is loaded there (the engine reports it running, or it is among the
	// last max_loras adapters the gateway sent it): no swap.
	Loaded bool
	// Free: the engine runs fewer adapters than its max_loras, so the adapter loads into a
	// free slot without evicting one that is in use.
	Free bool
}

// PickLoRA picks among cands (workers serving the adapter) by, in order:
//
//  1. a worker with the adapter loaded and its load under the bounded-load cap
//     ⌈c·(m+1)/n⌉ (m the candidates' total load, n their number), the prefix key's owner among
//     them by rendezvous hashing (prefix affinity within the set);
//  2. a worker with a free slot under the cap, the least loaded;
//  3. the least loaded worker with the adapter loaded, while its load is under twice the cap:
//     no forced swap while another worker has the adapter loaded and is not overrun;
//  4. the least loaded worker (a swap).
//
// Ties go to the rendezvous order, then the smaller id. Nil when cands is empty. The reason is
// ReasonLoRA when the adapter is loaded on the worker picked, else ReasonLeastLoad.
func PickLoRA(cands []LoRACandidate, key uint64, c float64) (*Member, Reason) {
	if len(cands) == 0 {
		return nil, ReasonLeastLoad
	}
	c = loadFactor(c)
	var total int64
	for _, x := range cands {
		total += x.M.load
	}
	capLoad := boundedCap(c, total, len(cands))
	var owner, free, loaded, least *LoRACandidate
	var ownerScore uint64
	for i := range cands {
		x := &cands[i]
		score := rendezvous(key, x.M.ID)
		under := x.M.load < capLoad
		if x.Loaded && under && (owner == nil || score > ownerScore || score == ownerScore && x.M.ID < owner.M.ID) {
			owner, ownerScore = x, score
		}
		if x.Free && under && lessLoaded(x, free, key) {
			free = x
		}
		if x.Loaded && lessLoaded(x, loaded, key) {
			loaded = x
		}
		if lessLoaded(x, least, key) {
			least = x
		}
	}
	switch {
	case owner != nil:
		return owner.M, ReasonLoRA
	case free != nil:
		return free.M, ReasonLeastLoad
	case loaded != nil && loaded.M.load < 2*capLoad:
		return loaded.M, ReasonLoRA
	}
	// Here the least loaded worker does not have the adapter loaded: had it, it would be under
	// twice the cap (the cap exceeds the mean load, and it is the least loaded).
	return least.M, ReasonLeastLoad
}

// lessLoaded reports whether x beats best (nil: x wins) on load, then rendezvous score, then id.
func lessLoaded(x, best *LoRACandidate, key uint64) bool {
	if best == nil {
		return true
	}
	if x.M.load != best.M.load {
		return x.M.load < best.M.load
	}
	sx, sb := rendezvous(key, x.M.ID), rendezvous(key, best.M.ID)
	if sx != sb {
		return sx > sb
	}
	return x.M.ID < best.M.ID
}

// rendezvous is member id's score for prefix key: the highest score owns the key.
func rendezvous(key uint64, id string) uint64 {
	h := xxhash.Sum64String(id) ^ key
	// splitmix64's finalizer: every bit of the key moves the score.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}
