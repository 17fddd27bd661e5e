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
package gopool

import (
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
	work    chan func() // unbuffered: a send succeeds only when a goroutine is waiting
	quit    chan struct{}
	maxIdle int32
	idle    atomic.Int32 // goroutines waiting on work (or about to)
	live    atomic.Int32 // goroutines the pool started that have not exited
	closed  atomic.Bool
	once    sync.Once
}

// New returns a pool that keeps at most maxIdle idle goroutines (DefaultMaxIdle when ≤ 0).
func New(maxIdle int) *Pool {
	if maxIdle <= 0 {
		maxIdle = DefaultMaxIdle
	}
	return &Pool{work: make(chan func()), quit: make(chan struct{}), maxIdle: int32(maxIdle)}
}

// Go runs fn on a pooled goroutine, or on a new one when none is idle. It never blocks. After
// Close it runs fn on a plain new goroutine.
func (p *Pool) Go(fn func()) {
	if !p.closed.Load() {
		select {
		case p.work <- fn:
			return
		default:
		}
	}
	p.live.Add(1)
	go p.worker(fn)
}

// Schedule implements actor.Dispatcher.
func (p *Pool) Schedule(fn func()) { p.Go(fn) }

// Throughput implements actor.Dispatcher: protoactor's default batch.
func (p *Pool) Throughput() int { return DefaultThroughput }

// worker runs fn and then, while the pool wants it, the functions handed to it.
func (p *Pool) worker(fn func()) {
	defer p.live.Add(-1)
	for {
		fn()
		if p.idle.Add(1) > p.maxIdle || p.closed.Load() {
			p.idle.Add(-1)
			return
		}
		select {
		case fn = <-p.work:
			p.idle.Add(-1)
		case <-p.quit:
			p.idle.Add(-1)
			return
		}
	}
}

// Idle is the number of goroutines waiting for work.
func (p *Pool) Idle() int { return int(p.idle.Load()) }

// Live is the number of goroutines the pool started that have not exited, idle or running.
func (p *Pool) Live() int { return int(p.live.Load()) }

// Close lets the idle goroutines exit, and the busy ones once their function returns. Go still
// works after Close (on plain goroutines), so a late timer or message is never lost.
func (p *Pool) Close() {
	p.once.Do(func() {
		p.closed.Store(true)
		close(p.quit)
	})
}
