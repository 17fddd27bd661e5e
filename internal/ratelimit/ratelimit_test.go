package ratelimit

import (
	"testing"
	"time"
)

type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time          { return f.t }
func (f *fakeNow) advance(d time.Duration) { f.t = f.t.Add(d) }
func newFake() (*fakeNow, *Limiter)        { f := &fakeNow{t: time.Unix(1_000_000, 0)}; return f, New(f.now) }
func allow(t *testing.T, l *Limiter, key int, lim Limits) Status {
	t.Helper()
	st, ok := l.Allow(key, lim)
	if !ok {
		t.Fatalf("refused: %+v", st)
	}
	return st
}

// TestRPM: rpm = 3 → the 4th request in a minute is refused with Retry-After until the first
// leaves the window; remaining counts down; other keys are independent.
func TestRPM(t *testing.T) {
	f, l := newFake()
	lim := Limits{RPM: 3}
	for i, want := range []int64{2, 1, 0} {
		if st := allow(t, l, 1, lim); st.RemainingRequests != want {
			t.Fatalf("request %d: remaining %d, want %d", i, st.RemainingRequests, want)
		}
		f.advance(10 * time.Second)
	}
	st, ok := l.Allow(1, lim) // at +30 s
	if ok || st.RetryAfter != 30*time.Second || st.RemainingRequests != 0 {
		t.Fatalf("4th: ok %v, %+v; want refused, retry after 30 s", ok, st)
	}
	allow(t, l, 2, lim) // another key
	f.advance(30*time.Second - time.Nanosecond)
	if _, ok := l.Allow(1, lim); ok {
		t.Fatal("allowed 1 ns before the first request left the window")
	}
	f.advance(time.Nanosecond)
	allow(t, l, 1, lim)
}

// TestTPM: tokens spent count against tpm; a request is refused while the window holds ≥ tpm
// tokens, until enough of them leave.
func TestTPM(t *testing.T) {
	f, l := newFake()
	lim := Limits{TPM: 100}
	allow(t, l, 7, lim)
	l.Spend(7, 60)
	f.advance(20 * time.Second)
	st := allow(t, l, 7, lim)
	if st.RemainingTokens != 40 {
		t.Fatalf("remaining tokens %d, want 40", st.RemainingTokens)
	}
	l.Spend(7, 50) // 110 in the window
	f.advance(time.Second)
	st, ok := l.Allow(7, lim)
	if ok || st.RetryAfter != 39*time.Second || st.RemainingTokens != 0 {
		t.Fatalf("over tpm: ok %v %+v; want refused until the 60 tokens leave (39 s)", ok, st)
	}
	f.advance(39 * time.Second)
	if st := allow(t, l, 7, lim); st.RemainingTokens != 50 {
		t.Fatalf("after the first spend left: remaining %d, want 50", st.RemainingTokens)
	}
	l.Spend(7, -5)
	l.Spend(99, 5) // a key never seen: nothing
	if len(l.keys) != 1 {
		t.Fatalf("keys %d", len(l.keys))
	}
}

// TestBurst: requests within one second all count at once; the wait counts from the moment of
// the refusal to the end of that second's window.
func TestBurst(t *testing.T) {
	f, l := newFake()
	f.advance(500 * time.Millisecond) // mid-second
	lim := Limits{RPM: 3}
	for range 3 {
		allow(t, l, 1, lim)
	}
	st, ok := l.Allow(1, lim)
	if ok || st.RetryAfter != 59500*time.Millisecond || st.RemainingRequests != 0 {
		t.Fatalf("4th in the same second: ok %v, %+v; want refused for 59.5 s", ok, st)
	}
	f.advance(59500*time.Millisecond - time.Nanosecond)
	if _, ok := l.Allow(1, lim); ok {
		t.Fatal("allowed before the burst's second left the window")
	}
	f.advance(time.Nanosecond)
	allow(t, l, 1, lim)
}

