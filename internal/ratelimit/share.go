package ratelimit

import (
	"math"
	"slices"
)

// A key's limits are the whole cluster's (R13.5, R16). Each replica counts only its own
// traffic, so it enforces a share of each limit. The even share ⌈limit / replicas⌉ refuses a
// key whose traffic lands unevenly: at 90% of its rpm split 70/20/10 over three replicas, the
// first replica's 63% meets a share of 33% (TestEvenShareRefusesUnevenTraffic). Instead each
// replica publishes its keys' Usage (through etcd, adapters/cluster) every exchange interval,
// and takes a share that follows the traffic it sees, from the others' last published Usage
// and its own current one:
//
//	share = min(allotment, limit − what the other replicas hold)
//
// The allotment divides the limit by demand (what arrived: admitted and refused). With D the
// key's demand over all replicas, d this replica's, n the live replicas and F = limit/10:
//
//	D ≤ limit − F:  d + ⌈(limit − D) / n⌉           its demand and an even part of the room left
//	D > limit − F:  ⌈F / n⌉ + ⌈(limit − F)·d / D⌉   a floor, and the rest in proportion to demand
//
// Worked example: rpm 600, 540 a minute split 378/108/54: D = 540 ≤ 540, so the shares are
// 398, 128 and 74 — each above its replica's traffic, and they add up to 600.
//
// The cap is what bounds over-admission: a replica admits only while its own count stays
// within limit − Σ others' published counts, so the cluster's window holds at most the limit
// plus what the other replicas admitted since they last published (one exchange interval and
// the time etcd takes to pass it on), plus one request per replica (a share is never 0,
// which means "no limit"). Under-admission: a replica refuses only once its own window reaches
// its share, which covers the demand it showed at the last exchange and an even part of the
// room left; traffic that moves to it faster than that waits one exchange interval.
//
// Keys are the configured keys' indexes, as everywhere in this package.

// Usage is one key's traffic at one replica: for requests, tokens and requests in flight,
// what the replica holds against the limit (the window's requests; the window's tokens and
// its reservations; the requests being served) and the demand (that, plus what the limits
// refused in the window).
type Usage struct {
	Requests, RequestDemand  int64
	Tokens, TokenDemand      int64
	InFlight, InFlightDemand int64
}

// add is u plus v, each field saturating at math.MaxInt64 / 2 (published values are bounded,
// the sum of many is not).
func (u Usage) add(v Usage) Usage {
	s := func(a, b int64) int64 { return min(a+b, math.MaxInt64/2) }
	return Usage{s(u.Requests, v.Requests), s(u.RequestDemand, v.RequestDemand), s(u.Tokens, v.Tokens),
		s(u.TokenDemand, v.TokenDemand), s(u.InFlight, v.InFlight), s(u.InFlightDemand, v.InFlightDemand)}
}

// zero reports whether u holds nothing.
func (u Usage) zero() bool { return u == Usage{} }

// KeyUsage is one key's Usage, by configured key index.
type KeyUsage struct {
	Key int
	Usage
}

// Peers is the other replicas' traffic as last published, summed per key. A Peers is never
// changed once given to SetPeers.
type Peers struct {
	Keys map[int]Usage // by configured key index: at most the keys the replicas published
}

// NewPeers sums the other replicas' published usage per key.
func NewPeers(replicas ...[]KeyUsage) *Peers {
	p := &Peers{Keys: make(map[int]Usage)}
	for _, r := range replicas {
		for _, ku := range r {
			p.Keys[ku.Key] = p.Keys[ku.Key].add(ku.Usage)
		}
	}
	return p
}

// SetPeers installs what the other replicas last published; nil: nothing usable (etcd is
// away), each replica takes ⌈limit / replicas⌉.
func (l *Limiter) SetPeers(p *Peers) { l.peers.Store(p) }

// Fallbacks is how many shares were taken as ⌈limit / replicas⌉ in a cluster (more than one
// replica) for want of the other replicas' usage.
func (l *Limiter) Fallbacks() int64 { return l.fallbacks.Load() }

// Share is this replica's share of key's limits total while n replicas are live (see the
// package comment above). With n ≤ 1 it is total; without peers' usage (SetPeers(nil)), the
// even share ⌈total / n⌉, counted in Fallbacks.
func (l *Limiter) Share(key int, total Limits, n int) Limits {
	if n <= 1 || !total.Any() {
		return total
	}
	p := l.peers.Load()
	if p == nil {
		l.fallbacks.Add(1)
		return total.PerReplica(n)
	}
	own := l.usage(key)
	other := p.Keys[key]
	return Limits{
		RPM:      share(total.RPM, own.RequestDemand, other.RequestDemand, other.Requests, n),
		TPM:      share(total.TPM, own.TokenDemand, other.TokenDemand, other.Tokens, n),
		InFlight: share(total.InFlight, own.InFlightDemand, other.InFlightDemand, other.InFlight, n),
	}
}

// floorDiv is 1/floorDiv of a limit: the floor F every replica's allotment holds in
// equal parts however the demand is split.
const floorDiv = 10

// share is one limit's share (see the package comment above): d is this replica's demand,
// od the others' demand and oc what the others hold. It is ≥ 1 (0 would mean no limit).
func share(limit, d, od, oc int64, n int) int64 {
	if limit <= 0 {
		return limit
	}
	nn := int64(n)
	total := d + od
	f := limit / floorDiv
	var a int64
	if total <= limit-f {
		a = d + ceilDiv(limit-total, nn)
	} else {
		a = ceilDiv(f, nn) + int64(math.Ceil(float64(limit-f)*float64(d)/float64(total)))
	}
	return max(min(a, limit-oc), 1)
}

// usage is key's Usage at this replica now.
func (l *Limiter) usage(key int) Usage {
	s := l.now().Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.keys[key]
	if w == nil {
		return Usage{}
	}
	return w.usage(s)
}

func (w *window) usage(s int64) Usage {
	var u Usage
	var refused, refusedTk, refusedIF int64
	for i := range Slots {
		if s-w.sec[i] < Slots && w.sec[i] <= s {
			u.Requests += w.requests[i]
			u.Tokens += w.tokens[i]
			refused += w.refused[i]
			refusedTk += w.refusedTk[i]
			refusedIF += w.refusedIF[i]
		}
	}
	u.Tokens += max(w.reserved, 0)
	u.InFlight = max(w.inFlight, 0)
	u.RequestDemand = u.Requests + refused
	u.TokenDemand = u.Tokens + refusedTk
	u.InFlightDemand = u.InFlight + refusedIF
	return u
}

// Usage is every key's Usage at this replica now, by key index, leaving out keys with
// nothing in the window and nothing held: what a replica publishes to the others.
func (l *Limiter) Usage() []KeyUsage {
	s := l.now().Unix()
	l.mu.Lock()
	out := make([]KeyUsage, 0, len(l.keys))
	for k, w := range l.keys {
		if u := w.usage(s); !u.zero() {
			out = append(out, KeyUsage{Key: k, Usage: u})
		}
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b KeyUsage) int { return a.Key - b.Key })
	return out
}
