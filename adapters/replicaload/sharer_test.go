package replicaload

import (
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
)

func holds(r *fakeRouter, replica string, want ...WorkerLoad) func() bool {
	return func() bool {
		got, ok := r.held(replica)
		return ok && slices.Equal(got, want) && (len(want) > 0 || got != nil)
	}
}

func forgot(r *fakeRouter, replica string) func() bool {
	return func() bool { _, ok := r.held(replica); return !ok }
}

// TestShareReachesPeerAndFollowsChanges: a sharer's own load reaches the peer's router as its
// table (sorted, zeros left out), each change follows, and stopping the sharer ends the stream,
// which the peer forgets.
func TestShareReachesPeerAndFollowsChanges(t *testing.T) {
	b := startServer(t, "b", newLive("a", "b"), nil)
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}}, nil)
	sh.router.setOwn(WorkerLoad{"w2", 1}, WorkerLoad{"w1", 3}, WorkerLoad{"w3", 0})
	sh.tickUntil(t, 5, "the first table", holds(b.router, "a", WorkerLoad{"w1", 3}, WorkerLoad{"w2", 1}))
	sh.router.setOwn(WorkerLoad{"w2", 5})
	sh.tickUntil(t, 5, "a change", holds(b.router, "a", WorkerLoad{"w2", 5}))
	sh.router.setOwn()
	sh.tickUntil(t, 5, "nothing in flight", holds(b.router, "a"))
	sh.stop()
	eventually(t, "forgotten once the sharer stops", forgot(b.router, "a"))
	if got := testutil.ToFloat64(sh.sh.m.failures); got != 0 {
		t.Fatalf("stream failures = %v", got)
	}
}

// TestUnchangedTableResentAfterRefresh: an unchanged table is not sent at each tick but again
// once Refresh (1 s) has passed since the last send; a change is sent at the next tick. The
// stream is in order, so a send at any of ticks 1–9 would show before the one at 1 s.
func TestUnchangedTableResentAfterRefresh(t *testing.T) {
	b := startServer(t, "b", newLive("a"), nil)
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}}, nil)
	sh.router.setOwn(WorkerLoad{"w", 1})
	// The first tick may have read the load before it was set: wait for a tick that sent it.
	sh.tickUntil(t, 5, "the table", holds(b.router, "a", WorkerLoad{"w", 1}))
	before := len(b.router.log())
	for range 9 {
		sh.tick(t)
	}
	sh.tick(t) // 1 s after the send
	eventually(t, "the table sent again at 1 s", func() bool { return len(b.router.log()) == before+1 })
	sh.router.setOwn(WorkerLoad{"w", 2})
	sh.tick(t)
	eventually(t, "the change sent at once", func() bool { return len(b.router.log()) == before+2 })
	log := b.router.log()
	if d := cmp.Diff([]string{"set a [{w 1}]", "set a [{w 1}]", "set a [{w 2}]"}, log[before-1:]); d != "" {
		t.Fatalf("router calls (-want +got):\n%s", d)
	}
}

// TestPeerGoneClosedNewOneDialled: a peer that leaves the list has its stream closed (it
// forgets this replica) and a new one is dialled and filled at once; a peer at a new address
// is dialled there.
func TestPeerGoneClosedNewOneDialled(t *testing.T) {
	live := newLive("a")
	b := startServer(t, "b", live, nil)
	c := startServer(t, "c", live, nil)
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}}, nil)
	sh.router.setOwn(WorkerLoad{"w", 1})
	sh.tickUntil(t, 5, "b has the table", holds(b.router, "a", WorkerLoad{"w", 1}))
	sh.setPeers(Peer{ID: "c", Address: c.addr})
	sh.tickUntil(t, 2, "c has the table, b forgot it", func() bool {
		return holds(c.router, "a", WorkerLoad{"w", 1})() && forgot(b.router, "a")()
	})
	sh.setPeers(Peer{ID: "c", Address: b.addr}) // c moved to where b was
	sh.tickUntil(t, 2, "the new address has the table, the old forgot it", func() bool {
		return holds(b.router, "a", WorkerLoad{"w", 1})() && forgot(c.router, "a")()
	})
}

