package config

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/contracts"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/oai"
)

func TestStaticWorkers(t *testing.T) {
	cfg, err := Parse([]byte(`
[[gateway.static_workers]]
id = "vllm-0"
model = "llama"
http_address = "10.0.0.5:8000"
metrics = "vllm"

[[gateway.static_workers]]
id = "sg-0"
model = "qwen"
http_address = "10.0.0.6:30000"
role = "decode"
metrics = "sglang"
metrics_url = "http://10.0.0.6:30001/metrics"
scrape_interval = "500ms"
kv_total_blocks = 2048
`), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ws := cfg.Gateway.StaticWorkers
	if len(ws) != 2 || ws[0].Role != "unified" || ws[0].MetricsURL != "http://10.0.0.5:8000/metrics" ||
		time.Duration(ws[0].ScrapeInterval) != 2*time.Second || ws[1].Role != "decode" ||
		time.Duration(ws[1].ScrapeInterval) != 500*time.Millisecond || ws[1].KVTotalBlocks != 2048 {
		t.Fatalf("static workers %+v", ws)
	}
	for name, c := range map[string]struct{ toml, key string }{
		"unknown field": {"[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:1'\nmetrics='vllm'\ncolour='red'\n", "gateway.static_workers[0].colour"},
		"bad kind":      {"[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:1'\nmetrics='triton'\n", "gateway.static_workers[0].metrics"},
		"no id":         {"[[gateway.static_workers]]\nmodel='m'\nhttp_address='h:1'\nmetrics='vllm'\n", "gateway.static_workers[0]"},
		"bad address":   {"[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='nohost'\nmetrics='vllm'\n", "gateway.static_workers[0].http_address"},
		"bad port":      {"[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:0'\nmetrics='vllm'\n", "gateway.static_workers[0].http_address"},
		"duplicate id":  {"[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:1'\nmetrics='vllm'\n[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:2'\nmetrics='vllm'\n", "gateway.static_workers[1].id"},
		"bad interval":  {"[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:1'\nmetrics='vllm'\nscrape_interval='often'\n", "gateway.static_workers[0].scrape_interval"},
		"bad url":       {"[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:1'\nmetrics='vllm'\nmetrics_url='ftp://x/m'\n", "gateway.static_workers[0].metrics_url"},
	} {
		_, err := Parse([]byte(c.toml), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: %v, want an error naming %s", name, err, c.key)
		}
	}
}

// TestStaticMetricsURLHostRules: a static worker's metrics_url follows the engine address
// rules of R13.2, and the problem names the key.
func TestStaticMetricsURLHostRules(t *testing.T) {
	for u, ok := range map[string]bool{
		"http://10.0.0.6:30001/metrics":                 true,
		"https://engine.internal/metrics":               true,
		"http://[2001:db8::1]:9000/metrics?x=1":         true,
		"http://169.254.169.254/latest/meta-data":       false,
		"http://169.254.169.254:80/latest":              false,
		"http://[fe80::1]:80/metrics":                   false,
		"http://0.0.0.0:8000/metrics":                   false,
		"http://[::]:8000/metrics":                      false,
		"http://user:pw@10.0.0.6:30001/metrics":         false,
		"http://10.0.0.6:0/metrics":                     false,
		"http://10.0.0.6:99999/metrics":                 false,
		"unix:///tmp/x.sock":                            false,
		"http:10.0.0.6/metrics":                         false,
		"http://" + strings.Repeat("a", 300) + "/m":     false,
		"http://[::ffff:169.254.169.254]:80/latest?x=1": false,
	} {
		toml := "[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:1'\nmetrics='vllm'\nmetrics_url='" + u + "'\n"
		_, err := Parse([]byte(toml), func(string) string { return "" })
		if ok != (err == nil) {
			t.Errorf("%s: %v, want ok=%v", u, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "gateway.static_workers[0].metrics_url") {
			t.Errorf("%s: %v does not name the key", u, err)
		}
	}
}

// TestStaticHTTPAddressRules (R20): a static worker's http_address follows the address rules
// of a heartbeat's — it becomes http://<http_address>/v1/…, so a scheme, path, query or
// userinfo would reach other URLs or hosts — and start-up stops naming the key.
func TestStaticHTTPAddressRules(t *testing.T) {
	for addr, ok := range map[string]bool{
		"10.0.0.5:8000":           true,
		"engine-0.internal:8000":  true,
		"[2001:db8::1]:8000":      true,
		"10.0.0.5:8000/v1/admin?": false,
		"10.0.0.5:8000?x=1":       false,
		"10.0.0.5:8000#frag":      false,
		"http://10.0.0.5:8000":    false,
		"u@10.0.0.5:8000":         false,
		"unix:8000":               false,
		"169.254.169.254:80":      false,
		"[fe80::1]:80":            false,
		"0.0.0.0:8000":            false,
		"10.0.0.5:65536":          false,
		"10.0.0.5":                false,
	} {
		toml := "[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='" + addr + "'\nmetrics='vllm'\n"
		_, err := Parse([]byte(toml), func(string) string { return "" })
		if ok != (err == nil) {
			t.Errorf("%s: %v, want ok=%v", addr, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "config: gateway.static_workers[0].http_address:") {
			t.Errorf("%s: %v does not name the key", addr, err)
		}
		if ws := []StaticWorker{{ID: "a", Model: "m", HTTPAddress: addr, Metrics: "vllm"}}; ok != (ValidateStaticWorkers(ws) == nil) {
			t.Errorf("%s: ValidateStaticWorkers (the admin API's) disagrees with the file: %v", addr, ValidateStaticWorkers(ws))
		}
	}
}

// TestStaticAddressesFollowEngineRules (R20): a static worker's addresses follow the same
// configuration's engine rules as heartbeats: engine_cidrs, and no loopback on a registry off
// loopback unless allow_loopback_engines — the http_address and the metrics_url, each named.
func TestStaticAddressesFollowEngineRules(t *testing.T) {
	const off = "[gateway]\nregistry_listen = '0.0.0.0:9090'\n"
	static := func(addr, metricsURL string) string {
		s := "[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='" + addr + "'\nmetrics='vllm'\n"
		if metricsURL != "" {
			s += "metrics_url='" + metricsURL + "'\n"
		}
		return s
	}
	for _, c := range []struct {
		name, toml, key string // key "": accepted
	}{
		{"loopback on a loopback registry", static("127.0.0.1:8000", ""), ""},
		{"loopback off loopback", off + "[registry]\nallow_insecure = true\n" + static("127.0.0.1:8000", ""), "gateway.static_workers[0].http_address"},
		{"loopback metrics off loopback", off + "[registry]\nallow_insecure = true\n" + static("10.0.0.5:8000", "http://[::1]:9000/metrics"), "gateway.static_workers[0].metrics_url"},
		{"allowed loopback", off + "[registry]\nallow_insecure = true\nallow_loopback_engines = true\n" + static("127.0.0.1:8000", ""), ""},
		{"a name off loopback", off + "[registry]\nallow_insecure = true\n" + static("localhost:8000", ""), ""}, // checked at dial time
		{"outside engine_cidrs", "[registry]\nengine_cidrs = ['10.0.0.0/8']\n" + static("192.168.1.5:8000", ""), "gateway.static_workers[0].http_address"},
		{"metrics outside engine_cidrs", "[registry]\nengine_cidrs = ['10.0.0.0/8']\n" + static("10.0.0.5:8000", "http://192.168.1.5:9000/m"), "gateway.static_workers[0].metrics_url"},
		{"inside engine_cidrs", "[registry]\nengine_cidrs = ['10.0.0.0/8']\n" + static("10.0.0.5:8000", ""), ""},
	} {
		_, err := Parse([]byte(c.toml), func(string) string { return "" })
		switch {
		case c.key == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", c.name, err)
		case c.key != "" && (err == nil || !strings.Contains(err.Error(), "config: "+c.key+":")):
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.key)
		}
	}
	rules := engineaddr.Rules{RefuseLoopback: true}
	err := StaticWorkerAddresses([]StaticWorker{{ID: "a", HTTPAddress: "10.0.0.5:1"}, {ID: "b", HTTPAddress: "127.0.0.1:1"}}, rules)
	if err == nil || !strings.Contains(err.Error(), "static_workers[1].http_address:") || strings.Contains(err.Error(), "[0]") {
		t.Fatalf("StaticWorkerAddresses: %v, want static_workers[1].http_address alone", err)
	}
	if err := StaticWorkerAddresses([]StaticWorker{{ID: "a", HTTPAddress: "10.0.0.5:1"}}, rules); err != nil {
		t.Fatal(err)
	}
}

// TestStaticWorkerEndpoints (R21): a static worker may list the serving endpoints its engine
// answers, by the catalogue's names; the list survives normalization (the admin table's round
// trip), and an unknown or repeated name is refused naming the entry — by the schema for a
// file, and by ValidateStaticWorkers for the admin PUT, which the schema does not see.
func TestStaticWorkerEndpoints(t *testing.T) {
	base := "[[gateway.static_workers]]\nid='a'\nmodel='m'\nhttp_address='h:1'\nmetrics='vllm'\n"
	cfg, err := Parse([]byte(base+"endpoints = ['embeddings', 'chat']\n"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ws := cfg.Gateway.StaticWorkers
	if len(ws) != 1 || !slices.Equal(ws[0].Endpoints, []string{"embeddings", "chat"}) {
		t.Fatalf("endpoints %+v", ws)
	}
	if got := StaticEndpoints(ws[0].Endpoints); got != oai.EndpointSet(0).With(oai.Chat).With(oai.Embeddings) {
		t.Fatalf("StaticEndpoints = %v", got)
	}
	for name, c := range map[string]struct{ toml, key, says string }{
		"unknown": {base + "endpoints = ['chat', 'telepathy']\n", "gateway.static_workers[0].endpoints[1]", `"telepathy"`},
		"twice":   {base + "endpoints = ['chat', 'chat']\n", "gateway.static_workers[0].endpoints", "items at 0 and 1 are equal"},
		"empty":   {base + "endpoints = ['']\n", "gateway.static_workers[0].endpoints[0]", `""`},
	} {
		_, err := Parse([]byte(c.toml), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error naming %s and %s", name, err, c.key, c.says)
		}
	}
	w := StaticWorker{ID: "a", Model: "m", HTTPAddress: "h:1", Metrics: "vllm"}
	for _, c := range []struct {
		endpoints []string
		want      string
	}{
		{[]string{"completions", "rerank", "translations"}, ""},
		{nil, ""},
		{[]string{"chat", "telepathy"}, `static_workers[0].endpoints[1]: "telepathy" is not an endpoint: want one of completions, chat, embeddings, responses, messages, completions_render, chat_render, tokenize, detokenize, rerank, score, pooling, transcriptions, translations`},
		{[]string{"chat", "tokenize", "chat"}, `static_workers[0].endpoints[2]: "chat" is listed twice`},
		{[]string{"Chat"}, `static_workers[0].endpoints[0]: "Chat" is not an endpoint`},
	} {
		w.Endpoints = c.endpoints
		err := ValidateStaticWorkers([]StaticWorker{w})
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%q: %v, want %q", c.endpoints, err, c.want)
		}
	}
	if got := NormalizeStaticWorkers([]StaticWorker{w}); !slices.Equal(got[0].Endpoints, w.Endpoints) {
		t.Fatalf("normalized endpoints %q, want %q", got[0].Endpoints, w.Endpoints)
	}
}

// TestSchemaEndpointsAreTheCatalogue: the schema's list of endpoint names is the catalogue's
// (internal/oai), so a file cannot name an endpoint the gateway refuses or miss one it serves.
func TestSchemaEndpointsAreTheCatalogue(t *testing.T) {
	var sch struct {
		Properties struct {
			Gateway struct {
				Properties struct {
					StaticWorkers struct {
						Items struct {
							Properties struct {
								Endpoints struct {
									Items struct {
										Enum []string `json:"enum"`
									} `json:"items"`
								} `json:"endpoints"`
							} `json:"properties"`
						} `json:"items"`
					} `json:"static_workers"`
				} `json:"properties"`
			} `json:"gateway"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &sch); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, k := range oai.Kinds() {
		want = append(want, k.Endpoint())
	}
	if got := sch.Properties.Gateway.Properties.StaticWorkers.Items.Properties.Endpoints.Items.Enum; !slices.Equal(got, want) {
		t.Fatalf("schema endpoints %q, the catalogue's %q", got, want)
	}
}
