package registry

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/worker"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/errs"
)

const ttl = 6 * time.Second

// fixture is a registry whose worker actors report to a probe standing in for the router,
// on a fake clock.
type fixture struct {
	t       *testing.T
	sys     *actor.ActorSystem
	clk     *clock.Fake
	reg     *actor.PID
	probe   *actor.PID
	states  chan *router.WorkerState
	evicted chan router.WorkerInfo
	pids    map[string]*actor.PID // the last worker actor seen per id
	st      *state                // the registry's tables: read only after settle
}

func newFixture(t *testing.T, tune func(*Config)) *fixture {
	t.Helper()
	f := &fixture{
		t: t, sys: actor.NewActorSystem(), clk: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		states: make(chan *router.WorkerState, 256), evicted: make(chan router.WorkerInfo, 64),
		pids: make(map[string]*actor.PID),
	}
	f.probe = f.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*router.WorkerState); ok {
			f.states <- m
		}
	}))
	cfg := Config{Clock: f.clk, Router: f.probe, TTL: ttl, Logger: slog.New(slog.DiscardHandler), OnEvict: func(w router.WorkerInfo) { f.evicted <- w }}
	if tune != nil {
		tune(&cfg)
	}
	f.st = newState(cfg)
	f.reg = f.sys.Root.Spawn(propsOf(f.st))
	t.Cleanup(func() {
		_ = f.sys.Root.StopFuture(f.reg).Wait()
		_ = f.sys.Root.StopFuture(f.probe).Wait()
	})
	return f
}

// beat sends one heartbeat and returns its ack, as the gRPC adapter does (Reply channel).
func (f *fixture) beat(id, model, cred string, hbTTL time.Duration) Ack {
	f.t.Helper()
	reply := make(chan Ack, 1)
	f.sys.Root.Send(f.reg, &Heartbeat{Info: router.WorkerInfo{ID: id, Model: model, HTTPAddress: "127.0.0.1:1"},
		TTL: hbTTL, Credential: cred, Reply: reply})
	select {
	case a := <-reply:
		return a
	case <-time.After(5 * time.Second):
		f.t.Fatalf("no ack for %s's heartbeat", id)
		return Ack{}
	}
}

// state waits for the next WorkerState a worker actor reports.
func (f *fixture) state() *router.WorkerState {
	f.t.Helper()
	select {
	case s := <-f.states:
		f.pids[s.Info.ID] = s.PID
		return s
	case <-time.After(5 * time.Second):
		f.t.Fatal("no worker state reported")
		return nil
	}
}

// settle waits until the registry, every known worker actor and the probe have processed
// everything sent to them so far.
func (f *fixture) settle() {
	f.t.Helper()
	touch := func(pid *actor.PID) {
		// A stopped actor answers nothing: its future times out, which is not a failure here.
		_ = f.sys.Root.RequestFuture(pid, &actor.Touch{}, time.Second).Wait()
	}
	touch(f.reg)
	for _, pid := range f.pids {
		touch(pid)
	}
	touch(f.probe)
}

// quiet checks that no worker state and no eviction are pending.
func (f *fixture) quiet(when string) {
	f.t.Helper()
	f.settle()
	select {
	case s := <-f.states:
		f.t.Fatalf("%s: unexpected worker state %+v live %v pid %v at %v", when, s.Info, s.Live, s.PID, f.clk.Now())
	case w := <-f.evicted:
		f.t.Fatalf("%s: unexpected eviction of %s", when, w.ID)
	default:
	}
}

func (f *fixture) evict() router.WorkerInfo {
	f.t.Helper()
	select {
	case w := <-f.evicted:
		return w
	case <-time.After(5 * time.Second):
		f.t.Fatal("no eviction")
		return router.WorkerInfo{}
	}
}

// TestOneWorkerActorPerID: the first heartbeat of an id spawns its worker actor, stamped
// with the registry's clock; later ones update the same actor.
func TestOneWorkerActorPerID(t *testing.T) {
	f := newFixture(t, nil)
	if a := f.beat("w1", "smol", "", 0); a != (Ack{Epoch: 1}) {
		t.Fatalf("first ack = %+v, want epoch 1", a)
	}
	s := f.state()
	if s.Info.ID != "w1" || !s.Live || !s.Info.LastHeartbeat.Equal(f.clk.Now()) {
		t.Fatalf("first state = %+v live %v", s.Info, s.Live)
	}
	first := s.PID
	f.clk.Advance(time.Second)
	f.beat("w1", "smol", "", 0)
	s = f.state()
	if !s.PID.Equal(first) {
		t.Fatalf("second heartbeat reported by %v, want the same actor %v", s.PID, first)
	}
	if !s.Info.LastHeartbeat.Equal(f.clk.Now()) {
		t.Fatalf("second heartbeat stamped %v, want %v", s.Info.LastHeartbeat, f.clk.Now())
	}
	f.beat("w2", "smol", "", 0)
	if s := f.state(); s.Info.ID != "w2" || s.PID.Equal(first) {
		t.Fatalf("w2 reported as %+v by %v", s.Info, s.PID)
	}
	f.quiet("after three heartbeats")
}

