package gopool

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/goleak"
)

// eventually polls cond until it holds or a deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func TestGoRunsEveryFunctionOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := New(4)
	defer func() { p.Close(); eventually(t, "no goroutines left", func() bool { return p.Live() == 0 }) }()
	const senders, each = 8, 500
	var ran atomic.Int64
	var wg sync.WaitGroup
	wg.Add(senders * each)
	for s := 0; s < senders; s++ {
		go func() {
			for i := 0; i < each; i++ {
				p.Go(func() { ran.Add(1); wg.Done() })
			}
		}()
	}
	wg.Wait()
	if got := ran.Load(); got != senders*each {
		t.Fatalf("ran %d functions, want %d", got, senders*each)
	}
	eventually(t, "the pool keeps at most 4 idle", func() bool { return p.Idle() <= 4 && p.Live() <= 4 })
}

// TestGoNeverBlocks: with every pooled goroutine busy, Go starts another instead of waiting.
func TestGoNeverBlocks(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := New(2)
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	for i := 0; i < 10; i++ {
		p.Go(func() { started <- struct{}{}; <-release })
	}
	for i := 0; i < 10; i++ {
		<-started // all ten run at once: none waited for another
	}
	if p.Live() != 10 {
		t.Fatalf("live %d, want 10", p.Live())
	}
	close(release)
	eventually(t, "eight exit and two stay idle", func() bool { return p.Live() == 2 && p.Idle() == 2 })
	p.Close()
	eventually(t, "the idle ones exit on Close", func() bool { return p.Live() == 0 && p.Idle() == 0 })
}

// parkedWorkers counts the pool goroutines blocked waiting for work. Idle counts a goroutine
// from just before it waits; a Go in between finds no receiver and starts a new goroutine, as
// documented, so a test of reuse waits for the goroutine to be parked.
func parkedWorkers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "gopool.(*Pool).worker") {
			n++
		}
	}
	return n
}

// TestIdleGoroutineIsReused: work handed out one at a time runs on one goroutine.
func TestIdleGoroutineIsReused(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := New(8)
	defer func() { p.Close(); eventually(t, "no goroutines left", func() bool { return p.Live() == 0 }) }()
	done := make(chan struct{})
	for i := 0; i < 100; i++ {
		eventually(t, "the goroutine is parked", func() bool { return i == 0 || (p.Idle() == 1 && parkedWorkers() == 1) })
		p.Go(func() { done <- struct{}{} })
		<-done
	}
	if p.Live() != 1 {
		t.Fatalf("100 sequential functions used %d goroutines, want 1", p.Live())
	}
}

// TestGoAfterClose: a late function still runs, on a goroutine the pool does not keep.
func TestGoAfterClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := New(0)
	p.Close()
	p.Close() // idempotent
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
	eventually(t, "the goroutine exits", func() bool { return p.Live() == 0 && p.Idle() == 0 })
	if p.Throughput() != DefaultThroughput || p.maxIdle != DefaultMaxIdle {
		t.Fatalf("defaults: throughput %d, max idle %d", p.Throughput(), p.maxIdle)
	}
}

// TestDispatcherKeepsAnActorsOrder: as a protoactor dispatcher, the pool delivers one actor's
// messages one at a time and in order.
func TestDispatcherKeepsAnActorsOrder(t *testing.T) {
	p := New(0)
	sys := actor.NewActorSystem()
	const n = 10000
	var got []int
	var inside atomic.Int32
	done := make(chan struct{})
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(int); ok {
			if inside.Add(1) != 1 {
				t.Error("two messages handled at once")
			}
			got = append(got, v)
			inside.Add(-1)
			if v == n-1 {
				close(done)
			}
		}
	}, actor.WithDispatcher(p)))
	for i := 0; i < n; i++ {
		sys.Root.Send(pid, i)
	}
	<-done
	for i, v := range got {
		if v != i {
			t.Fatalf("message %d arrived as %d", i, v)
		}
	}
	_ = sys.Root.StopFuture(pid).Wait()
	sys.Shutdown()
	p.Close()
	eventually(t, "the pool's goroutines exit", func() bool { return p.Live() == 0 })
}
