package grpcapi

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/connectivity"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
)

// TestConnectionBoundsDefaults: a zero Options bounds the handshake at 10 s and idleness at
// 5 min; values given are kept, and a negative one is the default.
func TestConnectionBoundsDefaults(t *testing.T) {
	if hs, idle := (Options{}).bounds(); hs != 10*time.Second || idle != 5*time.Minute {
		t.Fatalf("defaults: handshake %v, idle %v", hs, idle)
	}
	if hs, idle := (Options{HandshakeTimeout: time.Second, MaxConnectionIdle: time.Minute}).bounds(); hs != time.Second || idle != time.Minute {
		t.Fatalf("set: handshake %v, idle %v", hs, idle)
	}
	if hs, idle := (Options{HandshakeTimeout: -1, MaxConnectionIdle: -1}).bounds(); hs != DefaultHandshakeTimeout || idle != DefaultMaxConnectionIdle {
		t.Fatalf("negative: handshake %v, idle %v", hs, idle)
	}
}

// logBuf is a logger whose records a test reads back.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func newTestEngines(o EnginesOptions) (*Engines, *clock.Fake, *logBuf) {
	fc := clock.NewFake(time.Unix(1_000, 0))
	logs := &logBuf{}
	o.Clock, o.Logger = fc, slog.New(slog.NewTextHandler(logs, nil))
	return NewEngines(o), fc, logs
}

// checkEmpty fails unless e holds no registration and no connection: its tables are empty
// once the work is done.
func checkEmpty(t *testing.T, e *Engines) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.owners) != 0 || e.open != 0 {
		t.Fatalf("%d registrations and %d connections left", len(e.owners), e.open)
	}
}

func at(id string, reg uint64, addr string) request.Endpoint {
	return request.Endpoint{WorkerID: id, Reg: reg, Addr: addr}
}

// refusedUndialled reports whether err is a call's error for a connection Engines would not
// make: a dial error (the request fails over, no retry slot) wrapping want.
func refusedUndialled(err, want error) bool {
	var op *net.OpError
	return errors.Is(err, want) && errors.As(err, &op) && op.Op == "dial"
}

