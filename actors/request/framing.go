package request

// eventFramer cuts an SSE byte stream at event boundaries (a blank line; lines end in "\r\n",
// "\n" or "\r"), so the relay forwards whole events only. If an engine breaks off mid-event,
// the partial event is dropped and the error event that follows starts cleanly on its own:
// the client never sees one event spliced into another. A well-formed engine writes whole
// events, so nothing is held back and nothing is copied.
type eventFramer struct {
	pending   []byte // bytes after the last boundary
	lineStart bool   // the previous byte ended a line (or nothing came yet)
	lastCR    bool   // the previous byte was '\r' (a '\n' now completes "\r\n")
	started   bool
}

// feed adds chunk and returns the bytes up to and including the last complete event. The
// result stays valid until the next call.
func (f *eventFramer) feed(chunk []byte) []byte {
	if !f.started {
		f.started, f.lineStart = true, true
	}
	if n := len(chunk); len(f.pending) == 0 && n >= 2 && chunk[n-1] == '\n' && chunk[n-2] == '\n' {
		// The common case: the engine flushed whole events. A chunk ending in a blank line
		// ends on a boundary whatever came before it, so there is nothing to scan.
		f.lineStart, f.lastCR = true, false
		return chunk
	}
	end := -1 // boundary within chunk, exclusive
	for i, c := range chunk {
		switch {
		case c == '\n' && f.lastCR:
			f.lastCR = false // the "\n" of "\r\n": the line already ended
			if end == i {
				end = i + 1 // a blank line that ended in "\r\n": keep the "\n" with it
			}
		case c == '\n' || c == '\r':
			if f.lineStart {
				end = i + 1 // a blank line: an event ends here
			}
			f.lineStart, f.lastCR = true, c == '\r'
		default:
			f.lineStart, f.lastCR = false, false
		}
	}
	if end < 0 {
		f.pending = append(f.pending, chunk...)
		return nil
	}
	if len(f.pending) == 0 {
		out := chunk[:end]
		f.pending = append(f.pending[:0], chunk[end:]...)
		return out
	}
	out := append(f.pending, chunk[:end]...)
	f.pending = append(make([]byte, 0, len(chunk)-end+64), chunk[end:]...)
	return out
}

// rest returns what is buffered after the last complete event.
func (f *eventFramer) rest() []byte { return f.pending }
