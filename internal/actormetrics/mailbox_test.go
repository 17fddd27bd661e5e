package actormetrics

import (
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"
)

// TestFifoIsAQueue: any sequence of pushes and pops behaves as a slice queue, and a drained
// ring is back in the mailbox's own slots.
func TestFifoIsAQueue(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var q fifo
		var model []any
		next := 0
		// Bursts of pushes and of pops, so rings grow past the in-struct slots and drain.
		var ops []bool
		for range rapid.IntRange(0, 12).Draw(t, "bursts") {
			for range rapid.IntRange(0, 20).Draw(t, "pushes") {
				ops = append(ops, true)
			}
			for range rapid.IntRange(0, 25).Draw(t, "pops") {
				ops = append(ops, false)
			}
		}
		for _, push := range ops {
			if push {
				q.push(next)
				model = append(model, next)
				next++
				continue
			}
			m, ok := q.pop()
			if ok != (len(model) > 0) {
				t.Fatalf("pop ok %v with %d queued", ok, len(model))
			}
			if ok {
				if m != model[0] {
					t.Fatalf("popped %v, want %v", m, model[0])
				}
				model = model[1:]
			}
			if len(model) == 0 && q.capacity() > smallQueue {
				t.Fatalf("an empty queue holds %d slots", q.capacity())
			}
			if q.capacity() > smallQueue && q.small != [smallQueue]any{} {
				t.Fatalf("a grown ring left messages in the in-struct slots: %v", q.small)
			}
		}
		if q.size != len(model) {
			t.Fatalf("size %d, model %d", q.size, len(model))
		}
		for _, v := range q.buf {
			if v == nil {
				continue
			}
			found := false
			for _, w := range model {
				found = found || v == w
			}
			if !found {
				t.Fatalf("the ring keeps %v, which was popped", v)
			}
		}
	})
}

// TestMailboxOrder: each sender's messages arrive in the order sent, one at a time, however
// many send at once.
func TestMailboxOrder(t *testing.T) {
	m := New(prometheus.NewRegistry())
	sys := newSystem(t)
	const senders, each = 4, 2000
	type msg struct{ from, n int }
	last := make([]int, senders)
	for i := range last {
		last[i] = -1
	}
	var got int
	done := make(chan struct{})
	var inside sync.Mutex
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(msg); ok {
			if !inside.TryLock() {
				t.Error("two messages handled at once")
				return
			}
			if v.n != last[v.from]+1 {
				t.Errorf("sender %d: %d after %d", v.from, v.n, last[v.from])
			}
			last[v.from] = v.n
			inside.Unlock()
			if got++; got == senders*each {
				close(done)
			}
		}
	}, m.Options("order")...))
	for s := 0; s < senders; s++ {
		go func() {
			for i := 0; i < each; i++ {
				sys.Root.Send(pid, msg{s, i})
			}
		}()
	}
	<-done
}

// TestMailboxSuspendHoldsUserMessages: while suspended the mailbox handles system messages
// only; resumed, it hands over the user messages that waited, in order.
func TestMailboxSuspendHoldsUserMessages(t *testing.T) {
	k := New(prometheus.NewRegistry()).kind("suspend")
	p := newProbe(k)
	inv := &recorder{}
	p.RegisterHandlers(inv, syncDispatcher{})
	p.PostSystemMessage(&actor.SuspendMailbox{})
	p.PostUserMessage("a")
	p.PostUserMessage("b")
	p.PostSystemMessage(&actor.Started{})
	if _, ok := inv.got[0].(*actor.Started); len(inv.got) != 1 || !ok || inv.sys != 1 {
		t.Fatalf("while suspended the actor got %v", inv.got)
	}
	if p.UserMessageCount() != 2 {
		t.Fatalf("%d user messages queued, want 2", p.UserMessageCount())
	}
	p.PostSystemMessage(&actor.ResumeMailbox{})
	if len(inv.got) != 3 || inv.got[1] != "a" || inv.got[2] != "b" || p.UserMessageCount() != 0 {
		t.Fatalf("after resuming the actor got %v (%d queued)", inv.got, p.UserMessageCount())
	}
}

// TestMailboxEscalatesAPanic: a handler's panic goes to EscalateFailure with its message, and
// the mailbox goes on with the next message.
func TestMailboxEscalatesAPanic(t *testing.T) {
	k := New(prometheus.NewRegistry()).kind("panic")
	p := newProbe(k)
	inv := &recorder{panicOn: "boom"}
	p.RegisterHandlers(inv, syncDispatcher{})
	p.PostUserMessage("boom")
	p.PostUserMessage("after")
	if inv.escalated != "boom" || len(inv.got) != 2 || inv.got[1] != "after" {
		t.Fatalf("escalated %v, got %v", inv.escalated, inv.got)
	}
}

