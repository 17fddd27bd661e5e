package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
)

// offline is a store that never connects: the apply logic driven directly, as the session
// would drive it from a read or a watch.
func offline(t *testing.T, got *applied) *Store {
	t.Helper()
	s := &Store{
		cfg: Config{Self: Replica{ID: "me"}, Apply: got.applier(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			OpTimeout: time.Second},
		prefix: "/p/", log: slog.New(slog.NewTextHandler(io.Discard, nil)), m: newMetrics(nil),
		drained: map[string]int64{}, replicas: map[string]Replica{}, done: make(chan struct{}),
		maxDrained: 50, maxReplicas: 20,
		rollouts: map[string]storedRollout{}, windows: map[string]map[uint64]closedWindow{}, own: map[uint64]closedWindow{},
		rolloutsNow: make(chan struct{}, 1),
	}
	return s
}

func kv(key, val string, mod int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte("/p/" + key), Value: []byte(val), ModRevision: mod}
}

func put(key, val string, mod int64) *clientv3.Event {
	return &clientv3.Event{Type: clientv3.EventTypePut, Kv: kv(key, val, mod)}
}

func del(key string, mod int64) *clientv3.Event {
	return &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: kv(key, "", mod)}
}

func replicaJSON(id string) string { return fmt.Sprintf(`{"id":%q}`, id) }

// TestDrainOrderingByRevision: what is known at a newer revision is never undone by an older
// one — a local undrain at 10 beats a watched drain from 9 — and tombstones are forgotten once
// a snapshot or the watch has passed them.
func TestDrainOrderingByRevision(t *testing.T) {
	got := newApplied()
	s := offline(t, got)
	if !s.setDrainLocked("m", true, 5) || !s.setDrainLocked("m", false, 10) {
		t.Fatal("drain at 5 then undrain at 10 must each change the set")
	}
	if s.setDrainLocked("m", true, 9) || s.setDrainLocked("m", true, 10) || s.drained["m"] != -10 {
		t.Fatalf("an older or equal drain undid a newer undrain: %v", s.drained)
	}
	if !s.setDrainLocked("m", true, 11) || s.setDrainLocked("m", false, 11) || s.drained["m"] != 11 {
		t.Fatalf("drained %v", s.drained)
	}
	if s.live != 1 {
		t.Fatal("one drained model")
	}
	s.setDrainLocked("gone", false, 12)
	s.setDrainLocked("recent", false, 20)
	s.compactDrainsLocked(20) // the watch is at 20: a tombstone at 12 orders nothing now; 20's may
	if _, ok := s.drained["gone"]; ok {
		t.Fatal("a tombstone the watch has passed is kept")
	}
	if _, ok := s.drained["recent"]; !ok {
		t.Fatal("the tombstone at the watch's revision is dropped")
	}
	if s.drained["m"] != 11 {
		t.Fatal("compaction dropped a drained model")
	}
}

// TestSnapshotApply: a read of the whole prefix sets the tables (only newer ones), the drains
// exactly (an undrain made while away applies; a local undrain newer than the read stands),
// drops tombstones the read covers, and counts replicas with this one always in.
func TestSnapshotApply(t *testing.T) {
	got := newApplied()
	s := offline(t, got)
	s.setDrainLocked("away", true, 3)    // drained before; the read at 50 no longer has it
	s.setDrainLocked("local", false, 60) // undrained here after the read was taken
	s.setDrainLocked("old", false, 4)    // a tombstone the read covers
	s.applySnapshot(50, []*mvccpb.KeyValue{
		kv("routes", `{"routes":[{"model":"a"}]}`, 40),
		kv("static_workers", `{"static_workers":[]}`, 41),
		kv("drained/kept", "1", 30),
		kv("drained/local", "1", 30),
		kv("drained/a%2Fb", "1", 31),
		kv("drained/bad%zz", "1", 32),
		kv("replicas/r1", replicaJSON("r1"), 20),
		kv("replicas/r2", replicaJSON("other"), 21), // id mismatch: ignored
	})
	got.mu.Lock()
	if got.routeRev != 40 || got.static != 41 || !slices.Equal(got.drains, []string{"a/b", "kept"}) || got.replicas != 2 {
		t.Fatalf("routes %d static %d drains %v replicas %d", got.routeRev, got.static, got.drains, got.replicas)
	}
	got.mu.Unlock()
	if _, ok := s.drained["old"]; ok {
		t.Fatal("a tombstone older than the read is kept")
	}
	if s.drained["local"] != -60 {
		t.Fatal("a read older than a local undrain re-drained it")
	}
	// An older or equal table is not applied again; a newer one is.
	s.applySnapshot(51, []*mvccpb.KeyValue{kv("routes", `{"routes":[{"model":"b"}]}`, 40), kv("replicas/me", replicaJSON("me"), 45)})
	got.mu.Lock()
	if routeModels(got.routes)[0] != "a" || got.replicas != 1 {
		t.Fatalf("equal revision re-applied: %v; replicas %d (this one listed)", routeModels(got.routes), got.replicas)
	}
	got.mu.Unlock()
	if !slices.Equal(replicaIDs(s.Replicas()), []string{"me"}) || !s.Replicas()[0].Self {
		t.Fatalf("replicas %+v", s.Replicas())
	}
}

