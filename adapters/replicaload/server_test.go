package replicaload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
	"github.com/tlgw/tlgw/internal/clock"
)

// client is an attacker's (or a replica's) raw connection to a server.
func client(t *testing.T, addr string) replicav1.ReplicaLoadClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return replicav1.NewReplicaLoadClient(conn)
}

// open opens a Share stream carrying these authorization values; it is cancelled when the
// test ends.
func open(t *testing.T, c replicav1.ReplicaLoadClient, auth ...string) replicav1.ReplicaLoad_ShareClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, a := range auth {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", a)
	}
	st, err := c.Share(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// attempt sends tables on a new stream, closes it and answers the stream's status code.
func attempt(t *testing.T, addr string, auth []string, tables ...*replicav1.LoadTable) codes.Code {
	t.Helper()
	st := open(t, client(t, addr), auth...)
	for _, tb := range tables {
		if err := st.Send(tb); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("send: %v", err)
		}
	}
	_, err := st.CloseAndRecv()
	return status.Code(err)
}

// tbl is a table of replica with workers "id:n".
func tbl(replica string, workers ...string) *replicav1.LoadTable {
	t := &replicav1.LoadTable{ReplicaId: replica}
	for _, w := range workers {
		id, n, _ := strings.Cut(w, ":")
		var v uint32
		fmt.Sscan(n, &v)
		t.Workers = append(t.Workers, &replicav1.WorkerLoad{WorkerId: id, InFlight: v})
	}
	return t
}

// many is a table of n workers w0…, each with one request.
func many(replica string, n int) *replicav1.LoadTable {
	t := &replicav1.LoadTable{ReplicaId: replica}
	for i := range n {
		t.Workers = append(t.Workers, &replicav1.WorkerLoad{WorkerId: fmt.Sprintf("w%d", i), InFlight: 1})
	}
	return t
}

// part marks t as a part followed by more.
func part(t *replicav1.LoadTable) *replicav1.LoadTable {
	t.More = true
	return t
}

func outcome(ts *testServer, o string) float64 {
	return testutil.ToFloat64(ts.srv.m.tables.WithLabelValues(o))
}

// TestServerAppliesAndForgets: tables of a live replica replace each other in the router
// (nonzero entries, sorted); a stream the sender closes is acknowledged, and the replica
// forgotten.
func TestServerAppliesAndForgets(t *testing.T) {
	srv := startServer(t, "b", newLive("a", "b"), nil)
	st := open(t, client(t, srv.addr), bearer)
	for _, tb := range []*replicav1.LoadTable{tbl("a", "w2:4", "w1:0", "w3:1"), tbl("a"), tbl("a", "w9:1048576")} {
		if err := st.Send(tb); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatalf("a clean close: %v", err)
	}
	want := []string{"set a [{w2 4} {w3 1}]", "set a []", "set a [{w9 1048576}]", "forget a"}
	if d := cmp.Diff(want, srv.router.log()); d != "" {
		t.Fatalf("router calls (-want +got):\n%s", d)
	}
	if got := outcome(srv, outcomeApplied); got != 3 {
		t.Fatalf("applied = %v", got)
	}
	if got := testutil.ToFloat64(srv.srv.m.peers); got != 0 {
		t.Fatalf("peers after the end = %v", got)
	}
	if n, err := testutil.GatherAndCount(srv.reg, "tlgw_replica_load_tables_total", "tlgw_replica_load_peers"); err != nil || n != 4 {
		t.Fatalf("registered series: %d %v", n, err)
	}
}

