package request

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tlgw/tlgw/internal/errs"
)

// BufferBudget bounds the bytes of non-streamed answers the gateway buffers at once, over
// every request (R20 gateway.max_buffered_bytes). Each such answer is read whole before the
// client gets a byte (a body cut mid-way is a clean 502, never a truncated 200), so without a
// shared bound many large answers (echo and logprobs over long prompts) read slowly by their
// clients would each hold up to 64 MiB. An answer takes its buffer's bytes before it reads
// into them — its first buffer before it reads anything — and gives them back once it is
// written or has failed; an answer that finds no room is 503 overloaded. Shared by every
// request actor of a gateway; safe for concurrent use.
type BufferBudget struct {
	limit int64
	used  atomic.Int64
}

// NewBufferBudget returns a budget of limit bytes (limit ≤ 0: nothing fits).
func NewBufferBudget(limit int64) *BufferBudget { return &BufferBudget{limit: limit} }

// Limit is the budget's size in bytes.
func (b *BufferBudget) Limit() int64 { return b.limit }

// Used is the bytes held now by answers being buffered; 0 once none is.
func (b *BufferBudget) Used() int64 { return b.used.Load() }

// take holds n more bytes when they fit.
func (b *BufferBudget) take(n int64) bool {
	for {
		cur := b.used.Load()
		if cur+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// hold starts one answer's share of the budget (nil budget: nil, a hold that always grows).
func (b *BufferBudget) hold() *bufHold {
	if b == nil {
		return nil
	}
	return &bufHold{b: b}
}

// overloaded is the client's error for an answer that found no room.
func overloaded() error {
	return fmt.Errorf("the gateway is buffering as many answers as it may; try again: %w", errs.ErrOverloaded)
}

// errBufferBudget: an answer found no room in the budget (503 overloaded; no verdict on the
// worker, which did its part).
var errBufferBudget = errors.New("gateway.max_buffered_bytes is held by other answers")

// bufHold is one answer's bytes of the budget. It grows with the answer's buffer and is given
// back once, by release; a grow after release takes nothing and fails, so a reader that runs
// on after its request ended cannot take bytes that nobody will give back. A nil hold, or a
// hold of a nil budget, always grows.
type bufHold struct {
	b    *BufferBudget
	mu   sync.Mutex
	n    int64
	done bool
}

// grow takes n more bytes for the answer, when they fit.
func (h *bufHold) grow(n int64) bool {
	if h == nil || h.b == nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || !h.b.take(n) {
		return false
	}
	h.n += n
	return true
}

// release gives the answer's bytes back; later calls do nothing.
func (h *bufHold) release() {
	if h == nil || h.b == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done {
		h.done = true
		h.b.used.Add(-h.n)
		h.n = 0
	}
}
