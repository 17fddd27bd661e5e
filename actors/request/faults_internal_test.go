package request

import (
	"errors"
	"io"
	"net/http"
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

// chunkedReader serves s in reads of at most size bytes, then err (io.EOF when nil).
type chunkedReader struct {
	s    string
	size int
	err  error
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if c.s == "" {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.s)
	c.s = c.s[n:]
	return n, nil
}

// TestReadFirstEvent: the attempt reads up to the end of the first event, however the reads
// split it (an event end split between two reads included), and hands over what it read in
// the recycled array; an event past that array comes whole in a new one; a stream that ends
// or breaks before one whole event is a failure before the first byte, with the body closed.
func TestReadFirstEvent(t *testing.T) {
	resp := func(r io.Reader, cc *closeCount) *http.Response {
		return &http.Response{StatusCode: 200, Body: struct {
			io.Reader
			io.Closer
		}{r, cc}}
	}
	for _, end := range []string{"\n\n", "\r\n\r\n", "\r\r"} {
		stream := "data: {\"a\":1}" + end + "data: {\"b\":2}" + end
		first := len("data: {\"a\":1}") + len(end)
		for size := 1; size <= len(stream); size++ {
			cc := &closeCount{}
			fe := readFirstEvent(3, resp(&chunkedReader{s: stream, size: size}, cc))
			if fe.err != nil || fe.gen != 3 || fe.buf == nil || cc.n != 0 {
				t.Fatalf("%q in reads of %d: %+v, closed %d", end, size, fe, cc.n)
			}
			// Reads stop at the first read that completes the event.
			want := min(len(stream), (first+size-1)/size*size)
			if string(fe.prefix) != stream[:want] || &fe.prefix[0] != &(*fe.buf)[0] {
				t.Fatalf("%q in reads of %d: prefix %q, want %q (in the recycled array)", end, size, fe.prefix, stream[:want])
			}
			bufPool.Put(fe.buf)
		}
	}
	big := "data: " + strings.Repeat("x", 40<<10) + "\n\n"
	fe := readFirstEvent(1, resp(&chunkedReader{s: big, size: 4 << 10}, &closeCount{}))
	if fe.err != nil || fe.buf != nil || string(fe.prefix) != big {
		t.Fatalf("an event past the recycled array: err %v, buf %v, %d bytes", fe.err, fe.buf != nil, len(fe.prefix))
	}
	for _, c := range []struct {
		r    io.Reader
		want error
	}{
		{&chunkedReader{s: "data: half", size: 4}, errNoFirstEvent},
		{&chunkedReader{s: "data: half\n", size: 4, err: io.ErrUnexpectedEOF}, io.ErrUnexpectedEOF},
	} {
		cc := &closeCount{}
		fe := readFirstEvent(1, resp(c.r, cc))
		if !errors.Is(fe.err, c.want) || fe.buf != nil || cc.n != 1 {
			t.Fatalf("err %v (want %v), buf %v, closed %d", fe.err, c.want, fe.buf != nil, cc.n)
		}
	}
}
