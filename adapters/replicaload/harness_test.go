package replicaload

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgw/tlgw/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// secret is the fleet's peer secret in these tests; bearer is what a replica sends with it.
var (
	secret = []byte("0123456789abcdef0123456789abcdef")
	bearer = "Bearer " + hex.EncodeToString(secret)
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeRouter records what the exchange tells it and answers a settable own load.
type fakeRouter struct {
	mu      sync.Mutex
	own     []WorkerLoad
	ownErr  error
	block   bool // OwnLoad waits for its context
	owned   int  // OwnLoad calls
	tables  map[string][]WorkerLoad
	calls   []string // "set <replica> <loads>" and "forget <replica>", in order
	changed chan struct{}
}

func newRouter() *fakeRouter {
	return &fakeRouter{tables: map[string][]WorkerLoad{}, changed: make(chan struct{}, 1)}
}

func (r *fakeRouter) OwnLoad(ctx context.Context) ([]WorkerLoad, error) {
	r.mu.Lock()
	r.owned++
	own, err, block := slices.Clone(r.own), r.ownErr, r.block
	r.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return own, err
}

func (r *fakeRouter) SetReplicaLoad(replica string, loads []WorkerLoad) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tables[replica] = loads
	r.calls = append(r.calls, fmt.Sprintf("set %s %v", replica, loads))
}

func (r *fakeRouter) ForgetReplica(replica string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tables, replica)
	r.calls = append(r.calls, "forget "+replica)
}

func (r *fakeRouter) setOwn(loads ...WorkerLoad) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.own = loads
}

// held is the table the router holds for replica (ok false: none).
func (r *fakeRouter) held(replica string) ([]WorkerLoad, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tables[replica]
	return t, ok
}

func (r *fakeRouter) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *fakeRouter) ownCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owned
}

// eventually polls cond until it holds, failing after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		<-tick.C
	}
}

// liveSet is the replicas a server takes as live.
type liveSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func newLive(ids ...string) *liveSet {
	l := &liveSet{ids: map[string]bool{}}
	for _, id := range ids {
		l.ids[id] = true
	}
	return l
}

func (l *liveSet) has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ids[id]
}

func (l *liveSet) set(id string, live bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids[id] = live
}

// testServer is a replica's ReplicaLoad server on a loopback port.
type testServer struct {
	addr   string
	srv    *Server
	router *fakeRouter
	live   *liveSet
	reg    *prometheus.Registry
	opts   Options
	gs     *grpc.Server
	done   chan struct{}
}

// startServer serves replica self; edit adjusts its options. Stopped when the test ends.
func startServer(t *testing.T, self string, live *liveSet, edit func(*Options)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{addr: ln.Addr().String(), live: live}
	ts.opts = Options{Self: self, Secret: secret, Live: live.has, Logger: quiet}
	if edit != nil {
		edit(&ts.opts)
	}
	ts.serve(t, ln)
	t.Cleanup(ts.stop)
	return ts
}

// serve starts a fresh Server (a new process, as it were) with a fresh router on ln.
func (ts *testServer) serve(t *testing.T, ln net.Listener) {
	t.Helper()
	ts.router, ts.reg = newRouter(), prometheus.NewRegistry()
	o := ts.opts
	o.Router, o.Registerer = ts.router, ts.reg
	ts.srv = NewServer(o)
	ts.gs = grpc.NewServer()
	ts.srv.Register(ts.gs)
	ts.done = make(chan struct{})
	go func() {
		defer close(ts.done)
		_ = ts.gs.Serve(ln)
	}()
}

func (ts *testServer) stop() {
	ts.gs.Stop()
	<-ts.done
}

