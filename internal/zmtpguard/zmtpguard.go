// Package zmtpguard bounds what a ZMQ peer can make tlgw read (R22). The ZMQ library the
// gateway uses (github.com/go-zeromq/zmq4 v0.17.0) allocates a frame's body at the size the
// peer declares (up to 2^63 bytes) and gathers any number of frames into one message, and its
// handshake reads block without a deadline; a KV-event publisher, or anything that reaches the
// gateway's listen address, is hostile until checked. A Conn sits under the library, reads the
// ZMTP 3 framing as the bytes pass (the 64-byte greeting, then frames: a flags byte, a 1- or
// 8-byte size, the body) and fails the read — which closes the connection — on a frame larger
// than its bound, a message of more frames than its bound, reserved flag bits, or a handshake
// not finished within its deadline. It copies nothing: it only counts.
package zmtpguard

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Limits bound one connection's traffic.
type Limits struct {
	MaxFrame   uint64        // a data frame's body, bytes
	MaxCommand uint64        // a command frame's body (READY, SUBSCRIBE, PING…), bytes
	MaxFrames  int           // data frames of one message
	Handshake  time.Duration // from the connection's start to the end of the peer's first command (READY); 0 = none
}

// ErrLimit is wrapped by every refusal.
var ErrLimit = errors.New("zmtpguard: peer exceeded a bound")

const greetingLen = 64

const (
	flagMore    = 1
	flagLong    = 2
	flagCommand = 4
)

type phase uint8

const (
	inGreeting phase = iota
	inFlags
	inSize
	inBody
)

// Reader is the framing state machine, independent of any connection: Feed it the bytes a
// peer sent, in any pieces.
type Reader struct {
	l        Limits
	ph       phase
	left     uint64 // bytes left in the greeting, the size field or the body
	size     uint64 // the size being read (long form)
	flags    byte
	frames   int  // data frames so far in the current message
	readyEnd bool // the first command frame has been read whole
}

// NewReader returns a Reader at the start of a connection.
func NewReader(l Limits) *Reader { return &Reader{l: l, ph: inGreeting, left: greetingLen} }

// HandshakeDone reports whether the peer's first command (READY, for the NULL mechanism) has
// been read whole.
func (r *Reader) HandshakeDone() bool { return r.readyEnd }

// Feed accounts for p. It returns an error wrapping ErrLimit at the first byte that breaks a
// bound; the Reader is then unusable.
func (r *Reader) Feed(p []byte) error {
	for len(p) > 0 {
		switch r.ph {
		case inGreeting:
			n := min(uint64(len(p)), r.left)
			p, r.left = p[n:], r.left-n
			if r.left == 0 {
				r.ph = inFlags
			}
		case inFlags:
			f := p[0]
			p = p[1:]
			if f&^(flagMore|flagLong|flagCommand) != 0 {
				return fmt.Errorf("%w: reserved flag bits 0x%02x", ErrLimit, f)
			}
			if f&flagCommand != 0 && f&flagMore != 0 {
				return fmt.Errorf("%w: a command frame with more to follow", ErrLimit)
			}
			r.flags, r.size, r.ph = f, 0, inSize
			r.left = 1
			if f&flagLong != 0 {
				r.left = 8
			}
		case inSize:
			r.size = r.size<<8 | uint64(p[0])
			p = p[1:]
			r.left--
			if r.left > 0 {
				continue
			}
			if err := r.frameStart(); err != nil {
				return err
			}
		case inBody:
			n := min(uint64(len(p)), r.left)
			p, r.left = p[n:], r.left-n
			if r.left == 0 {
				r.frameEnd()
			}
		}
	}
	return nil
}

func (r *Reader) frameStart() error {
	if r.flags&flagCommand != 0 {
		if r.size > r.l.MaxCommand {
			return fmt.Errorf("%w: a command frame of %d bytes, more than %d", ErrLimit, r.size, r.l.MaxCommand)
		}
	} else {
		if r.size > r.l.MaxFrame {
			return fmt.Errorf("%w: a frame of %d bytes, more than %d", ErrLimit, r.size, r.l.MaxFrame)
		}
		r.frames++
		if r.frames > r.l.MaxFrames {
			return fmt.Errorf("%w: a message of more than %d frames", ErrLimit, r.l.MaxFrames)
		}
	}
	r.left, r.ph = r.size, inBody
	if r.left == 0 {
		r.frameEnd()
	}
	return nil
}

func (r *Reader) frameEnd() {
	r.ph = inFlags
	if r.flags&flagCommand != 0 {
		r.readyEnd = true
		return
	}
	if r.flags&flagMore == 0 {
		r.frames = 0
	}
}

// Conn is a net.Conn whose reads pass through a Reader.
type Conn struct {
	net.Conn
	r          *Reader
	deadlineOn bool
	err        error
}

// Wrap returns c guarded by l; with l.Handshake > 0 it sets a read deadline that is lifted
// once the peer's first command has been read.
func Wrap(c net.Conn, l Limits, now time.Time) *Conn {
	g := &Conn{Conn: c, r: NewReader(l)}
	if l.Handshake > 0 {
		g.deadlineOn = c.SetReadDeadline(now.Add(l.Handshake)) == nil
	}
	return g
}

// Read implements net.Conn: a read that breaks a bound fails, and every later one.
func (g *Conn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if ferr := g.r.Feed(p[:n]); ferr != nil {
		g.err = ferr
		_ = g.Conn.Close()
		return 0, ferr
	}
	if g.deadlineOn && g.r.HandshakeDone() {
		g.deadlineOn = false
		_ = g.Conn.SetReadDeadline(time.Time{})
	}
	return n, err
}
