package clock

import (
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