// TestAckByRespond: a heartbeat without a Reply channel (a static worker's scrape) is
// answered by Respond.
func TestAckByRespond(t *testing.T) {
	f := newFixture(t, nil)
	got, err := f.sys.Root.RequestFuture(f.reg, &Heartbeat{Info: router.WorkerInfo{ID: "s1", Model: "smol"},
		Credential: CredentialStatic}, 5*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := got.(*Ack); !ok || *a != (Ack{Epoch: 1}) {
		t.Fatalf("reply = %#v, want *Ack{Epoch: 1}", got)
	}
	f.state()
}

// TestIDBoundToItsCredential: a live worker's id answers only to the credential that
// registered it (R13.1); a refused heartbeat changes nothing, and the id is free again once
// the worker is evicted.
func TestIDBoundToItsCredential(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("w1", "smol", "alice", 0)
	f.state()
	a := f.beat("w1", "evil", "mallory", 0)
	if !errors.Is(a.Err, ErrIDTaken) || a.Drain || a.Epoch != 0 {
		t.Fatalf("ack for another credential = %+v, want ErrIDTaken and nothing else", a)
	}
	f.quiet("after the refused heartbeat")
	if a := f.beat("w1", "smol", "", 0); !errors.Is(a.Err, ErrIDTaken) {
		t.Fatalf("ack without a credential = %+v, want ErrIDTaken", a)
	}
	if a := f.beat("w1", "smol", "alice", 0); a.Err != nil {
		t.Fatalf("the registering credential refused: %v", a.Err)
	}
	if s := f.state(); s.Info.Model != "smol" {
		t.Fatalf("model = %q after the refused heartbeat, want smol", s.Info.Model)
	}
	f.clk.Advance(ttl)
	if w := f.evict(); w.ID != "w1" {
		t.Fatalf("evicted %q", w.ID)
	}
	if a := f.beat("w1", "smol", "mallory", 0); a.Err != nil {
		t.Fatalf("after eviction the id is free, got %v", a.Err)
	}
}

// TestMaxWorkers: a new id beyond max_workers is refused; registered ids keep heartbeating,
// and an eviction makes room.
func TestMaxWorkers(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxWorkers = 2 })
	f.beat("w1", "smol", "", 0)
	f.state()
	f.clk.Advance(time.Second)
	f.beat("w2", "smol", "", 0)
	f.state()
	a := f.beat("w3", "smol", "", 0)
	if !errors.Is(a.Err, ErrTooManyWorkers) || a.Epoch != 0 {
		t.Fatalf("third id: ack %+v, want ErrTooManyWorkers", a)
	}
	f.quiet("after the refused third id")
	if a := f.beat("w2", "smol", "", 0); a.Err != nil {
		t.Fatalf("a registered id at the cap: %v", a.Err)
	}
	f.state()
	f.clk.Advance(ttl - time.Second) // w1's deadline; w2 heartbeat 1 s later
	if w := f.evict(); w.ID != "w1" {
		t.Fatalf("evicted %q, want w1", w.ID)
	}
	if a := f.beat("w3", "smol", "", 0); a.Err != nil {
		t.Fatalf("third id after an eviction: %v", a.Err)
	}
}

