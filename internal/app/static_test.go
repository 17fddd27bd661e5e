package app_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/sim/engine"
)

// TestStaticWorkersAdmin: PUT /admin/v1/static-workers follows the routes' discipline (428,
// 412, 400, 200 with a new ETag) and a static worker put there is scraped into the registry.
func TestStaticWorkersAdmin(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.Start(engine.Config{ID: "st-1", Model: "llama", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	// Engines' heartbeats are not what a static worker lives by: its deadline is k scrape
	// intervals (150 ms here), not k·T (3 min).
	cfg.Gateway.HeartbeatInterval = time.Minute
	cfg.Registry.EngineCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	a, err := app.Start(cfg, app.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(t.Context())
	base := "http://" + a.HTTPAddr + "/admin/v1/static-workers"
	do := func(method, body string, hdr ...string) (*http.Response, string) {
		req, _ := http.NewRequest(method, base, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := do("GET", "")
	if resp.StatusCode != 200 || resp.Header.Get("ETag") != `"1"` || !strings.Contains(body, `"static_workers":[]`) {
		t.Fatalf("GET: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	table := fmt.Sprintf(`{"static_workers":[{"id":"st-1","model":"llama","http_address":%q,"metrics":"vllm","scrape_interval":"50ms"}]}`, e.HTTPAddr)
	if resp, _ := do("PUT", table); resp.StatusCode != 428 {
		t.Fatalf("no If-Match: %d", resp.StatusCode)
	}
	if resp, _ := do("PUT", table, "If-Match", `"7"`); resp.StatusCode != 412 {
		t.Fatalf("stale: %d", resp.StatusCode)
	}
	for _, bad := range []struct{ table, key string }{
		{`{"static_workers":[{"id":"x","model":"m","http_address":"h:1","metrics":"nope"}]}`, "static_workers[0].metrics"},
		{`{"static_workers":[{"id":"x","model":"m","http_address":"h:1","metrics":"vllm","colour":1}]}`, "colour"},
		{`{"static_workers":[{"id":"x","model":"m","http_address":"h:1","metrics":"vllm","scrape_interval":"soon"}]}`, "is not a duration"},
		{`{}`, "static_workers"},
		// R20: the address rules of a heartbeat, the configuration's engine_cidrs included.
		{`{"static_workers":[{"id":"x","model":"m","http_address":"h:1/v1/admin?x=","metrics":"vllm"}]}`, "static_workers[0].http_address"},
		{`{"static_workers":[{"id":"x","model":"m","http_address":"10.0.0.5:8000","metrics":"vllm"}]}`, "static_workers[0].http_address"},
	} {
		resp, body := do("PUT", bad.table, "If-Match", `"1"`)
		if resp.StatusCode != 400 || !strings.Contains(body, "invalid_static_worker") || !strings.Contains(body, bad.key) {
			t.Fatalf("%s: %d %s, want 400 invalid_static_worker naming %s", bad.table, resp.StatusCode, body, bad.key)
		}
	}
	resp, body = do("PUT", table, "If-Match", `"1"`)
	if resp.StatusCode != 200 || resp.Header.Get("ETag") != `"2"` || !strings.Contains(body, `"metrics_url":"http://`+e.HTTPAddr+`/metrics"`) {
		t.Fatalf("PUT: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	gwtest.Eventually(t, "the static worker is scraped into the registry", func() bool {
		l, err := a.Gateway.Workers()
		if err != nil || len(l.Workers) != 1 {
			return false
		}
		w := l.Workers[0]
		return w.Info.ID == "st-1" && w.Info.Static && w.Routable && w.Info.KVTotalBlocks == 1024 && w.Info.BlockSize == 16
	})
	// Served through the gateway.
	r, err := http.Post("http://"+a.HTTPAddr+"/v1/completions", "application/json", strings.NewReader(`{"model":"llama","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	_ = json.NewDecoder(r.Body).Decode(&out)
	r.Body.Close()
	if r.StatusCode != 200 || out["choices"] == nil {
		t.Fatalf("completion via a static worker: %d %v", r.StatusCode, out)
	}
	// Once its engine is gone, the worker is evicted k scrape intervals after its last scrape.
	e.Close()
	gwtest.Eventually(t, "the static worker whose engine stopped is evicted", func() bool {
		l, err := a.Gateway.Workers()
		return err == nil && len(l.Workers) == 0
	})
}

// TestStaticWorkerAdvertisesLoRA (R21): a static worker reaches the router with what its
// engine says of LoRA — its adapters and context length from GET /v1/models, its running
// adapters and max_lora from vllm:lora_requests_info — and the endpoints its table entry
// lists, as a heartbeating worker's status would give them; and the admin table's GET, PUT of
// what it read and GET again keep the endpoints.
func TestStaticWorkerAdvertisesLoRA(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			io.WriteString(w, `vllm:num_requests_waiting{model_name="llama"} 2
vllm:num_requests_running{model_name="llama"} 1
vllm:kv_cache_usage_perc{model_name="llama"} 0.25
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="400"} 1
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.0e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters="chat"} 1.7e9
`)
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[
{"id":"llama","object":"model","root":"llama","parent":null,"max_model_len":8192},
{"id":"sql","object":"model","root":"/lora/sql","parent":"llama"},
{"id":"chat","object":"model","root":"/lora/chat","parent":"llama"},
{"id":"not ours","object":"model","root":"/lora/x","parent":"other"}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer eng.Close()
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.HeartbeatInterval = time.Minute
	cfg.Registry.EngineCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	cfg.Gateway.StaticWorkers = config.NormalizeStaticWorkers([]config.StaticWorker{{
		ID: "lora-1", Model: "llama", HTTPAddress: eng.Listener.Addr().String(), Metrics: "vllm",
		ScrapeInterval: config.Duration(50 * time.Millisecond), Endpoints: []string{"embeddings", "completions"},
	}})
	a, err := app.Start(cfg, app.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(t.Context())

	var got router.WorkerInfo
	gwtest.Eventually(t, "the static worker is scraped into the registry", func() bool {
		l, err := a.Gateway.Workers()
		if err != nil || len(l.Workers) != 1 {
			return false
		}
		got = l.Workers[0].Info
		return got.Static
	})
	want := router.WorkerInfo{
		LoRAAdapters: []string{"chat", "sql"}, MaxLoRAs: 2, RunningLoRAs: []string{"sql"}, MaxModelLen: 8192,
		Endpoints:     oai.EndpointSet(0).With(oai.Completions).With(oai.Embeddings),
		BootstrapPort: config.DefaultBootstrapPort, // R22: the table's default reaches the worker
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(router.WorkerInfo{}, "ID", "Reg", "Model", "Role", "HTTPAddress",
		"QueueDepth", "Running", "KVFreeBlocks", "KVTotalBlocks", "BlockSize", "LastHeartbeat", "Static")); diff != "" {
		t.Fatalf("the worker's R21 fields, -want +got:\n%s", diff)
	}
	if !got.ServesLoRA("sql") || got.ServesLoRA("not ours") || got.QueueDepth != 2 {
		t.Fatalf("worker %+v", got)
	}

	// The admin table's round trip keeps the endpoints.
	admin := "http://" + a.HTTPAddr + "/admin/v1/static-workers"
	resp, err := http.Get(admin)
	if err != nil {
		t.Fatal(err)
	}
	table, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(table), `"endpoints":["embeddings","completions"]`) {
		t.Fatalf("GET: %s", table)
	}
	req, _ := http.NewRequest(http.MethodPut, admin, strings.NewReader(string(table)))
	req.Header.Set("If-Match", resp.Header.Get("ETag"))
	put, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := io.ReadAll(put.Body)
	put.Body.Close()
	rows := func(b []byte) string {
		var doc struct {
			StaticWorkers json.RawMessage `json:"static_workers"`
		}
		_ = json.Unmarshal(b, &doc)
		return string(doc.StaticWorkers)
	}
	if put.StatusCode != 200 || rows(after) != rows(table) {
		t.Fatalf("PUT of the table read: %d %s, want 200 and the rows of %s", put.StatusCode, after, table)
	}
}
