package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/dnstest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// TestEnginePoolDiscoveredByDNS (R23): tlengine processes on 127.0.0.1–3 share one port and
// are the A records of one name on a loopback DNS server, which tlgw asks (--dns-server).
// Every record is a scraped worker "pool/<ip:port>"; a record whose engine does not answer yet
// gets no traffic until its first good scrape; a record removed while its engine streams
// drains: the stream finishes, no new request goes there, and the worker is then removed.
func TestEnginePoolDiscoveredByDNS(t *testing.T) {
	dns := dnstest.Start(t)
	_, port, _ := net.SplitHostPort(freeAddr(t))
	addr := func(i int) string { return fmt.Sprintf("127.0.0.%d:%s", i, port) }
	id := func(i int) string { return "pool/" + addr(i) }
	ip := func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("127.0.0.%d", i)) }
	engine := func(i int) *proctest.Proc {
		return proctest.StartEngine(t, tlengineBin, "--id", fmt.Sprintf("e%d", i), "--model", "llama",
			"--http-listen", addr(i), "--decode-per-token", "40ms")
	}
	engine(1)
	engine(2)
	dns.Set("engines.test", ip(1), ip(2))

	cfg := filepath.Join(t.TempDir(), "tlgw.toml")
	toml := fmt.Sprintf(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_miss_limit = 3
route_policy = "round_robin"

[[gateway.engine_pools]]
name = "pool"
model = "llama"
dns = "engines.test:%s"
metrics = "vllm"
scrape_interval = "100ms"
refresh = "200ms"
`, port)
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	_, dnsPort, _ := net.SplitHostPort(dnsAddr(t, dns))
	gw := proctest.Start(t, tlgwBin, []string{"serve", "--config", cfg, "--dns-server", "127.0.0.1:" + dnsPort})
	f := &fleet{gw: gw, base: "http://" + gw.HTTPAddr}
	f.waitWorkers(t, id(1), id(2))

	post := func(stream bool, maxTokens int) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", f.base+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"llama","prompt":"hello","max_tokens":%d,"stream":%v}`, maxTokens, stream)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		return resp
	}
	served := func(i int) int { return completionsServed(t, addr(i)) }
	oneShot := func(n int) {
		t.Helper()
		for range n {
			resp := post(false, 1)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}

	// A record whose engine is not up: scraped, failing, never a worker, never routed.
	dns.Set("engines.test", ip(1), ip(2), ip(3))
	eventually(t, "the new record is scraped (and fails)", 10*time.Second, func() bool {
		return strings.Contains(scrapeErrorsOf(t, f.base), `tlgw_scrape_errors_total{reason="connect",worker="pool"}`)
	})
	oneShot(6)
	if ids := f.ids(t); !slices.Equal(ids, []string{id(1), id(2)}) {
		t.Fatalf("workers %v before the third engine answers a scrape", ids)
	}
	// Its engine starts: the next scrape makes it a worker, which round robin then uses.
	engine(3)
	f.waitWorkers(t, id(1), id(2), id(3))
	before3 := served(3)
	oneShot(6)
	if got := served(3) - before3; got != 2 {
		t.Fatalf("the third engine served %d of 6 round-robin requests once scraped; want 2", got)
	}

	// A stream runs on some engine; its record goes: the worker drains.
	stream := post(true, 50)
	defer stream.Body.Close()
	rd := bufio.NewReader(stream.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatalf("the stream's first line: %v", err)
	}
	busy := 0
	for _, w := range f.workers(t) {
		if w.InFlight > 0 {
			fmt.Sscanf(strings.TrimPrefix(w.ID, "pool/127.0.0."), "%d", &busy)
		}
	}
	if busy == 0 {
		t.Fatalf("no worker has the stream in flight: %+v", f.workers(t))
	}
	var keep []netip.Addr
	for i := 1; i <= 3; i++ {
		if i != busy {
			keep = append(keep, ip(i))
		}
	}
	dns.Set("engines.test", keep...)
	eventually(t, "the streaming worker drains", 10*time.Second, func() bool {
		for _, w := range f.workers(t) {
			if w.ID == id(busy) {
				return w.Draining && !w.Routable && w.InFlight == 1
			}
		}
		return false
	})
	beforeBusy := served(busy)
	oneShot(6)
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.Contains(string(rest), "data: [DONE]") || strings.Contains(string(rest), `"error"`) {
		t.Fatalf("the drained worker's stream did not finish cleanly: %v %q", err, rest)
	}
	// The stream itself is counted when it ends; nothing else went there.
	eventually(t, "the stream counted by its engine", 5*time.Second, func() bool { return served(busy) >= beforeBusy+1 })
	if got := served(busy) - beforeBusy; got != 1 {
		t.Fatalf("the draining engine served %d requests besides its stream", got-1)
	}
	// Drained: removed.
	var ids []string
	for i := 1; i <= 3; i++ {
		if i != busy {
			ids = append(ids, id(i))
		}
	}
	f.waitWorkers(t, ids...)
	metrics := scrapeErrorsOf(t, f.base)
	for _, want := range []string{`tlgw_engine_pool_workers{pool="pool",state="active"} 2`, `tlgw_engine_pool_workers{pool="pool",state="draining"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(metrics, "127.0.0.") {
		t.Error("an address is a metrics label")
	}
}

// dnsAddr is the loopback address dns serves on (through its resolver's dialer).
func dnsAddr(t *testing.T, dns *dnstest.Server) string {
	t.Helper()
	c, err := dns.Resolver().Dial(context.Background(), "udp", "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.RemoteAddr().String()
}

// completionsServed is tlengine_requests_total{code="200",endpoint="completions"} of the
// engine at addr.
func completionsServed(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, `tlengine_requests_total{code="200",endpoint="completions"}`) {
			var n int
			fmt.Sscan(strings.Fields(line)[1], &n)
			return n
		}
	}
	return 0
}

// scrapeErrorsOf is the gateway's metrics page.
func scrapeErrorsOf(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