// TestTableInParts: a table larger than the registry port's 64 KiB message bound (5,000
// workers with 40-byte ids, about 235 KiB) goes from a Sharer to a Server whose gRPC server
// refuses bigger messages, in parts, and is applied whole, once per table.
func TestTableInParts(t *testing.T) {
	srv := startServer(t, "b", newLive("a", "b"), nil)
	srv.stop()
	ln, err := net.Listen("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv.router, srv.reg = newRouter(), prometheus.NewRegistry()
	o := srv.opts
	o.Router, o.Registerer = srv.router, srv.reg
	srv.srv = NewServer(o)
	srv.gs = grpc.NewServer(grpc.MaxRecvMsgSize(64 << 10))
	srv.srv.Register(srv.gs)
	srv.done = make(chan struct{})
	go func() {
		defer close(srv.done)
		_ = srv.gs.Serve(ln)
	}()
	var own []WorkerLoad
	for i := range 5000 {
		own = append(own, WorkerLoad{ID: fmt.Sprintf("pool-with-a-long-name/10.1.%03d.%03d:8000", i/250, i%250), InFlight: int64(1 + i%7)})
	}
	if parts := encode("a", sanitize(own, DefaultMaxWorkers), MaxPartBytes); len(parts) < 4 {
		t.Fatalf("%d parts, want the table split", len(parts))
	}
	sh := startSharer(t, "a", []Peer{{ID: "b", Address: srv.addr}}, nil)
	sh.router.setOwn(own...)
	sh.tickUntil(t, 50, "the table arrives whole", func() bool {
		got, ok := srv.router.held("a")
		return ok && len(got) == len(own)
	})
	got, _ := srv.router.held("a")
	want := sanitize(own, DefaultMaxWorkers)
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-sent +held):\n%s", d)
	}
	for _, l := range srv.router.log() {
		// The sharer's first tick may have read an empty table: whole too.
		if n := strings.Count(l, "{"); strings.HasPrefix(l, "set a") && n != 0 && n != len(own) {
			t.Fatalf("a table of %d entries reached the router: %.200s", n, l)
		}
	}
}

// TestServerRefusesAttacks: what an attacker can send over a socket, each on a fresh stream:
// refused with its code, before anything reaches the router.
func TestServerRefusesAttacks(t *testing.T) {
	long := strings.Repeat("x", MaxWorkerIDLen+1)
	for _, c := range []struct {
		name   string
		auth   []string
		tables []*replicav1.LoadTable
		want   codes.Code
		metric string
	}{
		{"no bearer", nil, []*replicav1.LoadTable{tbl("a", "w:1")}, codes.Unauthenticated, outcomeUnauthenticated},
		{"wrong secret", []string{"Bearer " + strings.Repeat("00", 32)}, []*replicav1.LoadTable{tbl("a", "w:1")}, codes.Unauthenticated, outcomeUnauthenticated},
		{"the secret raw, not hex", []string{"Bearer " + string(secret)}, []*replicav1.LoadTable{tbl("a", "w:1")}, codes.Unauthenticated, outcomeUnauthenticated},
		{"another scheme", []string{"Basic " + strings.TrimPrefix(bearer, "Bearer ")}, []*replicav1.LoadTable{tbl("a", "w:1")}, codes.Unauthenticated, outcomeUnauthenticated},
		{"no space", []string{strings.Replace(bearer, " ", "", 1)}, []*replicav1.LoadTable{tbl("a", "w:1")}, codes.Unauthenticated, outcomeUnauthenticated},
		{"two values", []string{bearer, bearer}, []*replicav1.LoadTable{tbl("a", "w:1")}, codes.Unauthenticated, outcomeUnauthenticated},
		{"unknown replica", []string{bearer}, []*replicav1.LoadTable{tbl("z", "w:1")}, codes.PermissionDenied, outcomeRejected},
		{"claiming self", []string{bearer}, []*replicav1.LoadTable{tbl("b", "w:1")}, codes.PermissionDenied, outcomeRejected},
		{"an invalid replica id", []string{bearer}, []*replicav1.LoadTable{tbl("a/x", "w:1")}, codes.PermissionDenied, outcomeRejected},
		{"no replica id", []string{bearer}, []*replicav1.LoadTable{tbl("", "w:1")}, codes.PermissionDenied, outcomeRejected},
		{"no table", []string{bearer}, nil, codes.InvalidArgument, outcomeRejected},
		{"too many entries", []string{bearer}, []*replicav1.LoadTable{many("a", DefaultMaxWorkers+1)}, codes.InvalidArgument, outcomeRejected},
		{"duplicate ids", []string{bearer}, []*replicav1.LoadTable{tbl("a", "w:1", "v:2", "w:0")}, codes.InvalidArgument, outcomeRejected},
		{"oversize id", []string{bearer}, []*replicav1.LoadTable{tbl("a", long+":1")}, codes.InvalidArgument, outcomeRejected},
		{"empty id", []string{bearer}, []*replicav1.LoadTable{tbl("a", ":1")}, codes.InvalidArgument, outcomeRejected},
		{"in_flight over the bound", []string{bearer}, []*replicav1.LoadTable{tbl("a", "w:1048577")}, codes.InvalidArgument, outcomeRejected},
		{"the stream ends inside a table", []string{bearer}, []*replicav1.LoadTable{part(tbl("a", "w:1"))}, codes.InvalidArgument, outcomeRejected},
		{"parts over the bound", []string{bearer}, []*replicav1.LoadTable{part(many("a", DefaultMaxWorkers)), tbl("a", "x:1")}, codes.InvalidArgument, outcomeRejected},
		{"an id in two parts", []string{bearer}, []*replicav1.LoadTable{part(tbl("a", "w:1")), tbl("a", "w:2")}, codes.InvalidArgument, outcomeRejected},
		{"a part of another replica", []string{bearer}, []*replicav1.LoadTable{part(tbl("a", "w:1")), tbl("c", "v:2")}, codes.InvalidArgument, outcomeRejected},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := startServer(t, "b", newLive("a", "b", "a/x", ""), nil) // the invalid ids count as live: only their form refuses them
			if got := attempt(t, srv.addr, c.auth, c.tables...); got != c.want {
				t.Fatalf("code %v, want %v", got, c.want)
			}
			if got := srv.router.log(); len(got) != 0 {
				t.Fatalf("the router heard %v", got)
			}
			if got := outcome(srv, c.metric); got != 1 {
				t.Fatalf("%s = %v, want 1", c.metric, got)
			}
			if got := outcome(srv, outcomeApplied); got != 0 {
				t.Fatalf("applied = %v", got)
			}
		})
	}
}