// TestEviction: a worker whose deadline passes is stopped, forgotten and reported to
// OnEvict; an Expired older than the last status forwarded is ignored (a newer heartbeat is
// on its way to the worker and revives it); a heartbeat's own TTL replaces k·T.
func TestEviction(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("w1", "smol", "", 0) // status 1
	f.state()
	f.beat("w1", "smol", "", 0) // status 2
	f.state()
	f.sys.Root.Send(f.reg, &worker.Expired{ID: "w1", Seq: 1})
	f.sys.Root.Send(f.reg, &worker.Expired{ID: "nobody", Seq: 1})
	f.quiet("after a stale Expired")

	f.clk.Advance(ttl - time.Nanosecond)
	f.quiet("1 ns before the deadline")
	f.clk.Advance(time.Nanosecond)
	if s := f.state(); s.Live {
		t.Fatalf("state at the deadline: live")
	}
	if w := f.evict(); w.ID != "w1" || w.Model != "smol" {
		t.Fatalf("evicted %+v", w)
	}
	pid := f.pids["w1"]
	f.settle()
	if _, alive := f.sys.ProcessRegistry.Get(pid); alive {
		t.Fatalf("the evicted worker's actor %v is still running", pid)
	}

	// A static worker's TTL (k·scrape_interval) replaces k·T.
	f.beat("s1", "smol", CredentialStatic, 2*time.Second)
	f.state()
	f.clk.Advance(2 * time.Second)
	if s := f.state(); s.Live {
		t.Fatal("the static worker is live 2 s after its scrape")
	}
	if w := f.evict(); w.ID != "s1" {
		t.Fatalf("evicted %q, want s1", w.ID)
	}
	f.beat("s1", "smol", CredentialStatic, 2*time.Second)
	f.state()
	f.clk.Advance(time.Second)
	f.beat("s1", "smol", CredentialStatic, 0) // no TTL: k·T from here
	f.state()
	f.clk.Advance(ttl - time.Nanosecond)
	f.quiet("a heartbeat without a TTL uses k·T")
	f.clk.Advance(time.Nanosecond)
	f.state()
	if w := f.evict(); w.ID != "s1" {
		t.Fatalf("evicted %q, want s1", w.ID)
	}
}

// TestWorkerStoppedElsewhere: a worker actor that stops without an eviction (its supervisor
// gave up) leaves the registry, which reports it; the id registers afresh.
func TestWorkerStoppedElsewhere(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("w1", "smol", "", 0)
	f.beat("w2", "smol", "", 0)
	f.state()
	f.state()
	if err := f.sys.Root.StopFuture(f.pids["w2"]).Wait(); err != nil {
		t.Fatal(err)
	}
	if w := f.evict(); w.ID != "w2" {
		t.Fatalf("evicted %q, want w2", w.ID)
	}
	delete(f.pids, "w2")
	f.quiet("after the stop")
	f.beat("w2", "smol", "", 0)
	if s := f.state(); s.Info.ID != "w2" || !s.Live {
		t.Fatalf("re-registered: %+v", s.Info)
	}
}

// TestStoppingTheRegistryStopsItsWorkers: the workers are not the registry's children, yet
// they stop with it.
func TestStoppingTheRegistryStopsItsWorkers(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("w1", "smol", "", 0)
	s := f.state()
	if err := f.sys.Root.StopFuture(f.reg).Wait(); err != nil {
		t.Fatal(err)
	}
	done := f.sys.Root.StopFuture(s.PID) // answers at once when the actor is gone already
	if err := done.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, alive := f.sys.ProcessRegistry.Get(s.PID); alive {
		t.Fatal("the worker outlived its registry")
	}
}

