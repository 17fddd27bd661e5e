package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/proctest"
)

// registryClient sends raw heartbeats to a gateway's registry, as an engine (or an attacker
// holding a credential) would.
type registryClient struct {
	c controlv1.WorkerRegistryClient
}

func newRegistryClient(t *testing.T, addr string) *registryClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &registryClient{c: controlv1.NewWorkerRegistryClient(conn)}
}

func (r *registryClient) beat(st *controlv1.WorkerStatus) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := r.c.Heartbeat(ctx, st)
	return err
}

// dialCounter is a set of loopback listeners that count the connections each accepts (and
// close them at once: nothing behind them speaks gRPC).
type dialCounter struct {
	addrs    []string
	accepted []atomic.Int64
	wg       sync.WaitGroup
}

func newDialCounter(t *testing.T, n int) *dialCounter {
	t.Helper()
	d := &dialCounter{accepted: make([]atomic.Int64, n)}
	var lis []net.Listener
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis = append(lis, l)
		d.addrs = append(d.addrs, l.Addr().String())
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					return // closed at cleanup
				}
				d.accepted[i].Add(1)
				c.Close()
			}
		}()
	}
	t.Cleanup(func() {
		for _, l := range lis {
			l.Close()
		}
		d.wg.Wait()
	})
	return d
}

// dialled is how many of the listeners have accepted at least one connection.
func (d *dialCounter) dialled() int {
	n := 0
	for i := range d.accepted {
		if d.accepted[i].Load() > 0 {
			n++
		}
	}
	return n
}

// maxFollowedMoves is how many address changes of one registration the gateway follows per
// window (grpcapi.MaxMoves): with its first address, at most this many + 1 addresses are
// ever dialled for it within a minute.
const maxFollowedMoves = 3

