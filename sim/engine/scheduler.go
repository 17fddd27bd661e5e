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
		}
		return nil, 0, ctx.Err()
	}
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
