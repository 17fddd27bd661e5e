package actormetrics

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// probe is one actor's mailbox: protoactor's unbounded mailbox semantics (system messages
// first, SuspendMailbox/ResumeMailbox, the dispatcher's throughput with a yield, a panic
// escalated to the supervisor, batches unpacked), with the metrics built in: it keeps the
// actor in its kind's live set and times each message it hands to the actor's context.
//
// It replaces protoactor's default mailbox on the request path, where that one costs: a
// closure allocated each time the mailbox is scheduled, a node allocated per system message,
// three allocations for its queues at every spawn, and a user ring that never shrinks after a
// burst. Here the run function is bound once, both queues start in the struct, and a queue that
// grew past smallQueue goes back to it once drained.
//
// It is reached from posting goroutines (Post*, under mu), its dispatcher's goroutine (process)
// and the spawner's (Start); the kind's mutex orders the live-set changes.
type probe struct {
	kind *kind

	mu        sync.Mutex
	sys, user fifo
	sysN      atomic.Int32
	userN     atomic.Int32
	status    atomic.Int32 // mailboxIdle or mailboxRunning
	suspended atomic.Bool

	inv     actor.MessageInvoker // the actor's context
	disp    actor.Dispatcher
	process func() // p.run bound once: scheduling allocates nothing

	// The kind's live set (actormetrics.go).
	prev, next *probe
	state      uint8
}

const (
	mailboxIdle int32 = iota
	mailboxRunning
)

var _ actor.Mailbox = (*probe)(nil)

func newProbe(k *kind) *probe {
	p := &probe{kind: k}
	p.process = p.run
	return p
}

// PostUserMessage implements actor.Mailbox.
func (p *probe) PostUserMessage(msg any) {
	// A batch is delivered as its messages and then as itself, as protoactor's mailbox does.
	if batch, ok := msg.(actor.MessageBatch); ok {
		for _, m := range batch.GetMessages() {
			p.PostUserMessage(m)
		}
	}
	if env, ok := msg.(*actor.MessageEnvelope); ok {
		if batch, ok := env.Message.(actor.MessageBatch); ok {
			for _, m := range batch.GetMessages() {
				p.PostUserMessage(m)
			}
		}
	}
	p.mu.Lock()
	p.user.push(msg)
	p.mu.Unlock()
	p.userN.Add(1)
	p.schedule()
}

// PostSystemMessage implements actor.Mailbox.
//
// A Watch or Unwatch does not wake an idle actor; it waits for the actor's next run. It only
// matters when the actor ends, which it cannot do without running its mailbox, and every run
// handles the waiting system messages before anything else: the watcher still gets its
// Terminated. A request actor waiting on its engine is watched by its worker and its router;
// woken for each, it cost two runs of its mailbox (two goroutine hand-offs) that did nothing.
func (p *probe) PostSystemMessage(msg any) {
	p.mu.Lock()
	p.sys.push(msg)
	p.mu.Unlock()
	p.sysN.Add(1)
	switch msg.(type) {
	case *actor.Watch, *actor.Unwatch:
		return
	}
	p.schedule()
}

// RegisterHandlers implements actor.Mailbox.
func (p *probe) RegisterHandlers(inv actor.MessageInvoker, d actor.Dispatcher) {
	p.inv, p.disp = inv, d
}

// Start implements actor.Mailbox: the actor joins its kind's live set.
func (p *probe) Start() { p.started() }

// UserMessageCount implements actor.Mailbox.
func (p *probe) UserMessageCount() int { return int(p.userN.Load()) }

func (p *probe) schedule() {
	if p.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		p.disp.Schedule(p.process)
	}
}

// run handles messages until the mailbox is empty (or suspended with no system message), then
// goes idle, running again if a message came in meanwhile.
func (p *probe) run() {
	for {
		p.drain()
		p.status.Store(mailboxIdle)
		// A count can read -1 for a moment: a poster pushes, the drain pops and counts down,
		// and only then the poster counts up (and schedules, finding the mailbox idle). So
		// "nothing left" is ≤ 0, never a spin until the poster runs.
		if p.sysN.Load() <= 0 && (p.suspended.Load() || p.userN.Load() <= 0) {
			return
		}
		if !p.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
			return // another goroutine scheduled it and runs it
		}
	}
}

func (p *probe) pop(q *fifo) (any, bool) {
	p.mu.Lock()
	m, ok := q.pop()
	p.mu.Unlock()
	return m, ok
}

// drain is one run of the mailbox: system messages first, user messages while not suspended,
// a yield every throughput messages. A panicking handler is escalated to the supervisor.
func (p *probe) drain() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			p.inv.EscalateFailure(r, msg)
		}
	}()
	for i, t := 0, p.disp.Throughput(); ; i++ {
		if i > t {
			i = 0
			runtime.Gosched()
		}
		if m, ok := p.pop(&p.sys); ok {
			msg = m
			p.sysN.Add(-1)
			switch msg.(type) {
			case *actor.SuspendMailbox:
				p.suspended.Store(true)
			case *actor.ResumeMailbox:
				p.suspended.Store(false)
			default:
				// The real monotonic clock, not the injected one: this measures how long the
				// handler ran on this machine, and no behaviour depends on it. A handler that
				// panics is not timed; the supervisor counts it.
				obs, start := p.kind.observer(msg), time.Since(epoch)
				p.inv.InvokeSystemMessage(msg)
				obs.Observe((time.Since(epoch) - start).Seconds())
			}
			p.received(msg)
			continue
		}
		if p.suspended.Load() {
			return
		}
		m, ok := p.pop(&p.user)
		if !ok {
			return
		}
		msg = m
		p.userN.Add(-1)
		obs, start := p.kind.observer(actor.UnwrapEnvelopeMessage(msg)), time.Since(epoch)
		p.inv.InvokeUserMessage(msg)
		obs.Observe((time.Since(epoch) - start).Seconds())
		p.received(msg)
	}
}

// smallQueue is the capacity a queue starts with, in the mailbox itself, and returns to once
// drained after growing.
const smallQueue = 4

// fifo is a ring of messages. Its first smallQueue slots live in the mailbox; it doubles when
// full and drops back to them when emptied, so a burst does not pin memory.
type fifo struct {
	small      [smallQueue]any
	buf        []any
	head, size int
}

func (q *fifo) push(m any) {
	if q.buf == nil {
		q.buf = q.small[:]
	}
	if q.size == len(q.buf) {
		grown := make([]any, 2*len(q.buf))
		n := copy(grown, q.buf[q.head:])
		copy(grown[n:], q.buf[:q.head])
		if len(q.buf) == smallQueue {
			clear(q.small[:]) // moved out: the in-struct slots keep no message alive
		}
		q.buf, q.head = grown, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = m
	q.size++
}

func (q *fifo) pop() (any, bool) {
	if q.size == 0 {
		return nil, false
	}
	m := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	if q.size == 0 {
		q.head = 0
		if len(q.buf) > smallQueue {
			q.buf = q.small[:]
		}
	}
	return m, true
}

// capacity is the ring's current size (tests).
func (q *fifo) capacity() int { return len(q.buf) }
