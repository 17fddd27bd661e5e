package zmtpguard

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"
)

var lim = Limits{MaxFrame: 100, MaxCommand: 20, MaxFrames: 3}

func greeting() []byte { b := make([]byte, greetingLen); b[0], b[9] = 0xff, 0x7f; return b }

func frame(flags byte, body []byte) []byte {
	if len(body) > 255 || flags&flagLong != 0 {
		h := make([]byte, 9)
		h[0] = flags | flagLong
		binary.BigEndian.PutUint64(h[1:], uint64(len(body)))
		return append(h, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestReaderAcceptsWithinBounds(t *testing.T) {
	s := cat(greeting(), frame(flagCommand, make([]byte, 20)), // READY at the command bound
		frame(flagMore, []byte("kv@h:1@m")), frame(flagMore, make([]byte, 8)), frame(0, make([]byte, 100)), // 3 frames, one at the bound
		frame(flagLong, make([]byte, 5)), // a long-form size, a 1-frame message
		frame(0, nil))                    // an empty frame
	r := NewReader(lim)
	if r.HandshakeDone() {
		t.Fatal("handshake done before any byte")
	}
	if err := r.Feed(s); err != nil {
		t.Fatal(err)
	}
	if !r.HandshakeDone() || r.ph != inFlags || r.frames != 0 {
		t.Fatalf("state after whole messages: %+v", r)
	}
}

func TestReaderRefuses(t *testing.T) {
	for name, s := range map[string][]byte{
		"frame over":     cat(greeting(), frame(0, make([]byte, 101))),
		"command over":   cat(greeting(), frame(flagCommand, make([]byte, 21))),
		"frames over":    cat(greeting(), frame(flagMore, nil), frame(flagMore, nil), frame(flagMore, nil), frame(0, nil)),
		"reserved bit":   cat(greeting(), []byte{0x08, 0}),
		"command more":   cat(greeting(), []byte{flagCommand | flagMore, 0}),
		"declared huge":  cat(greeting(), []byte{flagLong, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
		"declared 2^64":  cat(greeting(), []byte{flagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
		"after commands": cat(greeting(), frame(flagCommand, nil), frame(flagMore, nil), frame(flagCommand, nil), frame(flagMore, nil), frame(flagMore, nil), frame(0, nil)),
	} {
		if err := NewReader(lim).Feed(s); !errors.Is(err, ErrLimit) {
			t.Errorf("%s: %v, want ErrLimit", name, err)
		}
	}
}

// A message's frame count restarts after its last frame; a command between frames of one
// message does not restart it.
func TestFrameCountPerMessage(t *testing.T) {
	ok := cat(greeting(), frame(flagMore, nil), frame(flagMore, nil), frame(0, nil), frame(flagMore, nil), frame(flagMore, nil), frame(0, nil))
	if err := NewReader(lim).Feed(ok); err != nil {
		t.Fatal(err)
	}
}

// FuzzReader: feeding a stream in two pieces, split anywhere, ends as feeding it whole.
func FuzzReader(f *testing.F) {
	f.Add(cat(greeting(), frame(flagCommand, []byte("READY")), frame(flagMore, []byte("t")), frame(0, []byte("p"))), 70)
	f.Add(cat(greeting(), frame(0, make([]byte, 101))), 65)
	f.Fuzz(func(t *testing.T, s []byte, at int) {
		whole := NewReader(lim)
		werr := whole.Feed(s)
		if at < 0 || at > len(s) {
			at = len(s) / 2
		}
		split := NewReader(lim)
		serr := split.Feed(s[:at])
		if serr == nil {
			serr = split.Feed(s[at:])
		}
		if (werr == nil) != (serr == nil) {
			t.Fatalf("whole %v, split at %d %v", werr, at, serr)
		}
		if werr == nil && (*whole != *split) {
			t.Fatalf("states differ: %+v vs %+v", *whole, *split)
		}
	})
}

// A peer that connects and sends nothing is cut at the handshake deadline; the deadline is
// lifted once the peer's READY has been read.
func TestConnHandshakeDeadline(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	g := Wrap(a, Limits{MaxFrame: 10, MaxCommand: 10, MaxFrames: 3, Handshake: 20 * time.Millisecond}, time.Now())
	defer g.Close()
	buf := make([]byte, 8)
	if _, err := g.Read(buf); err == nil {
		t.Fatal("a silent peer's read succeeded")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("err %v, want a timeout", err)
	}

	c, d := net.Pipe()
	defer d.Close()
	g2 := Wrap(c, Limits{MaxFrame: 10, MaxCommand: 10, MaxFrames: 3, Handshake: time.Hour}, time.Now())
	defer g2.Close()
	hello := cat(greeting(), frame(flagCommand, []byte("READY")))
	go func() { _, _ = d.Write(hello) }()
	got := 0
	for got < len(hello) {
		n, err := g2.Read(make([]byte, 16))
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if g2.deadlineOn || !g2.r.HandshakeDone() {
		t.Fatal("the deadline was not lifted after READY")
	}
	// A frame over the bound fails the read and every later one, and closes the connection.
	go func() { _, _ = d.Write(frame(0, make([]byte, 11))) }()
	var err error
	for range 10 {
		if _, err = g2.Read(make([]byte, 16)); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("err %v, want ErrLimit", err)
	}
	if _, err := g2.Read(make([]byte, 1)); !errors.Is(err, ErrLimit) {
		t.Fatalf("a later read: %v", err)
	}
}

// deadlines records a connection's read deadlines.
type deadlines struct {
	net.Conn
	set []time.Time
}

func (d *deadlines) SetReadDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return d.Conn.SetReadDeadline(t)
}

// TestConnDeadlineCalls: no handshake bound sets no deadline; a bound sets now+bound, and the
// first command lifts it (a zero deadline), once.
func TestConnDeadlineCalls(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	none := &deadlines{Conn: a}
	_ = Wrap(none, Limits{MaxFrame: 10, MaxCommand: 10, MaxFrames: 3}, time.Now())
	if len(none.set) != 0 {
		t.Fatalf("no handshake bound set deadlines %v", none.set)
	}
	now := time.Now()
	rec := &deadlines{Conn: a}
	g := Wrap(rec, Limits{MaxFrame: 10, MaxCommand: 10, MaxFrames: 3, Handshake: time.Hour}, now)
	defer g.Close()
	hello := cat(greeting(), frame(flagCommand, []byte("READY")), frame(0, []byte("x")))
	go func() { _, _ = b.Write(hello) }()
	for got := 0; got < len(hello); {
		n, err := g.Read(make([]byte, 16))
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if len(rec.set) != 2 || !rec.set[0].Equal(now.Add(time.Hour)) || !rec.set[1].IsZero() {
		t.Fatalf("deadlines %v", rec.set)
	}
}
