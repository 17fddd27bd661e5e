package rollout

import (
	"math"
	"sync"
	"testing"
	"time"
)

// TestWindowCounts: each backend's requests, errors and TTFT histogram (a TTFT on a bound is
// in that bound's bucket); other models and requests without a first byte; Take starts over.
func TestWindowCounts(t *testing.T) {
	w := NewWindow("new", "old")
	w.Observe("new", false, time.Millisecond)     // bucket 0.001
	w.Observe("new", true, 1500*time.Microsecond) // bucket 0.002
	w.Observe("new", true, 0)                     // no first byte: no TTFT
	w.Observe("old", false, time.Hour)            // +Inf
	w.Observe("other", true, time.Millisecond)    // not this rollout's
	w.Observe("old", false, 500*time.Microsecond) // bucket 0.0005
	ct, bt := w.Take()
	c, b := ct.Counts(), bt.Counts()
	if c.Requests != 3 || c.Errors != 2 || b.Requests != 2 || b.Errors != 0 {
		t.Fatalf("canary %+v baseline %+v", c, b)
	}
	for le, want := range map[float64]uint64{0.0005: 0, 0.001: 1, 0.002: 2, math.Inf(1): 2} {
		if c.TTFT[le] != want {
			t.Errorf("canary le %v: %d, want %d", le, c.TTFT[le], want)
		}
	}
	for le, want := range map[float64]uint64{0.0005: 1, TTFTBuckets[len(TTFTBuckets)-1]: 1, math.Inf(1): 2} {
		if b.TTFT[le] != want {
			t.Errorf("baseline le %v: %d, want %d", le, b.TTFT[le], want)
		}
	}
	if len(c.TTFT) != len(TTFTBuckets)+1 {
		t.Fatalf("%d buckets", len(c.TTFT))
	}
	ct, bt = w.Take()
	c, b = ct.Counts(), bt.Counts()
	if c.Requests+c.Errors+b.Requests+b.Errors != 0 || c.TTFT[math.Inf(1)] != 0 {
		t.Fatalf("the next window starts with %+v %+v", c, b)
	}
}

// TestWindowConcurrent: request actors observe from many goroutines while the driver takes
// windows; every request is counted in exactly one window.
func TestWindowConcurrent(t *testing.T) {
	w := NewWindow("new", "old")
	const writers, each = 8, 2000
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				w.Observe([]string{"new", "old"}[(i+j)%2], j%10 == 0, time.Duration(j)*time.Microsecond)
			}
		}()
	}
	var total, errs, ttft uint64
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	add := func() {
		ct, bt := w.Take()
		c, b := ct.Counts(), bt.Counts()
		total += c.Requests + b.Requests
		errs += c.Errors + b.Errors
		ttft += c.TTFT[math.Inf(1)] + b.TTFT[math.Inf(1)]
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			add()
		}
	}
	add()
	if total != writers*each || errs != writers*each/10 || ttft != writers*(each-1) {
		t.Fatalf("counted %d requests, %d errors, %d TTFTs", total, errs, ttft)
	}
}

// TestWindowLastBucket: a TTFT on the last bound is in the last bucket, above it in +Inf only.
func TestWindowLastBucket(t *testing.T) {
	w := NewWindow("new", "old")
	last := TTFTBuckets[len(TTFTBuckets)-1]
	w.Observe("new", false, time.Duration(last*float64(time.Second)))
	w.Observe("new", false, time.Duration(last*float64(time.Second))+time.Millisecond)
	ct, _ := w.Take()
	c := ct.Counts()
	if c.TTFT[last] != 1 || c.TTFT[math.Inf(1)] != 2 {
		t.Fatalf("last bucket %d, +Inf %d", c.TTFT[last], c.TTFT[math.Inf(1)])
	}
}
