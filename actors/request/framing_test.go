package request

import (
	"bytes"
	"testing"
)

func feedAll(chunks [][]byte) ([]byte, []byte) {
	var f eventFramer
	var out []byte
	for _, c := range chunks {
		out = append(out, f.feed(c)...)
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
	f.Fuzz(func(t *testing.T, stream []byte, step uint8) {
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
		one, _ := feedAll([][]byte{stream})
		if !bytes.Equal(one, out) && !(len(one) == len(out)+1 && bytes.HasPrefix(one, out) && one[len(one)-1] == '\n') {
			t.Fatalf("split reads forwarded %q, one read %q", out, one)
		}
		// The forwarded part ends where an event ends: a new event appended to it is read as
		// its own event by a fresh framer.
		if len(out) > 0 {
			var g eventFramer
			whole := g.feed(append(append([]byte(nil), out...), "event: error\ndata: x\n\n"...))
			if !bytes.HasSuffix(whole, []byte("event: error\ndata: x\n\n")) {
				t.Fatalf("the error event does not stand on its own after %q", out)
			}
		}
	})
}
