package actormetrics

import (
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind. protoactor starts
// one goroutine per dead-letter throttle interval; the test systems shorten
// that interval to a millisecond, so goleak's own retries outlast it and no
// ignore option is needed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type (
	Pick  struct{}
	Other struct{ N int }
	block struct{ entered, release chan struct{} }
)

func newSystem(tb testing.TB) *actor.ActorSystem {
	tb.Helper()
	sys := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }),
		actor.WithDeadLetterThrottleInterval(time.Millisecond),
	)
	tb.Cleanup(sys.Shutdown)
	return sys
}

// barrier returns once pid has handled everything sent to it before.
func barrier(tb testing.TB, sys *actor.ActorSystem, pid *actor.PID) {
	tb.Helper()
	if err := sys.Root.RequestFuture(pid, &actor.Touch{}, 10*time.Second).Wait(); err != nil {
		tb.Fatalf("barrier: %v", err)
	}
}

// eventually yields the processor until cond holds (or fails after 10 s).
// A mailbox reports *actor.Stop to its middleware only after the actor's
// watchers have been told it stopped, so there is no message to wait for.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func (m *Metrics) live(kindName string) int {
	_, live := m.kind(kindName).sample()
	return live
}

func gauges(kinds ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP %s Live actors, by actor kind.\n# TYPE %s gauge\n", ActorsName, ActorsName)
	for i := 0; i < len(kinds); i += 3 {
		fmt.Fprintf(&b, "%s{actor_kind=%q} %s\n", ActorsName, kinds[i], kinds[i+1])
	}
	fmt.Fprintf(&b, "# HELP %s User messages queued in the mailboxes of live actors, by actor kind.\n# TYPE %s gauge\n", MailboxLengthName, MailboxLengthName)
	for i := 0; i < len(kinds); i += 3 {
		fmt.Fprintf(&b, "%s{actor_kind=%q} %s\n", MailboxLengthName, kinds[i], kinds[i+2])
	}
	return b.String()
}

// checkGauges compares tlgw_actors and tlgw_actor_mailbox_length with
// triples of kind, live actors, queued messages.
func checkGauges(t *testing.T, reg *prometheus.Registry, kinds ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(gauges(kinds...)), ActorsName, MailboxLengthName); err != nil {
		t.Error(err)
	}
}

func TestMailboxLength(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	sys := newSystem(t)
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if b, ok := c.Message().(block); ok {
			close(b.entered)
			<-b.release
		}
	}, m.Options("worker")...))

	b := block{make(chan struct{}), make(chan struct{})}
	var once sync.Once
	unblock := func() { once.Do(func() { close(b.release) }) }
	t.Cleanup(unblock)
	sys.Root.Send(pid, b)
	<-b.entered
	for range 7 {
		sys.Root.Send(pid, Pick{})
	}
	checkGauges(t, reg, "worker", "1", "7")

	unblock()
	barrier(t, sys, pid)
	checkGauges(t, reg, "worker", "1", "0")
}

// sampleCounts returns the histogram's sample count per "kind/message".
func sampleCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != MessageSecondsName {
			continue
		}
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			counts[labels["actor_kind"]+"/"+labels["message"]] = mt.GetHistogram().GetSampleCount()
		}
	}
	return counts
}

func TestMessageHistogram(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	sys := newSystem(t)
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}, m.Options("router")...))
	for range 3 {
		sys.Root.Send(pid, Pick{})
	}
	sys.Root.Send(pid, &Other{1})
	sys.Root.Send(pid, Other{2})
	barrier(t, sys, pid)
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}

	// What the mailbox hands the actor's context, by type: the lifecycle as its system
	// messages (Started; Stop, whose handling runs Stopping and Stopped; the Watch of the
	// StopFuture), user messages unwrapped from their envelope (Touch came in a Request).
	want := map[string]uint64{
		"router/Started": 1,
		"router/Pick":    3,
		"router/Other":   2, // pointer or not
		"router/Touch":   1,
		"router/Watch":   1,
		"router/Stop":    1,
	}
	// The StopFuture completes on the Terminated that the Stop's handling sends, which may be
	// before that handling returns and is observed: wait for its sample.
	eventually(t, "the Stop observed", func() bool { return sampleCounts(t, reg)["router/Stop"] == 1 })
	if got := sampleCounts(t, reg); !reflect.DeepEqual(got, want) {
		t.Errorf("sample counts = %v, want %v", got, want)
	}
	// The handlers do nothing: on average each took between 0 and 50 ms (a clock arithmetic
	// slip would read as minus or twice the process's age).
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			if h := mt.GetHistogram(); f.GetName() == MessageSecondsName && (h.GetSampleSum() < 0 || h.GetSampleSum() >= 0.05*float64(h.GetSampleCount())) {
				t.Errorf("%v: %d samples summing to %v s", mt.GetLabel(), h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
	if n := testutil.CollectAndCount(m.handle, MessageSecondsName); n != len(want) {
		t.Errorf("%d series, want %d", n, len(want))
	}
}

func TestLiveActorsDropAfterStop(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	sys := newSystem(t)
	// The synchronized dispatcher handles a message on the sending
	// goroutine, so a Stop has been fully processed when it returns.
	sync := actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))
	workers := actor.PropsFromFunc(func(actor.Context) {}, append(m.Options("worker"), sync)...)
	routers := actor.PropsFromFunc(func(actor.Context) {}, append(m.Options("router"), sync)...)
	var pids []*actor.PID
	for range 3 {
		pids = append(pids, sys.Root.Spawn(workers))
	}
	r := sys.Root.Spawn(routers)
	checkGauges(t, reg, "worker", "3", "0", "router", "1", "0")

	sys.Root.Stop(pids[0])
	sys.Root.Stop(pids[0]) // a second stop changes nothing
	sys.Root.Poison(pids[1])
	checkGauges(t, reg, "worker", "1", "0", "router", "1", "0")

	sys.Root.Stop(pids[2])
	sys.Root.Stop(r)
	checkGauges(t, reg, "worker", "0", "0", "router", "0", "0")
}