// TestRetryAfterSkipsSecondsThatLeft: a bucket still holding a second older than the window
// (its slot not reused since) neither counts nor shortens the wait.
func TestRetryAfterSkipsSecondsThatLeft(t *testing.T) {
	f, l := newFake()
	lim := Limits{RPM: 1}
	allow(t, l, 1, lim) // second 0, slot 0
	f.advance(61 * time.Second)
	allow(t, l, 1, lim) // second 61, slot 1; slot 0 still holds second 0
	f.advance(500 * time.Millisecond)
	st, ok := l.Allow(1, lim)
	if ok || st.RetryAfter != 59500*time.Millisecond {
		t.Fatalf("ok %v, %+v; want refused for 59.5 s", ok, st)
	}
}

// TestTPMAtTheLimit: a window holding exactly tpm tokens refuses.
func TestTPMAtTheLimit(t *testing.T) {
	f, l := newFake()
	lim := Limits{TPM: 100}
	allow(t, l, 1, lim)
	l.Spend(1, 99)
	f.advance(time.Second)
	allow(t, l, 1, lim) // 99 < 100
	l.Spend(1, 1)
	if st, ok := l.Allow(1, lim); ok || st.RetryAfter != 59*time.Second || st.RemainingTokens != 0 {
		t.Fatalf("at 100 of 100 tokens: ok %v, %+v; want refused until the 99 leave (59 s)", ok, st)
	}
}

// TestNoLimits: zero limits never refuse.
func TestNoLimits(t *testing.T) {
	_, l := newFake()
	for i := 0; i < 1000; i++ {
		allow(t, l, 1, Limits{})
		l.Spend(1, 1000)
	}
}

// FuzzLimiter: whatever the sequence, a key is never allowed more than rpm requests in any 60 s
// window, RetryAfter is within (0, 60 s] when refused, and remaining counts are never negative.
func FuzzLimiter(f *testing.F) {
	f.Add([]byte{1, 2, 3, 200, 4, 5, 0, 0, 0})
	f.Add([]byte{1, 1, 1, 1, 1, 1, 1, 1})                  // a burst within one second
	f.Add([]byte{3, 1, 1, 1, 1, 1, 1, 201, 1, 1, 1, 1, 1}) // mid-second bursts across a minute
	f.Fuzz(func(t *testing.T, ops []byte) {
		fk, l := newFake()
		lim := Limits{RPM: 5, TPM: 300}
		var allowed []time.Time
		for _, op := range ops {
			switch op % 3 {
			case 0:
				fk.advance(time.Duration(op) * 100 * time.Millisecond)
			case 1:
				st, ok := l.Allow(1, lim)
				if st.RemainingRequests < 0 || st.RemainingTokens < 0 {
					t.Fatalf("negative remaining: %+v", st)
				}
				if !ok && (st.RetryAfter <= 0 || st.RetryAfter > Window) {
					t.Fatalf("refused with retry after %v", st.RetryAfter)
				}
				if ok {
					allowed = append(allowed, fk.t)
				}
			case 2:
				l.Spend(1, int64(op))
			}
			n := 0
			for _, at := range allowed {
				if fk.t.Sub(at) < Window-time.Second { // within the window whatever the bucketing
					n++
				}
			}
			if n > int(lim.RPM) {
				t.Fatalf("%d requests allowed within a window of rpm %d", n, lim.RPM)
			}
		}
	})
}

func TestPerReplica(t *testing.T) {
	for _, c := range []struct {
		in   Limits
		n    int
		want Limits
	}{
		{Limits{RPM: 100, TPM: 1000}, 1, Limits{RPM: 100, TPM: 1000}},
		{Limits{RPM: 100, TPM: 1000}, 0, Limits{RPM: 100, TPM: 1000}},
		{Limits{RPM: 100, TPM: 1000}, 3, Limits{RPM: 34, TPM: 334}},
		{Limits{RPM: 99, TPM: 0}, 3, Limits{RPM: 33, TPM: 0}},
		{Limits{RPM: 1, TPM: 5}, 4, Limits{RPM: 1, TPM: 2}},
		{Limits{RPM: 10, TPM: 10}, 10, Limits{RPM: 1, TPM: 1}},
		{Limits{RPM: 10, TPM: 10}, 11, Limits{RPM: 1, TPM: 1}},
	} {
		if got := c.in.PerReplica(c.n); got != c.want {
			t.Errorf("%+v / %d = %+v, want %+v", c.in, c.n, got, c.want)
		}
	}
}
