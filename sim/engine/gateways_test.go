package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// lookupAnswer is one scripted lookup result.
type lookupAnswer struct {
	ips []string
	err error
}

// scriptedResolver answers each name from its script, one answer per lookup; the last answer
// repeats. calls counts lookups of every name.
type scriptedResolver struct {
	mu      sync.Mutex
	scripts map[string][]lookupAnswer
	calls   int
}

var _ Resolver = (*scriptedResolver)(nil)

func (r *scriptedResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	script := r.scripts[host]
	if network != "ip" || len(script) == 0 {
		return nil, fmt.Errorf("lookup %s %s: no such host", network, host)
	}
	a := script[0]
	if len(script) > 1 {
		r.scripts[host] = script[1:]
	}
	var out []netip.Addr
	for _, ip := range a.ips {
		out = append(out, netip.MustParseAddr(ip))
	}
	return out, a.err
}

func (r *scriptedResolver) lookups() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// countingRegistry is a WorkerRegistry that counts heartbeats and its open connections. Its
// ack names no interval, so the engine keeps its own.
type countingRegistry struct {
	controlv1.UnimplementedWorkerRegistryServer
	beats atomic.Int64
	conns atomic.Int64
}

var _ stats.Handler = (*countingRegistry)(nil)

func (r *countingRegistry) Heartbeat(context.Context, *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	r.beats.Add(1)
	return &controlv1.HeartbeatAck{Epoch: 1}, nil
}

func (r *countingRegistry) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (r *countingRegistry) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (r *countingRegistry) HandleRPC(context.Context, stats.RPCStats) {}

func (r *countingRegistry) HandleConn(_ context.Context, s stats.ConnStats) {
	switch s.(type) {
	case *stats.ConnBegin:
		r.conns.Add(1)
	case *stats.ConnEnd:
		r.conns.Add(-1)
	}
}

// startRegistries starts one countingRegistry per loopback IP, all on the same port (what a
// name's replicas look like); an IP that cannot be bound fails the test (IPv6 loopback included:
// the machine's resolver answers AAAA records too).
func startRegistries(t *testing.T, ips ...string) ([]*countingRegistry, string) {
	t.Helper()
	port := "0"
	regs := make([]*countingRegistry, len(ips))
	for i, ip := range ips {
		lis, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			t.Fatalf("cannot listen on %s (the test needs IPv4 and IPv6 loopback): %v", ip, err)
		}
		_, port, _ = net.SplitHostPort(lis.Addr().String())
		regs[i] = &countingRegistry{}
		s := grpc.NewServer(grpc.StatsHandler(regs[i]))
		controlv1.RegisterWorkerRegistryServer(s, regs[i])
		go func() { _ = s.Serve(lis) }()
		t.Cleanup(s.Stop)
	}
	return regs, port
}

// noLeaks fails the test if a goroutine started during it outlives its cleanups; call it first.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

func beats(regs []*countingRegistry) []int64 {
	out := make([]int64, len(regs))
	for i, r := range regs {
		out[i] = r.beats.Load()
	}
	return out
}

// TestDNSGatewayFollowsAnswers: a dns:/// gateway whose name answers 2, then 3, then 1
// address, then fails. Each answer's addresses are heartbeated; an added one right after the
// re-resolve tick; a removed one's connection is closed and it hears no more; a failed lookup
// keeps the set. T is 100 s, past three 30 s re-resolves, so every beat is accounted for.
func TestDNSGatewayFollowsAnswers(t *testing.T) {
	noLeaks(t)
	regs, port := startRegistries(t, "127.0.0.1", "127.0.0.2", "::1")
	a, b, c := "127.0.0.1:"+port, "127.0.0.2:"+port, "[::1]:"+port
	res := &scriptedResolver{scripts: map[string][]lookupAnswer{"registry.test": {
		{ips: []string{"127.0.0.2", "127.0.0.1"}},
		{ips: []string{"127.0.0.1", "::1", "127.0.0.2"}},
		{ips: []string{"::1"}},
		{err: errors.New("server misbehaving")},
	}}}
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{Gateways: []string{"dns:///registry.test:" + port}, Resolver: res, Clock: fc,
		HeartbeatInterval: 100 * time.Second})

	// settled: the lookups done, the set running, every loop and the re-resolve armed.
	settled := func(lookups int, want []string, wantBeats ...int64) {
		t.Helper()
		gwtest.Eventually(t, fmt.Sprintf("lookup %d: %v heartbeated", lookups, want), func() bool {
			return res.lookups() == lookups && cmp.Equal(e.heartbeatTargets(), want) &&
				fc.Pending() == len(want)+1 && cmp.Equal(beats(regs), wantBeats)
		})
	}
	settled(1, []string{a, b}, 1, 1, 0)

	fc.Advance(30 * time.Second) // 3 addresses: the new one is heartbeated at once
	settled(2, []string{a, b, c}, 1, 1, 1)

	fc.Advance(30 * time.Second) // 1 address: the other two loops end, their connections close
	settled(3, []string{c}, 1, 1, 1)
	gwtest.Eventually(t, "removed gateways' connections closed", func() bool {
		return regs[0].conns.Load() == 0 && regs[1].conns.Load() == 0
	})

	fc.Advance(30 * time.Second) // the lookup fails: the set stays
	settled(4, []string{c}, 1, 1, 1)

	// t = 130 s: the remaining gateway's second beat; the removed ones' T (at 100 s) never came.
	fc.Advance(40 * time.Second)
	settled(5, []string{c}, 1, 1, 2)
	if n := regs[2].conns.Load(); n != 1 {
		t.Fatalf("the kept gateway has %d connections, want 1", n)
	}

	e.Close()
	if got := e.heartbeatTargets(); len(got) != 0 || fc.Pending() != 0 {
		t.Fatalf("after Close: loops %v, %d timers pending", got, fc.Pending())
	}
	gwtest.Eventually(t, "connections closed", func() bool { return regs[2].conns.Load() == 0 })
}

