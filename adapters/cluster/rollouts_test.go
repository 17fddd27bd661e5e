package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/rollout"
)

var (
	rt0     = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	smolRun = rollout.Spec{Canary: "v4", Baseline: "v3", Steps: []float64{10, 50, 100}, Interval: time.Minute, MinRequests: 10,
		MaxErrorRatio: 1.5, MaxTTFTP99Ratio: 1.25, MaxErrorRate: 0.05}
)

func tally(requests, errors uint64) rollout.Tally {
	t := rollout.Tally{Requests: requests, Errors: errors}
	t.TTFT[4] = requests
	return t
}

func running(spec rollout.Spec, step int, start time.Time) storedRollout {
	return storedRollout{rev: 7, st: rollout.Stored{Spec: rollout.SpecKey(spec), State: rollout.State{Status: rollout.Running, Step: step, WindowStart: start}}}
}

// TestPlanRollouts: the decider's pass — a state for a new or changed rollout, a verdict once
// every live replica's counts for the ended window are in (their sum), a wait for the grace
// while one is missing and a verdict on the others' after it, nothing for a paused one, a
// delete for a route without a rollout, and when the next pass is owed.
func TestPlanRollouts(t *testing.T) {
	specs := map[string]rollout.Spec{"smol": smolRun}
	h, w := routeHash("smol"), rt0.UnixNano()
	both := map[string]map[uint64]closedWindow{
		"a": {h: {window: w, canary: tally(6, 0), baseline: tally(50, 0)}},
		"b": {h: {window: w, canary: tally(6, 0), baseline: tally(40, 0)}},
	}
	live := []string{"a", "b"}
	due := rt0.Add(time.Minute)

	// New: started now, owed at its window's end.
	ws, next := planRollouts(rt0, specs, nil, nil, live, RolloutGrace)
	if len(ws) != 1 || ws[0].rev != 0 || ws[0].val.State.Status != rollout.Running || !ws[0].val.State.WindowStart.Equal(rt0) ||
		ws[0].val.Spec != rollout.SpecKey(smolRun) || !next.Equal(due) {
		t.Fatalf("new: %+v next %v", ws, next)
	}
	// Changed spec: started again over the stored revision.
	other := smolRun
	other.MinRequests = 99
	ws, _ = planRollouts(rt0, specs, map[string]storedRollout{"smol": running(other, 1, rt0)}, nil, live, RolloutGrace)
	if len(ws) != 1 || ws[0].rev != 7 || ws[0].val.State.Step != 0 {
		t.Fatalf("changed: %+v", ws)
	}
	stored := map[string]storedRollout{"smol": running(smolRun, 0, rt0)}
	// Not due: nothing, owed at the end.
	if ws, next = planRollouts(due.Add(-1), specs, stored, both, live, RolloutGrace); len(ws) != 0 || !next.Equal(due) {
		t.Fatalf("before the end: %+v %v", ws, next)
	}
	// Due with both: advance on the sum (12 canary requests ≥ 10), the next window at the end.
	ws, next = planRollouts(due.Add(time.Second), specs, stored, both, live, RolloutGrace)
	if len(ws) != 1 || ws[0].rev != 7 {
		t.Fatalf("due: %+v", ws)
	}
	st := ws[0].val.State
	if st.Step != 1 || !st.WindowStart.Equal(due) || st.History[0].Canary.Requests != 12 || st.History[0].Baseline.Requests != 90 ||
		!next.Equal(due.Add(time.Minute)) {
		t.Fatalf("verdict %+v next %v", st, next)
	}
	if stored["smol"].st.State.Step != 0 || len(stored["smol"].st.State.History) != 0 {
		t.Fatal("the plan changed the stored state it was given")
	}
	// One replica's counts missing, or for another window: wait for the grace, then judge on
	// the rest (6 requests: hold).
	onlyA := map[string]map[uint64]closedWindow{"a": both["a"], "b": {h: {window: w - 1, canary: tally(100, 100)}}}
	if ws, next = planRollouts(due.Add(time.Second), specs, stored, onlyA, live, RolloutGrace); len(ws) != 0 || !next.Equal(due.Add(RolloutGrace)) {
		t.Fatalf("waiting: %+v %v", ws, next)
	}
	ws, _ = planRollouts(due.Add(RolloutGrace), specs, stored, onlyA, live, RolloutGrace)
	if len(ws) != 1 || ws[0].val.State.History[0].Decision != rollout.Hold || ws[0].val.State.History[0].Canary.Requests != 6 {
		t.Fatalf("after the grace: %+v", ws)
	}
	// A replica that is not live is not waited for, and its counts are not summed.
	gone := maps.Clone(both)
	gone["c"] = map[uint64]closedWindow{h: {window: w, canary: tally(1000, 1000)}}
	ws, _ = planRollouts(due, specs, stored, gone, live, RolloutGrace)
	if len(ws) != 1 || ws[0].val.State.History[0].Decision != rollout.Advance {
		t.Fatalf("a gone replica's counts: %+v", ws)
	}
	// The grace is at most half the interval.
	short := smolRun
	short.Interval = 2 * time.Second
	ss := map[string]storedRollout{"smol": running(short, 0, rt0)}
	if _, next = planRollouts(rt0.Add(2*time.Second), map[string]rollout.Spec{"smol": short}, ss, onlyA, live, RolloutGrace); !next.Equal(rt0.Add(3 * time.Second)) {
		t.Fatalf("grace of a 2 s interval ends at %v", next)
	}
	// A verdict over an interval late starts the next window now.
	ws, _ = planRollouts(due.Add(2*time.Minute), specs, stored, both, live, RolloutGrace)
	if !ws[0].val.State.WindowStart.Equal(due.Add(2 * time.Minute)) {
		t.Fatalf("late verdict: window %v", ws[0].val.State.WindowStart)
	}
	// Paused: nothing owed. Removed: deleted.
	paused := running(smolRun, 1, rt0)
	paused.st.State.Status = rollout.Paused
	if ws, next = planRollouts(due, specs, map[string]storedRollout{"smol": paused}, both, live, RolloutGrace); len(ws) != 0 || !next.IsZero() {
		t.Fatalf("paused: %+v %v", ws, next)
	}
	ws, next = planRollouts(due, nil, map[string]storedRollout{"smol": paused, "old": running(smolRun, 0, rt0)}, nil, live, RolloutGrace)
	if len(ws) != 2 || ws[0].route != "old" || ws[0].val != nil || ws[1].route != "smol" || ws[1].val != nil || ws[1].rev != 7 || !next.IsZero() {
		t.Fatalf("removed: %+v", ws)
	}
}