// TestOneIDMovingAddressesHoldsOneConnection (R20, issue 35's reproduction of item 3): a
// credentialed engine that heartbeats one id with 1,000 different grpc_addresses, reporting
// kv_events so that each address would be subscribed to at once, makes the gateway dial at
// most the first few of them (address changes are rate-limited), holds at most one engine
// connection throughout the end, logs the ignored changes once, and once the id has expired
// holds none, with its goroutines back where they were. Before, every heartbeat opened a new
// ClientConn and subscription: a port scanner pointed anywhere, and goroutines and file
// descriptors growing with the heartbeats.
func TestOneIDMovingAddressesHoldsOneConnection(t *testing.T) {
	const moves = 1000
	// k·T = 3 s: the 1,000 heartbeats keep one registration alive even on a loaded machine
	// (a registration that expired and came back would start a new window of moves).
	gw := startTLGW(t, strings.Replace(preciseConfig, `heartbeat_interval = "200ms"`, `heartbeat_interval = "1s"`, 1))
	base := "http://" + gw.HTTPAddr
	targets := newDialCounter(t, moves)
	reg := newRegistryClient(t, gw.GRPCAddr)
	status := func(i int) *controlv1.WorkerStatus {
		return &controlv1.WorkerStatus{WorkerId: "mover", Model: "smol", HttpAddress: "127.0.0.1:9",
			GrpcAddress: targets.addrs[i], KvEvents: true, KvTotalBlocks: 16, KvFreeBlocks: 16}
	}
	if err := reg.beat(status(0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first address is subscribed to", 5*time.Second, func() bool { return targets.accepted[0].Load() > 0 })
	baseline := metricSum(t, base, "go_goroutines")

	for i := 1; i < moves; i++ {
		if err := reg.beat(status(i)); err != nil {
			t.Fatalf("heartbeat %d: %v", i, err)
		}
	}
	// Keep the id alive on its last address while the gateway settles.
	keep := func() {
		if err := reg.beat(status(moves - 1)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the gateway's goroutines settle after the moves", 10*time.Second, func() bool {
		keep()
		return metricSum(t, base, "go_goroutines") <= baseline+10
	})
	if n := targets.dialled(); n > 1+maxFollowedMoves {
		t.Fatalf("%d of the %d addresses were dialled, want at most %d", n, moves, 1+maxFollowedMoves)
	}
	if n := metricSum(t, base, "tlgw_engine_connections"); n > 1 {
		t.Fatalf("%v engine connections open for one worker", n)
	}
	if n := strings.Count(gw.Logs(), "worker id reported with different addresses"); n > 1 {
		t.Fatalf("the address change was logged %d times, want once per window", n)
	}
	if n := strings.Count(gw.Logs(), "changes its engine addresses too often"); n != 1 {
		t.Fatalf("the ignored changes were logged %d times, want once per window:\n%.4000s", n, gw.Logs())
	}

	// The id stops heartbeating and expires (k·T = 3 s): nothing of it is left.
	admin := &fleet{base: base}
	eventually(t, "the mover is evicted and its connections closed", 10*time.Second, func() bool {
		return len(admin.ids(t)) == 0 && metricSum(t, base, "tlgw_engine_connections") == 0
	})
	eventually(t, "the gateway's goroutines are back", 10*time.Second, func() bool {
		return metricSum(t, base, "go_goroutines") <= baseline
	})
}

// pdConfig is a gateway with a disaggregated route "smol" (R8).
const pdConfig = fastHeartbeats + `
[[gateway.routes]]
model = "smol"
backends = [{ model = "smol", weight = 1 }]
targets = ["disaggregated"]
`

// TestImpostorExpiryKeepsTheVictimsConnection (R20, issue 35's reproduction of item 3):
// a worker that registers another live engine's gRPC address (under a model of its own, so it
// is never picked) and then expires does not close the victim's connection: a Prefill in
// flight on the victim when the impostor expires completes, and the request is answered.
// Before, connections were keyed by address, and the impostor's eviction closed the shared
// one under the victim's call.
func TestImpostorExpiryKeepsTheVictimsConnection(t *testing.T) {
	f := startFleet(t, pdConfig,
		// 200 prompt tokens at 20 ms each: the Prefill runs for about 4 s, over the impostor's
		// expiry 600 ms after its only heartbeat.
		[]string{"p", "--model", "smol", "--role", "prefill", "--prefill-per-token", "20ms"},
		[]string{"d", "--model", "smol", "--role", "decode"})
	victim := f.engines["p"]
	reg := newRegistryClient(t, f.gw.GRPCAddr)
	if err := reg.beat(&controlv1.WorkerStatus{WorkerId: "impostor", Model: "other", HttpAddress: "127.0.0.1:9",
		GrpcAddress: victim.GRPCAddr, KvAddress: victim.GRPCAddr, Role: controlv1.Role_ROLE_PREFILL}); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		prompt := strings.Repeat("word ", 200)
		resp, err := http.Post(f.base+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":4,"seed":1}`, prompt)))
		if err != nil {
			done <- answer{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{resp.StatusCode, string(b)}
	}()
	running := func() float64 { return metricSum(t, "http://"+victim.HTTPAddr, "tlengine_running") }
	eventually(t, "the Prefill runs on the victim", 5*time.Second, func() bool { return running() > 0 })
	f.waitWorkers(t, "d", "p") // the impostor expired while the Prefill runs
	select {
	case a := <-done:
		if a.code != 200 {
			t.Fatalf("the victim's request, as the impostor expired: %d %s, want 200", a.code, a.body)
		}
		t.Fatal("the Prefill ended before the impostor expired: the test proves nothing")
	default:
	}
	select {
	case a := <-done:
		if a.code != 200 {
			t.Fatalf("the victim's request: %d %s, want 200", a.code, a.body)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the victim's request did not end")
	}
}

// TestDialTimeRefusesLoopbackNames (R20, issue 35's reproduction of item 5): on a registry
// that listens off loopback, an engine address that is a DNS name resolving to loopback
// ("localhost") passes registration (names are not resolved there) but is refused at dial
// time, for HTTP attempts and for gRPC control calls alike: the request fails over and is
// answered 503 without an engine address or name in the message, and the engine never sees a
// request. A literal loopback IP is refused at registration. With
// [registry] allow_loopback_engines the same engine serves.
func TestDialTimeRefusesLoopbackNames(t *testing.T) {
	unified := proctest.StartEngine(t, tlengineBin, "--id", "u", "--model", "smol")
	prefill := proctest.StartEngine(t, tlengineBin, "--id", "p", "--model", "pd", "--role", "prefill")
	decode := proctest.StartEngine(t, tlengineBin, "--id", "d", "--model", "pd", "--role", "decode")
	named := func(addr string) string {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		return "localhost:" + port
	}
	const offLoopback = `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "0.0.0.0:0"
heartbeat_interval = "1m"

[registry]
allow_insecure = true

[[gateway.routes]]
model = "pd"
backends = [{ model = "pd", weight = 1 }]
targets = ["disaggregated"]
`
	for _, c := range []struct {
		name  string
		toml  string
		serve bool
	}{
		{"refused", offLoopback, false},
		{"allow_loopback_engines", strings.Replace(offLoopback, "allow_insecure = true", "allow_insecure = true\nallow_loopback_engines = true", 1), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			toml := c.toml
			gw := startTLGW(t, toml)
			_, port, _ := net.SplitHostPort(gw.GRPCAddr)
			reg := newRegistryClient(t, "127.0.0.1:"+port)
			literal := &controlv1.WorkerStatus{WorkerId: "lit", Model: "smol", HttpAddress: unified.HTTPAddr}
			if err := reg.beat(literal); c.serve != (err == nil) || (err != nil && status.Code(err) != codes.InvalidArgument) {
				t.Fatalf("a literal loopback address: %v", err)
			}
			for _, st := range []*controlv1.WorkerStatus{
				{WorkerId: "u", Model: "smol", HttpAddress: named(unified.HTTPAddr)},
				{WorkerId: "p", Model: "pd", Role: controlv1.Role_ROLE_PREFILL, HttpAddress: named(prefill.HTTPAddr),
					GrpcAddress: named(prefill.GRPCAddr)},
				{WorkerId: "d", Model: "pd", Role: controlv1.Role_ROLE_DECODE, HttpAddress: named(decode.HTTPAddr),
					GrpcAddress: named(decode.GRPCAddr), KvAddress: named(decode.KVAddr)},
			} {
				st.KvTotalBlocks, st.KvFreeBlocks = 1024, 1024
				if err := reg.beat(st); err != nil {
					t.Fatalf("heartbeat %s: %v", st.WorkerId, err)
				}
			}
			for _, model := range []string{"smol", "pd"} {
				served := func() float64 {
					return metricSum(t, "http://"+unified.HTTPAddr, "tlengine_requests_total") +
						metricSum(t, "http://"+prefill.HTTPAddr, "tlengine_grpc_requests_total")
				}
				before := served()
				resp, body := post(t, "http://"+gw.HTTPAddr+"/v1/completions", "", fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2}`, model))
				after := served()
				if c.serve {
					if resp.StatusCode != 200 {
						t.Fatalf("%s with loopback engines allowed: %d %s", model, resp.StatusCode, body)
					}
					continue
				}
				if resp.StatusCode != 503 || after != before {
					t.Fatalf("%s: %d %s with %v engine requests, want 503 and none", model, resp.StatusCode, body, after-before)
				}
				for _, leak := range []string{"localhost", "127.0.0.1", "refused"} {
					if strings.Contains(body, leak) {
						t.Fatalf("%s: the client's answer %s names %q", model, body, leak)
					}
				}
			}
		})
	}
}
