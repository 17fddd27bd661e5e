// Package ratelimit is the per-key request and token limit of SPEC R13.5: rpm requests and
// tpm tokens per sliding 60 s window, pure Go on an injected clock.
//
// The window is kept as 60 one-second buckets per key, so memory per key is fixed whatever the
// traffic, and the window slides in whole seconds: a request or token counted at 12.3 s leaves
// the window at 72 s. Keys are the gateway's own key indexes (never a client string), so the
// table is bounded by the configured keys.
package ratelimit

import (
	"sync"
	"time"
)

// Window is the sliding window (R13.5: 60 s) and Slots its one-second buckets.
const (
	Window = 60 * time.Second
	Slots  = 60
)

// Limits are one key's limits; 0 = none.
type Limits struct {
	RPM int64 // requests per window
	TPM int64 // tokens per window
}

// PerReplica is the share of l one of n gateway replicas enforces: ⌈limit / n⌉ of each
// (R16: every replica counts only its own traffic). n ≤ 1 is the whole limit.
func (l Limits) PerReplica(n int) Limits {
	if n <= 1 {
		return l
	}
	d := int64(n)
	return Limits{RPM: ceilDiv(l.RPM, d), TPM: ceilDiv(l.TPM, d)}
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return a
	}
	return (a-1)/b + 1
}

// Status is a key's state as the response headers show it (x-ratelimit-*).
type Status struct {
	Limits
	RemainingRequests int64 // RPM − requests in the window (0 when over); meaningless when RPM = 0
	RemainingTokens   int64 // TPM − tokens in the window (0 when over); meaningless when TPM = 0
	// RetryAfter is how long until the key may send again (0 when it may now).
	RetryAfter time.Duration
}

// Limiter holds every key's window. It is safe for concurrent use.
type Limiter struct {
	now  func() time.Time
	mu   sync.Mutex
	keys map[int]*window // by configured key index: at most one per [[auth.keys]] entry with a limit
}

// window is one key's buckets: requests and tokens counted in the second sec of each slot.
type window struct {
	sec      [Slots]int64 // the Unix second a slot holds (a slot of another second is stale)
	requests [Slots]int64
	tokens   [Slots]int64
}

// New returns a limiter reading time from now.
func New(now func() time.Time) *Limiter {
	return &Limiter{now: now, keys: make(map[int]*window)}
}

// sums returns the requests and tokens in the window ending at second s, and the first
// second (oldest) that still holds anything.
func (w *window) sums(s int64) (reqs, toks int64) {
	for i := range Slots {
		if s-w.sec[i] < Slots && w.sec[i] <= s {
			reqs += w.requests[i]
			toks += w.tokens[i]
		}
	}
	return reqs, toks
}

// slot returns the bucket of second s, cleared if it held an older second.
func (w *window) slot(s int64) int {
	i := int(((s % Slots) + Slots) % Slots)
	if w.sec[i] != s {
		w.sec[i], w.requests[i], w.tokens[i] = s, 0, 0
	}
	return i
}

// retryAfter is how long from now until the window holds fewer than limit of the counts
// (requests or tokens) that reach it: the end of the window of the second that must leave.
func (w *window) retryAfter(now time.Time, s, over int64, counts *[Slots]int64) time.Duration {
	// Walk the seconds oldest first, dropping counts until the excess is gone.
	for old := s - Slots + 1; old <= s; old++ {
		i := int(((old % Slots) + Slots) % Slots)
		if w.sec[i] == old {
			over -= counts[i]
		}
		if over < 0 {
			return time.Unix(old+Slots, 0).Sub(now)
		}
	}
	return Window
}

// Allow counts one request of key when its limits allow it now, and returns the key's status
// either way (RetryAfter > 0 when it was refused). Tokens are counted later, with Spend.
func (l *Limiter) Allow(key int, lim Limits) (Status, bool) {
	now := l.now()
	s := now.Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.keys[key]
	if w == nil {
		w = &window{}
		for i := range w.sec {
			w.sec[i] = -1 << 62 // no second yet
		}
		l.keys[key] = w
	}
	reqs, toks := w.sums(s)
	st := Status{Limits: lim}
	var wait time.Duration
	if lim.RPM > 0 && reqs >= lim.RPM {
		wait = max(wait, w.retryAfter(now, s, reqs-lim.RPM, &w.requests))
	}
	if lim.TPM > 0 && toks >= lim.TPM {
		wait = max(wait, w.retryAfter(now, s, toks-lim.TPM, &w.tokens))
	}
	if wait > 0 {
		st.RetryAfter = wait
		st.RemainingRequests, st.RemainingTokens = max(lim.RPM-reqs, 0), max(lim.TPM-toks, 0)
		return st, false
	}
	w.requests[w.slot(s)]++
	st.RemainingRequests, st.RemainingTokens = max(lim.RPM-reqs-1, 0), max(lim.TPM-toks, 0)
	return st, true
}

// Len is the number of keys with a window.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// Spend counts tokens of key now (a request's usage.total_tokens once known; negative counts
// are ignored).
func (l *Limiter) Spend(key int, tokens int64) {
	if tokens <= 0 {
		return
	}
	s := l.now().Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.keys[key]; w != nil {
		w.tokens[w.slot(s)] += tokens
	}
}