// TestWindowsCodec: a rollout_windows/ value reads back as written; each invalid value is
// refused with its reason; the largest fits the bound.
func TestWindowsCodec(t *testing.T) {
	ws := map[uint64]closedWindow{1: {window: -5, canary: tally(3, 1), baseline: tally(1<<40, 0)}, 2: {window: 9}}
	got, err := decodeWindows(encodeWindows(ws))
	if err != nil || len(got) != 2 || got[1] != ws[1] || got[2] != ws[2] {
		t.Fatalf("%+v %v", got, err)
	}
	if b := encodeWindows(nil); !bytes.Equal(b, []byte{rolloutWindowVersion, 0}) {
		t.Fatalf("empty: %v", b)
	}
	full := make(map[uint64]closedWindow)
	for i := range config.MaxRollouts {
		var tl rollout.Tally
		tl.Requests, tl.Errors = math.MaxUint64, math.MaxUint64
		for j := range tl.TTFT {
			tl.TTFT[j] = math.MaxUint64
		}
		full[uint64(i)] = closedWindow{window: math.MinInt64, canary: tl, baseline: tl}
	}
	b := encodeWindows(full)
	if len(b) > MaxRolloutWindowBytes {
		t.Fatalf("the largest value is %d bytes, over %d", len(b), MaxRolloutWindowBytes)
	}
	if got, err := decodeWindows(b); err != nil || len(got) != config.MaxRollouts || got[3] != full[3] {
		t.Fatalf("the largest: %v", err)
	}
	one := encodeWindows(map[uint64]closedWindow{1: {window: 1}})
	dup := append(append([]byte{rolloutWindowVersion, 2}, one[2:]...), one[2:]...)
	for _, c := range []struct {
		val  []byte
		want string
	}{
		{make([]byte, MaxRolloutWindowBytes+1), "over the bound"},
		{[]byte{2, 0}, "not a version 1"},
		{[]byte{1}, "not a version 1"},
		{[]byte{1, config.MaxRollouts + 1}, "window count"},
		{[]byte{1, 0x80}, "window count"},
		{one[:10], "short"},
		{one[:len(one)-1], "a count"},
		{append(bytes.Clone(one), 0), "bytes after"},
		{dup, "a route twice"},
	} {
		if _, err := decodeWindows(c.val); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%x: %v, want %q", c.val, err, c.want)
		}
	}
}

