package kvpub

import "sync"

// retained is one encoded batch kept for replay.
type retained struct {
	seq     uint64
	payload []byte
}

// ring keeps the latest batches for replay: at most max of them and maxBytes of payload (the
// oldest go first; the newest is always kept).
type ring struct {
	mu       sync.Mutex
	buf      []retained // circular, len max
	start, n int
	bytes    int
	maxBytes int
}

func newRing(max, maxBytes int) ring {
	return ring{buf: make([]retained, max), maxBytes: maxBytes}
}

func (r *ring) add(b retained) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == len(r.buf) {
		r.dropOldest()
	}
	r.buf[(r.start+r.n)%len(r.buf)] = b
	r.n++
	r.bytes += len(b.payload)
	for r.bytes > r.maxBytes && r.n > 1 {
		r.dropOldest()
	}
}

func (r *ring) dropOldest() {
	r.bytes -= len(r.buf[r.start].payload)
	r.buf[r.start] = retained{}
	r.start = (r.start + 1) % len(r.buf)
	r.n--
}

// from returns the retained batches with seq ≥ seq, oldest first (a copy of at most max
// entries; the payloads are shared and never written).
func (r *ring) from(seq uint64) []retained {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []retained
	for i := 0; i < r.n; i++ {
		if b := r.buf[(r.start+i)%len(r.buf)]; b.seq >= seq {
			out = append(out, b)
		}
	}
	return out
}
