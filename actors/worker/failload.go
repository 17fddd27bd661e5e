package worker

import (
	"time"

	"github.com/tlgw/tlgw/actors/router"
)

// Recent failures as load (R19). A worker that fails fast holds nothing in flight, so a policy
// that reads load (least_outstanding, the bounded-load cap of affinity, prefix_aware and
// precise_prefix, predicted_latency's load feature) would send it more and more picks: the
// least-connections black hole. So every failed attempt (R14.2's failures: refused, reset,
// timeout, 5xx before the first byte, an interrupted stream) adds to the worker's load, and
// that load decays.
//
// Decisions written down here:
//   - A failure weighs FailureWeight = 1: one more request in flight. A worker that keeps
//     failing gathers a failure load until it is the most loaded of its pool and stops being
//     picked; it is tried again as the load decays, so a worker that has recovered is back in
//     a few seconds and one that has not gets a few picks per half-life, not most of them.
//   - The load halves every FailureHalfLife = 1 s on the injected clock (integer halving: n
//     failures are forgotten after ⌊log₂ n⌋ + 1 half-lives). The first halving comes a whole
//     half-life after the failure that started the load, so a lone failure counts for 1 s.
//   - It is at most MaxFailLoad, so a long outage is forgotten within ⌊log₂ MaxFailLoad⌋ + 1
//     = 11 s of the last failure.
//   - A success does not clear it: a worker that fails one request in two still counts half
//     its attempts as load. An outcome that says nothing of the engine (the client left) does
//     not add to it.
//   - The state is one counter and one timer per worker actor (a live worker); the timer runs
//     only while the load is above 0.
const (
	FailureWeight   = 1
	FailureHalfLife = time.Second
	MaxFailLoad     = 1024
)

// failLoad is a worker's recent failures as load. Not safe for concurrent use: it belongs to
// the worker actor.
type failLoad struct {
	n int64
}

// add counts outcome o; it reports whether the load went from 0 to above (the decay timer is
// to be armed).
func (f *failLoad) add(o router.Outcome) (started bool) {
	if !o.Failed() {
		return false
	}
	started = f.n == 0
	f.n = min(f.n+FailureWeight, MaxFailLoad)
	return started
}

// halve is one half-life passing; it reports whether load is left (the timer is to be armed
// again).
func (f *failLoad) halve() bool {
	f.n >>= 1
	return f.n > 0
}

// load is the failure load now.
func (f *failLoad) load() int64 { return f.n }