// TestGatewayNamedTwiceHeartbeatedOnce: a fixed address, two names and a repeated entry that
// overlap run one loop per distinct address.
func TestGatewayNamedTwiceHeartbeatedOnce(t *testing.T) {
	noLeaks(t)
	regs, port := startRegistries(t, "127.0.0.1", "127.0.0.2")
	a, b := "127.0.0.1:"+port, "127.0.0.2:"+port
	res := &scriptedResolver{scripts: map[string][]lookupAnswer{
		"a.test": {{ips: []string{"127.0.0.1", "127.0.0.2", "::ffff:127.0.0.2"}}},
		"b.test": {{ips: []string{"127.0.0.2"}}},
	}}
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{Gateways: []string{a, "dns:///a.test:" + port, "dns:///b.test:" + port, "dns:///a.test:" + port},
		Resolver: res, Clock: fc, HeartbeatInterval: 100 * time.Second})
	gwtest.Eventually(t, "both heartbeated", func() bool {
		return fc.Pending() == 3 && cmp.Equal(beats(regs), []int64{1, 1})
	})
	if diff := cmp.Diff([]string{a, b}, e.heartbeatTargets()); diff != "" {
		t.Fatalf("loops (-want +got):\n%s", diff)
	}
	if n := res.lookups(); n != 2 {
		t.Fatalf("%d lookups for two names, want 2", n)
	}
}

// TestDNSGatewayFirstLookupFails: no address until the name answers; then heartbeats start.
func TestDNSGatewayFirstLookupFails(t *testing.T) {
	regs, port := startRegistries(t, "127.0.0.1")
	res := &scriptedResolver{scripts: map[string][]lookupAnswer{"later.test": {
		{err: errors.New("no such host")},
		{ips: []string{}}, // an empty answer counts as a failure too
		{ips: []string{"127.0.0.1"}},
	}}}
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{Gateways: []string{"dns:///later.test:" + port}, Resolver: res, Clock: fc})
	for lookups := 1; lookups <= 2; lookups++ {
		gwtest.Eventually(t, "re-resolve armed", func() bool { return res.lookups() == lookups && fc.Pending() == 1 })
		if got := e.heartbeatTargets(); len(got) != 0 {
			t.Fatalf("lookup %d failed, yet loops %v", lookups, got)
		}
		fc.Advance(30 * time.Second)
	}
	gwtest.Eventually(t, "heartbeat after the name answers", func() bool { return regs[0].beats.Load() == 1 })
}