// TestConnectionsBelongToRegistrations (R20): two workers advertising one address each get a
// connection of their own; the expiry of one (an impostor that registered the other's
// address) closes its own alone. A call for a registration that is gone, or for an address
// its registration does not advertise, dials nothing; a new registration of an id replaces the
// old one's connections; the tables are empty once every registration is forgotten.
func TestConnectionsBelongToRegistrations(t *testing.T) {
	e, _, _ := newTestEngines(EnginesOptions{})
	defer e.Close()
	shared, kv := "127.0.0.1:1", "127.0.0.1:2"
	victim := router.WorkerInfo{ID: "victim", Reg: 1, GRPCAddress: shared, KVAddress: kv}
	impostor := router.WorkerInfo{ID: "impostor", Reg: 2, GRPCAddress: shared}
	e.Accept(victim, nil)
	e.Accept(impostor, nil)
	cv, err := e.conn(at("victim", 1, shared))
	if err != nil {
		t.Fatal(err)
	}
	ci, err := e.conn(at("impostor", 2, shared))
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := e.conn(at("victim", 1, shared)); cv == ci || again != cv || e.Len() != 2 {
		t.Fatalf("shared: %v, reused: %v, %d conns", cv == ci, again == cv, e.Len())
	}
	if _, err := e.conn(at("victim", 1, kv)); err != nil || e.Len() != 3 {
		t.Fatalf("the victim's KV address: %v, %d conns", err, e.Len())
	}

	e.Forget(impostor)
	if ci.cc.GetState() != connectivity.Shutdown || cv.cc.GetState() == connectivity.Shutdown || e.Len() != 2 {
		t.Fatalf("after the impostor's expiry: impostor %v, victim %v, %d conns", ci.cc.GetState(), cv.cc.GetState(), e.Len())
	}
	if _, err := e.conn(at("impostor", 2, shared)); !refusedUndialled(err, errNotRegistered) || e.Len() != 2 {
		t.Fatalf("a call for the expired impostor: %v, %d conns", err, e.Len())
	}
	e.Forget(router.WorkerInfo{ID: "victim", Reg: 7}) // another registration's eviction: not the victim's
	for _, c := range []struct {
		at   request.Endpoint
		want error
	}{
		{at("victim", 1, "127.0.0.1:3"), errNotFollowed}, // an address the victim never advertised
		{at("victim", 1, ""), errNotFollowed},
		{at("victim", 2, shared), errNotRegistered}, // a registration that is not the victim's
		{at("nobody", 1, shared), errNotRegistered},
	} {
		if _, err := e.conn(c.at); !refusedUndialled(err, c.want) {
			t.Errorf("%+v: %v, want a dial error wrapping %v", c.at, err, c.want)
		}
	}
	if e.Len() != 2 || cv.cc.GetState() == connectivity.Shutdown {
		t.Fatalf("the victim lost its connection: %d conns, %v", e.Len(), cv.cc.GetState())
	}

	// The victim's id registers anew (its engine restarted): the old registration's
	// connections close, calls naming it dial nothing, the new one dials its own.
	e.Accept(router.WorkerInfo{ID: "victim", Reg: 3, GRPCAddress: shared}, nil)
	if cv.cc.GetState() != connectivity.Shutdown || e.Len() != 0 {
		t.Fatalf("after a new registration: old conn %v, %d conns", cv.cc.GetState(), e.Len())
	}
	if _, err := e.conn(at("victim", 1, shared)); !refusedUndialled(err, errNotRegistered) {
		t.Fatalf("a call for the old registration: %v", err)
	}
	if _, err := e.conn(at("victim", 3, shared)); err != nil || e.Len() != 1 {
		t.Fatalf("the new registration: %v, %d conns", err, e.Len())
	}
	// A worker with neither address holds nothing.
	e.Accept(router.WorkerInfo{ID: "http-only", Reg: 4}, nil)
	e.Forget(router.WorkerInfo{ID: "victim", Reg: 3})
	checkEmpty(t, e)
}

// TestMovesAreRateLimited (R20): a registration's addresses are followed through MaxMoves
// changes per MoveWindow, each closing the connection it left; a change beyond that is ignored
// (Accept returns the addresses followed, a call naming the new one dials nothing), also a move
// to no address and back; one warning per window, whatever the number of ignored heartbeats;
// after the window the next change is followed.
func TestMovesAreRateLimited(t *testing.T) {
	e, fc, logs := newTestEngines(EnginesOptions{})
	defer e.Close()
	addr := func(i int) string { return "127.0.0.1:" + string(rune('0'+i)) + "000" }
	beat := func(grpc string) router.WorkerInfo {
		return e.Accept(router.WorkerInfo{ID: "w", Reg: 1, GRPCAddress: grpc, KVAddress: grpc}, nil)
	}
	beat(addr(1))
	prev, err := e.conn(at("w", 1, addr(1)))
	if err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 1+MaxMoves; i++ { // MaxMoves followed changes, a second apart
		fc.Advance(time.Second)
		if got := beat(addr(i)); got.GRPCAddress != addr(i) || got.KVAddress != addr(i) {
			t.Fatalf("move %d: followed %+v", i-1, got)
		}
		if prev.cc.GetState() != connectivity.Shutdown || e.Len() != 0 {
			t.Fatalf("move %d: the connection left is %v, %d conns", i-1, prev.cc.GetState(), e.Len())
		}
		if prev, err = e.conn(at("w", 1, addr(i))); err != nil {
			t.Fatal(err)
		}
	}
	last := addr(1 + MaxMoves)
	for i := range 50 { // ignored: the window opened MaxMoves-1 s ago
		next := addr(5 + i%4)
		if i%5 == 0 {
			next = "" // dropping the address does not reset the count
		}
		if got := beat(next); got.GRPCAddress != last || got.KVAddress != last {
			t.Fatalf("an ignored change: Accept says %+v, want %s still", got, last)
		}
		if next != "" {
			if _, err := e.conn(at("w", 1, next)); !refusedUndialled(err, errNotFollowed) {
				t.Fatalf("a call naming an ignored address: %v", err)
			}
		}
	}
	if e.Len() != 1 || prev.cc.GetState() == connectivity.Shutdown {
		t.Fatalf("the followed connection: %d conns, %v", e.Len(), prev.cc.GetState())
	}
	if n := logs.count("changes its engine addresses too often"); n != 1 {
		t.Fatalf("the ignored changes were logged %d times, want once", n)
	}
	// The window opened with the first followed change, MaxMoves-1 s before now.
	fc.Advance(MoveWindow - time.Duration(MaxMoves)*time.Second)
	if got := beat(addr(8)); got.GRPCAddress != last {
		t.Fatalf("1 s before the window ends: followed %s", got.GRPCAddress)
	}
	fc.Advance(time.Second)
	if got := beat(addr(8)); got.GRPCAddress != addr(8) || prev.cc.GetState() != connectivity.Shutdown {
		t.Fatalf("after the window: followed %s, old conn %v", got.GRPCAddress, prev.cc.GetState())
	}
	for range MaxMoves { // a new window: MaxMoves-1 more followed, then ignored and warned again
		fc.Advance(time.Second)
		beat(addr(9))
		beat(addr(8))
	}
	if n := logs.count("changes its engine addresses too often"); n != 2 {
		t.Fatalf("the second window's ignored changes: %d warnings in all, want 2", n)
	}
	e.Forget(router.WorkerInfo{ID: "w", Reg: 1})
	checkEmpty(t, e)
}

