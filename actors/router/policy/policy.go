// Package policy holds tlgw's worker-picking algorithms (SPEC R3). Each policy is a pure,
// incrementally maintained index over the routable members of one pool (a model and role):
// the router tells it when members join, leave or change load, and a pick reads the index
// without allocating and without asking anybody. Nothing here is safe for concurrent use:
// a policy belongs to the router actor that owns it.
package policy

import (
	"fmt"
	"slices"

	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// Reason says why a member was picked; it is a label of tlgw_routing_decisions_total.
type Reason uint8

const (
	// ReasonLeastLoad: the member with the minimum load (R3.1).
	ReasonLeastLoad Reason = iota
	// ReasonWeighted: smooth weighted round robin by capacity (R3.2).
	ReasonWeighted
	// ReasonAffinity: the prefix key's owner on the hash ring (R3.3).
	ReasonAffinity
	// ReasonLoad: the owner was at its bounded-load cap and a later member took it (R3.3).
	ReasonLoad
	// ReasonPrefix: the member with the longest matched prompt prefix under the bounded-load
	// cap (prefix_aware; precise_prefix, from what the engines report they hold).
	ReasonPrefix
	// ReasonRoundRobin: the next member in turn (round_robin, R18.2).
	ReasonRoundRobin
	// ReasonPredicted: the lowest predicted time to first token (predicted_latency, R18.2).
	ReasonPredicted
	// ReasonLoRA: a worker with the request's LoRA adapter loaded (R21, PickLoRA).
	ReasonLoRA
)

func (r Reason) String() string {
	switch r {
	case ReasonLeastLoad:
		return "least_load"
	case ReasonWeighted:
		return "weighted"
	case ReasonAffinity:
		return "affinity"
	case ReasonLoad:
		return "load"
	case ReasonPrefix:
		return "prefix"
	case ReasonRoundRobin:
		return "round_robin"
	case ReasonPredicted:
		return "predicted"
	case ReasonLoRA:
		return "lora"
	}
	return "unknown"
}

// Member is one routable worker as a policy sees it. The router owns the struct and sets ID
// and Ref; Load and Weight change only through the policy's SetLoad and SetWeight so that
// its index stays consistent.
type Member struct {
	ID  string
	Ref any // the router's own record for this member; opaque to policies
	// Tie orders equally loaded members before their ids; the router sets it before Add and
	// never changes it while the member is in a policy. 0 for every member is id order (one
	// gateway). Replicas sharing their load (R23) each set their own hash of the id: their
	// views agree between shares, and with one order they would all send to the same least
	// loaded members until the next share told them of each other.
	Tie uint64

	load   int64
	weight int64

	pos   int     // position in the policy's heap; affinity: 1 while on the ring
	key   int64   // weighted: the lazy round robin counter (see Weighted)
	class *wclass // weighted: the member's weight class
	gen   uint32  // affinity: which of its ring points are current
	row   int32   // predicted_latency: its row in the policy's dense table
	// ttft is the member's TTFT model (predicted_latency; nil until its first observation).
	ttft *ttftmodel.Model
}

// Load is the member's load as last set (R2: in flight + reported queue depth).
func (m *Member) Load() int64 { return m.load }

// Weight is the member's capacity weight as last set.
func (m *Member) Weight() int64 { return m.weight }

// Policy picks one member of a pool.
//
// Bounds: a policy's tables (heaps, rows, byID maps, weight classes, the affinity ring) hold
// its pool's members, added and removed by the router as workers become routable and leave, and
// the request of the pick at hand (hashes, the last prefix for Warm) until the next; nothing is
// kept per request served. The router drops a pool's policy when its last member leaves.
type Policy interface {
	// Add makes m pickable with the given load and weight. m must not already be in.
	Add(m *Member, load, weight int64)
	// Remove makes m unpickable. Removing a member that is not in is a no-op.
	Remove(m *Member)
	// SetLoad records m's new load.
	SetLoad(m *Member, load int64)
	// SetWeight records m's new capacity weight.
	SetWeight(m *Member, weight int64)
	// Pick returns a member not in exclude, or nil when there is none. key is the request's
	// prefix-key hash (only affinity reads it). Pick does not change loads: the caller
	// records the reservation with SetLoad.
	Pick(key uint64, exclude []string) (*Member, Reason)
	// Len is the number of pickable members.
	Len() int
}

// registry is the one table of route policies: configuration name to constructor. What each
// reads follows from its type (ReadsOf).
var registry = map[string]func(Options) Policy{
	"least_outstanding": func(Options) Policy { return NewLeastOutstanding() },
	"weighted":          func(Options) Policy { return NewWeighted() },
	"affinity":          func(o Options) Policy { return NewAffinity(o.LoadFactor, o.VirtualNodes) },
	"prefix_aware":      func(o Options) Policy { return NewPrefixAware(o.LoadFactor) },
	"round_robin":       func(Options) Policy { return NewRoundRobin() },
	"precise_prefix":    func(o Options) Policy { return NewPrecisePrefix(o.LoadFactor) },
	"predicted_latency": func(o Options) Policy { return NewPredictedLatency(o.LoadFactor) },
}

// Options parameterise policy construction.
type Options struct {
	LoadFactor   float64 // affinity's c (R3.3); default 1.25
	VirtualNodes int     // affinity ring points per member; default 64
}

// New builds the policy registered under name.
func New(name string, o Options) (Policy, error) {
	mk, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("policy: unknown route policy %q (known: %v)", name, Names())
	}
	return mk(o), nil
}

// Reads is what a policy reads besides its members' loads and weights; the gateway builds and
// feeds only what its route policy reads.
type Reads struct {
	// PrefixIndex: the approximate index of the prompts the gateway sent each worker
	// (PrefixScorer, LatencyScorer), and with it each request's chunk hashes.
	PrefixIndex bool
	// KVEvents: the exact index that the engines' KV events feed (HeldScorer, R18.3): the
	// gateway subscribes to the engines' events only for such a policy.
	KVEvents bool
	// TTFT: the time to first token the gateway measures per worker (LatencyScorer).
	TTFT bool
}

// ReadsOf is what the policy registered under name reads (nothing for an unknown name). The
// policy's type says it, by the interfaces it implements, so a new policy is its code and one
// line in the registry, with no list of names elsewhere to keep in step.
func ReadsOf(name string) Reads {
	mk, ok := registry[name]
	if !ok {
		return Reads{}
	}
	p := mk(Options{})
	_, prefix := p.(PrefixScorer)
	_, held := p.(HeldScorer)
	_, latency := p.(LatencyScorer)
	// A held scorer reads the approximate index only as its fallback for pools keyed by the
	// engines' own events (R22), which the router turns on itself when those arrive.
	return Reads{PrefixIndex: (prefix && !held) || latency, KVEvents: held, TTFT: latency}
}

// Names returns the registered policy names, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func excluded(id string, exclude []string) bool {
	for _, e := range exclude {
		if e == id {
			return true
		}
	}
	return false
}