// TestServerBadLaterTableForgets: a stream that starts well and then sends a bad table ends
// with InvalidArgument, and the replica's table is forgotten.
func TestServerBadLaterTableForgets(t *testing.T) {
	for _, c := range []struct {
		name string
		bad  *replicav1.LoadTable
	}{
		{"replica_id changed", tbl("c", "w:1")},
		{"replica_id dropped", tbl("", "w:1")},
		{"too many entries", many("a", DefaultMaxWorkers+1)},
		{"duplicate ids", tbl("a", "w:1", "w:1")},
		{"oversize id", tbl("a", strings.Repeat("x", MaxWorkerIDLen+1)+":1")},
		{"in_flight over the bound", tbl("a", "w:1048577")},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := startServer(t, "b", newLive("a", "b", "c"), nil)
			if got := attempt(t, srv.addr, []string{bearer}, tbl("a", "w:1"), c.bad, tbl("a", "w:2")); got != codes.InvalidArgument {
				t.Fatalf("code %v", got)
			}
			want := []string{"set a [{w 1}]", "forget a"}
			if d := cmp.Diff(want, srv.router.log()); d != "" {
				t.Fatalf("router calls (-want +got):\n%s", d)
			}
			if a, r := outcome(srv, outcomeApplied), outcome(srv, outcomeRejected); a != 1 || r != 1 {
				t.Fatalf("applied %v rejected %v", a, r)
			}
		})
	}
}

// TestServerReplicaNoLongerLive: a replica that has left replicas/ is refused at its next
// table and forgotten.
func TestServerReplicaNoLongerLive(t *testing.T) {
	live := newLive("a")
	srv := startServer(t, "b", live, nil)
	st := open(t, client(t, srv.addr), bearer)
	if err := st.Send(tbl("a", "w:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's table held", func() bool { _, ok := srv.router.held("a"); return ok })
	live.set("a", false)
	_ = st.Send(tbl("a", "w:2"))
	if _, err := st.CloseAndRecv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("after leaving: %v", err)
	}
	if d := cmp.Diff([]string{"set a [{w 1}]", "forget a"}, srv.router.log()); d != "" {
		t.Fatalf("router calls (-want +got):\n%s", d)
	}
}

