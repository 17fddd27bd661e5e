// Package gopool runs short functions on long-lived goroutines. It is the gateway's protoactor
// dispatcher (every actor kind's mailbox runs on it) and the goroutine source of the request
// actors' I/O.
//
// protoactor's default dispatcher starts a new goroutine each time an idle mailbox gets a
// message, and a request actor's I/O used to start one per step. A new goroutine begins on a
// small stack, and the deep call chains of a mailbox run or an HTTP round trip grow it by
// copying, again for every goroutine: on the pinned proxy benchmark that copying alone was a
// fifth of the gateway's CPU. A pooled goroutine keeps the stack it grew (the runtime halves an
// idle one at most once per GC cycle), so a message or an I/O step costs a channel hand-off
// to a parked goroutine instead of a goroutine start and a stack regrown.
//
// Schedule never blocks: the function goes to an idle goroutine if one is waiting, else to a
// new one, which stays for more work afterwards while fewer than MaxIdle are idle. The pool
// therefore bounds only what it keeps, never what runs: a function that blocks (an HTTP round
// trip) occupies its goroutine like a plain go statement would.
//
// The idle goroutines are a stack: work goes to the one that parked last, whose stack and data
// are the likeliest to be still in the CPU's caches. (Goroutines waiting on one shared channel
// would be served first-come first-served, so every hand-off would land on the goroutine idle
// the longest, the coldest.)
package gopool

import (
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultMaxIdle is how many idle goroutines New keeps when given none.
const DefaultMaxIdle = 256

// DefaultThroughput is the mailbox batch of protoactor's default dispatcher: how many
// messages a mailbox handles before it yields.
const DefaultThroughput = 300

// Pool is a set of reusable goroutines. It implements protoactor's actor.Dispatcher. The zero
// value is not usable; use New.
type Pool struct {
	mu      sync.Mutex
	idle    []*worker // parked (or about to park) goroutines, the last parked on top
	closed  bool      // under mu
	quit    chan struct{}
	maxIdle int
	nIdle   atomic.Int32 // len(idle), for Idle without the lock
	live    atomic.Int32 // goroutines the pool started that have not exited
	once    sync.Once
}

// worker is one pooled goroutine's mailbox: at most one function, handed over by the Go call
// that took the worker off the idle stack (so the send never blocks).
type worker struct{ work chan func() }

// New returns a pool that keeps at most maxIdle idle goroutines (DefaultMaxIdle when ≤ 0).
func New(maxIdle int) *Pool {
	if maxIdle <= 0 {
		maxIdle = DefaultMaxIdle
	}
	return &Pool{quit: make(chan struct{}), maxIdle: maxIdle}
}

// Go runs fn on a pooled goroutine, or on a new one when none is idle. It never blocks. After
// Close it runs fn on a plain new goroutine.
func (p *Pool) Go(fn func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 && !p.closed {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.nIdle.Store(int32(n - 1))
		p.mu.Unlock()
		w.work <- fn // buffered and empty: this call alone took w off the stack
		return
	}
	p.mu.Unlock()
	p.live.Add(1)
	go p.worker(&worker{work: make(chan func(), 1)}, fn)
}

// Schedule implements actor.Dispatcher.
func (p *Pool) Schedule(fn func()) { p.Go(fn) }

// Throughput implements actor.Dispatcher: protoactor's default batch.
func (p *Pool) Throughput() int { return DefaultThroughput }

// worker runs fn and then, while the pool wants it, the functions handed to it.
func (p *Pool) worker(w *worker, fn func()) {
	defer p.live.Add(-1)
	for {
		fn()
		p.mu.Lock()
		if p.closed || len(p.idle) >= p.maxIdle {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, w)
		p.nIdle.Store(int32(len(p.idle)))
		p.mu.Unlock()
		select {
		case fn = <-w.work:
		case <-p.quit:
			p.mu.Lock()
			i := slices.Index(p.idle, w)
			if i >= 0 {
				p.idle = slices.Delete(p.idle, i, i+1)
				p.nIdle.Store(int32(len(p.idle)))
			}
			p.mu.Unlock()
			if i >= 0 {
				return
			}
			fn = <-w.work // a Go took it off the stack before Close: its function is on the way
		}
	}
}

// Idle is the number of goroutines waiting for work.
func (p *Pool) Idle() int { return int(p.nIdle.Load()) }

// Live is the number of goroutines the pool started that have not exited, idle or running.
func (p *Pool) Live() int { return int(p.live.Load()) }

// Close lets the idle goroutines exit, and the busy ones once their function returns. Go still
// works after Close (on plain goroutines), so a late timer or message is never lost.
func (p *Pool) Close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.quit)
	})
}