// restart stops the server and serves a new one on the same address.
func (ts *testServer) restart(t *testing.T) {
	t.Helper()
	ts.stop()
	ln, err := net.Listen("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	ts.serve(t, ln)
}

// recClock is a fake clock that counts the waits it is asked for, by length.
type recClock struct {
	*clock.Fake
	mu    sync.Mutex
	waits []time.Duration
}

func newClock() *recClock { return &recClock{Fake: clock.NewFake(time.Unix(1700000000, 0))} }

// AfterFunc schedules f, then counts the wait: once a wait is counted, an Advance fires it.
func (c *recClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	tm := c.Fake.AfterFunc(d, f)
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	return tm
}

// asked is how many waits of length d were asked for.
func (c *recClock) asked(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, w := range c.waits {
		if w == d {
			n++
		}
	}
	return n
}

// backoffs is the waits asked for that are not a tick's (Interval) or OwnLoad's bound
// (Refresh): the peers' redial backoffs, in order.
func (c *recClock) backoffs() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for _, w := range c.waits {
		if w != DefaultInterval && w != DefaultRefresh {
			out = append(out, w)
		}
	}
	return out
}

// testSharer is a running Sharer on a recClock.
type testSharer struct {
	sh     *Sharer
	clk    *recClock
	router *fakeRouter
	reg    *prometheus.Registry
	mu     sync.Mutex
	peers  []Peer
	ticks  int // ticks the test has let run (the first runs at once)
	cancel context.CancelFunc
	done   chan struct{}
}

func startSharer(t *testing.T, self string, peers []Peer, edit func(*SharerOptions)) *testSharer {
	t.Helper()
	ts := &testSharer{clk: newClock(), router: newRouter(), reg: prometheus.NewRegistry(), peers: peers, ticks: 1, done: make(chan struct{})}
	o := SharerOptions{
		Self: self, Secret: secret, Router: ts.router, Peers: ts.getPeers,
		DialOptions: startSharerDial(),
		Clock:       ts.clk, Logger: quiet, Registerer: ts.reg,
	}
	if edit != nil {
		edit(&o)
	}
	ts.sh = NewSharer(o)
	ctx, cancel := context.WithCancel(context.Background())
	ts.cancel = cancel
	go func() {
		defer close(ts.done)
		ts.sh.Run(ctx)
	}()
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testSharer) getPeers() []Peer {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.peers)
}

func (ts *testSharer) setPeers(ps ...Peer) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.peers = ps
}

func (ts *testSharer) stop() {
	ts.cancel()
	<-ts.done
}

// settle waits until the sharer's last tick is over (it has scheduled the next).
func (ts *testSharer) settle(t *testing.T) {
	t.Helper()
	eventually(t, "the tick is over", func() bool { return ts.clk.asked(DefaultInterval) >= ts.ticks })
}

// tick waits until the sharer's last tick is over, then lets the next one run.
func (ts *testSharer) tick(t *testing.T) {
	t.Helper()
	ts.settle(t)
	ts.clk.Advance(DefaultInterval)
	ts.ticks++
}

// tickUntil lets ticks run, each once the one before is over, until cond holds: at most n
// more ticks, and 10 s. Ticks run faster than the network: what takes more than one round
// trip (a failure seen, then a redial after a backoff on the clock) needs a generous n.
func (ts *testSharer) tickUntil(t *testing.T, n int, what string, cond func() bool) {
	t.Helper()
	deadline, last := time.Now().Add(10*time.Second), ts.ticks+n
	poll := time.NewTicker(time.Millisecond)
	defer poll.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %d ticks and 10 s", what, n)
		}
		if ts.ticks < last && ts.clk.asked(DefaultInterval) >= ts.ticks {
			ts.clk.Advance(DefaultInterval)
			ts.ticks++
		}
		<-poll.C
	}
}

func startSharerDial() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
}

// logRecorder is a slog handler that keeps every record (at most what a test logs).
type logRecorder struct {
	mu   *sync.Mutex
	recs *[]string // "LEVEL msg key=value …"
}

func newLogRecorder() (*slog.Logger, func() []string) {
	r := logRecorder{mu: &sync.Mutex{}, recs: new([]string)}
	return slog.New(r), func() []string {
		r.mu.Lock()
		defer r.mu.Unlock()
		return slices.Clone(*r.recs)
	}
}

func (logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r logRecorder) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Level.String() + " " + rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.recs = append(*r.recs, line)
	return nil
}

func (r logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r logRecorder) WithGroup(string) slog.Handler      { return r }

// matching is the lines that start with prefix.
func matching(lines []string, prefix string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}
