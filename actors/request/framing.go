package request

import (
	"bytes"
	"fmt"
	"sync"
)

// maxEventBytes bounds one SSE event the relay holds back (R14.4): an event over 1 MiB ends the
// answer with the error event, so an engine that never ends its event cannot grow the relay's
// memory.
const maxEventBytes = 1 << 20

// errEventTooLarge: the engine sent an event over maxEventBytes.
var errEventTooLarge = fmt.Errorf("an event larger than %d bytes", maxEventBytes)

// eventFramer cuts an SSE byte stream at event boundaries (a blank line; lines end in "\r\n",
// "\n" or "\r"), so the relay forwards whole events only. If an engine breaks off mid-event,
// the partial event is dropped and the error event that follows starts cleanly on its own:
// the client never sees one event spliced into another. A well-formed engine writes whole
// events, so nothing is held back and nothing is copied. What it holds back is one event's
// start, never more than maxEventBytes (length and capacity).
type eventFramer struct {
	pending   []byte // bytes after the last boundary
	spare     []byte // the array of the last result, which the next pending reuses
	lineStart bool   // the previous byte ended a line (or nothing came yet)
	lastCR    bool   // the previous byte was '\r' (a '\n' now completes "\r\n")
	started   bool
	failed    bool // an event went over maxEventBytes; the stream is over
}

// feed adds chunk and returns the bytes up to and including the last complete event. The
// result stays valid until the next call. Once the event being read goes over maxEventBytes,
// feed returns the whole events before it and errEventTooLarge, drops what it held, and
// returns that error from then on.
func (f *eventFramer) feed(chunk []byte) ([]byte, error) {
	if f.failed {
		return nil, errEventTooLarge
	}
	if !f.started {
		f.started, f.lineStart = true, true
	}
	if n := len(chunk); len(f.pending) == 0 && n >= 2 && n <= maxEventBytes && chunk[n-1] == '\n' && chunk[n-2] == '\n' {
		// The common case: the engine flushed whole events. A chunk ending in a blank line
		// ends on a boundary whatever came before it, so there is nothing to scan (and no
		// event in it is longer than the chunk).
		f.lineStart, f.lastCR = true, false
		return chunk, nil
	}
	end := -1 // boundary within chunk, exclusive
	if len(chunk) > 0 && len(f.pending)+len(chunk) <= maxEventBytes && !f.lastCR && bytes.IndexByte(chunk, '\r') < 0 {
		// Lines end in "\n" only: the last boundary is the last blank line, found by a
		// vectorized search instead of the byte loop below (the common case of an engine whose
		// reads end mid-event). No event here can exceed the bound: all of them together fit.
		if i := bytes.LastIndex(chunk, []byte("\n\n")); i >= 0 {
			end = i + 2
		} else if f.lineStart && chunk[0] == '\n' {
			end = 1 // the blank line's second "\n" starts this chunk
		}
		f.lineStart = chunk[len(chunk)-1] == '\n'
		return f.cut(chunk, end), nil
	}
	size := len(f.pending) // bytes of the event being read, up to and including chunk[i]
	for i, c := range chunk {
		// The event's bytes include its blank line (but not the "\n" of a closing "\r\n",
		// which comes after the boundary).
		if size++; size > maxEventBytes {
			return f.fail(chunk, end), errEventTooLarge
		}
		switch {
		case c == '\n' && f.lastCR:
			f.lastCR = false // the "\n" of "\r\n": the line already ended
			if end == i {
				end, size = i+1, 0 // a blank line that ended in "\r\n": keep the "\n" with it
			}
		case c == '\n' || c == '\r':
			if f.lineStart {
				end, size = i+1, 0 // a blank line: an event ends here
			}
			f.lineStart, f.lastCR = true, c == '\r'
		default:
			f.lineStart, f.lastCR = false, false
		}
	}
	return f.cut(chunk, end), nil
}

// cut returns the held bytes and chunk up to end (the last boundary; -1: none) and holds what
// follows it.
func (f *eventFramer) cut(chunk []byte, end int) []byte {
	if end < 0 {
		f.pending = appendCapped(f.pending, chunk, maxEventBytes)
		return nil
	}
	if len(f.pending) == 0 {
		out := chunk[:end]
		f.pending = appendCapped(f.pending[:0], chunk[end:], maxEventBytes)
		return out
	}
	// The held event is finished: the result is built in pending's array and the new pending in
	// the other one (the previous result's, which is no longer valid), so a stream whose reads
	// end mid-event alternates two arrays instead of allocating one per read.
	out := appendCapped(f.pending, chunk[:end], len(f.pending)+end)
	f.pending = appendCapped(f.spare[:0], chunk[end:], min(len(chunk)-end+64, maxEventBytes))
	f.spare = out[:0]
	return out
}

// fail ends the stream after an oversized event: it returns the whole events before it (up
// to end within chunk) and lets go of what it held.
func (f *eventFramer) fail(chunk []byte, end int) []byte {
	f.failed = true
	var out []byte
	if end > 0 {
		out = chunk[:end]
		if len(f.pending) > 0 {
			out = appendCapped(f.pending, out, len(f.pending)+end)
		}
	}
	f.pending, f.spare = nil, nil
	return out
}

// framerBufs recycles the framers' arrays between streams; arrays past framerBufMax (a stream
// with big events) are left to the collector.
var framerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

const framerBufMax = 64 << 10

// newEventFramer is a framer with recycled arrays; release hands them back.
func newEventFramer() eventFramer {
	return eventFramer{pending: *framerBufs.Get().(*[]byte), spare: *framerBufs.Get().(*[]byte)}
}

// release returns the framer's arrays for reuse; the framer and its results are not used again.
func (f *eventFramer) release() {
	for _, b := range [2][]byte{f.pending, f.spare} {
		if b != nil && cap(b) <= framerBufMax {
			b = b[:0]
			framerBufs.Put(&b)
		}
	}
	f.pending, f.spare = nil, nil
}

// rest returns what is buffered after the last complete event.
func (f *eventFramer) rest() []byte { return f.pending }

// appendCapped appends b to dst like append, but a new array is at most limit bytes long (or
// exactly len(dst)+len(b), if that is more) and at most twice the old capacity, so an event
// that arrives in small reads is copied O(log n) times and never held in an array past the
// bound.
func appendCapped(dst, b []byte, limit int) []byte {
	need := len(dst) + len(b)
	if need <= cap(dst) {
		return append(dst, b...)
	}
	size := min(max(2*cap(dst), need, 512), max(limit, need))
	return append(append(make([]byte, 0, size), dst...), b...)
}
