// Package clock is the one source of wall time in tlgw. Every timing rule (heartbeat eviction,
// queue deadlines, KV leases) reads time through a Clock, so tests can drive it exactly with Fake.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and schedules callbacks.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (Real) or synchronously from Advance (Fake) once d
	// has passed. f must not block; actors use it only to send themselves a message.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a scheduled callback. Stop reports whether it prevented the call.
type Timer interface {
	Stop() bool
}

// Real is the system clock.
type Real struct{}

var _ Clock = Real{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Since is the time elapsed on c since t, which c's Now gave. On Real it reads the monotonic
// clock only (time.Since): half the cost of Now, whose wall-clock read a hot path that only
// measures intervals does not need.
func Since(c Clock, t time.Time) time.Duration {
	if _, ok := c.(Real); ok {
		return time.Since(t)
	}
	return c.Now().Sub(t)
}

// Fake is a manually advanced clock for tests. Callbacks due at or before the new time run
// synchronously inside Advance, in due-time order (ties in scheduling order).
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers map[*fakeTimer]struct{}
}

var _ Clock = (*Fake)(nil)

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, timers: make(map[*fakeTimer]struct{})}
}

type fakeTimer struct {
	c   *Fake
	at  time.Time
	seq uint64
	f   func()
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, ok := t.c.timers[t]
	delete(t.c.timers, t)
	return ok
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d. A d <= 0 is due at once but still runs only from Advance,
// which keeps a test in control of every callback.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	c.timers[t] = struct{}{}
	return t
}

// Pending is the number of scheduled, unfired timers.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Next is how long from now the earliest scheduled, unfired timer is due (≤ 0: already due),
// and false when none is scheduled: what a test reads to check a wait's length.
func (c *Fake) Next() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first *fakeTimer
	for t := range c.timers {
		if first == nil || t.at.Before(first.at) {
			first = t
		}
	}
	if first == nil {
		return 0, false
	}
	return first.at.Sub(c.now), true
}

// Advance moves the clock forward by d (d >= 0), firing every timer that falls due.
func (c *Fake) Advance(d time.Duration) {
	if d < 0 {
		panic("clock: negative Advance")
	}
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *fakeTimer
		for t := range c.timers {
			if t.at.After(target) {
				continue
			}
			if next == nil || t.at.Before(next.at) || (t.at.Equal(next.at) && t.seq < next.seq) {
				next = t
			}
		}
		if next == nil {
			c.now = target
			c.mu.Unlock()
			return
		}
		delete(c.timers, next)
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
	}
}