// TestMovesWindow: the rate limit's arithmetic on its own — MaxMoves changes from the window's
// first, the next one refused until MoveWindow after that first, then a new window.
func TestMovesWindow(t *testing.T) {
	t0 := time.Unix(0, 0)
	var m moves
	for i := range MaxMoves {
		if !m.allow(t0.Add(time.Duration(i) * time.Second)) {
			t.Fatalf("change %d refused", i+1)
		}
	}
	if m.allow(t0.Add(MoveWindow - time.Nanosecond)) {
		t.Fatal("a change past MaxMoves within the window followed")
	}
	if !m.allow(t0.Add(MoveWindow)) || m.n != 1 || !m.since.Equal(t0.Add(MoveWindow)) {
		t.Fatalf("the first change of the next window: %+v", m)
	}
}

// counter is loopback listeners that count the connections each accepts and close them.
type counter struct {
	addrs    []string
	accepted []atomic.Int64
}

func newCounter(t *testing.T, n int) *counter {
	t.Helper()
	c := &counter{accepted: make([]atomic.Int64, n)}
	var wg sync.WaitGroup
	var lis []net.Listener
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis = append(lis, l)
		c.addrs = append(c.addrs, l.Addr().String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				c.accepted[i].Add(1)
				conn.Close()
			}
		}()
	}
	t.Cleanup(func() {
		for _, l := range lis {
			l.Close()
		}
		wg.Wait()
	})
	return c
}

func (c *counter) dialled() int {
	n := 0
	for i := range c.accepted {
		if c.accepted[i].Load() > 0 {
			n++
		}
	}
	return n
}

// waitGoroutines polls until at most n goroutines run (a deadline, never a sleep).
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, want at most %d", runtime.NumGoroutine(), n)
		}
		runtime.Gosched()
	}
}

