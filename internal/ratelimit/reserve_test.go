package ratelimit

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

func reserve(t *testing.T, l *Limiter, key int, lim Limits, tokens int64) (Status, int64) {
	t.Helper()
	st, r, ok := l.Reserve(key, lim, tokens)
	if !ok {
		t.Fatalf("reserving %d refused: %+v", tokens, st)
	}
	return st, r
}

// TestReserveCountsRequestsInFlight (R20): tpm counts a request's most tokens from its
// admission, not only once it ended — so one key's long requests cannot all start before the
// first of them is counted. A reservation that does not fit next to the others is refused;
// settling gives the reservation back and counts what was really used in the window.
func TestReserveCountsRequestsInFlight(t *testing.T) {
	f, l := newFake()
	lim := Limits{TPM: 100}
	st, a := reserve(t, l, 1, lim, 60)
	if a != 60 || st.RemainingTokens != 40 {
		t.Fatalf("first: reserved %d, remaining %d; want 60, 40", a, st.RemainingTokens)
	}
	st, b := reserve(t, l, 1, lim, 40) // exactly the rest
	if b != 40 || st.RemainingTokens != 0 {
		t.Fatalf("second: reserved %d, remaining %d", b, st.RemainingTokens)
	}
	st, r, ok := l.Reserve(1, lim, 1)
	if ok || r != 0 || st.RetryAfter != ReservedWait || st.RemainingTokens != 0 {
		t.Fatalf("a third over the reservations: ok %v, reserved %d, %+v; want refused for %v", ok, r, st, ReservedWait)
	}
	if _, ok := l.Allow(1, lim); ok {
		t.Fatal("a request allowed while reservations hold the whole tpm")
	}
	if got, _ := l.Held(1); got != 100 {
		t.Fatalf("held %d, want 100", got)
	}
	l.Settle(1, a, 10) // the first used 10 of its 60
	f.advance(time.Second)
	st, c := reserve(t, l, 1, lim, 50) // 10 used + 40 reserved + 50
	if c != 50 || st.RemainingTokens != 0 {
		t.Fatalf("after the first settled: reserved %d, remaining %d", c, st.RemainingTokens)
	}
	l.Settle(1, b, 40)
	l.Settle(1, c, 0)
	if got, _ := l.Held(1); got != 0 {
		t.Fatalf("held %d after every request settled", got)
	}
	// 50 used in the window: a reservation of 51 waits for the 10 spent at second 0 to leave
	// (59 s from now), one of 50 fits.
	st, _, ok = l.Reserve(1, lim, 51)
	if ok || st.RetryAfter != 59*time.Second || st.RemainingTokens != 50 {
		t.Fatalf("51 over 50 used: ok %v %+v; want refused for 59 s", ok, st)
	}
	_, d := reserve(t, l, 1, lim, 50)
	l.Settle(1, d, 0)
	if st, ok := l.Allow(2, lim); !ok || st.RemainingTokens != 100 {
		t.Fatalf("another key: ok %v %+v", ok, st)
	}
}

// TestReserveMoreThanTheWholeTPM: a request that may cost more than the key's whole tpm is not
// refused forever — it reserves the whole tpm and runs alone; without a tpm nothing is held.
func TestReserveMoreThanTheWholeTPM(t *testing.T) {
	_, l := newFake()
	lim := Limits{TPM: 100}
	st, r := reserve(t, l, 1, lim, 1<<40)
	if r != 100 || st.RemainingTokens != 0 {
		t.Fatalf("reserved %d, remaining %d; want the whole 100", r, st.RemainingTokens)
	}
	if _, _, ok := l.Reserve(1, lim, 1); ok {
		t.Fatal("a reservation next to one holding the whole tpm")
	}
	l.Settle(1, r, 0)
	if _, r, ok := l.Reserve(1, lim, -5); !ok || r != 0 {
		t.Fatalf("a negative estimate: ok %v reserved %d", ok, r)
	}
	if _, r, ok := l.Reserve(3, Limits{RPM: 1}, 1<<40); !ok || r != 0 || l.Len() != 1 {
		t.Fatalf("no tpm: ok %v reserved %d, %d windows", ok, r, l.Len())
	}
}

