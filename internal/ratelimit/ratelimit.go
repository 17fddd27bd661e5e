// Package ratelimit is the per-key request and token limit of SPEC R13.5: rpm requests and
// tpm tokens per sliding 60 s window, pure Go on an injected clock — and the per-key isolation
// of R20: a key's requests in flight (max_in_flight), and tpm reservations that count a
// request's most tokens from its admission until it ends.
//
// The window is kept as 60 one-second buckets per key, so memory per key is fixed whatever the
// traffic, and the window slides in whole seconds: a request or token counted at 12.3 s leaves
// the window at 72 s. Keys are the gateway's own key indexes (never a client string), so the
// table is bounded by the configured keys.
package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// Window is the sliding window (R13.5: 60 s) and Slots its one-second buckets.
const (
	Window = 60 * time.Second
	Slots  = 60
)

// Limits are one key's limits; 0 = none.
type Limits struct {
	RPM      int64 // requests per window
	TPM      int64 // tokens per window
	InFlight int64 // requests being served at once (R20 max_in_flight)
}

// Any reports whether l limits anything.
func (l Limits) Any() bool { return l.RPM > 0 || l.TPM > 0 || l.InFlight > 0 }

// PerReplica is the share of l one of n gateway replicas enforces: ⌈limit / n⌉ of each
// (R16: every replica counts only its own traffic). n ≤ 1 is the whole limit.
func (l Limits) PerReplica(n int) Limits {
	if n <= 1 {
		return l
	}
	d := int64(n)
	return Limits{RPM: ceilDiv(l.RPM, d), TPM: ceilDiv(l.TPM, d), InFlight: ceilDiv(l.InFlight, d)}
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
	// peers is what the other replicas last published of their traffic (share.go); nil:
	// none usable, each replica takes ⌈limit / replicas⌉.
	peers     atomic.Pointer[Peers]
	fallbacks atomic.Int64 // shares taken as ⌈limit / replicas⌉ in a cluster for want of peers
}

// window is one key's buckets: requests and tokens counted in the second sec of each slot,
// and what its requests being served hold now.
type window struct {
	sec      [Slots]int64 // the Unix second a slot holds (a slot of another second is stale)
	requests [Slots]int64
	tokens   [Slots]int64
	// What the key's limits refused in each second: requests (rpm, tpm before the body),
	// tokens asked by refused reservations, and requests refused for max_in_flight. With
	// what was admitted, they are the key's demand at this replica (share.go).
	refused   [Slots]int64
	refusedTk [Slots]int64
	refusedIF [Slots]int64
	// reserved is the tokens reserved by the key's requests being served (Reserve, until
	// Settle); inFlight is those requests (Enter, until Leave). Both are 0 once every
	// request of the key has ended.
	reserved int64
	inFlight int64
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
		w.refused[i], w.refusedTk[i], w.refusedIF[i] = 0, 0, 0
	}
	return i
}

// ReservedWait is the Retry-After of a key whose tokens are held by its own requests being
// served rather than by the window: they give theirs back when they end, which no clock says.
const ReservedWait = time.Second

// retryAfter is how long from now until the window holds fewer than limit of the counts
// (requests or tokens) that reach it: the end of the window of the second that must leave.
// over is the excess to drop, less one (the count must go below the limit); when the window
// holds less than that, the rest is reserved by requests in flight: ReservedWait.
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
	return ReservedWait
}

// window returns key's window, made on first use.
func (l *Limiter) window(key int) *window {
	w := l.keys[key]
	if w == nil {
		w = &window{}
		for i := range w.sec {
			w.sec[i] = -1 << 62 // no second yet
		}
		l.keys[key] = w
	}
	return w
}

// Allow counts one request of key when its limits allow it now, and returns the key's status
// either way (RetryAfter > 0 when it was refused). A key is refused while its window holds rpm
// requests, or while the window and its reservations hold tpm tokens. Tokens are counted
// later: reserved with Reserve, settled with Settle (or counted with Spend).
func (l *Limiter) Allow(key int, lim Limits) (Status, bool) {
	now := l.now()
	s := now.Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.window(key)
	reqs, toks := w.sums(s)
	held := toks + w.reserved
	st := Status{Limits: lim}
	var wait time.Duration
	if lim.RPM > 0 && reqs >= lim.RPM {
		wait = max(wait, w.retryAfter(now, s, reqs-lim.RPM, &w.requests))
	}
	if lim.TPM > 0 && held >= lim.TPM {
		wait = max(wait, w.retryAfter(now, s, held-lim.TPM, &w.tokens))
	}
	if wait > 0 {
		w.refused[w.slot(s)]++
		st.RetryAfter = wait
		st.RemainingRequests, st.RemainingTokens = max(lim.RPM-reqs, 0), max(lim.TPM-held, 0)
		return st, false
	}
	w.requests[w.slot(s)]++
	st.RemainingRequests, st.RemainingTokens = max(lim.RPM-reqs-1, 0), max(lim.TPM-held, 0)
	return st, true
}

// Reserve holds tokens of key's tpm for a request about to be served (R20: its prompt and
// the most it may generate), when they fit: the window's tokens, the key's other reservations
// and these stay within tpm. A request that asks for more than the whole tpm reserves the
// whole tpm: it can run, alone. It returns the key's status with the reservation counted
// (RetryAfter > 0 when refused) and the tokens held, which the caller gives to Settle exactly
// once when the request ends, whatever its outcome. Without a tpm it holds nothing.
func (l *Limiter) Reserve(key int, lim Limits, tokens int64) (Status, int64, bool) {
	st := Status{Limits: lim}
	if lim.TPM <= 0 {
		return st, 0, true
	}
	r := min(max(tokens, 0), lim.TPM)
	now := l.now()
	s := now.Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.window(key)
	reqs, toks := w.sums(s)
	st.RemainingRequests = max(lim.RPM-reqs, 0)
	if over := toks + w.reserved + r - lim.TPM; over > 0 {
		w.refusedTk[w.slot(s)] += r
		st.RetryAfter = w.retryAfter(now, s, over-1, &w.tokens)
		st.RemainingTokens = max(lim.TPM-toks-w.reserved, 0)
		return st, 0, false
	}
	w.reserved += r
	st.RemainingTokens = lim.TPM - toks - w.reserved
	return st, r, true
}

// Settle ends a reservation of key: the reserved tokens are given back and the tokens the
// request really used are counted in the window now (negative counts are ignored).
func (l *Limiter) Settle(key int, reserved, used int64) {
	s := l.now().Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.keys[key]
	if w == nil {
		return
	}
	w.reserved -= max(reserved, 0)
	if used > 0 {
		w.tokens[w.slot(s)] += used
	}
}

// Enter counts one more request of key being served, unless lim.InFlight of them are (R20
// max_in_flight; 0 = no limit): false, and nothing is counted. The caller calls Leave exactly
// once for each Enter that returned true.
func (l *Limiter) Enter(key int, lim Limits) bool {
	s := l.now().Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.window(key)
	if lim.InFlight > 0 && w.inFlight >= lim.InFlight {
		w.refusedIF[w.slot(s)]++
		return false
	}
	w.inFlight++
	return true
}

// Leave ends a request that Enter counted.
func (l *Limiter) Leave(key int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.keys[key]; w != nil {
		w.inFlight--
	}
}

// Held is what key's requests being served hold now: their reserved tokens and their number
// (counted by Enter). Both are 0 once every request of the key has ended.
func (l *Limiter) Held(key int) (reserved, inFlight int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.keys[key]; w != nil {
		return w.reserved, w.inFlight
	}
	return 0, 0
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
