package app_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/dnstest"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/engine"
)

// syncBuf is a log the test reads while the gateway writes it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDialTimeAddressRules (R20, issue 35 item 5): a gateway resolves engine names when it
// dials them (here through a test DNS server) and checks the IP a name resolved to. A
// heartbeat whose http_address is a name resolving to the link-local metadata address passes
// registration (a name is not resolved there) but its requests are refused at dial time: at
// once, not after a connect timeout, answered 503 with no address or name in the message, the
// refusal in the log. A static worker at such a name is never scraped into the registry. A
// name resolving to an allowed address serves.
func TestDialTimeAddressRules(t *testing.T) {
	dns := dnstest.Start(t)
	dns.Set("metadata.test", netip.MustParseAddr("169.254.0.1"))
	dns.Set("engine.test", netip.MustParseAddr("127.0.0.1"))
	e, err := engine.Start(engine.Config{ID: "good", Model: "good", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, port, _ := net.SplitHostPort(e.HTTPAddr)

	logs := &syncBuf{}
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.HeartbeatInterval = time.Minute
	cfg.Gateway.StaticWorkers = config.NormalizeStaticWorkers([]config.StaticWorker{
		{ID: "static-meta", Model: "static", HTTPAddress: "metadata.test:9", Metrics: "vllm", ScrapeInterval: config.Duration(250 * time.Millisecond)},
	})
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), Resolver: dns.Resolver()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(t.Context())

	conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := controlv1.NewWorkerRegistryClient(conn)
	for _, st := range []*controlv1.WorkerStatus{
		{WorkerId: "meta", Model: "meta", HttpAddress: "metadata.test:9"},
		{WorkerId: "good", Model: "good", HttpAddress: "engine.test:" + port},
	} {
		st.KvTotalBlocks, st.KvFreeBlocks = 1024, 1024
		if _, err := reg.Heartbeat(context.Background(), st); err != nil {
			t.Fatalf("heartbeat %s: %v", st.WorkerId, err)
		}
	}
	complete := func(model string) (int, string, time.Duration) {
		start := time.Now()
		resp, err := http.Post("http://"+a.HTTPAddr+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2}`, model)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), time.Since(start)
	}
	code, body, took := complete("meta")
	if code != 503 || took > 2*time.Second {
		t.Fatalf("a name resolving to link-local: %d %s after %v, want 503 at once", code, body, took)
	}
	for _, leak := range []string{"169.254", "metadata", "refused"} {
		if strings.Contains(body, leak) {
			t.Fatalf("the answer %s names %q", body, leak)
		}
	}
	if !strings.Contains(logs.String(), "engine address refused: the link-local address 169.254.0.1") {
		t.Fatalf("the refusal is not in the log:\n%s", logs.String())
	}
	if code, body, _ := complete("good"); code != 200 {
		t.Fatalf("a name resolving to loopback on a loopback registry: %d %s", code, body)
	}
	gwtest.Eventually(t, "the static worker's scrapes fail to connect", func() bool {
		return scrapeErrors(t, a, "static-meta", "connect") >= 3
	})
	if n := scrapeErrors(t, a, "static-meta", "timeout"); n != 0 {
		t.Fatalf("%v scrapes of the link-local name timed out: they dialled", n)
	}
	l, err := a.Gateway.Workers()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range l.Workers {
		if w.Info.ID == "static-meta" {
			t.Fatal("the static worker at a link-local name was scraped into the registry")
		}
	}
}

// scrapeErrors is tlgw_scrape_errors_total{worker, reason} of a's registry.
func scrapeErrors(t *testing.T, a *app.App, worker, reason string) float64 {
	t.Helper()
	fams, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "tlgw_scrape_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["worker"] == worker && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
