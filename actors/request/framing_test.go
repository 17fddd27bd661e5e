package request

import (
	"bytes"
	"testing"
)

func feedAll(chunks [][]byte) ([]byte, []byte) {
	var f eventFramer
	var out []byte
	for _, c := range chunks {
		b, err := f.feed(c)
		if err != nil {
			panic(err) // no test stream here has an event over maxEventBytes
		}
		out = append(out, b...)
	}
	return out, f.rest()
}

func TestEventFramer(t *testing.T) {
	cases := []struct {
		chunks    []string
		out, rest string
	}{
		{[]string{"data: a\n\ndata: b\n\n"}, "data: a\n\ndata: b\n\n", ""},
		{[]string{"data: a\n", "\ndata: b"}, "data: a\n\n", "data: b"},
		{[]string{"data: {\"te"}, "", "data: {\"te"},
		{[]string{"event: x\r\ndata: y\r\n\r\n", "data: z\r\n"}, "event: x\r\ndata: y\r\n\r\n", "data: z\r\n"},
		{[]string{"data: a\r\r", "data: b"}, "data: a\r\r", "data: b"},
		{[]string{"data: a\r\n\r", "\ndata: b\n\n"}, "data: a\r\n\r\ndata: b\n\n", ""},
		{[]string{"da", "ta: a", "\n", "\n", "data: [DONE]\n\n"}, "data: a\n\ndata: [DONE]\n\n", ""},
	}
	for _, c := range cases {
		var chunks [][]byte
		for _, s := range c.chunks {
			chunks = append(chunks, []byte(s))
		}
		out, rest := feedAll(chunks)
		if string(out) != c.out || string(rest) != c.rest {
			t.Errorf("%q: out %q rest %q, want %q %q", c.chunks, out, rest, c.out, c.rest)
		}
	}
}

// FuzzEventFraming: however the stream is split into reads, the framer forwards a prefix of
// it that ends on an event boundary, holds back exactly the rest, and never reorders bytes;
// the forwarded part, followed by any new event, parses as whole events.
func FuzzEventFraming(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: b\r\n\r\nevent: c\rdata: d\r\rdata: [DONE]\n\n"), uint8(3))
	f.Add([]byte("data: partial"), uint8(1))
	f.Add([]byte("\n\n\r\n\r\r"), uint8(2))
	// Reads of 8 bytes: a read that starts with the "\r" ending a blank line, and one that
	// starts with two blank lines ("\n" line ends only) before a partial event.
	f.Add([]byte("data: x\n\rdata: y"), uint8(7))
	f.Add([]byte("data: x\n\n\nmore"), uint8(7))
	f.Fuzz(func(t *testing.T, stream []byte, step uint8) {
		// The property is about events within the bound (the bound has its own tests): a
		// longer input is cut to the bound, so no event in it can exceed it.
		stream = stream[:min(len(stream), maxEventBytes)]
		size := int(step%17) + 1
		var chunks [][]byte
		for i := 0; i < len(stream); i += size {
			chunks = append(chunks, stream[i:min(i+size, len(stream))])
		}
		out, rest := feedAll(chunks)
		if !bytes.Equal(append(append([]byte(nil), out...), rest...), stream) {
			t.Fatalf("forwarded %q + held %q != stream %q", out, rest, stream)
		}
		// The forwarded part is the same whatever the read sizes (one read gives the reference).
		// Only a "\n" that completes a "\r\n" may wait for the next read; with "\n" line ends
		// only, the two are equal.
		one, _ := feedAll([][]byte{stream})
		tolerated := bytes.ContainsRune(stream, '\r') && len(one) == len(out)+1 && bytes.HasPrefix(one, out) && one[len(one)-1] == '\n'
		if !bytes.Equal(one, out) && !tolerated {
			t.Fatalf("split reads forwarded %q, one read %q", out, one)
		}
		// With "\n" line ends only, one read forwards up to the last blank line (a fresh framer
		// is at a line start, so a leading "\n" is one).
		if !bytes.ContainsRune(stream, '\r') {
			want := -1
			if i := bytes.LastIndex(stream, []byte("\n\n")); i >= 0 {
				want = i + 2
			} else if len(stream) > 0 && stream[0] == '\n' {
				want = 1
			}
			if got := len(one); (want < 0 && got != 0) || (want >= 0 && got != want) {
				t.Fatalf("one read of %q forwarded %q, want %d bytes", stream, one, max(want, 0))
			}
		}
		// The forwarded part ends where an event ends: a new event appended to it is read as
		// its own event by a fresh framer.
		if len(out) > 0 {
			var g eventFramer
			whole, _ := g.feed(append(append([]byte(nil), out...), "event: error\ndata: x\n\n"...))
			if !bytes.HasSuffix(whole, []byte("event: error\ndata: x\n\n")) {
				t.Fatalf("the error event does not stand on its own after %q", out)
			}
		}
	})
}

