package clock

import (
	"slices"
	"testing"
	"time"
)

func TestFakeFiresInOrderAtExactTimes(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	var got []time.Duration
	at := func() { got = append(got, c.Now().Sub(time.Unix(0, 0))) }
	c.AfterFunc(3*time.Second, at)
	c.AfterFunc(1*time.Second, at)
	stopped := c.AfterFunc(2*time.Second, at)
	if !stopped.Stop() {
		t.Fatal("Stop on a pending timer must report true")
	}
	if stopped.Stop() {
		t.Fatal("second Stop must report false")
	}
	c.Advance(2999 * time.Millisecond)
	if len(got) != 1 || got[0] != time.Second {
		t.Fatalf("after 2.999s got %v, want [1s]", got)
	}
	c.Advance(time.Millisecond)
	if len(got) != 2 || got[1] != 3*time.Second {
		t.Fatalf("after 3s got %v, want [1s 3s]", got)
	}
	if c.Pending() != 0 {
		t.Fatalf("pending = %d, want 0", c.Pending())
	}
}

func TestFakeCallbackMayReschedule(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	n := 0
	var tick func()
	tick = func() {
		n++
		if n < 5 {
			c.AfterFunc(time.Second, tick)
		}
	}
	c.AfterFunc(time.Second, tick)
	c.Advance(10 * time.Second)
	if n != 5 {
		t.Fatalf("ticks = %d, want 5", n)
	}
}

func TestSince(t *testing.T) {
	start := time.Unix(1000, 0)
	fake := NewFake(start)
	fake.Advance(1500 * time.Millisecond)
	if got := Since(fake, start); got != 1500*time.Millisecond {
		t.Fatalf("Since on Fake = %v, want 1.5s", got)
	}
	// On Real: the monotonic interval, never negative, within what passed around it.
	before := time.Now()
	t0 := Real{}.Now()
	got := Since(Real{}, t0)
	if bound := time.Since(before); got < 0 || got > bound {
		t.Fatalf("Since on Real = %v, want within [0, %v]", got, bound)
	}
	if got := Since(Real{}, time.Now().Add(-time.Hour)); got < time.Hour {
		t.Fatalf("Since an hour ago = %v", got)
	}
}

// TestFakeTiesFireInSchedulingOrder: timers due at one instant fire in the order they were
// scheduled, whatever their number.
func TestFakeTiesFireInSchedulingOrder(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	var got []int
	for i := range 20 {
		d := time.Second
		if i%3 == 0 {
			d = 2 * time.Second
		}
		c.AfterFunc(d, func() { got = append(got, i) })
	}
	c.Advance(2 * time.Second)
	var want []int
	for _, late := range []bool{false, true} {
		for i := range 20 {
			if (i%3 == 0) == late {
				want = append(want, i)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
}

// TestFakeDueNowFiresOnAdvanceZero: a timer due now (or in the past) waits for an Advance,
// and Advance(0) fires it without moving the clock.
func TestFakeDueNowFiresOnAdvanceZero(t *testing.T) {
	start := time.Unix(100, 0)
	c := NewFake(start)
	fired := 0
	c.AfterFunc(0, func() { fired++ })
	c.AfterFunc(-time.Second, func() { fired++ })
	if fired != 0 || c.Pending() != 2 {
		t.Fatalf("fired %d, pending %d before any Advance", fired, c.Pending())
	}
	c.Advance(0)
	if fired != 2 || !c.Now().Equal(start) {
		t.Fatalf("after Advance(0): fired %d, now %v", fired, c.Now())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a negative Advance did not panic")
		}
	}()
	c.Advance(-time.Nanosecond)
}

// TestFakeNext: the time until the earliest unfired timer, stopped ones left out; none, false.
func TestFakeNext(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	if d, ok := c.Next(); ok || d != 0 {
		t.Fatalf("no timers: %v, %v", d, ok)
	}
	c.AfterFunc(3*time.Second, func() {})
	early := c.AfterFunc(time.Second, func() {})
	c.AfterFunc(2*time.Second, func() {})
	if d, ok := c.Next(); !ok || d != time.Second {
		t.Fatalf("next %v, %v; want 1s", d, ok)
	}
	early.Stop()
	c.Advance(500 * time.Millisecond)
	if d, ok := c.Next(); !ok || d != 1500*time.Millisecond {
		t.Fatalf("next %v, %v; want 1.5s", d, ok)
	}
	c.Advance(3 * time.Second)
	if d, ok := c.Next(); ok {
		t.Fatalf("all fired, next %v", d)
	}
}