// TestEnterCapsRequestsInFlight (R20 max_in_flight): a key may have at most its limit of
// requests being served; one more is refused until one leaves. Other keys and keys without a
// limit are not touched, and every count is back to 0 once the requests left.
func TestEnterCapsRequestsInFlight(t *testing.T) {
	_, l := newFake()
	lim := Limits{InFlight: 2}
	if !l.Enter(1, lim) || !l.Enter(1, lim) {
		t.Fatal("refused under the limit")
	}
	if l.Enter(1, lim) {
		t.Fatal("a third request of max_in_flight 2 entered")
	}
	if !l.Enter(2, lim) || !l.Enter(3, Limits{}) {
		t.Fatal("another key refused")
	}
	if _, n := l.Held(1); n != 2 {
		t.Fatalf("in flight %d, want 2", n)
	}
	l.Leave(1)
	if !l.Enter(1, lim) {
		t.Fatal("refused after one left")
	}
	l.Leave(1)
	l.Leave(1)
	l.Leave(2)
	l.Leave(3)
	l.Leave(9) // never entered: nothing
	for _, k := range []int{1, 2, 3, 9} {
		if r, n := l.Held(k); r != 0 || n != 0 {
			t.Fatalf("key %d holds %d tokens, %d requests after all left", k, r, n)
		}
	}
}

// TestLimitsPerReplicaShareInFlight (R16 with R20): each of n replicas lets ⌈max_in_flight / n⌉
// of a key's requests in.
func TestLimitsPerReplicaShareInFlight(t *testing.T) {
	if got := (Limits{InFlight: 10}).PerReplica(3); got != (Limits{InFlight: 4}) {
		t.Fatalf("got %+v", got)
	}
	if !(Limits{InFlight: 1}).Any() || !(Limits{TPM: 1}).Any() || !(Limits{RPM: 1}).Any() || (Limits{}).Any() {
		t.Fatal("Any")
	}
}

