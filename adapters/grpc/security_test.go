package grpcapi_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/actors/gateway"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// call sends one heartbeat with token as bearer ("" = no metadata) and returns its code.
func (r *rig) call(t *testing.T, token string, st *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return r.client.Heartbeat(ctx, st)
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

// TestHeartbeatAddressRules (R13.2): addresses that are not a plain host:port, link-local or
// unspecified IPs, IPs outside engine_cidrs and over-long ids or models are InvalidArgument
// and register nothing.
func TestHeartbeatAddressRules(t *testing.T) {
	cidrs, err := engineaddr.ParseCIDRs([]string{"127.0.0.0/8", "10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	r := newRigWith(t, grpcapi.Options{Addresses: engineaddr.Rules{CIDRs: cidrs}}, nil)
	long := strings.Repeat("x", 257)
	bad := map[string]func(*controlv1.WorkerStatus){
		"metadata service": func(s *controlv1.WorkerStatus) { s.HttpAddress = "169.254.169.254/latest?x=" },
		"link-local":       func(s *controlv1.WorkerStatus) { s.HttpAddress = "169.254.169.254:80" },
		"link-local v6":    func(s *controlv1.WorkerStatus) { s.HttpAddress = "[fe80::1]:80" },
		"unspecified":      func(s *controlv1.WorkerStatus) { s.HttpAddress = "0.0.0.0:8001" },
		"path":             func(s *controlv1.WorkerStatus) { s.HttpAddress = "127.0.0.1:8001/v1" },
		"scheme":           func(s *controlv1.WorkerStatus) { s.HttpAddress = "http://127.0.0.1:8001" },
		"userinfo":         func(s *controlv1.WorkerStatus) { s.HttpAddress = "u@127.0.0.1:8001" },
		"unix grpc":        func(s *controlv1.WorkerStatus) { s.GrpcAddress = "unix:/tmp/engine.sock" },
		"bad kv port":      func(s *controlv1.WorkerStatus) { s.KvAddress = "127.0.0.1:70000" },
		"outside cidrs":    func(s *controlv1.WorkerStatus) { s.HttpAddress = "192.168.1.5:8001" },
		"long host":        func(s *controlv1.WorkerStatus) { s.HttpAddress = long + ":80" },
		"long id":          func(s *controlv1.WorkerStatus) { s.WorkerId = long },
		"long model":       func(s *controlv1.WorkerStatus) { s.Model = long },
	}
	for name, mutate := range bad {
		st := status1("w-" + name)
		mutate(st)
		_, err := r.call(t, "", st)
		wantCode(t, name, err, codes.InvalidArgument)
	}
	if ids := r.IDs(); len(ids) != 0 {
		t.Fatalf("invalid heartbeats registered %v", ids)
	}
	st := status1("w-dns")
	st.HttpAddress = "engine-1.internal:8001"
	r.beat(t, st) // a DNS name is not resolved; CIDRs restrict IP addresses
	r.WaitIDs("w-dns")
}

// TestHeartbeatTooLarge (R13.2): a message over 64 KiB is refused by the server.
func TestHeartbeatTooLarge(t *testing.T) {
	r := newRig(t)
	st := status1("w1")
	st.Model = strings.Repeat("m", grpcapi.MaxRecvMsgSize)
	_, err := r.call(t, "", st)
	wantCode(t, "65 KiB heartbeat", err, codes.ResourceExhausted)
	if ids := r.IDs(); len(ids) != 0 {
		t.Fatalf("registered %v", ids)
	}
}

// TestRegistryTokens (R13.1): a missing or unknown token is Unauthenticated; a model or id
// outside the token's grant is PermissionDenied; all change nothing.
func TestRegistryTokens(t *testing.T) {
	auth := grpcapi.NewAuth([]grpcapi.Token{
		{Secret: "tok-smol", Models: []string{"smol*"}, IDPrefix: "a-"},
		{Secret: "tok-any"},
	}, false)
	r := newRigWith(t, grpcapi.Options{Auth: auth}, nil)

	_, err := r.call(t, "", status1("a-1"))
	wantCode(t, "no token", err, codes.Unauthenticated)
	_, err = r.call(t, "tok-wrong", status1("a-1"))
	wantCode(t, "wrong token", err, codes.Unauthenticated)
	_, err = r.call(t, "tok-smo", status1("a-1"))
	wantCode(t, "token prefix", err, codes.Unauthenticated)

	big := status1("a-big")
	big.Model = "big"
	_, err = r.call(t, "tok-smol", big)
	wantCode(t, "smol* token registering big", err, codes.PermissionDenied)
	_, err = r.call(t, "tok-smol", status1("b-1"))
	wantCode(t, "id outside id_prefix", err, codes.PermissionDenied)
	// A LoRA adapter is a model id clients ask for: each must be granted too (R21).
	lora := status1("a-lora")
	lora.Model = "smol-base"
	lora.LoraAdapters = []string{"smol-lora", "big"}
	_, err = r.call(t, "tok-smol", lora)
	wantCode(t, "smol* token advertising the adapter big", err, codes.PermissionDenied)
	if ids := r.IDs(); len(ids) != 0 {
		t.Fatalf("refused heartbeats registered %v", ids)
	}

	st := status1("a-1")
	st.Model = "smol-instruct"
	if _, err := r.call(t, "tok-smol", st); err != nil {
		t.Fatal(err)
	}
	if _, err := r.call(t, "tok-any", big); err != nil {
		t.Fatal(err)
	}
	lora.LoraAdapters = []string{"smol-lora"}
	if _, err := r.call(t, "tok-smol", lora); err != nil {
		t.Fatal(err)
	}
	r.WaitIDs("a-1", "a-big", "a-lora")

	// An invalid status with a valid token is still InvalidArgument.
	bad := status1("a-2")
	bad.HttpAddress = "169.254.169.254:80"
	_, err = r.call(t, "tok-smol", bad)
	wantCode(t, "link-local with a token", err, codes.InvalidArgument)
}

// TestCredentialBoundIDs (R13.1): a live worker's id cannot be taken over by another
// credential (state unchanged); once evicted, the id is free again.
func TestCredentialBoundIDs(t *testing.T) {
	auth := grpcapi.NewAuth([]grpcapi.Token{{Secret: "tok-a"}, {Secret: "tok-b"}}, false)
	r := newRigWith(t, grpcapi.Options{Auth: auth}, nil)
	if _, err := r.call(t, "tok-a", status1("w1")); err != nil {
		t.Fatal(err)
	}
	r.Eventually("w1 routable", func() bool { v, ok := r.View("w1"); return ok && v.Routable })

	thief := status1("w1")
	thief.HttpAddress = "127.0.0.1:6666"
	thief.QueueDepth = 0
	_, err := r.call(t, "tok-b", thief)
	wantCode(t, "takeover by another token", err, codes.PermissionDenied)
	// The owner's next heartbeat is taken and the thief's address never shows.
	owner := status1("w1")
	owner.QueueDepth = 7
	if _, err := r.call(t, "tok-a", owner); err != nil {
		t.Fatal(err)
	}
	r.Eventually("owner's heartbeat seen", func() bool { v, _ := r.View("w1"); return v.Info.QueueDepth == 7 })
	if v, _ := r.View("w1"); v.Info.HTTPAddress != "127.0.0.1:8001" {
		t.Fatalf("address after takeover attempt: %s", v.Info.HTTPAddress)
	}

	// k·T later the worker is evicted; then the id is free for another credential.
	r.Clock.Advance(6 * time.Second)
	r.WaitIDs()
	if _, err := r.call(t, "tok-b", thief); err != nil {
		t.Fatalf("heartbeat after eviction: %v", err)
	}
	r.Eventually("new owner", func() bool { v, _ := r.View("w1"); return v.Info.HTTPAddress == "127.0.0.1:6666" })
}

// TestStaticIDNotTakenOver: an open registry still binds a static worker's id to its
// scrapes, so a heartbeat of that id is PermissionDenied.
func TestStaticIDNotTakenOver(t *testing.T) {
	r := newRig(t)
	info := gwtest.Worker("vllm-0", "smol", 0)
	info.Static = true
	if err := r.GW.Scraped(info, 6*time.Second); err != nil {
		t.Fatal(err)
	}
	r.WaitIDs("vllm-0")
	_, err := r.call(t, "", status1("vllm-0"))
	wantCode(t, "heartbeat of a static id", err, codes.PermissionDenied)
	if v, _ := r.View("vllm-0"); !v.Info.Static || v.Info.HTTPAddress != info.HTTPAddress {
		t.Fatalf("static worker changed: %+v", v.Info)
	}
	// And a heartbeating worker's id cannot become static.
	r.beat(t, status1("w1"))
	info.ID = "w1"
	if err := r.GW.Scraped(info, 6*time.Second); err == nil {
		t.Fatal("a scrape took over a heartbeating worker's id")
	}
}

// TestMaxWorkers (R13.2): a new id beyond max_workers is ResourceExhausted; registered ids
// keep heartbeating; after an eviction a new id fits again.
func TestMaxWorkers(t *testing.T) {
	h := gwtest.New(t, func(c *gateway.Config) { c.MaxWorkers = 3 })
	r := newRigGW(t, h, grpcapi.Options{}, nil)
	for _, id := range []string{"w1", "w2", "w3"} {
		r.beat(t, status1(id))
	}
	_, err := r.call(t, "", status1("w4"))
	wantCode(t, "worker 4 of 3", err, codes.ResourceExhausted)
	r.beat(t, status1("w2")) // an existing id still heartbeats
	r.WaitIDs("w1", "w2", "w3")
}

// TestMaxWorkersDefault (R13.2): with the default cap of 10000, worker 10,001 is
// ResourceExhausted.
func TestMaxWorkersDefault(t *testing.T) {
	h := gwtest.New(t, func(c *gateway.Config) { c.MaxWorkers = 10000 })
	for i := range 10000 {
		info := gwtest.Worker("w"+strconv.Itoa(i), "smol", 0)
		if _, err := h.GW.Heartbeat(info); err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	r := newRigGW(t, h, grpcapi.Options{}, nil)
	_, err := r.call(t, "", status1("w-10001"))
	wantCode(t, "worker 10,001", err, codes.ResourceExhausted)
	if _, err := r.call(t, "", status1("w0")); err != nil {
		t.Fatalf("existing id: %v", err)
	}
}

// TestIdentity: a client certificate's credential is its CN, else its first DNS SAN.
func TestIdentity(t *testing.T) {
	for _, tc := range []struct {
		cert x509.Certificate
		want string
	}{
		{x509.Certificate{Subject: pkix.Name{CommonName: "engine-a"}, DNSNames: []string{"a.internal"}}, "engine-a"},
		{x509.Certificate{DNSNames: []string{"b.internal", "c.internal"}}, "b.internal"},
		{x509.Certificate{}, ""},
	} {
		if got := grpcapi.Identity(&tc.cert); got != tc.want {
			t.Errorf("Identity(%v) = %q, want %q", tc.cert.Subject, got, tc.want)
		}
	}
}

// TestConnectionBounds (R13.3): a peer that connects and sends nothing is closed after the
// handshake bound, and a connection that runs no call for the idle bound is sent away
// (GOAWAY: the client's connection goes idle and dials again on its next call).
func TestConnectionBounds(t *testing.T) {
	r := newRigWith(t, grpcapi.Options{HandshakeTimeout: 100 * time.Millisecond, MaxConnectionIdle: 200 * time.Millisecond}, nil)
	raw, err := net.Dial("tcp", r.conn.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	for {
		_, err := raw.Read(buf) // whatever the server writes first, then its close
		if err == nil {
			continue
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("a connection that sent nothing is still open after 5 s")
		}
		break
	}

	r.beat(t, status1("w1"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Ready after the call, unless the idle bound has already sent it away.
	if r.conn.GetState() == connectivity.Ready && !r.conn.WaitForStateChange(ctx, connectivity.Ready) {
		t.Fatal("an idle connection is still ready after 5 s")
	}
	r.beat(t, status1("w1")) // the next call dials again
}

// dialInsecure opens another client connection to target, closed when the test ends.
func dialInsecure(t *testing.T, target string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// healthCheck calls health's Check (unary) on cc within d.
func healthCheck(cc *grpc.ClientConn, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// TestOpenStreamsBounded (R13.2): streaming calls, which ask for no credential, are bounded
// across the listener's connections. One more than MaxOpenStreams is ResourceExhausted while
// heartbeats and health checks go on, and a stream that closes frees its place.
func TestOpenStreamsBounded(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conns := []*grpc.ClientConn{r.conn, dialInsecure(t, r.conn.Target())}
	// watch opens a Watch stream on cc and reads its first answer.
	watch := func(cc *grpc.ClientConn) (context.CancelFunc, error) {
		sctx, scancel := context.WithCancel(ctx)
		st, err := healthpb.NewHealthClient(cc).Watch(sctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		return scancel, err
	}
	var open []context.CancelFunc
	defer func() {
		for _, c := range open {
			c()
		}
	}()
	for i := range grpcapi.MaxOpenStreams {
		c, err := watch(conns[i%2])
		if err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, grpcapi.MaxOpenStreams, err)
		}
		open = append(open, c)
	}
	for _, cc := range conns {
		c, err := watch(cc)
		c()
		wantCode(t, "a stream beyond the bound", err, codes.ResourceExhausted)
	}
	r.beat(t, status1("w1"))
	if err := healthCheck(conns[1], 5*time.Second); err != nil {
		t.Fatalf("a health check while the streams are open: %v", err)
	}

	// The server learns of the client's cancel after the client does: poll.
	open[0]()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		c, err := watch(conns[1])
		c()
		if err == nil {
			break
		}
		wantCode(t, "a stream while the bound is reached", err, codes.ResourceExhausted)
		select {
		case <-ctx.Done():
			t.Fatal("a closed stream did not free its place within 10 s")
		case <-tick.C:
		}
	}
}

// TestConnectionLimit (R13.2): the listener holds at most Options.MaxConnections connections;
// one more is not served until a held one closes.
func TestConnectionLimit(t *testing.T) {
	r := newRigWith(t, grpcapi.Options{MaxConnections: 2}, nil)
	b := dialInsecure(t, r.conn.Target())
	for i, cc := range []*grpc.ClientConn{r.conn, b} {
		if err := healthCheck(cc, 5*time.Second); err != nil {
			t.Fatalf("connection %d of 2: %v", i+1, err)
		}
	}
	c := dialInsecure(t, r.conn.Target())
	wantCode(t, "a call on a third connection", healthCheck(c, 300*time.Millisecond), codes.DeadlineExceeded)
	b.Close()
	if err := healthCheck(c, 5*time.Second); err != nil {
		t.Fatalf("the third connection once the second closed: %v", err)
	}
	r.beat(t, status1("w1"))
}

// TestStopEndsStreams: a peer that keeps a stream open does not hold the listener's Stop. A
// health Watch is ended at once, however long Stop would wait; a reflection stream, which
// waits in its peer's next message, is cut when Stop's context ends.
func TestStopEndsStreams(t *testing.T) {
	start := func(t *testing.T) (*grpcapi.Listener, *grpc.ClientConn, <-chan struct{}) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l := grpcapi.NewListener(gwtest.New(t).GW, grpcapi.Options{})
		served := make(chan struct{})
		go func() { defer close(served); _ = l.Serve(lis) }()
		return l, dialInsecure(t, lis.Addr().String()), served
	}
	// stop runs l.Stop(ctx) and fails the test if it has not returned within 10 s.
	stop := func(t *testing.T, l *grpcapi.Listener, ctx context.Context, served <-chan struct{}) {
		stopped := make(chan struct{})
		go func() { defer close(stopped); l.Stop(ctx) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("Stop has not returned after 10 s")
		}
		<-served
	}
	t.Run("watch", func(t *testing.T) {
		l, cc, served := start(t)
		w, err := healthpb.NewHealthClient(cc).Watch(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
		stop(t, l, context.Background(), served)
		for i := 0; ; i++ { // NOT_SERVING may come first; then the end
			if _, err := w.Recv(); err != nil {
				break
			}
			if i == 10 {
				t.Fatal("the Watch stream goes on after Stop")
			}
		}
	})
	t.Run("reflection", func(t *testing.T) {
		l, cc, served := start(t)
		rs, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		if _, err := rs.Recv(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		stop(t, l, ctx, served)
		if _, err := rs.Recv(); err == nil {
			t.Fatal("the reflection stream goes on after Stop")
		}
	})
}

// TestCallsBounded: the listener runs at most Options.MaxProbeCalls calls other than heartbeats
// at once, counting a call that waits for its peer's next message (a reflection stream stands
// for a stalled request). One more is ResourceExhausted, while heartbeats, which have places of
// their own (R20), still answer. A call gives its place back however it ends: returning through
// the interceptors, or (an unknown method) only when its stream ends, so many short calls never
// use the places up.
func TestCallsBounded(t *testing.T) {
	const limit = 3
	r := newRigWith(t, grpcapi.Options{MaxCalls: limit, MaxProbeCalls: limit}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	wait := func(what string) {
		select {
		case <-ctx.Done():
			t.Fatalf("%s within 10 s", what)
		case <-tick.C:
		}
	}
	for i := range 50 {
		r.beat(t, status1("w1"))
		if _, err := r.call(t, "", &controlv1.WorkerStatus{}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("call %d: %v, want InvalidArgument", i, err)
		}
		// An unknown method never reaches the interceptors: its place comes back when its
		// stream ends, a moment after the client has its answer.
		err := r.conn.Invoke(ctx, "/tl.control.v1.WorkerRegistry/Nope", &controlv1.WorkerStatus{}, &controlv1.HeartbeatAck{})
		if c := status.Code(err); c != codes.Unimplemented && c != codes.ResourceExhausted {
			t.Fatalf("unknown method %d: %v", i, err)
		}
	}

	conns := []*grpc.ClientConn{r.conn, dialInsecure(t, r.conn.Target())}
	var held []context.CancelFunc
	defer func() {
		for _, c := range held {
			c()
		}
	}()
	for len(held) < limit { // every place is free again: each stream is let in
		sctx, scancel := context.WithCancel(ctx)
		rs, err := reflectionpb.NewServerReflectionClient(conns[len(held)%2]).ServerReflectionInfo(sctx)
		if err == nil {
			err = rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		}
		if err == nil {
			_, err = rs.Recv()
		}
		if err == nil {
			held = append(held, scancel)
			continue
		}
		scancel()
		wantCode(t, fmt.Sprintf("stream %d of %d", len(held)+1, limit), err, codes.ResourceExhausted)
		wait("the places of ended calls did not all come back")
	}
	wantCode(t, "a health check with every probe place held", healthCheck(conns[0], 5*time.Second), codes.ResourceExhausted)
	r.beat(t, status1("w1")) // heartbeats have their own places

	held[0]()
	for {
		err := healthCheck(conns[1], 5*time.Second)
		if err == nil {
			break
		}
		wantCode(t, "a health check while the places are held", err, codes.ResourceExhausted)
		wait("a held call that ended did not give its place back")
	}
	r.beat(t, status1("w1"))

	// A call that returns through the interceptors gives its place back before its answer is
	// sent: one place is enough for calls one after another.
	one := newRigWith(t, grpcapi.Options{MaxCalls: 1}, nil)
	for range 100 {
		one.beat(t, status1("w1"))
	}
}
