package fleet

import (
	"fmt"
	"slices"

	"github.com/tlgw/tlgw/sim/kv"
)

// audit checks, in tests (Options.audit), promises of the engine model as a run goes: an engine
// starts what reached it (requests and warm-ups) in the order it came, a warm-up ends after
// the prefill of what its engine did not hold and one decode step, and (precise_prefix) its
// engine then holds its prompt's chunks but for the last two (the block it ends in: 16-token
// blocks, 4 bytes a token). Every method is a no-op on a nil audit.
type audit struct {
	order  [][]int32 // per engine: entries placed and not started, oldest first
	faults []string
}

func (a *audit) fault(format string, args ...any) {
	if len(a.faults) < 16 {
		a.faults = append(a.faults, fmt.Sprintf(format, args...))
	}
}

// placed: entry (a request, or ^k for warm-up k) reached engine eng.
func (a *audit) placed(eng, entry int32) {
	if a != nil {
		a.order[eng] = append(a.order[eng], entry)
	}
}

// started: entry started on engine eng; it must be the oldest placed there.
func (a *audit) started(eng, entry int32) {
	if a == nil {
		return
	}
	q := a.order[eng]
	if len(q) == 0 || q[0] != entry {
		a.fault("engine %d started %d while %v waited before it", eng, entry, q[:min(len(q), 4)])
		if i := slices.Index(q, entry); i >= 0 {
			a.order[eng] = slices.Delete(q, i, i+1)
		}
		return
	}
	a.order[eng] = q[1:]
}

// warmEnded: a warm-up ended at now, due at want.
func (a *audit) warmEnded(now, want int64) {
	if a != nil && now != want {
		a.fault("a warm-up ended at %d ns, due at %d", now, want)
	}
}

// warmHeld: a warm-up of chunks started on pool.
func (a *audit) warmHeld(pool *kv.Pool, chunks []uint64) {
	if a == nil {
		return
	}
	held := pool.Tagged(nil)
	n := 0
	for _, id := range chunks {
		if slices.Contains(held, id) {
			n++
		}
	}
	if n < len(chunks)-2 {
		a.fault("a warm-up of %d chunks left its engine holding %d", len(chunks), n)
	}
}