// TestServerRestartRedialledWithBackoff: a peer that restarts is redialled after 200 ms; a
// peer that stays away is redialled after 200 ms, 400 ms, … up to 5 s between tries (a stream
// that held for 5 s starts the backoff over), and reached when it is back.
func TestServerRestartRedialledWithBackoff(t *testing.T) {
	b := startServer(t, "b", newLive("a"), nil)
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}}, nil)
	sh.router.setOwn(WorkerLoad{"w", 1})
	sh.tickUntil(t, 5, "the table", holds(b.router, "a", WorkerLoad{"w", 1}))
	b.restart(t)
	sh.tickUntil(t, 2000, "the broken stream seen", func() bool { return len(sh.clk.backoffs()) == 1 })
	// The redial 200 ms later starts its stream with the latest table: no tick sends it (it
	// is unchanged, and was refreshed when the break was seen).
	sh.tickUntil(t, 3, "the restarted peer has the table", holds(b.router, "a", WorkerLoad{"w", 1}))
	sh.router.setOwn(WorkerLoad{"w", 2})
	sh.tickUntil(t, 2, "the new stream carries the next change", holds(b.router, "a", WorkerLoad{"w", 2}))
	if d := cmp.Diff([]time.Duration{minBackoff}, sh.clk.backoffs()); d != "" {
		t.Fatalf("backoffs (-want +got):\n%s", d)
	}
	for range 50 { // the stream holds for 5 s
		sh.tick(t)
	}
	b.stop()
	sh.tickUntil(t, 2000, "seven tries", func() bool { return len(sh.clk.backoffs()) >= 8 })
	want := []time.Duration{minBackoff, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second}
	if d := cmp.Diff(want, sh.clk.backoffs()[:8]); d != "" {
		t.Fatalf("backoffs (-want +got):\n%s", d)
	}
	ln, err := net.Listen("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	b.serve(t, ln)
	sh.tickUntil(t, 2000, "the peer back has the table", holds(b.router, "a", WorkerLoad{"w", 2}))
	if got, n := testutil.ToFloat64(sh.sh.m.failures), len(sh.clk.backoffs()); got != float64(n) {
		t.Fatalf("stream failures = %v, backoffs %d", got, n)
	}
}

// TestSlowPeerHoldsUpNobody: a peer that never answers (a socket that accepts and says
// nothing) holds up neither the ticks nor the other peer, which gets every change.
func TestSlowPeerHoldsUpNobody(t *testing.T) {
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	held.Add(1)
	go func() {
		defer held.Done()
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = mute.Close()
		held.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	c := startServer(t, "c", newLive("a"), nil)
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: mute.Addr().String()}, {ID: "c", Address: c.addr}}, nil)
	for i := range 20 {
		sh.router.setOwn(WorkerLoad{"w", int64(i + 1)})
		sh.tickUntil(t, 3, "c follows", holds(c.router, "a", WorkerLoad{"w", int64(i + 1)}))
	}
	mu.Lock()
	n := len(conns)
	mu.Unlock()
	if n != 1 {
		t.Fatalf("%d connections to the mute peer, want 1", n)
	}
}

// TestOfferKeepsOnlyTheLatest: a peer's slot holds one table, the newest.
func TestOfferKeepsOnlyTheLatest(t *testing.T) {
	p := &peer{slot: make(chan []*replicav1.LoadTable, 1)}
	t1, t2, t3 := tbl("a", "w:1"), tbl("a", "w:2"), tbl("a", "w:3")
	p.offer([]*replicav1.LoadTable{t1})
	p.offer([]*replicav1.LoadTable{t2})
	if got := <-p.slot; got[0] != t2 || len(p.slot) != 0 {
		t.Fatalf("took %v, %d left", got, len(p.slot))
	}
	p.offer([]*replicav1.LoadTable{t3})
	if got := <-p.slot; got[0] != t3 {
		t.Fatalf("took %v", got)
	}
}

// TestChoosePeers: self, empty ids and addresses are skipped, an id listed twice keeps its
// first address, and past MaxPeers the first by id are kept and the rest counted.
func TestChoosePeers(t *testing.T) {
	s := NewSharer(SharerOptions{Self: "a", Secret: secret, Router: newRouter(), Peers: func() []Peer { return nil },
		DialOptions: startSharerDial(), MaxPeers: 3})
	got, ignored := s.choose([]Peer{
		{"e", "e:1"}, {"a", "self:1"}, {"", "x:1"}, {"c", ""}, {"d", "d:1"}, {"b", "b:1"}, {"d", "d:2"}, {"c", "c:1"},
	})
	if d := cmp.Diff(map[string]string{"b": "b:1", "c": "c:1", "d": "d:1"}, got); d != "" || ignored != 1 {
		t.Fatalf("chose (-want +got):\n%s ignored %d", d, ignored)
	}
	got, ignored = s.choose([]Peer{{"b", "b:1"}, {"c", "c:1"}, {"d", "d:1"}})
	if len(got) != 3 || ignored != 0 {
		t.Fatalf("exactly MaxPeers: %v ignored %d", got, ignored)
	}
}