func replicaIDs(rs []Replica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

// TestEventsApply: watched events in order; invalid values keep the last good table under the
// new revision; bounds on replicas and drained models.
func TestEventsApply(t *testing.T) {
	got := newApplied()
	s := offline(t, got)
	s.applyEvent(put("routes", `{"routes":[{"model":"a"}]}`, 5))
	s.applyEvent(put("routes", `garbage`, 6))
	s.applyEvent(put("static_workers", `{"static_workers":[{"id":"v","model":"m","http_address":"10.0.0.1:1","metrics":"vllm"}]}`, 7))
	s.applyEvent(put("static_workers", `{"static_workers":[{"id":""}]}`, 8))
	got.mu.Lock()
	if got.routeRev != 6 || routeModels(got.routes)[0] != "a" || got.static != 8 || len(got.ws) != 1 {
		t.Fatalf("routes %d %v static %d %v", got.routeRev, routeModels(got.routes), got.static, got.ws)
	}
	got.mu.Unlock()
	s.applyEvent(put("replicas/r1", replicaJSON("r1"), 9))
	s.applyEvent(put("replicas/me", replicaJSON("me"), 10))
	got.mu.Lock()
	if got.replicas != 2 {
		t.Fatalf("replicas %d", got.replicas)
	}
	got.mu.Unlock()
	s.applyEvent(del("replicas/r1", 11))
	got.mu.Lock()
	if got.replicas != 1 {
		t.Fatalf("replicas %d after a delete", got.replicas)
	}
	got.mu.Unlock()
	for i := range s.maxReplicas + 5 {
		s.applyEvent(put(fmt.Sprintf("replicas/x%d", i), replicaJSON(fmt.Sprintf("x%d", i)), int64(100+i)))
	}
	if len(s.replicas) != s.maxReplicas {
		t.Fatalf("%d replicas kept, bound %d", len(s.replicas), s.maxReplicas)
	}
	s.applyEvent(put("replicas/x0", replicaJSON("x0"), 5000)) // an update of a listed one still applies
	rev := int64(10000)
	for i := range s.maxDrained + 3 {
		rev++
		s.applyEvent(put(fmt.Sprintf("drained/d%d", i), "1", rev))
	}
	if n := s.live; n != s.maxDrained {
		t.Fatalf("%d drained models kept, bound %d", n, s.maxDrained)
	}
	rev++
	s.applyEvent(put("drained/d1", "1", rev)) // already drained: not a new entry
	rev++
	s.applyEvent(del("drained/d1", rev))
	rev++
	s.applyEvent(put("drained/newcomer", "1", rev)) // room again
	if s.drained["newcomer"] <= 0 {
		t.Fatal("a drain after an undrain freed room was refused")
	}
}

// TestStoreDefaultsAndOfflineWrites: zero timeouts take their defaults; a store that is not up
// refuses writes at once with ErrUnavailable, and a model id is bounded before anything else.
func TestStoreDefaultsAndOfflineWrites(t *testing.T) {
	s, err := Start(Config{
		Cluster: config.Cluster{EtcdEndpoints: []string{"127.0.0.1:1"}, Prefix: "/p/", LeaseTTL: 2 * time.Second},
		Self:    Replica{ID: "me"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.cfg.OpTimeout != 2*time.Second || s.cfg.ProbeInterval != time.Second {
		t.Fatalf("defaults %v %v", s.cfg.OpTimeout, s.cfg.ProbeInterval)
	}
	if _, err := s.PutRoutes(1, nil); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("put offline: %v", err)
	}
	if err := s.SetDrained(strings.Repeat("m", MaxModelIDLen), true); !errors.Is(err, errs.ErrConfigStoreUnavailable) {
		t.Fatalf("a model of the bound offline: %v", err)
	}
	if err := s.SetDrained(strings.Repeat("m", MaxModelIDLen+1), true); !errors.Is(err, errs.ErrModelNotFound) {
		t.Fatalf("a model over the bound: %v", err)
	}
	for _, bad := range []Config{
		{Cluster: config.Cluster{Prefix: "/p/"}, Self: Replica{ID: "a b"}},
		{Cluster: config.Cluster{Prefix: "p"}, Self: Replica{ID: "me"}},
		{Cluster: config.Cluster{Prefix: "/p/", TLSCA: "/nonexistent/ca.pem"}, Self: Replica{ID: "me"}},
	} {
		if _, err := Start(bad); err == nil {
			t.Errorf("Start(%+v) accepted", bad)
		}
	}
}

// TestSnapshotDrainBound: a read listing more drained models than the bound keeps exactly the
// bound.
func TestSnapshotDrainBound(t *testing.T) {
	got := newApplied()
	s := offline(t, got)
	var kvs []*mvccpb.KeyValue
	for i := range s.maxDrained + 1 {
		kvs = append(kvs, kv(fmt.Sprintf("drained/m%03d", i), "1", int64(10+i)))
	}
	s.applySnapshot(100, kvs)
	if s.live != s.maxDrained {
		t.Fatalf("%d drained kept from %d listed, bound %d", s.live, len(kvs), s.maxDrained)
	}
}

// TestBackoff: the wait between sessions starts at 100 ms and doubles to 2 s while sessions
// end before they held; one that held (up for 2 s or more) starts it afresh.
func TestBackoff(t *testing.T) {
	var b backoff
	ms := time.Millisecond
	for i, step := range []struct {
		held bool
		want time.Duration
	}{
		{false, 100 * ms}, {false, 200 * ms}, {false, 400 * ms}, {false, 800 * ms}, {false, 1600 * ms},
		{false, 2000 * ms}, {false, 2000 * ms},
		{true, 100 * ms}, {false, 200 * ms}, {true, 100 * ms}, {true, 100 * ms},
	} {
		if got := b.next(step.held); got != step.want {
			t.Fatalf("wait %d (held %v): %v, want %v", i, step.held, got, step.want)
		}
	}
	if got := (&backoff{}).next(true); got != 100*ms {
		t.Fatalf("first wait after a session that held: %v", got)
	}

	clk := clock.NewFake(time.Unix(1000, 0))
	s := &Store{cfg: Config{Clock: clk}}
	up := clk.Now()
	if s.held(time.Time{}) {
		t.Fatal("a session that never got up held")
	}
	clk.Advance(2*time.Second - time.Nanosecond)
	if s.held(up) {
		t.Fatal("held after 2 s − 1 ns")
	}
	clk.Advance(time.Nanosecond)
	if !s.held(up) {
		t.Fatal("not held after 2 s")
	}
}

// applyEvent is one event in a watch answer of its own.
func (s *Store) applyEvent(ev *clientv3.Event) { s.applyEvents([]*clientv3.Event{ev}) }

// TestEventsPushOncePerAnswer: a watch answer of many events tells the gateway each kind of
// change once, with the state after the last event, and decodes every table put in it (a
// valid table followed by an invalid one leaves the valid one's rows, under the invalid
// one's revision, as one event at a time does).
func TestEventsPushOncePerAnswer(t *testing.T) {
	got := newApplied()
	s := offline(t, got)
	var evs []*clientv3.Event
	for i := range 40 {
		evs = append(evs, put(fmt.Sprintf("drained/m%02d", i), "1", 10))
	}
	evs = append(evs,
		put("routes", `{"routes":[{"model":"a"}]}`, 11), put("routes", `{"routes":[{"model":"b"}]}`, 12), put("routes", `garbage`, 13),
		put("static_workers", `{"static_workers":[]}`, 14),
		put("replicas/r1", replicaJSON("r1"), 15), put("replicas/r2", replicaJSON("r2"), 15), del("replicas/r1", 16),
		del("drained/m00", 17))
	s.applyEvents(evs)
	got.mu.Lock()
	defer got.mu.Unlock()
	if got.pushes != 4 {
		t.Fatalf("%d pushes for one answer, want 4 (routes, static workers, drains, replicas)", got.pushes)
	}
	if got.routeRev != 13 || !slices.Equal(routeModels(got.routes), []string{"b"}) || got.static != 14 || got.replicas != 2 {
		t.Fatalf("routes %d %v, static %d, replicas %d", got.routeRev, routeModels(got.routes), got.static, got.replicas)
	}
	if len(got.drains) != 39 || got.drains[0] != "m01" {
		t.Fatalf("drains %v", got.drains)
	}
	got.pushes = 0
	got.mu.Unlock()
	s.applyEvents([]*clientv3.Event{put("drained/m01", "1", 18), put("routes", `{"routes":[{"model":"c"}]}`, 12), put("nothing/here", "1", 19)})
	got.mu.Lock()
	if got.pushes != 0 {
		t.Fatalf("an answer that changes nothing pushed %d times", got.pushes)
	}
}

// TestEventsBatchedAsOneByOne: however a watch's events are cut into answers, the state the
// gateway ends with is the state one event at a time gives, and no answer pushes a kind of
// change twice.
func TestEventsBatchedAsOneByOne(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 60).Draw(rt, "events")
		var evs []*clientv3.Event
		rev := int64(1)
		for i := range n {
			if rapid.IntRange(0, 3).Draw(rt, fmt.Sprintf("same revision %d", i)) > 0 {
				rev++ // else: another event of the same transaction
			}
			key := rapid.SampledFrom([]string{"routes", "static_workers", "drained/a", "drained/b", "drained/c%2Fd", "drained/%zz",
				"replicas/r1", "replicas/r2", "replicas/me", "other"}).Draw(rt, fmt.Sprintf("key %d", i))
			isPut := key == "routes" || key == "static_workers" || rapid.Bool().Draw(rt, fmt.Sprintf("put %d", i))
			switch {
			case !isPut:
				evs = append(evs, del(key, rev))
			case key == "routes":
				evs = append(evs, put(key, rapid.SampledFrom([]string{`{"routes":[{"model":"x"}]}`, `{"routes":[{"model":"y"}]}`, `{"routes":7}`}).Draw(rt, fmt.Sprintf("table %d", i)), rev))
			case key == "static_workers":
				evs = append(evs, put(key, rapid.SampledFrom([]string{`{"static_workers":[]}`, `[`}).Draw(rt, fmt.Sprintf("table %d", i)), rev))
			case strings.HasPrefix(key, "replicas/"):
				evs = append(evs, put(key, replicaJSON(strings.TrimPrefix(key, "replicas/")), rev))
			default:
				evs = append(evs, put(key, "1", rev))
			}
		}
		oneGot := newApplied()
		one := offline(t, oneGot)
		for _, ev := range evs {
			one.applyEvent(ev)
		}
		batched := newApplied()
		b := offline(t, batched)
		for rest := evs; len(rest) > 0; {
			k := rapid.IntRange(1, len(rest)).Draw(rt, "answer")
			batched.mu.Lock()
			before := batched.pushes
			batched.mu.Unlock()
			b.applyEvents(rest[:k])
			batched.mu.Lock()
			if batched.pushes-before > 4 {
				rt.Fatalf("one answer of %d events pushed %d times", k, batched.pushes-before)
			}
			batched.mu.Unlock()
			rest = rest[k:]
		}
		if oneGot.routeRev != batched.routeRev || !slices.Equal(routeModels(oneGot.routes), routeModels(batched.routes)) ||
			oneGot.static != batched.static || len(oneGot.ws) != len(batched.ws) ||
			!slices.Equal(oneGot.drains, batched.drains) || oneGot.replicas != batched.replicas {
			rt.Fatalf("one by one: routes %d %v static %d drains %v replicas %d; batched: routes %d %v static %d drains %v replicas %d",
				oneGot.routeRev, routeModels(oneGot.routes), oneGot.static, oneGot.drains, oneGot.replicas,
				batched.routeRev, routeModels(batched.routes), batched.static, batched.drains, batched.replicas)
		}
	})
}
