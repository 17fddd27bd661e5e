package engine

import (
	"context"
	"errors"
	"sync"

	"github.com/tlgw/tlgw/sim/kv"
)

// scheduler is the engine's running set and the FIFO queue behind it. A request runs when
// fewer than maxRunning run and its prompt's KV blocks can be allocated; otherwise it waits
// in order. Every admitted sequence is released exactly once.
type scheduler struct {
	mu         sync.Mutex
	pool       *kv.Pool
	maxRunning int
	running    int
	queue      []*waiter
}

type waiter struct {
	prompt []uint32
	held   *kv.Seq       // adopt: the sequence that already holds its KV (nothing to allocate)
	ready  chan struct{} // closed when admitted (or failed)
	seq    *kv.Seq
	cached int
	err    error
}

func newScheduler(pool *kv.Pool, maxRunning int) *scheduler {
	return &scheduler{pool: pool, maxRunning: maxRunning}
}

// errTooLong: the prompt needs more KV blocks than the whole pool has.
var errTooLong = errors.New("the prompt needs more KV blocks than the engine has")

type schedStatus struct {
	queued, running int
	kv              kv.Stats
}

func (s *scheduler) status() schedStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return schedStatus{queued: len(s.queue), running: s.running, kv: s.pool.Stats()}
}

// admit waits until the prompt runs; it returns the sequence holding its KV and how many
// prompt tokens were found in the prefix cache. A caller that leaves while queued gives up its
// place at once.
func (s *scheduler) admit(ctx context.Context, prompt []uint32, blockSize int) (*kv.Seq, int, error) {
	s.mu.Lock()
	if need := (len(prompt) + blockSize) / blockSize; need > s.pool.Stats().TotalBlocks {
		s.mu.Unlock()
		return nil, 0, errTooLong
	}
	if s.running < s.maxRunning && len(s.queue) == 0 {
		seq, cached, err := s.pool.Allocate(prompt)
		if err == nil {
			s.running++
			s.mu.Unlock()
			return seq, cached, nil
		}
		if !errors.Is(err, kv.ErrNoSpace) {
			s.mu.Unlock()
			return nil, 0, err
		}
	}
	w := &waiter{prompt: prompt, ready: make(chan struct{})}
	s.queue = append(s.queue, w)
	s.mu.Unlock()
	return s.await(ctx, w)
}

// adopt makes seq, whose KV the pool already holds (an imported KV handle), a running sequence:
// at once when a slot is free and nobody queues, else in FIFO order behind the waiting
// requests. The scheduler owns seq from the call on: on success the caller releases it like an
// admitted sequence; on failure (the caller left while queued) it is already freed.
func (s *scheduler) adopt(ctx context.Context, seq *kv.Seq) error {
	s.mu.Lock()
	if s.running < s.maxRunning && len(s.queue) == 0 {
		s.running++
		s.mu.Unlock()
		return nil
	}
	w := &waiter{held: seq, ready: make(chan struct{})}
	s.queue = append(s.queue, w)
	s.mu.Unlock()
	_, _, err := s.await(ctx, w)
	return err
}

// await waits for a queued waiter's turn, or takes it out of the queue when ctx ends first.
func (s *scheduler) await(ctx context.Context, w *waiter) (*kv.Seq, int, error) {
	select {
	case <-w.ready:
		return w.seq, w.cached, w.err
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		select {
		case <-w.ready: // admitted meanwhile: hand the slot back
			if w.err == nil {
				s.releaseLocked(w.seq)
			}
		default:
			for i, q := range s.queue {
				if q == w {
					s.queue = append(s.queue[:i], s.queue[i+1:]...)
					break
				}
			}
			if w.held != nil {
				s.pool.Free(w.held)
			}
			s.dispatchLocked() // a head that left may have blocked the rest
		}
		return nil, 0, ctx.Err()
	}
}

// importSeq creates a sequence holding pushed KV (not running: a held KV handle).
func (s *scheduler) importSeq(tokens []uint32) (*kv.Seq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pool.Import(tokens)
}

// freeHeld frees a sequence that is not running (a KV handle released or expired) and lets the
// queue move.
func (s *scheduler) freeHeld(seq *kv.Seq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pool.Free(seq)
	s.dispatchLocked()
}

// release frees a running sequence's KV and lets the queue move.
func (s *scheduler) release(seq *kv.Seq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(seq)
}

func (s *scheduler) releaseLocked(seq *kv.Seq) {
	s.pool.Free(seq)
	s.running--
	s.dispatchLocked()
}

func (s *scheduler) dispatchLocked() {
	for len(s.queue) > 0 && s.running < s.maxRunning {
		w := s.queue[0]
		if w.held != nil {
			s.queue = s.queue[1:]
			s.running++
			w.seq = w.held
			close(w.ready)
			continue
		}
		seq, cached, err := s.pool.Allocate(w.prompt)
		if errors.Is(err, kv.ErrNoSpace) {
			return // wait for KV to free up
		}
		s.queue = s.queue[1:]
		if err == nil {
			s.running++
		}
		w.seq, w.cached, w.err = seq, cached, err
		close(w.ready)
	}
}

// appendToken grows a running sequence by one generated token.
func (s *scheduler) appendToken(seq *kv.Seq, tok uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return seq.Append(tok)
}