// TestPeersOverTheBoundIgnored: past MaxPeers the extra peers are not dialled and are counted.
func TestPeersOverTheBoundIgnored(t *testing.T) {
	live := newLive("a")
	b := startServer(t, "b", live, nil)
	c := startServer(t, "c", live, nil)
	logger, lines := newLogRecorder()
	sh := startSharer(t, "a", []Peer{{ID: "c", Address: c.addr}, {ID: "b", Address: b.addr}}, func(o *SharerOptions) { o.MaxPeers, o.Logger = 1, logger })
	sh.router.setOwn(WorkerLoad{"w", 1})
	sh.tickUntil(t, 5, "b has the table", holds(b.router, "a", WorkerLoad{"w", 1}))
	if got := testutil.ToFloat64(sh.sh.m.ignored); got != 1 {
		t.Fatalf("ignored = %v", got)
	}
	sh.setPeers(Peer{ID: "c", Address: c.addr})
	sh.tickUntil(t, 5, "c has the table once b is gone", holds(c.router, "a", WorkerLoad{"w", 1}))
	if got := testutil.ToFloat64(sh.sh.m.ignored); got != 0 {
		t.Fatalf("ignored = %v", got)
	}
	if got := matching(lines(), "WARN more replicas than"); len(got) != 1 {
		t.Fatalf("warned %q, want once, when peers were ignored", got)
	}
}

// TestOwnLoadFailsOrHangs: a tick whose OwnLoad fails sends nothing; one that hangs is cut
// off after Refresh on the clock, and the ticks go on.
func TestOwnLoadFailsOrHangs(t *testing.T) {
	b := startServer(t, "b", newLive("a"), nil)
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}}, nil)
	sh.router.setOwn(WorkerLoad{"w", 1})
	sh.tickUntil(t, 5, "the table", holds(b.router, "a", WorkerLoad{"w", 1}))
	sh.settle(t)
	sh.router.mu.Lock()
	sh.router.own, sh.router.ownErr = []WorkerLoad{{"w", 2}}, errors.New("router away")
	sh.router.mu.Unlock()
	before := len(b.router.log())
	for range 12 { // past Refresh: not even the refresh goes out
		sh.tick(t)
	}
	sh.settle(t)
	sh.router.mu.Lock()
	sh.router.ownErr, sh.router.block = nil, true
	calls := sh.router.owned
	sh.router.mu.Unlock()
	sh.tick(t)
	eventually(t, "OwnLoad called and waiting", func() bool { return sh.router.ownCalls() > calls })
	if d, ok := sh.clk.Next(); !ok || d != DefaultRefresh {
		t.Fatalf("the next wait is %v %v, want OwnLoad's bound %v", d, ok, DefaultRefresh)
	}
	sh.router.mu.Lock()
	sh.router.block = false
	sh.router.mu.Unlock()
	sh.clk.Advance(DefaultRefresh)
	if got := len(b.router.log()); got != before {
		t.Fatalf("sent while OwnLoad failed: %v", b.router.log()[before:])
	}
	sh.tickUntil(t, 5, "sent once OwnLoad answers", holds(b.router, "a", WorkerLoad{"w", 2}))
}

// TestSharerSendsOnlyValidTables: whatever the router answers, what reaches a server is a table
// it accepts: invalid, zero and repeated entries left out, counts capped, the busiest workers
// kept.
func TestSharerSendsOnlyValidTables(t *testing.T) {
	b := startServer(t, "b", newLive("a"), func(o *Options) { o.MaxWorkers = 3 })
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}}, func(o *SharerOptions) { o.MaxWorkers = 3 })
	sh.router.setOwn(WorkerLoad{"w1", 1}, WorkerLoad{"w2", 7}, WorkerLoad{"w2", 9}, WorkerLoad{"", 5},
		WorkerLoad{strings.Repeat("x", MaxWorkerIDLen+1), 5}, WorkerLoad{"w3", 0}, WorkerLoad{"w4", -2},
		WorkerLoad{"w5", 1 << 40}, WorkerLoad{"w6", 2}, WorkerLoad{strings.Repeat("y", MaxWorkerIDLen), 3})
	sh.tickUntil(t, 5, "the valid table", holds(b.router, "a", WorkerLoad{"w2", 9}, WorkerLoad{"w5", MaxInFlight}, WorkerLoad{strings.Repeat("y", MaxWorkerIDLen), 3}))
	if got := outcome(b, outcomeRejected); got != 0 {
		t.Fatalf("rejected = %v", got)
	}
}