// TestEventFramerBoundsAnEndlessEvent (R14.4): one SSE line that never ends is held up to
// maxEventBytes, never more (length and capacity), then feed fails; the whole event before it
// was forwarded, and nothing is held after the failure.
func TestEventFramerBoundsAnEndlessEvent(t *testing.T) {
	var f eventFramer
	first := "data: {\"text\":\"The\"}\n\n"
	out, err := f.feed([]byte(first + "data: "))
	if err != nil || string(out) != first {
		t.Fatalf("first event: %q, %v", out, err)
	}
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	fed := len("data: ")
	for {
		out, err = f.feed(chunk)
		fed += len(chunk)
		if len(f.pending) > maxEventBytes || cap(f.pending) > maxEventBytes {
			t.Fatalf("after %d bytes the framer holds %d (capacity %d)", fed, len(f.pending), cap(f.pending))
		}
		if err != nil {
			break
		}
		if len(out) != 0 {
			t.Fatalf("forwarded part of an unfinished event: %d bytes", len(out))
		}
		if fed > 2*maxEventBytes {
			t.Fatal("an endless event was never stopped")
		}
	}
	if err != errEventTooLarge || len(out) != 0 || fed <= maxEventBytes || fed > maxEventBytes+len(chunk) {
		t.Fatalf("stopped after %d bytes with %v, forwarding %d bytes", fed, err, len(out))
	}
	if f.pending != nil || f.rest() != nil {
		t.Fatalf("still holds %d bytes after the failure", cap(f.pending))
	}
	if out, err := f.feed([]byte("\n\ndata: [DONE]\n\n")); err != errEventTooLarge || out != nil {
		t.Fatalf("fed after the failure: %q, %v", out, err)
	}
}

// TestEventFramerEventSizeBound: an event of exactly maxEventBytes (its blank line included)
// passes, in one read or many; one byte more fails, whatever the reads; a read that holds
// several events (more than maxEventBytes in all, each under it) passes whole.
func TestEventFramerEventSizeBound(t *testing.T) {
	event := func(size int) []byte {
		b := append([]byte("data: "), bytes.Repeat([]byte("y"), size-len("data: ")-2)...)
		return append(b, "\n\n"...)
	}
	for _, step := range []int{1 << 10, 32 << 10, 3 * maxEventBytes} {
		split := func(stream []byte) (out []byte, err error) {
			var f eventFramer
			for i := 0; i < len(stream); i += step {
				b, ferr := f.feed(stream[i:min(i+step, len(stream))])
				out = append(out, b...)
				if ferr != nil {
					return out, ferr
				}
				if len(f.pending) > maxEventBytes || cap(f.pending) > maxEventBytes {
					t.Fatalf("step %d: holds %d bytes (capacity %d)", step, len(f.pending), cap(f.pending))
				}
			}
			return out, nil
		}
		ok := append(event(100), event(maxEventBytes)...)
		if out, err := split(ok); err != nil || !bytes.Equal(out, ok) {
			t.Fatalf("step %d: an event of exactly %d bytes: %d bytes forwarded, %v", step, maxEventBytes, len(out), err)
		}
		over := append(event(100), event(maxEventBytes+1)...)
		if out, err := split(over); err != errEventTooLarge || !bytes.Equal(out, event(100)) {
			t.Fatalf("step %d: an event of %d bytes: %d bytes forwarded, %v", step, maxEventBytes+1, len(out), err)
		}
		// The event held back is finished by a read that also holds all of the oversized one.
		var f eventFramer
		long := append(event(600<<10), event(maxEventBytes+1)...)
		if out, err := f.feed(long[:512<<10]); err != nil || len(out) != 0 {
			t.Fatalf("the first half of an event: %d bytes forwarded, %v", len(out), err)
		}
		if out, err := f.feed(long[512<<10:]); err != errEventTooLarge || !bytes.Equal(out, event(600<<10)) || f.pending != nil {
			t.Fatalf("finished in one read with the oversized one: %d bytes forwarded, %v", len(out), err)
		}
		var many []byte
		for range 3 {
			many = append(many, event(maxEventBytes/2)...)
		}
		if out, err := split(many); err != nil || !bytes.Equal(out, many) {
			t.Fatalf("step %d: three half-size events: %d bytes forwarded, %v", step, len(out), err)
		}
	}
}