// TestStoppedActorsLeaveTheRegistry spawns and stops 10,000 actors on each
// dispatcher and checks that the live-mailbox registry is empty again.
func TestStoppedActorsLeaveTheRegistry(t *testing.T) {
	const n = 10000
	for _, tc := range []struct {
		name string
		opts []actor.PropsOption
	}{
		{"synchronized", []actor.PropsOption{actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))}},
		{"default", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := New(reg)
			sys := newSystem(t)
			props := actor.PropsFromFunc(func(actor.Context) {}, append(m.Options("request"), tc.opts...)...)
			pids := make([]*actor.PID, n)
			for i := range pids {
				pids[i] = sys.Root.Spawn(props)
				sys.Root.Send(pids[i], Pick{})
			}
			if got := m.live("request"); got != n {
				t.Fatalf("live = %d after spawning, want %d", got, n)
			}
			for _, pid := range pids {
				sys.Root.Stop(pid)
			}
			eventually(t, "the registry to empty", func() bool { return m.live("request") == 0 })
			k := m.kind("request")
			k.mu.Lock()
			empty := k.head.next == &k.head && k.head.prev == &k.head
			k.mu.Unlock()
			if !empty {
				t.Error("the ring of live mailboxes is not empty")
			}
			checkGauges(t, reg, "request", "0", "0")
		})
	}
}

// TestEveryStopPathDeregisters covers the ways an actor stops besides Stop.
func TestEveryStopPathDeregisters(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	sys := newSystem(t)
	child := actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(Other); ok {
			panic("injected crash")
		}
	}, m.Options("child")...)
	stopOnFailure := actor.NewOneForOneStrategy(10, time.Second, func(any) actor.Directive { return actor.StopDirective })
	terminated := make(chan *actor.PID, 10)
	parent := actor.PropsFromFunc(func(c actor.Context) {
		switch msg := c.Message().(type) {
		case Pick:
			c.Respond(c.Spawn(child))
		case *actor.Terminated:
			terminated <- msg.Who
		}
	}, append(m.Options("parent"), actor.WithSupervisor(stopOnFailure))...)

	p := sys.Root.Spawn(parent)
	spawnChild := func() *actor.PID {
		res, err := sys.Root.RequestFuture(p, Pick{}, 10*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.(*actor.PID)
	}
	// A Stop directive after a crash.
	crashed := spawnChild()
	sys.Root.Send(crashed, Other{})
	if who := <-terminated; !who.Equal(crashed) {
		t.Fatalf("terminated %v, want %v", who, crashed)
	}
	eventually(t, "the crashed child to leave", func() bool { return m.live("child") == 0 })

	// The parent stopping its children.
	for range 5 {
		spawnChild()
	}
	if got := m.live("child"); got != 5 {
		t.Fatalf("live children = %d, want 5", got)
	}
	if err := sys.Root.PoisonFuture(p).Wait(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "all actors to leave", func() bool { return m.live("child") == 0 && m.live("parent") == 0 })
}

func TestDeadLetters(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	sys := newSystem(t)
	unsubscribe := m.WatchSystem(sys)
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		sys.Root.Send(pid, Pick{}) // published on this goroutine
	}
	want := func(n int) string {
		return fmt.Sprintf("# HELP %[1]s Messages sent to actors that no longer exist.\n# TYPE %[1]s counter\n%[1]s %d\n", DeadLettersName, n)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(3)), DeadLettersName); err != nil {
		t.Error(err)
	}
	unsubscribe()
	unsubscribe() // idempotent
	sys.Root.Send(pid, Pick{})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(3)), DeadLettersName); err != nil {
		t.Error(err)
	}
}