// TestThousandMovesLeaveOneConnection (R20, issue 35 item 3): one id that heartbeats 1,000
// different addresses, each followed by a call there, has at most 1+MaxMoves of them dialled
// (loopback listeners count the accepts) and one connection open; when every move is followed
// (a window apart), each closes the connection it left: one connection open at the end, the
// goroutines back, and none left once the registration is forgotten.
func TestThousandMovesLeaveOneConnection(t *testing.T) {
	const n = 1000
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	targets := newCounter(t, n)
	base := runtime.NumGoroutine()
	for _, spaced := range []bool{false, true} {
		e, fc, _ := newTestEngines(EnginesOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for i := range n {
			if spaced {
				fc.Advance(MoveWindow)
			}
			info := e.Accept(router.WorkerInfo{ID: "mover", Reg: 1, GRPCAddress: targets.addrs[i]}, nil)
			// A Prefill on the address the heartbeat named: the engines behind close every
			// connection, so it fails — after a dial, when the address is followed.
			_, _ = e.Prefill(ctx, at("mover", 1, targets.addrs[i]), request.PrefillCall{})
			if e.Len() > 1 {
				t.Fatalf("move %d (spaced %v): %d connections open", i, spaced, e.Len())
			}
			if spaced && info.GRPCAddress != targets.addrs[i] {
				t.Fatalf("move %d a window after the last was not followed", i)
			}
		}
		cancel()
		if !spaced && targets.dialled() > 1+MaxMoves {
			t.Fatalf("%d of %d addresses dialled, want at most %d", targets.dialled(), n, 1+MaxMoves)
		}
		if spaced && targets.dialled() != n {
			t.Fatalf("%d of %d addresses dialled when every move is followed", targets.dialled(), n)
		}
		waitGoroutines(t, base+10) // one connection's goroutines at most
		e.Forget(router.WorkerInfo{ID: "mover", Reg: 1})
		checkEmpty(t, e)
		waitGoroutines(t, base)
		e.Close()
	}
}

// TestConnectionCap (R20): at MaxConns open connections a dial is refused as never made (the
// call fails over) and logged once per window; a connection closed makes room.
func TestConnectionCap(t *testing.T) {
	e, fc, logs := newTestEngines(EnginesOptions{MaxConns: ConnLimit(1)})
	defer e.Close()
	if ConnLimit(1) != 2 || ConnLimit(10000) != 20000 {
		t.Fatalf("ConnLimit(1) = %d, ConnLimit(10000) = %d: two per worker", ConnLimit(1), ConnLimit(10000))
	}
	e.Accept(router.WorkerInfo{ID: "a", Reg: 1, GRPCAddress: "127.0.0.1:1", KVAddress: "127.0.0.1:2"}, nil)
	e.Accept(router.WorkerInfo{ID: "b", Reg: 2, GRPCAddress: "127.0.0.1:3"}, nil)
	for _, addr := range []string{"127.0.0.1:1", "127.0.0.1:2"} {
		if _, err := e.conn(at("a", 1, addr)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := e.conn(at("b", 2, "127.0.0.1:3")); !refusedUndialled(err, errTooManyConns) || e.Len() != 2 {
			t.Fatalf("a dial at the cap: %v, %d conns", err, e.Len())
		}
	}
	if n := logs.count("engine connection refused"); n != 1 {
		t.Fatalf("the cap was logged %d times, want once", n)
	}
	fc.Advance(MoveWindow)
	if _, err := e.conn(at("b", 2, "127.0.0.1:3")); !refusedUndialled(err, errTooManyConns) || logs.count("engine connection refused") != 2 {
		t.Fatalf("a window later: %v, logged %d times", err, logs.count("engine connection refused"))
	}
	e.Forget(router.WorkerInfo{ID: "a", Reg: 1})
	if _, err := e.conn(at("b", 2, "127.0.0.1:3")); err != nil || e.Len() != 1 {
		t.Fatalf("after a's eviction: %v, %d conns", err, e.Len())
	}
	e.Close()
	checkEmpty(t, e)
	if _, err := e.conn(at("b", 2, "127.0.0.1:3")); !refusedUndialled(err, errEnginesClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if e.Accept(router.WorkerInfo{ID: "c", Reg: 3, GRPCAddress: "127.0.0.1:4"}, nil); len(e.owners) != 0 {
		t.Fatal("a registration followed after Close")
	}
}