// TestSharerWrongSecret: a sharer with another secret is refused, reaches nothing, and keeps
// redialling with backoff.
func TestSharerWrongSecret(t *testing.T) {
	b := startServer(t, "b", newLive("a"), nil)
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}}, func(o *SharerOptions) { o.Secret = []byte("not the fleet's") })
	sh.router.setOwn(WorkerLoad{"w", 1})
	sh.tickUntil(t, 2000, "refused twice", func() bool { return outcome(b, outcomeUnauthenticated) >= 2 })
	if got := b.router.log(); len(got) != 0 {
		t.Fatalf("the router heard %v", got)
	}
	if got := testutil.ToFloat64(sh.sh.m.failures); got < 1 {
		t.Fatalf("stream failures = %v", got)
	}
}

func TestNextBackoff(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 8 {
		d = nextBackoff(d, maxBackoff-time.Nanosecond)
		got = append(got, d)
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second, 5 * time.Second}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	if got := nextBackoff(maxBackoff, maxBackoff); got != minBackoff {
		t.Fatalf("after a stream that held %v: %v", maxBackoff, got)
	}
}

func TestNewSharerNeedsItsOptions(t *testing.T) {
	full := SharerOptions{Self: "a", Secret: secret, Router: newRouter(), Peers: func() []Peer { return nil }, DialOptions: startSharerDial()}
	for _, edit := range []func(*SharerOptions){
		func(o *SharerOptions) { o.Self = "" }, func(o *SharerOptions) { o.Secret = nil },
		func(o *SharerOptions) { o.Router = nil }, func(o *SharerOptions) { o.Peers = nil },
		func(o *SharerOptions) { o.DialOptions = nil },
	} {
		o := full
		edit(&o)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewSharer(%+v) did not panic", o)
				}
			}()
			NewSharer(o)
		}()
	}
	s := NewSharer(full)
	if s.o.Interval != DefaultInterval || s.o.Refresh != DefaultRefresh || s.o.MaxPeers != MaxReplicas || s.o.MaxWorkers != DefaultMaxWorkers || s.o.Clock == nil || s.log == nil {
		t.Fatalf("defaults: %+v", s.o)
	}
	if s.bearer != bearer {
		t.Fatalf("bearer %q", s.bearer)
	}
}

// TestSharerLogs: a peer's first failure in a row is a warning naming the peer's answer, the
// ones after it debug lines; peers over the bound are warned of once, not at every tick.
func TestSharerLogs(t *testing.T) {
	b := startServer(t, "b", newLive("a"), nil)
	c := startServer(t, "c", newLive("a"), nil)
	logger, lines := newLogRecorder()
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: b.addr}, {ID: "c", Address: c.addr}}, func(o *SharerOptions) {
		o.Secret, o.Logger, o.MaxPeers = []byte("not the fleet's"), logger, 1
	})
	sh.router.setOwn(WorkerLoad{"w", 1})
	failed := func() []string { return matching(lines(), "") }
	sh.tickUntil(t, 2000, "three failures logged", func() bool {
		n := 0
		for _, l := range failed() {
			if strings.Contains(l, "a load stream to a replica failed") {
				n++
			}
		}
		return n >= 3
	})
	all := failed()
	var warn, debug []string
	for _, l := range all {
		if strings.Contains(l, "a load stream to a replica failed") {
			if strings.HasPrefix(l, "WARN") {
				warn = append(warn, l)
			} else if strings.HasPrefix(l, "DEBUG") {
				debug = append(debug, l)
			}
		}
	}
	if len(warn) != 1 || len(debug) < 2 || !strings.Contains(warn[0], "Unauthenticated") || !strings.Contains(warn[0], "replica=b") {
		t.Fatalf("warnings %q, debug lines %q", warn, debug)
	}
	if got := matching(lines(), "WARN more replicas than"); len(got) != 1 || !strings.Contains(got[0], "ignored=1") {
		t.Fatalf("over the bound: %q", got)
	}
}