func TestSupervisionDirectives(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	sys := newSystem(t)
	defer m.WatchSystem(sys)()

	// A top-level actor that crashes is restarted by the default strategy.
	started := make(chan struct{}, 2)
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch c.Message().(type) {
		case *actor.Started:
			started <- struct{}{}
		case Other:
			panic("injected crash")
		}
	}, m.Options("worker")...))
	<-started
	sys.Root.Send(pid, Other{})
	<-started // the restart; its SupervisorEvent was published before it

	// A child under a Stop strategy is stopped.
	stopOnFailure := actor.NewOneForOneStrategy(10, time.Second, func(any) actor.Directive { return actor.StopDirective })
	terminated := make(chan struct{})
	sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch c.Message().(type) {
		case *actor.Started:
			kid := c.Spawn(actor.PropsFromFunc(func(c actor.Context) {
				if _, ok := c.Message().(Other); ok {
					panic("injected crash")
				}
			}))
			c.Send(kid, Other{})
		case *actor.Terminated:
			close(terminated)
		}
	}, actor.WithSupervisor(stopOnFailure)))
	<-terminated

	// A child under a Resume strategy keeps running: the message after its crash is handled.
	resumeOnFailure := actor.NewOneForOneStrategy(10, time.Second, func(any) actor.Directive { return actor.ResumeDirective })
	handled := make(chan struct{})
	sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actor.Started); ok {
			kid := c.Spawn(actor.PropsFromFunc(func(c actor.Context) {
				switch m := c.Message().(type) {
				case Other:
					if m.N == 0 {
						panic("injected crash")
					}
					close(handled)
				}
			}))
			c.Send(kid, Other{})
			c.Send(kid, Other{N: 1})
		}
	}, actor.WithSupervisor(resumeOnFailure)))
	<-handled

	// A directive this package has no label for (none today; the event is published by hand,
	// synchronously) is counted as unknown, at either end of the range.
	sys.EventStream.Publish(&actor.SupervisorEvent{Directive: actor.Directive(len(directiveLabels))})
	sys.EventStream.Publish(&actor.SupervisorEvent{Directive: -1})

	expected := fmt.Sprintf(`# HELP %[1]s Supervision directives applied to failed actors (resume, restart, stop, escalate).
# TYPE %[1]s counter
%[1]s{directive="escalate"} 0
%[1]s{directive="restart"} 1
%[1]s{directive="resume"} 1
%[1]s{directive="stop"} 1
%[1]s{directive="unknown"} 2
`, RestartsName)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected), RestartsName); err != nil {
		t.Error(err)
	}
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
}

type generic[T any] struct{ v T }

func TestMessageName(t *testing.T) {
	p := &Pick{}
	tests := []struct {
		msg  any
		want string
	}{
		{Pick{}, "Pick"},
		{p, "Pick"},
		{&p, "Pick"},
		{&actor.Started{}, "Started"},
		{actor.Terminated{}, "Terminated"},
		{[]byte("x"), "[]uint8"},
		{nil, "nil"},
		{42, "int"},
		{generic[int]{}, "generic[int]"},
	}
	for _, tc := range tests {
		if got := messageName(reflect.TypeOf(tc.msg)); got != tc.want {
			t.Errorf("messageName(%T) = %q, want %q", tc.msg, got, tc.want)
		}
	}
}

func TestObserverCacheAllocatesNothing(t *testing.T) {
	m := New(prometheus.NewRegistry())
	k := m.kind("k")
	var msg any = Pick{}
	k.observer(msg)
	if n := testing.AllocsPerRun(1000, func() { k.observer(msg).Observe(1e-6) }); n != 0 {
		t.Errorf("a cached observer lookup allocates %v times", n)
	}
}

func BenchmarkSend(b *testing.B) {
	for _, bc := range []struct {
		name    string
		metrics bool
	}{{"bare", false}, {"metrics", true}} {
		b.Run(bc.name, func(b *testing.B) {
			sys := newSystem(b)
			var opts []actor.PropsOption
			if bc.metrics {
				opts = New(prometheus.NewRegistry()).Options("bench")
			}
			pid := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}, opts...))
			barrier(b, sys, pid)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				sys.Root.Send(pid, Pick{})
			}
			barrier(b, sys, pid) // timed: the actor must have handled them all
			b.StopTimer()
			sys.Root.Stop(pid)
		})
	}
}

func BenchmarkSpawnStop(b *testing.B) {
	for _, bc := range []struct {
		name    string
		metrics bool
	}{{"bare", false}, {"metrics", true}} {
		b.Run(bc.name, func(b *testing.B) {
			sys := newSystem(b)
			var opts []actor.PropsOption
			if bc.metrics {
				opts = New(prometheus.NewRegistry()).Options("bench")
			}
			props := actor.PropsFromFunc(func(actor.Context) {}, opts...)
			b.ReportAllocs()
			for b.Loop() {
				if err := sys.Root.StopFuture(sys.Root.Spawn(props)).Wait(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
