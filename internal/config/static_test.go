package config

import (
	"strings"
	"testing"
	"time"
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