// TestLimiterStateMachine drives the limiter with random interleavings of the calls the HTTP
// adapter makes for concurrent requests of two keys — Allow, Enter/Leave, Reserve/Settle, and
// time passing — against a model: a reservation is granted exactly when the window's tokens,
// the outstanding reservations and it fit in tpm; Enter exactly when fewer than max_in_flight
// are in; Retry-After is within (0, 60 s]; what a key holds is the sum of what its requests
// hold, and nothing once every request has settled and left.
func TestLimiterStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := &fakeNow{t: time.Unix(1_000_000, 0)}
		l := New(f.now)
		lims := []Limits{
			{TPM: rapid.Int64Range(1, 500).Draw(t, "tpm0"), InFlight: rapid.Int64Range(0, 4).Draw(t, "inflight0")},
			{TPM: rapid.Int64Range(1, 500).Draw(t, "tpm1"), RPM: 3},
		}
		type spend struct {
			sec    int64
			tokens int64
		}
		type model struct {
			reservations []int64
			inFlight     int64
			spent        []spend
		}
		m := []*model{{}, {}}
		windowTokens := func(k int) int64 {
			var n int64
			now := f.t.Unix()
			for _, s := range m[k].spent {
				if now-s.sec < Slots {
					n += s.tokens
				}
			}
			return n
		}
		sum := func(xs []int64) int64 {
			var n int64
			for _, x := range xs {
				n += x
			}
			return n
		}
		check := func(t *rapid.T) {
			for k := range m {
				r, n := l.Held(k)
				if r != sum(m[k].reservations) || n != m[k].inFlight {
					t.Fatalf("key %d holds %d tokens, %d requests; the model %d, %d", k, r, n, sum(m[k].reservations), m[k].inFlight)
				}
			}
		}
		key := func(t *rapid.T) int { return rapid.IntRange(0, 1).Draw(t, "key") }
		t.Repeat(map[string]func(*rapid.T){
			"reserve": func(t *rapid.T) {
				k := key(t)
				want := rapid.Int64Range(-5, 700).Draw(t, "tokens")
				st, r, ok := l.Reserve(k, lims[k], want)
				fits := windowTokens(k)+sum(m[k].reservations)+min(max(want, 0), lims[k].TPM) <= lims[k].TPM
				if ok != fits {
					t.Fatalf("Reserve(%d) of key %d: ok %v, the model says %v", want, k, ok, fits)
				}
				if !ok && (st.RetryAfter <= 0 || st.RetryAfter > Window) {
					t.Fatalf("refused with Retry-After %v", st.RetryAfter)
				}
				if st.RemainingTokens < 0 {
					t.Fatalf("remaining %d", st.RemainingTokens)
				}
				if ok {
					m[k].reservations = append(m[k].reservations, r)
				}
			},
			"settle": func(t *rapid.T) {
				k := key(t)
				if len(m[k].reservations) == 0 {
					t.Skip("nothing reserved")
				}
				i := rapid.IntRange(0, len(m[k].reservations)-1).Draw(t, "which")
				used := rapid.Int64Range(-1, 900).Draw(t, "used")
				l.Settle(k, m[k].reservations[i], used)
				m[k].reservations = append(m[k].reservations[:i], m[k].reservations[i+1:]...)
				if used > 0 {
					m[k].spent = append(m[k].spent, spend{f.t.Unix(), used})
				}
			},
			"enter": func(t *rapid.T) {
				k := key(t)
				ok := l.Enter(k, lims[k])
				if want := lims[k].InFlight == 0 || m[k].inFlight < lims[k].InFlight; ok != want {
					t.Fatalf("Enter of key %d with %d in: %v, want %v", k, m[k].inFlight, ok, want)
				}
				if ok {
					m[k].inFlight++
				}
			},
			"leave": func(t *rapid.T) {
				k := key(t)
				if m[k].inFlight == 0 {
					t.Skip("nobody in")
				}
				l.Leave(k)
				m[k].inFlight--
			},
			"allow": func(t *rapid.T) {
				k := key(t)
				st, ok := l.Allow(k, lims[k])
				if held := windowTokens(k) + sum(m[k].reservations); ok && held >= lims[k].TPM {
					t.Fatalf("allowed with %d of %d tokens held", held, lims[k].TPM)
				}
				if !ok && (st.RetryAfter <= 0 || st.RetryAfter > Window) {
					t.Fatalf("refused with Retry-After %v", st.RetryAfter)
				}
			},
			"advance": func(t *rapid.T) {
				f.advance(time.Duration(rapid.Int64Range(1, 30_000).Draw(t, "ms")) * time.Millisecond)
			},
			"": check,
		})
		// Every request ends: what is left is settled and left, and nothing is held.
		for k := range m {
			for _, r := range m[k].reservations {
				l.Settle(k, r, 1)
			}
			for range m[k].inFlight {
				l.Leave(k)
			}
			if r, n := l.Held(k); r != 0 || n != 0 {
				t.Fatalf("key %d holds %d tokens, %d requests after every request ended", k, r, n)
			}
		}
	})
}

// TestReserveWaitsForExactlyTheTokensItNeeds: a refused reservation's Retry-After is the end
// of the window of the latest second that must leave for it to fit: a request that needs
// exactly what the oldest second holds waits for that second only, one that needs one token
// more waits for the next. Its status also tells the key's remaining requests (rpm), which the
// answer's headers carry.
func TestReserveWaitsForExactlyTheTokensItNeeds(t *testing.T) {
	f, l := newFake()
	lim := Limits{TPM: 100, RPM: 5}
	allow(t, l, 1, lim)
	l.Spend(1, 10) // second 0
	f.advance(time.Second)
	l.Spend(1, 40) // second 1
	f.advance(time.Second)
	st, _, ok := l.Reserve(1, lim, 60) // 50 + 60 = 110: the 10 of second 0 must leave
	if ok || st.RetryAfter != 58*time.Second || st.RemainingRequests != 4 {
		t.Fatalf("60 over 50 used: ok %v %+v; want refused for 58 s with 4 requests left", ok, st)
	}
	st, _, ok = l.Reserve(1, lim, 61) // 111: second 1 must leave too
	if ok || st.RetryAfter != 59*time.Second {
		t.Fatalf("61 over 50 used: ok %v %+v; want refused for 59 s", ok, st)
	}
	st, r := reserve(t, l, 1, lim, 50)
	if st.RemainingRequests != 4 || st.RemainingTokens != 0 {
		t.Fatalf("fitting: %+v", st)
	}
	l.Settle(1, r, 0)
}