// TestServerBoundsReplicas: tables of MaxReplicas replicas are held; another replica's stream
// is refused and changes nothing; a held replica's new stream still takes over.
func TestServerBoundsReplicas(t *testing.T) {
	live := newLive("extra")
	var ids []string
	for i := range MaxReplicas {
		ids = append(ids, fmt.Sprintf("r%02d", i))
		live.set(ids[i], true)
	}
	srv := startServer(t, "b", live, nil)
	c := client(t, srv.addr)
	streams := make([]replicav1.ReplicaLoad_ShareClient, len(ids))
	for i, id := range ids {
		streams[i] = open(t, c, bearer)
		if err := streams[i].Send(tbl(id, "w:1")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every table held", func() bool { return testutil.ToFloat64(srv.srv.m.peers) == MaxReplicas })
	if got := attempt(t, srv.addr, []string{bearer}, tbl("extra", "w:1")); got != codes.ResourceExhausted {
		t.Fatalf("replica %d: %v", MaxReplicas+1, got)
	}
	if _, ok := srv.router.held("extra"); ok || len(srv.router.log()) != MaxReplicas {
		t.Fatalf("the refused replica changed the router: %d calls", len(srv.router.log()))
	}
	if got := outcome(srv, outcomeRejected); got != 1 {
		t.Fatalf("rejected = %v", got)
	}
	again := open(t, c, bearer)
	if err := again.Send(tbl("r00", "w:7")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new stream's table", func() bool { got, _ := srv.router.held("r00"); return slices.Equal(got, []WorkerLoad{{"w", 7}}) })
	if _, err := streams[0].CloseAndRecv(); status.Code(err) != codes.Aborted {
		t.Fatalf("the replaced stream: %v", err)
	}
	if got, _ := srv.router.held("r00"); !slices.Equal(got, []WorkerLoad{{"w", 7}}) || slices.Contains(srv.router.log(), "forget r00") {
		t.Fatalf("r00 holds %v after %v", got, srv.router.log())
	}
	if got := testutil.ToFloat64(srv.srv.m.peers); got != MaxReplicas {
		t.Fatalf("peers = %v", got)
	}
}

// TestServerBoundsWaitingStreams: streams authenticated and silent hold at most MaxReplicas
// places; past them a stream is refused, until one of them sends its table.
func TestServerBoundsWaitingStreams(t *testing.T) {
	srv := startServer(t, "b", newLive("a", "c", "d"), func(o *Options) { o.MaxReplicas = 2 })
	c := client(t, srv.addr)
	first, second := open(t, c, bearer), open(t, c, bearer)
	_ = second
	pending := func() int {
		srv.srv.mu.Lock()
		defer srv.srv.mu.Unlock()
		return srv.srv.pending
	}
	eventually(t, "two streams wait", func() bool { return pending() == 2 })
	if got := attempt(t, srv.addr, []string{bearer}, tbl("d", "w:1")); got != codes.ResourceExhausted {
		t.Fatalf("a third waiting stream: %v", got)
	}
	if got := attempt(t, srv.addr, nil, tbl("d", "w:1")); got != codes.Unauthenticated {
		t.Fatalf("a stranger when full: %v", got)
	}
	if err := first.Send(tbl("a", "w:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first is admitted", func() bool { return pending() == 1 })
	if got := attempt(t, srv.addr, []string{bearer}, tbl("c", "w:1")); got != codes.OK {
		t.Fatalf("with a place free: %v", got)
	}
	if d := cmp.Diff([]string{"set a [{w 1}]", "set c [{w 1}]", "forget c"}, srv.router.log()); d != "" {
		t.Fatalf("router calls (-want +got):\n%s", d)
	}
}

// TestServerOlderStreamEndsAfterNewer: a replica's newer stream takes over; the older one is
// ended, and neither its end nor a table it had in hand undoes the newer one's table.
func TestServerOlderStreamEndsAfterNewer(t *testing.T) {
	srv := startServer(t, "b", newLive("a"), nil)
	c := client(t, srv.addr)
	older := open(t, c, bearer)
	if err := older.Send(tbl("a", "w:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the older stream's table", func() bool { t, _ := srv.router.held("a"); return len(t) == 1 && t[0].InFlight == 1 })
	srv.srv.mu.Lock()
	olderHolder := srv.srv.held["a"]
	srv.srv.mu.Unlock()
	newer := open(t, c, bearer)
	if err := newer.Send(tbl("a", "w:2")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the newer stream's table", func() bool { t, _ := srv.router.held("a"); return len(t) == 1 && t[0].InFlight == 2 })
	_ = older.Send(tbl("a", "w:3"))
	if _, err := older.CloseAndRecv(); status.Code(err) != codes.Aborted {
		t.Fatalf("the older stream: %v", err)
	}
	// What the older stream's handler does if it still had a table in hand, and at its end.
	if err := srv.srv.apply("a", olderHolder, []WorkerLoad{{"w", 4}}); status.Code(err) != codes.Aborted {
		t.Fatalf("a late table of the older stream: %v", err)
	}
	srv.srv.end("a", olderHolder)
	want := []string{"set a [{w 1}]", "set a [{w 2}]"}
	if d := cmp.Diff(want, srv.router.log()); d != "" {
		t.Fatalf("router calls (-want +got):\n%s", d)
	}
	if got := testutil.ToFloat64(srv.srv.m.peers); got != 1 {
		t.Fatalf("peers = %v", got)
	}
	if _, err := newer.CloseAndRecv(); err != nil {
		t.Fatalf("the newer stream: %v", err)
	}
	if d := cmp.Diff(append(want, "forget a"), srv.router.log()); d != "" {
		t.Fatalf("router calls (-want +got):\n%s", d)
	}
}

// TestServerIdleTimeout: a stream silent for IdleTimeout (on the server's clock) is ended and
// its replica forgotten; a stream that never sends its first table is ended too. 4.999 s of
// silence is not enough.
func TestServerIdleTimeout(t *testing.T) {
	clk := clock.NewFake(time.Unix(1700000000, 0))
	srv := startServer(t, "b", newLive("a"), func(o *Options) { o.Clock = clk })
	c := client(t, srv.addr)
	st := open(t, c, bearer)
	if err := st.Send(tbl("a", "w:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the table held, the next one awaited", func() bool {
		_, ok := srv.router.held("a")
		d, armed := clk.Next()
		return ok && armed && d == DefaultIdleTimeout
	})
	clk.Advance(DefaultIdleTimeout - time.Millisecond)
	if _, ok := srv.router.held("a"); !ok {
		t.Fatal("forgotten before the idle timeout")
	}
	clk.Advance(time.Millisecond)
	if _, err := st.CloseAndRecv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a silent stream: %v", err)
	}
	eventually(t, "forgotten", func() bool { _, ok := srv.router.held("a"); return !ok })

	silent := open(t, c, bearer)
	eventually(t, "the silent stream waits", func() bool { _, armed := clk.Next(); return armed })
	clk.Advance(DefaultIdleTimeout)
	if _, err := silent.CloseAndRecv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a stream with no table: %v", err)
	}
}

// TestServerStopForgets: a server stopping ends its streams, and forgets their replicas.
func TestServerStopForgets(t *testing.T) {
	srv := startServer(t, "b", newLive("a"), nil)
	st := open(t, client(t, srv.addr), bearer)
	if err := st.Send(tbl("a", "w:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "held", func() bool { _, ok := srv.router.held("a"); return ok })
	srv.stop()
	eventually(t, "forgotten", func() bool { return len(srv.router.log()) == 2 })
	if d := cmp.Diff([]string{"set a [{w 1}]", "forget a"}, srv.router.log()); d != "" {
		t.Fatalf("router calls (-want +got):\n%s", d)
	}
}

func TestNewServerNeedsItsOptions(t *testing.T) {
	full := Options{Self: "b", Secret: secret, Live: newLive().has, Router: newRouter()}
	for _, edit := range []func(*Options){
		func(o *Options) { o.Self = "" }, func(o *Options) { o.Secret = nil },
		func(o *Options) { o.Live = nil }, func(o *Options) { o.Router = nil },
	} {
		o := full
		edit(&o)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewServer(%+v) did not panic", o)
				}
			}()
			NewServer(o)
		}()
	}
	s := NewServer(full)
	if s.o.MaxWorkers != DefaultMaxWorkers || s.o.MaxReplicas != MaxReplicas || s.o.IdleTimeout != DefaultIdleTimeout || s.o.Clock == nil || s.log == nil {
		t.Fatalf("defaults: %+v", s.o)
	}
}

// TestTableBytes: the bound is the size of the largest table, exactly.
func TestTableBytes(t *testing.T) {
	for _, n := range []int{0, 1, 127, 16384} {
		tb := &replicav1.LoadTable{ReplicaId: strings.Repeat("r", 128)}
		for i := range n {
			id := fmt.Sprintf("%0256d", i)
			tb.Workers = append(tb.Workers, &replicav1.WorkerLoad{WorkerId: id, InFlight: MaxInFlight})
		}
		if got := proto.Size(tb); got != TableBytes(n) {
			t.Fatalf("%d workers: %d bytes, TableBytes says %d", n, got, TableBytes(n))
		}
	}
	if TableBytes(DefaultMaxWorkers) != 4358275 {
		t.Fatalf("TableBytes(%d) = %d", DefaultMaxWorkers, TableBytes(DefaultMaxWorkers))
	}
}