// FuzzDecodeWindows: whatever another replica put, decoding returns at most MaxRollouts
// windows, and what decodes encodes back to the same bytes when it was canonical.
func FuzzDecodeWindows(f *testing.F) {
	f.Add(encodeWindows(map[uint64]closedWindow{1: {window: 1, canary: tally(3, 1)}}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ws, err := decodeWindows(b)
		if err != nil {
			return
		}
		if len(ws) > config.MaxRollouts {
			t.Fatalf("%d windows", len(ws))
		}
		again, err := decodeWindows(encodeWindows(ws))
		if err != nil || len(again) != len(ws) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// smolRollout is a route table with one rollout of 1 s windows.
func smolRollout() []config.Route {
	return config.NormalizeRoutes([]config.Route{{Model: "smol", Rollout: &config.Rollout{Canary: "v4", Baseline: "v3",
		Steps: []float64{10, 50, 100}, StepInterval: config.Duration(time.Second), MinRequests: 10}}})
}

// stateOf is route smol's stored state as r last applied it.
func stateOf(r replica) (rollout.State, uint64, string, bool) {
	r.got.mu.Lock()
	defer r.got.mu.Unlock()
	st, ok := r.got.states["smol"]
	return st.State, r.got.rolloutVer, r.got.decider, ok
}

// startOnClock is a test replica whose store runs on clk (its probe an hour away on it).
func startOnClock(t *testing.T, endpoint, id string, seed []config.Route, clk clock.Clock) replica {
	t.Helper()
	got := newApplied()
	s, err := Start(Config{
		Cluster: config.Cluster{Enabled: true, EtcdEndpoints: []string{endpoint}, Prefix: "/test/", LeaseTTL: 2 * time.Second},
		Self:    Replica{ID: id, HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2"}, SeedRoutes: seed,
		Apply: got.applier(), Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OpTimeout: 2 * time.Second, ProbeInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return replica{Store: s, got: got}
}

// TestRolloutsAcrossReplicas (R25 with [cluster]), on a fake clock against a real etcd: the
// first replica takes rollout_leader and stores the rollout's first state; the decider judges
// a window when it ends on every replica's counts (their sum), or, missing one, after the
// grace; every replica applies the verdict; an operator's action on any replica is a
// compare-and-swap (a stale If-Match changes nothing); when the decider goes, another takes
// rollout_leader and decides on; a replica started later resumes the stored state.
func TestRolloutsAcrossReplicas(t *testing.T) { rolloutsAcross(t, etcdtest.Start(t)) }

// TestRolloutsOnDebianEtcd34: the same on the machine's etcd 3.4 (the decider's fencing
// compares rollout_leader's lease in a transaction).
func TestRolloutsOnDebianEtcd34(t *testing.T) { rolloutsAcross(t, etcdtest.StartSystem(t, nil)) }

func rolloutsAcross(t *testing.T, etcd interface{ Endpoint() string }) {
	clk := clock.NewFake(rt0)
	a := startOnClock(t, etcd.Endpoint(), "a", smolRollout(), clk)
	a.got.await(t, 5*time.Second, "a stores the first state and decides", func(x *applied) bool {
		st, ok := x.states["smol"]
		return ok && st.State.Status == rollout.Running && x.decider == "a"
	})
	b := startOnClock(t, etcd.Endpoint(), "b", nil, clk)
	b.got.await(t, 5*time.Second, "b follows", func(x *applied) bool {
		st, ok := x.states["smol"]
		return ok && st.State.WindowStart.Equal(rt0) && x.decider == "a"
	})

	// Window 1: both replicas' counts, summed by the decider when the window ends.
	a.CloseWindow("smol", rt0, tally(6, 0), tally(50, 0))
	b.CloseWindow("smol", rt0, tally(6, 0), tally(40, 0))
	awaitWindows(t, a, "b", rt0)
	clk.Advance(time.Second)
	for _, r := range []replica{a, b} {
		r.got.await(t, 5*time.Second, "the verdict on the summed window", func(x *applied) bool {
			st := x.states["smol"].State
			return st.Step == 1 && len(st.History) == 1 && st.History[0].Canary.Requests == 12 && st.History[0].Baseline.Requests == 90
		})
	}
	st, ver, _, _ := stateOf(b)
	if !st.WindowStart.Equal(rt0.Add(time.Second)) {
		t.Fatalf("the next window starts at %v, want the first's end", st.WindowStart)
	}

	// Window 2: b's counts never come; the decider judges on its own after the grace (half
	// the interval): too few requests, a hold.
	a.CloseWindow("smol", st.WindowStart, tally(3, 0), tally(3, 0))
	clk.Advance(time.Second)
	if _, v, _, _ := stateOf(a); v != ver {
		t.Fatal("judged before the grace with a replica's counts missing")
	}
	clk.Advance(time.Second / 2)
	a.got.await(t, 5*time.Second, "the verdict after the grace", func(x *applied) bool {
		h := x.states["smol"].State.History
		return len(h) == 2 && h[1].Decision == rollout.Hold && h[1].Canary.Requests == 3
	})
	b.got.await(t, 5*time.Second, "b applies it", func(x *applied) bool { return len(x.states["smol"].State.History) == 2 })
	_, ver, _, _ = stateOf(b)

	// An operator's pause on b: a stale If-Match changes nothing; the current one pauses both.
	stale := ver - 1
	if err := b.RolloutAction("smol", rollout.Pause, &stale); !errors.Is(err, errs.ErrEtagMismatch) {
		t.Fatalf("stale If-Match: %v", err)
	}
	if err := b.RolloutAction("nope", rollout.Pause, nil); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("no rollout: %v", err)
	}
	if err := b.RolloutAction("smol", "dance", nil); !errors.Is(err, errs.ErrInvalidRequest) {
		t.Fatalf("unknown action: %v", err)
	}
	if err := b.RolloutAction("smol", rollout.Pause, &ver); err != nil {
		t.Fatal(err)
	}
	if st, v, _, _ := stateOf(b); st.Status != rollout.Paused || v <= ver {
		t.Fatalf("b answered before applying its own action: %s at version %d", st.Status, v)
	}
	a.got.await(t, 5*time.Second, "a sees the pause", func(x *applied) bool {
		return x.states["smol"].State.Status == rollout.Paused && x.rolloutVer > ver
	})
	clk.Advance(time.Hour)
	if st, _, _, _ := stateOf(a); st.Status != rollout.Paused || len(st.History) != 3 {
		t.Fatalf("a paused rollout moved: %+v", st)
	}

	// The decider goes: b takes rollout_leader and decides the next window alone.
	a.Close()
	b.got.await(t, 5*time.Second, "b decides", func(x *applied) bool { return x.decider == "b" })
	awaitCond(t, 5*time.Second, "a's windows leave with its lease", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		_, ok := b.windows["a"]
		return !ok
	})
	if err := b.RolloutAction("smol", rollout.Resume, nil); err != nil {
		t.Fatal(err)
	}
	st, _, _, _ = stateOf(b)
	if st.Status != rollout.Running || !st.WindowStart.Equal(clk.Now()) {
		t.Fatalf("resumed: %+v", st)
	}
	b.CloseWindow("smol", st.WindowStart, tally(10, 0), tally(10, 0))
	clk.Advance(time.Second)
	b.got.await(t, 5*time.Second, "b's verdict", func(x *applied) bool {
		st := x.states["smol"].State
		return st.Step == 2 && st.History[len(st.History)-1].Decision == rollout.Advance
	})
	st, _, _, _ = stateOf(b)

	// A restart: a replica started after the others resumes the stored state.
	b.Close()
	c := startOnClock(t, etcd.Endpoint(), "c", nil, clk)
	c.got.await(t, 5*time.Second, "c resumes the stored state", func(x *applied) bool {
		got, ok := x.states["smol"]
		return ok && got.State.Same(st) && got.State.Step == 2 && x.decider == "c"
	})

	// The rollout leaves the table: the decider deletes its state, and nothing is left of it.
	c.got.mu.Lock()
	etag := c.got.routeRev
	c.got.mu.Unlock()
	if _, err := c.PutRoutes(etag, config.NormalizeRoutes([]config.Route{{Model: "smol", Backends: []config.Backend{{Model: "v3", Weight: 1}}}})); err != nil {
		t.Fatal(err)
	}
	c.got.await(t, 5*time.Second, "the state is deleted", func(x *applied) bool { return len(x.states) == 0 })
	cli := rawClient(t, etcd.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/test/"+DirRollouts, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("rollouts/ keys left: %v %v", resp, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.rollouts) != 0 || len(c.own) != 0 || len(c.windows) != 0 {
		t.Fatalf("left: %d states, %d own windows, %d replicas' windows", len(c.rollouts), len(c.own), len(c.windows))
	}
}

// awaitWindows waits until r has read replica id's closed window of smol that began at w.
func awaitWindows(t *testing.T, r replica, id string, w time.Time) {
	t.Helper()
	r.got.await(t, 5*time.Second, "the decider reads "+id+"'s counts", func(*applied) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.windows[id][routeHash("smol")].window == w.UnixNano()
	})
}

// TestRolloutEntriesBounded: what other parties put is held within its bounds — stored
// rollouts up to config.MaxRollouts (a newer put of a kept one still applies, an invalid one
// keeps the last), other replicas' windows up to the replica bound (this replica's own are not
// taken from etcd), a window value of the byte bound read as a value (not refused for its
// size); this replica's own closed windows are pruned to the table's rollout routes once past
// config.MaxRollouts.
func TestRolloutEntriesBounded(t *testing.T) {
	got := newApplied()
	s := offline(t, got)
	st, _ := rollout.Stored{Spec: rollout.SpecKey(smolRun), State: rollout.State{Status: rollout.Paused}}.Encode()
	var evs []*clientv3.Event
	for i := range config.MaxRollouts + 1 {
		evs = append(evs, put(fmt.Sprintf("rollouts/r%03d", i), string(st), int64(10+i)))
	}
	evs = append(evs, put("rollouts/r000", "garbage", 100), put("rollouts/r001", string(st), 101))
	s.applyEvents(evs)
	if len(s.rollouts) != config.MaxRollouts || s.rollouts[fmt.Sprintf("r%03d", config.MaxRollouts)].rev != 0 {
		t.Fatalf("%d stored rollouts kept", len(s.rollouts))
	}
	if s.rollouts["r000"].rev != 10 || s.rollouts["r001"].rev != 101 || s.rolloutRev != 101 {
		t.Fatalf("r000 at %d, r001 at %d, version %d", s.rollouts["r000"].rev, s.rollouts["r001"].rev, s.rolloutRev)
	}
	got.mu.Lock()
	n, ver := len(got.states), got.rolloutVer
	got.mu.Unlock()
	if n != config.MaxRollouts || ver != 101 {
		t.Fatalf("pushed %d states at version %d", n, ver)
	}
	s.applyEvent(del("rollouts/r002", 102))
	if _, ok := s.rollouts["r002"]; ok || s.rolloutRev != 102 {
		t.Fatal("a deleted state stayed")
	}

	w := string(encodeWindows(map[uint64]closedWindow{1: {window: 5}}))
	evs = nil
	for i := range s.maxReplicas + 1 {
		evs = append(evs, put(fmt.Sprintf("rollout_windows/r%02d", i), w, 200))
	}
	s.applyEvents(append(evs, put("rollout_windows/me", w, 201)))
	if len(s.windows) != s.maxReplicas || s.windows[fmt.Sprintf("r%02d", s.maxReplicas)] != nil || s.windows["me"] != nil {
		t.Fatalf("%d replicas' windows kept", len(s.windows))
	}
	s.applyEvent(put("rollout_windows/r00", "bad", 202))
	if _, ok := s.windows["r00"]; ok {
		t.Fatal("an unreadable value kept the replica's last windows")
	}
	if _, err := decodeWindows(make([]byte, MaxRolloutWindowBytes)); err == nil || strings.Contains(err.Error(), "over the bound") {
		t.Fatalf("a value of exactly the bound: %v", err)
	}

	s.routes.rows = smolRollout()
	s.CloseWindow("smol", rt0, tally(1, 0), rollout.Tally{})
	for i := range config.MaxRollouts - 1 {
		s.CloseWindow(fmt.Sprintf("gone%d", i), rt0, rollout.Tally{}, rollout.Tally{})
	}
	if len(s.own) != config.MaxRollouts {
		t.Fatalf("%d own windows at the bound", len(s.own))
	}
	s.CloseWindow("gone-last", rt0, rollout.Tally{}, rollout.Tally{})
	if len(s.own) != 1 || s.own[routeHash("smol")].canary.Requests != 1 {
		t.Fatalf("%d own windows past the bound, want smol's alone", len(s.own))
	}
}

// TestDeciderTTL: the decider's lease is half the replicas' lease TTL, at least 1 s.
func TestDeciderTTL(t *testing.T) {
	for ttl, want := range map[time.Duration]int64{10 * time.Second: 5, 3 * time.Second: 1, 2 * time.Second: 1, time.Hour: 1800} {
		s := &Store{cfg: Config{Cluster: config.Cluster{LeaseTTL: ttl}}}
		if got := s.deciderTTL(); got != want {
			t.Errorf("lease_ttl %v: decider lease %d s, want %d", ttl, got, want)
		}
	}
}
