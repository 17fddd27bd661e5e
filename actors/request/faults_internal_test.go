package request

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
)

func TestRetryBudgetLimit(t *testing.T) {
	b := NewRetryBudget(20)
	for _, c := range []struct{ inFlight, limit int64 }{{0, 3}, {10, 3}, {15, 3}, {20, 4}, {50, 10}, {101, 20}} {
		b.inFlight.Store(c.inFlight)
		if got := b.Limit(); got != c.limit {
			t.Errorf("in flight %d: limit %d, want %d", c.inFlight, got, c.limit)
		}
	}
	b.inFlight.Store(20)
	for range 4 {
		if !b.tryAcquire() {
			t.Fatal("refused within the budget")
		}
	}
	if b.tryAcquire() {
		t.Fatal("a fifth failover with 20 in flight at 20%")
	}
}

type closeCount struct{ n int }

func (c *closeCount) Close() error { c.n++; return nil }

// TestIdleBodyResetsOnEventEnds: the idle timer restarts on an event end, also one split
// between two reads, and not on bytes inside an event.
func TestIdleBodyResetsOnEventEnds(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	pr, pw := io.Pipe()
	cc := &closeCount{}
	b := newIdleBody(pr, cc, clk, 5*time.Second, nil)
	buf := make([]byte, 64)
	send := func(s string) {
		go func() { _, _ = pw.Write([]byte(s)) }()
		if n, err := b.Read(buf); err != nil || string(buf[:n]) != s {
			t.Fatalf("read %q %v", buf[:n], err)
		}
	}
	clk.Advance(3 * time.Second)
	send("data: a\n")
	clk.Advance(time.Second)
	send("\ndata: b") // completes the first event (at 4 s): the timer restarts here
	clk.Advance(4 * time.Second)
	send("c") // inside an event (at 8 s): no restart
	if b.idle.Load() {
		t.Fatal("idle too early")
	}
	clk.Advance(time.Second)
	if !b.idle.Load() {
		t.Fatal("5 s without an event end did not count as idle")
	}
	if _, err := b.Read(buf); err != errStreamIdle {
		t.Fatalf("read after idle: %v", err)
	}
	if !strings.Contains(errStreamIdle.Error(), "stream_idle_timeout") {
		t.Fatal(errStreamIdle)
	}
}

// scriptedReader returns its reads in order, then blocks nothing: an empty read is (0, nil).
type scriptedReader struct{ reads []string }

func (s *scriptedReader) Read(p []byte) (int, error) {
	if len(s.reads) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.reads[0])
	s.reads = s.reads[1:]
	return n, nil
}

// TestIdleBodyEmptyReadIsNoEvent: a read of no bytes is no event end, even right after one —
// it does not restart the idle timer.
func TestIdleBodyEmptyReadIsNoEvent(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b := newIdleBody(&scriptedReader{reads: []string{"data: a\n\n", ""}}, &closeCount{}, clk, 5*time.Second, nil)
	buf := make([]byte, 64)
	if n, err := b.Read(buf); err != nil || n != 9 {
		t.Fatalf("read %d %v", n, err)
	}
	clk.Advance(4 * time.Second)
	if n, err := b.Read(buf); err != nil || n != 0 {
		t.Fatalf("empty read %d %v", n, err)
	}
	clk.Advance(time.Second)
	if !b.idle.Load() {
		t.Fatal("an empty read restarted the idle timer")
	}
}