type syncDispatcher struct{}

func (syncDispatcher) Schedule(fn func()) { fn() }
func (syncDispatcher) Throughput() int    { return 2 } // a yield every few messages

type recorder struct {
	got       []any
	sys       int
	panicOn   string
	escalated any
}

func (r *recorder) InvokeSystemMessage(m any) { r.sys++; r.got = append(r.got, m) }
func (r *recorder) InvokeUserMessage(m any) {
	r.got = append(r.got, m)
	if m == r.panicOn {
		panic(m)
	}
}
func (r *recorder) EscalateFailure(_ any, m any) { r.escalated = m }

// TestMailboxRunEndsOnATransientNegativeCount: a poster that has pushed but not yet counted its
// message leaves the count at -1 once the drain has taken it; the run ends (it used to spin
// until the poster ran), and the poster's late count and schedule find nothing left.
func TestMailboxRunEndsOnATransientNegativeCount(t *testing.T) {
	k := New(prometheus.NewRegistry()).kind("race")
	p := newProbe(k)
	inv := &recorder{}
	p.RegisterHandlers(inv, syncDispatcher{})
	p.mu.Lock()
	p.user.push("early") // a poster between its push and its count
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.status.Store(mailboxRunning)
		p.run()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the mailbox keeps running with nothing to handle")
	}
	if len(inv.got) != 1 || inv.got[0] != "early" || p.UserMessageCount() != -1 {
		t.Fatalf("handled %v, count %d", inv.got, p.UserMessageCount())
	}
	p.userN.Add(1) // the poster counts and schedules
	p.schedule()
	if len(inv.got) != 1 || p.UserMessageCount() != 0 || p.status.Load() != mailboxIdle {
		t.Fatalf("after the late count: handled %v, count %d, status %d", inv.got, p.UserMessageCount(), p.status.Load())
	}
}

// countingDispatcher runs what it is given at once and counts it.
type countingDispatcher struct{ n *int }

func (d countingDispatcher) Schedule(fn func()) { *d.n++; fn() }
func (countingDispatcher) Throughput() int      { return 300 }

// TestMailboxWatchWaitsForTheNextRun: a Watch or Unwatch to an idle mailbox schedules nothing;
// the next message runs the mailbox, which hands over the waiting system messages first.
func TestMailboxWatchWaitsForTheNextRun(t *testing.T) {
	k := New(prometheus.NewRegistry()).kind("watch")
	p := newProbe(k)
	inv := &recorder{}
	var runs int
	p.RegisterHandlers(inv, countingDispatcher{&runs})
	w, u := &actor.Watch{}, &actor.Unwatch{}
	p.PostSystemMessage(w)
	p.PostSystemMessage(u)
	if runs != 0 || len(inv.got) != 0 {
		t.Fatalf("a watch woke the mailbox: %d runs, got %v", runs, inv.got)
	}
	p.PostUserMessage("a")
	if runs != 1 || len(inv.got) != 3 || inv.got[0] != w || inv.got[1] != u || inv.got[2] != "a" {
		t.Fatalf("%d runs, got %v", runs, inv.got)
	}
	p.PostSystemMessage(&actor.Started{})
	if runs != 2 || len(inv.got) != 4 {
		t.Fatalf("another system message: %d runs, got %v", runs, inv.got)
	}
}

// TestWatcherOfAnIdleActorGetsTerminated: an actor that never runs between being watched and
// being stopped still tells its watcher; so does one watched while it runs.
func TestWatcherOfAnIdleActorGetsTerminated(t *testing.T) {
	m := New(prometheus.NewRegistry())
	sys := newSystem(t)
	for _, busy := range []bool{false, true} {
		release := make(chan struct{})
		watchee := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if c.Message() == "block" {
				<-release
			}
		}, m.Options("watchee")...))
		if busy {
			sys.Root.Send(watchee, "block")
		}
		terminated := make(chan *actor.PID, 1)
		watching := make(chan struct{})
		sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch msg := c.Message().(type) {
			case *actor.Started:
				c.Watch(watchee)
				close(watching)
			case *actor.Terminated:
				terminated <- msg.Who
			}
		}, m.Options("watcher")...))
		<-watching
		close(release)
		sys.Root.Stop(watchee)
		select {
		case who := <-terminated:
			if who.Id != watchee.Id {
				t.Fatalf("terminated %v, want %v", who, watchee)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("busy %v: the watcher got no Terminated", busy)
		}
	}
}