// TestGatewayTargets: unmapped, deduplicated, sorted, bracketed, at most 64.
func TestGatewayTargets(t *testing.T) {
	ips := []netip.Addr{
		netip.MustParseAddr("::1"), netip.MustParseAddr("10.0.0.2"),
		netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("10.0.0.2"), {},
	}
	got, dropped := gatewayTargets(ips, "9090")
	if diff := cmp.Diff([]string{"10.0.0.1:9090", "10.0.0.2:9090", "[::1]:9090"}, got); diff != "" || dropped != 0 {
		t.Fatalf("targets (-want +got), %d dropped:\n%s", dropped, diff)
	}

	var many []netip.Addr
	for i := 70; i >= 1; i-- {
		many = append(many, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	got, dropped = gatewayTargets(many, "1")
	if len(got) != MaxGatewaysPerName || dropped != 70-MaxGatewaysPerName || got[0] != "10.0.0.1:1" || got[63] != "10.0.0.64:1" {
		t.Fatalf("70 addresses: kept %d (%s … %s), dropped %d", len(got), got[0], got[len(got)-1], dropped)
	}
}

func TestParseGatewayList(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name253 := strings.Repeat(label63+".", 3) + strings.Repeat("b", 61) // 3×64 + 61 = 253
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{" , ", nil},
		{"gw:9090", []string{"gw:9090"}},
		{" gw-0:9090 , dns:///tlgw-registry.ns.svc.cluster.local:9090,", []string{"gw-0:9090", "dns:///tlgw-registry.ns.svc.cluster.local:9090"}},
		{"[::1]:9090,:9090,10.0.0.1:1", []string{"[::1]:9090", ":9090", "10.0.0.1:1"}},
		{"dns:///10.0.0.1:80,dns:///[::1]:80,dns:///name.:80,dns:///_grpc.x:65535", []string{"dns:///10.0.0.1:80", "dns:///[::1]:80", "dns:///name.:80", "dns:///_grpc.x:65535"}},
		{"dns:///" + label63 + ":1", []string{"dns:///" + label63 + ":1"}},
		{"dns:///" + name253 + ":1", []string{"dns:///" + name253 + ":1"}},
	} {
		got, err := ParseGatewayList(c.in)
		if err != nil || !cmp.Equal(got, c.want) {
			t.Errorf("%q: %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{
		"gw", "gw:0", "gw:http", "gw:70000", "unix:///tmp/registry.sock", "unix:/tmp/registry.sock",
		"passthrough:///gw:9090", "https://gw:443", "dns:gw:9090", "dns://8.8.8.8/gw:9090",
		"dns:///gw", "dns:///:9090", "dns:///a..b:90", "dns:///bad!name:90", "dns:///.:90",
		"dns:///" + strings.Repeat("a", 64) + ":1", "dns:///" + name253 + "b:1",
	} {
		_, err := ParseGatewayList("ok:1," + bad)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--gateway %q", bad)) {
			t.Errorf("%q: err %v, want one naming the entry", bad, err)
		}
	}
	if _, err := Start(Config{ID: "x", Model: "smol", Gateways: []string{"unix:///s"}}); err == nil {
		t.Fatal("Start took a unix:/// gateway")
	}
}

// FuzzParseGateway: any accepted entry is host:port with a port of 1 to 65535, and a dns
// entry's name is at most 253 characters.
func FuzzParseGateway(f *testing.F) {
	for _, s := range []string{"gw:9090", "dns:///svc.ns:1", "dns:///[::1]:80", "unix:///s", "dns:x:1", ":1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ge, err := parseGateway(s)
		if err != nil {
			return
		}
		hostPort := ge.addr
		if ge.name != "" {
			hostPort = net.JoinHostPort(ge.name, ge.port)
			if len(strings.TrimSuffix(ge.name, ".")) > maxDNSName {
				t.Fatalf("%q: name of %d characters accepted", s, len(ge.name))
			}
		}
		if _, _, err := splitHostPort(hostPort); err != nil {
			t.Fatalf("%q accepted as %+v: %v", s, ge, err)
		}
	})
}

// TestResolveIntervalDefault: 30 s unless set; negative is refused.
func TestResolveIntervalDefault(t *testing.T) {
	c := Config{ID: "r", Model: "smol"}
	if err := c.defaults(); err != nil || c.ResolveInterval != 30*time.Second || c.Resolver != net.DefaultResolver {
		t.Fatalf("defaults: %v, %v, %v", c.ResolveInterval, c.Resolver, err)
	}
	c = Config{ID: "r", Model: "smol", ResolveInterval: -time.Second}
	if err := c.defaults(); err == nil {
		t.Fatal("a negative resolve interval was accepted")
	}
}

// TestDNSNameCharacters: a label takes letters, digits, hyphens and underscores, and nothing
// next to them in ASCII.
func TestDNSNameCharacters(t *testing.T) {
	for _, ok := range []string{"a", "z", "A", "Z", "0", "9", "-", "_", "aZ09-_"} {
		if err := checkDNSName("x" + ok + ".svc"); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"`", "{", "@", "[", "/", ":", ",", "^", "\x7f", "é"} {
		if err := checkDNSName("x" + bad + ".svc"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
