package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/proctest"
)

// freeAddr returns a loopback address free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestStaticWorkersScrapedAsVLLM: two tlengine processes without --gateway are fronted as
// static workers scraped with the vLLM metric names. Requests route by least outstanding using
// the scraped queue depth; a killed engine is evicted after k·interval and requests keep
// succeeding on the other; restarted, it comes back.
func TestStaticWorkersScrapedAsVLLM(t *testing.T) {
	a, b := freeAddr(t), freeAddr(t)
	start := func(id, addr string) *proctest.Proc {
		return proctest.StartEngine(t, tlengineBin, "--id", id, "--model", "llama", "--http-listen", addr,
			"--max-running", "1", "--decode-per-token", "20ms")
	}
	ea := start("a", a)
	start("b", b)
	toml := fmt.Sprintf(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_miss_limit = 3

[[gateway.static_workers]]
id = "a"
model = "llama"
http_address = %q
metrics = "vllm"
scrape_interval = "100ms"

[[gateway.static_workers]]
id = "b"
model = "llama"
http_address = %q
metrics = "vllm"
scrape_interval = "100ms"
`, a, b)
	f := &fleet{gw: startTLGW(t, toml)}
	f.base = "http://" + f.gw.HTTPAddr
	f.waitWorkers(t, "a", "b")

	post := func(maxTokens int) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", f.base+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"llama","prompt":"hello","max_tokens":%d}`, maxTokens)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for i := 0; i < 4; i++ {
		if code, body := post(2); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}

	// Load a's engine directly (not through the gateway): with max-running 1 its queue fills;
	// once scraped, least outstanding sends gateway traffic to b.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 3; i++ {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+a+"/v1/completions",
				strings.NewReader(`{"model":"llama","prompt":"busy","max_tokens":200}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	eventually(t, "a's scraped queue depth shows", 5*time.Second, func() bool {
		for _, w := range f.workersFull(t) {
			if w.ID == "a" && w.QueueDepth >= 1 {
				return true
			}
		}
		return false
	})
	servedByB := func() int {
		resp, err := http.Get("http://" + b + "/metrics")
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
	before := servedByB()
	for i := 0; i < 3; i++ {
		if code, body := post(1); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
	}
	if got := servedByB() - before; got != 3 {
		t.Fatalf("b served %d of 3 requests while a's scraped queue was long; want all", got)
	}
	cancel()

	// Kill a: evicted after k·interval (300 ms), requests keep succeeding on b.
	if err := ea.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-ea.Exited()
	f.waitWorkers(t, "b")
	for i := 0; i < 5; i++ {
		if code, body := post(1); code != 200 {
			t.Fatalf("after the kill: %d %s", code, body)
		}
	}
	// Restart a on the same address: back on its next good scrape.
	start("a", a)
	f.waitWorkers(t, "a", "b")
}

type workerFull struct {
	ID          string `json:"id"`
	QueueDepth  int    `json:"queue_depth"`
	Static      bool   `json:"static"`
	ScrapeError string `json:"scrape_error"`
}

func (f *fleet) workersFull(t *testing.T) []workerFull {
	t.Helper()
	resp, err := http.Get(f.base + "/admin/v1/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Workers []workerFull `json:"workers"`
	}
	body, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(body, &out)
	return out.Workers
}