// TestDrainModel: draining a model marks every worker of it (and only it), in their states and
// in their heartbeat acks, and a worker of that model registering later; undraining reverses
// it; a model no worker serves is ErrModelNotFound and changes nothing.
func TestDrainModel(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("a1", "a", "", 0)
	f.beat("a2", "a", "", 0)
	f.beat("b1", "b", "", 0)
	for range 3 {
		f.state()
	}
	ask := func(m *DrainModel) any {
		t.Helper()
		got, err := f.sys.Root.RequestFuture(f.reg, m, 5*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := ask(&DrainModel{Model: "c", Drained: true}); !errors.Is(got.(error), errs.ErrModelNotFound) {
		t.Fatalf("drain of an unserved model = %v", got)
	}
	f.quiet("after the refused drain")
	if a := f.beat("b1", "b", "", 0); a.Drain {
		t.Fatal("b drained by a refused drain of c")
	}
	f.state()

	if got := ask(&DrainModel{Model: "a", Drained: true}); *got.(*DrainResult) != (DrainResult{Workers: 2}) {
		t.Fatalf("drain a = %+v", got)
	}
	seen := map[string]bool{}
	for range 2 {
		s := f.state()
		if s.Info.Model != "a" || !s.Info.AdminDrained {
			t.Fatalf("state after draining a: %+v", s.Info)
		}
		seen[s.Info.ID] = true
	}
	if len(seen) != 2 {
		t.Fatalf("drained workers %v, want a1 and a2", seen)
	}
	f.quiet("after draining a")
	if a := f.beat("a1", "a", "", 0); !a.Drain {
		t.Fatal("a1's ack after the drain: not drained")
	}
	if s := f.state(); !s.Info.AdminDrained {
		t.Fatal("a1's heartbeat undid the drain")
	}
	if a := f.beat("b1", "b", "", 0); a.Drain {
		t.Fatal("b1 drained with a")
	}
	f.state()
	if a := f.beat("a3", "a", "", 0); !a.Drain {
		t.Fatal("a new worker of a drained model: not drained")
	}
	if s := f.state(); !s.Info.AdminDrained {
		t.Fatal("a3's first state: not drained")
	}
	// Draining again changes no worker, yet answers with the count.
	if got := ask(&DrainModel{Model: "a", Drained: true}); got.(*DrainResult).Workers != 3 {
		t.Fatalf("second drain = %+v", got)
	}
	f.quiet("after draining a drained model")

	if got := ask(&DrainModel{Model: "a", Drained: false}); got.(*DrainResult).Workers != 3 {
		t.Fatalf("undrain = %+v", got)
	}
	for range 3 {
		if s := f.state(); s.Info.AdminDrained {
			t.Fatalf("after undraining: %+v", s.Info)
		}
	}
	if a := f.beat("a4", "a", "", 0); a.Drain {
		t.Fatal("a new worker after the undrain: drained")
	}
}

// TestSyncDrains: the cluster's set of drained models replaces the registry's: workers of a
// model in it are drained, the others undrained, and later workers follow it.
func TestSyncDrains(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("a1", "a", "", 0)
	f.beat("b1", "b", "", 0)
	f.state()
	f.state()
	f.sys.Root.Send(f.reg, &SyncDrains{Models: []string{"a", "unserved"}})
	if s := f.state(); s.Info.ID != "a1" || !s.Info.AdminDrained {
		t.Fatalf("after syncing {a}: %+v", s.Info)
	}
	f.quiet("only a1 changes")
	f.sys.Root.Send(f.reg, &SyncDrains{Models: []string{"b"}})
	got := map[string]bool{}
	for range 2 {
		s := f.state()
		got[s.Info.ID] = s.Info.AdminDrained
	}
	if !(got["b1"] && !got["a1"] && len(got) == 2) {
		t.Fatalf("after syncing {b}: %v", got)
	}
	if a := f.beat("b2", "b", "", 0); !a.Drain {
		t.Fatal("a new worker of a synced drained model: not drained")
	}
	if a := f.beat("a2", "a", "", 0); a.Drain {
		t.Fatal("a new worker of a model synced undrained: drained")
	}
	if a := f.beat("u1", "unserved", "", 0); a.Drain {
		t.Fatal("a model dropped from the set stays drained")
	}
}

// TestEpochFollowsTheRouteTable: acks carry the route table's epoch as last announced, even a
// lower one (a rebuilt etcd restarts its revisions).
func TestEpochFollowsTheRouteTable(t *testing.T) {
	f := newFixture(t, nil)
	for _, epoch := range []uint64{7, 3} {
		f.sys.Root.Send(f.reg, &router.EpochChanged{Epoch: epoch})
		if a := f.beat("w1", "smol", "", 0); a.Epoch != epoch {
			t.Fatalf("ack epoch %d, want %d", a.Epoch, epoch)
		}
		f.state()
	}
}

// TestActorNames: any id registers; the characters protoactor reserves or that make a poor
// name become '_', and two ids that sanitize alike still get their own actors.
func TestActorNames(t *testing.T) {
	for in, want := range map[string]string{
		"w-1.a_b":                "w-1.a_b",
		"a/b$c":                  "a_b_c",
		"sp ace\ttab":            "sp_ace_tab",
		"\x00\x1f\x20!~\x7f\xff": "___!~__",
		"é":                      "__",
	} {
		if got := sanitize(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
	f := newFixture(t, nil)
	f.beat("a/b", "smol", "", 0)
	f.beat("a$b", "smol", "", 0)
	x, y := f.state(), f.state()
	if x.PID.Equal(y.PID) || x.Info.ID == y.Info.ID {
		t.Fatalf("two ids share an actor: %v %v", x, y)
	}
}

// TestScrapeFailed: a failed scrape is shown on its worker; one for an unknown id is dropped.
func TestScrapeFailed(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("s1", "smol", CredentialStatic, 0)
	f.state()
	f.sys.Root.Send(f.reg, &ScrapeFailed{ID: "s1", Reason: "connection refused"})
	f.sys.Root.Send(f.reg, &ScrapeFailed{ID: "nobody", Reason: "x"})
	if s := f.state(); s.Info.ScrapeError != "connection refused" || !s.Live {
		t.Fatalf("after a failed scrape: %+v", s.Info)
	}
	f.quiet("after the failed scrapes")
}

// recorder keeps the messages of the records logged at Warn or above.
type recorder struct{ warns chan string }

func (r recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r recorder) Handle(_ context.Context, rec slog.Record) error {
	r.warns <- rec.Message
	return nil
}
func (r recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r recorder) WithGroup(string) slog.Handler      { return r }

// TestChangedAddressesAreWarnedOf: a worker id heartbeating with other addresses or another
// model is taken at its word (the latest wins) and the operator warned — at most once a
// minute per worker (R20: an engine that changes its address every heartbeat would otherwise
// write a line per heartbeat); the same heartbeat again warns of nothing.
func TestChangedAddressesAreWarnedOf(t *testing.T) {
	rec := recorder{warns: make(chan string, 16)}
	f := newFixture(t, func(c *Config) { c.Logger = slog.New(rec) })
	var last router.WorkerInfo // the last heartbeat's info
	beat := func(info router.WorkerInfo) {
		t.Helper()
		reply := make(chan Ack, 1)
		f.sys.Root.Send(f.reg, &Heartbeat{Info: info, Reply: reply})
		if a := <-reply; a.Err != nil {
			t.Fatal(a.Err)
		}
		f.state()
		last = info
	}
	warnings := func() int {
		n := 0
		for {
			select {
			case msg := <-rec.warns:
				if !strings.Contains(msg, "different addresses or model") {
					t.Fatalf("warning %q", msg)
				}
				n++
			default:
				return n
			}
		}
	}
	base := router.WorkerInfo{ID: "w1", Model: "smol", HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2", KVAddress: "127.0.0.1:3"}
	// keepAlive moves the clock to until, heartbeating the last info at most every half TTL so
	// the worker stays registered.
	keepAlive := func(until time.Time) {
		t.Helper()
		for f.clk.Now().Before(until) {
			f.clk.Advance(min(ttl/2, until.Sub(f.clk.Now())))
			beat(last)
		}
	}
	beat(base)
	beat(base)
	if n := warnings(); n != 0 {
		t.Fatalf("unchanged heartbeats warned %d times", n)
	}
	for _, change := range []func(*router.WorkerInfo){
		func(w *router.WorkerInfo) { w.HTTPAddress = "127.0.0.1:9" },
		func(w *router.WorkerInfo) { w.GRPCAddress = "127.0.0.1:9" },
		func(w *router.WorkerInfo) { w.KVAddress = "127.0.0.1:9" },
		func(w *router.WorkerInfo) { w.Model = "big" },
	} {
		info := base
		change(&info)
		beat(info)
		warnedAt := f.clk.Now()
		if n := warnings(); n != 1 {
			t.Fatalf("%+v after %+v: %d warnings, want 1", info, base, n)
		}
		for range 10 { // back and forth within the minute: no more lines
			beat(base)
			beat(info)
		}
		keepAlive(warnedAt.Add(changeWarnEvery - time.Nanosecond))
		beat(base)
		if n := warnings(); n != 0 {
			t.Fatalf("%d more warnings within the minute", n)
		}
		f.clk.Advance(time.Nanosecond)
		beat(info)
		if n := warnings(); n != 1 {
			t.Fatalf("a change a minute after the warning: %d warnings, want 1", n)
		}
		keepAlive(f.clk.Now().Add(changeWarnEvery)) // the next case's change a minute after this warning
	}
}

// TestNoLoggerGiven: a registry configured without a logger uses the default one.
func TestNoLoggerGiven(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Logger = nil })
	f.beat("w1", "smol", "", 0)
	f.state()
	if a := f.beat("w1", "smol", "other", 0); !errors.Is(a.Err, ErrIDTaken) { // logs a warning
		t.Fatalf("ack %+v", a)
	}
}

// TestStaleTerminatedKeepsTheNewRegistration: an id evicted and registered again at once gets
// an actor of its own name, so the old actor's Terminated, arriving after the new
// registration, neither forgets nor reports the new one (before, the reused name gave both
// actors one PID: the new worker was dropped and its actor left running unregistered).
func TestStaleTerminatedKeepsTheNewRegistration(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("w1", "smol", "", 0)
	old := f.state().PID
	f.clk.Advance(ttl)
	f.state() // live false
	f.evict()
	// The old actor has stopped and the registry has had its Terminated: its name is free.
	if err := f.sys.Root.StopFuture(old).Wait(); err != nil {
		t.Fatal(err)
	}
	f.settle()
	f.beat("w1", "smol", "", 0)
	cur := f.state().PID
	if cur.Equal(old) {
		t.Fatalf("the new registration's actor has the old one's PID %v", old)
	}
	f.sys.Root.Send(f.reg, &actor.Terminated{Who: old}) // a late copy of the old actor's Terminated
	f.quiet("after the old actor's Terminated")
	f.clk.Advance(time.Second)
	if a := f.beat("w1", "smol", "", 0); a.Err != nil {
		t.Fatal(a.Err)
	}
	if s := f.state(); !s.PID.Equal(cur) || !s.Live {
		t.Fatalf("the next heartbeat reported by %v (live %v), want the registered actor %v", s.PID, s.Live, cur)
	}
}

// TestDrainEcho: a heartbeat's draining is the echo of the gateway's drain when it began under
// the drain (or a new registration reports it under the drain), and for echoHeartbeats
// heartbeats after an undrain kept the echo; otherwise, and after any report of not draining,
// it is the engine's own.
func TestDrainEcho(t *testing.T) {
	hb := func(draining, drained bool) router.WorkerInfo {
		return router.WorkerInfo{ID: "w", Model: "m", Draining: draining, AdminDrained: drained}
	}
	ent := func(draining, echo bool, left int) *entry {
		return &entry{info: router.WorkerInfo{Draining: draining}, echo: echo, echoLeft: left}
	}
	for _, tc := range []struct {
		name   string
		e      *entry
		info   router.WorkerInfo
		echo   bool
		left   int
		marked bool
	}{
		{"new, not draining", nil, hb(false, false), false, 0, false},
		{"new, draining by itself", nil, hb(true, false), false, 0, false},
		{"new, draining under the drain", nil, hb(true, true), true, 0, true},
		{"began draining under the drain", ent(false, false, 0), hb(true, true), true, 0, true},
		{"still echoing under the drain", ent(true, true, 0), hb(true, true), true, 0, true},
		{"draining before the drain", ent(true, false, 0), hb(true, true), false, 0, false},
		{"not draining under the drain", ent(true, true, 0), hb(false, true), false, 0, false},
		{"first heartbeat after the undrain", ent(true, true, 2), hb(true, false), true, 1, true},
		{"second heartbeat after the undrain", ent(true, true, 1), hb(true, false), true, 0, true},
		{"third heartbeat after the undrain", ent(true, true, 0), hb(true, false), false, 0, false},
		{"stopped draining after the undrain", ent(true, true, 2), hb(false, false), false, 0, false},
		{"draining by itself", ent(false, false, 0), hb(true, false), false, 0, false},
		{"re-drained in the echo window", ent(true, true, 1), hb(true, true), true, 0, true},
	} {
		echo, left := drainEcho(tc.e, tc.info)
		if echo != tc.echo || left != tc.left || (tc.info.Draining && echo) != tc.marked {
			t.Errorf("%s: echo %v, %d left; want %v, %d", tc.name, echo, left, tc.echo, tc.left)
		}
	}
}

// TestUndrainKeepsTheEcho: the registry marks a heartbeat's draining as the drain's echo in the
// status it forwards (DrainEcho), an undrain keeps it for echoHeartbeats heartbeats, routable
// at once, and a worker that drained by itself before the drain is not marked.
func TestUndrainKeepsTheEcho(t *testing.T) {
	f := newFixture(t, nil)
	beat := func(id string, draining bool) (Ack, *router.WorkerState) {
		t.Helper()
		reply := make(chan Ack, 1)
		f.sys.Root.Send(f.reg, &Heartbeat{Info: router.WorkerInfo{ID: id, Model: "m", HTTPAddress: "127.0.0.1:1", Draining: draining},
			Reply: reply})
		select {
		case a := <-reply:
			return a, f.state()
		case <-time.After(5 * time.Second):
			t.Fatalf("no ack for %s's heartbeat", id)
			return Ack{}, nil
		}
	}
	beat("echo", false)
	beat("own", true)
	if _, err := f.sys.Root.RequestFuture(f.reg, &DrainModel{Model: "m", Drained: true}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	f.state()
	f.state()
	if a, s := beat("echo", true); !a.Drain || !s.Info.DrainEcho || !s.Info.AdminDrained {
		t.Fatalf("under the drain: ack %+v, %+v", a, s.Info)
	}
	if _, s := beat("own", true); s.Info.DrainEcho {
		t.Fatalf("drained by itself before the drain: %+v", s.Info)
	}
	if _, err := f.sys.Root.RequestFuture(f.reg, &DrainModel{Model: "m", Drained: false}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if s := f.state(); s.Info.AdminDrained || (s.Info.ID == "echo") != s.Info.DrainEcho {
			t.Fatalf("undrained: %+v", s.Info)
		}
	}
	for i := range echoHeartbeats {
		if a, s := beat("echo", true); a.Drain || !s.Info.DrainEcho {
			t.Fatalf("heartbeat %d after the undrain: ack %+v, %+v", i+1, a, s.Info)
		}
	}
	if _, s := beat("echo", true); s.Info.DrainEcho {
		t.Fatalf("still echoing %d heartbeats after the undrain: %+v", echoHeartbeats+1, s.Info)
	}
}

// TestRegistrationsNumbered: each registration of an id gets a number of its own (1, 2, …),
// kept by its heartbeats, and the worker actor's reports name it; OnAccepted is told every
// accepted heartbeat with its number, on the registry's goroutine, so an eviction's OnEvict
// comes between the last OnAccepted of a registration and the first of the next.
func TestRegistrationsNumbered(t *testing.T) {
	type told struct {
		evict bool
		info  router.WorkerInfo
	}
	log := make(chan told, 16)
	f := newFixture(t, func(c *Config) {
		c.OnEvict = func(w router.WorkerInfo) { log <- told{evict: true, info: w} }
		c.OnAccepted = func(w router.WorkerInfo) { log <- told{info: w} }
	})
	next := func() told {
		t.Helper()
		select {
		case m := <-log:
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("OnAccepted/OnEvict not told")
			return told{}
		}
	}
	f.beat("w1", "smol", "", 0)
	f.beat("w2", "smol", "", 0)
	f.beat("w1", "smol", "", 0)
	for _, want := range []struct {
		id  string
		reg uint64
	}{{"w1", 1}, {"w2", 2}, {"w1", 1}} {
		if m := next(); m.evict || m.info.ID != want.id || m.info.Reg != want.reg {
			t.Fatalf("told %+v, want %s's heartbeat under registration %d", m, want.id, want.reg)
		}
	}
	for range 3 {
		if s := f.state(); s.Info.Reg != map[string]uint64{"w1": 1, "w2": 2}[s.Info.ID] {
			t.Fatalf("%s reports registration %d", s.Info.ID, s.Info.Reg)
		}
	}
	f.clk.Advance(ttl)
	for range 2 {
		if s := f.state(); s.Live {
			t.Fatalf("%s live after its deadline", s.Info.ID)
		}
	}
	evicted := map[string]uint64{}
	for range 2 {
		m := next()
		if !m.evict {
			t.Fatalf("told %+v, want an eviction", m)
		}
		evicted[m.info.ID] = m.info.Reg
	}
	if evicted["w1"] != 1 || evicted["w2"] != 2 {
		t.Fatalf("evicted %v", evicted)
	}
	f.beat("w1", "smol", "", 0)
	if m := next(); m.evict || m.info.ID != "w1" || m.info.Reg != 3 {
		t.Fatalf("told %+v, want w1's new registration 3", m)
	}
	if s := f.state(); s.Info.Reg != 3 || !s.Live {
		t.Fatalf("w1's new actor reports %+v", s.Info)
	}
}

// beatAs sends one heartbeat of id with cred counted against quotas and returns its ack.
func (f *fixture) beatAs(id, cred string, quotas ...Quota) Ack {
	f.t.Helper()
	reply := make(chan Ack, 1)
	f.sys.Root.Send(f.reg, &Heartbeat{Info: router.WorkerInfo{ID: id, Model: "smol", HTTPAddress: "127.0.0.1:1"},
		Credential: cred, Quotas: quotas, Reply: reply})
	select {
	case a := <-reply:
		return a
	case <-time.After(5 * time.Second):
		f.t.Fatalf("no ack for %s's heartbeat", id)
		return Ack{}
	}
}

// TestCredentialQuotas (R20, issue 35: one token could take every max_workers slot): a new id
// beyond a credential's quota is refused with ErrTooManyWorkers and registers nothing; the
// credential's registered ids keep heartbeating, other credentials still register, a worker
// counts against each of its quotas (a token's and a certificate's), a zero Max caps nothing,
// and an eviction gives the place back. The quota table is empty once every worker went.
func TestCredentialQuotas(t *testing.T) {
	f := newFixture(t, nil)
	tokA := Quota{Key: "token:0", Max: 2}
	cert := Quota{Key: "cert:pool-b", Max: 1}
	for _, id := range []string{"a1", "a2"} {
		if a := f.beatAs(id, "token:0", tokA); a.Err != nil {
			t.Fatalf("%s within the quota: %v", id, a.Err)
		}
		f.state()
	}
	a := f.beatAs("a3", "token:0", tokA)
	if !errors.Is(a.Err, ErrTooManyWorkers) || a.Epoch != 0 || !strings.Contains(a.Err.Error(), "this credential") {
		t.Fatalf("a third id for a quota of 2: %+v, want ErrTooManyWorkers naming the credential's quota", a)
	}
	f.quiet("after the id over the quota")
	if a := f.beatAs("a2", "token:0", tokA); a.Err != nil {
		t.Fatalf("a registered id at its quota: %v", a.Err)
	}
	f.state()
	if a := f.beatAs("b1", "token:1 cert:pool-b", Quota{Key: "token:1"}, cert); a.Err != nil {
		t.Fatalf("another credential: %v", a.Err)
	}
	f.state()
	if a := f.beatAs("b2", "token:1 cert:pool-b", Quota{Key: "token:1"}, cert); !errors.Is(a.Err, ErrTooManyWorkers) {
		t.Fatalf("a second id for a certificate quota of 1 (the token has none): %+v", a)
	}
	f.quiet("after the id over the certificate's quota")
	if a := f.beatAs("b2", "token:1 cert:pool-c", Quota{Key: "token:1"}, Quota{Key: "cert:pool-c", Max: 1}); a.Err != nil {
		t.Fatalf("the same token with another certificate: %v", a.Err)
	}
	f.state()
	if got := f.st.quota; len(got) != 3 || got["token:0"] != 2 || got["cert:pool-b"] != 1 || got["cert:pool-c"] != 1 {
		t.Fatalf("quota counts %v, want token:0=2 and one per certificate (no Max, no count)", got)
	}
	f.clk.Advance(ttl)
	for range 4 {
		f.evict()
	}
	f.settle()
	if len(f.st.quota) != 0 {
		t.Fatalf("quota counts %v after every worker went", f.st.quota)
	}
	if a := f.beatAs("a3", "token:0", tokA); a.Err != nil {
		t.Fatalf("an id after the evictions: %v", a.Err)
	}
}

// TestRetire: a Retire removes a worker registered under its credential at once, as its
// deadline would (it reports not live, then leaves); another credential's, or an unknown id,
// is left alone.
func TestRetire(t *testing.T) {
	f := newFixture(t, nil)
	f.beat("p/10.0.0.1:8000", "smol", CredentialPool, 2*time.Second)
	f.state()
	f.beat("s1", "smol", CredentialStatic, 2*time.Second)
	f.state()
	f.sys.Root.Send(f.reg, &Retire{ID: "s1", Credential: CredentialPool})
	f.sys.Root.Send(f.reg, &Retire{ID: "nobody", Credential: CredentialPool})
	f.quiet("a Retire under another credential, or of nobody")

	f.sys.Root.Send(f.reg, &Retire{ID: "p/10.0.0.1:8000", Credential: CredentialPool})
	if s := f.state(); s.Live || s.Info.ID != "p/10.0.0.1:8000" {
		t.Fatalf("state after Retire: %+v live %v", s.Info, s.Live)
	}
	if w := f.evict(); w.ID != "p/10.0.0.1:8000" {
		t.Fatalf("evicted %q", w.ID)
	}
	pid := f.pids["p/10.0.0.1:8000"]
	f.settle()
	if _, alive := f.sys.ProcessRegistry.Get(pid); alive {
		t.Fatalf("the retired worker's actor %v is still running", pid)
	}
	// A second Retire, and the retired worker's deadline, change nothing.
	f.sys.Root.Send(f.reg, &Retire{ID: "p/10.0.0.1:8000", Credential: CredentialPool})
	f.clk.Advance(time.Second)
	f.quiet("after the retirement")
	// The id registers afresh on its next scrape.
	f.beat("p/10.0.0.1:8000", "smol", CredentialPool, 2*time.Second)
	if s := f.state(); !s.Live {
		t.Fatal("the id is not live again after a new scrape")
	}
}
