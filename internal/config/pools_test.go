package config

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/contracts"
)

func TestEnginePools(t *testing.T) {
	cfg, err := Parse([]byte(`
[[gateway.engine_pools]]
name = "vllm-a"
model = "llama"
dns = "vllm-headless.ns.svc.cluster.local:8000"
metrics = "vllm"

[[gateway.engine_pools]]
name = "sg.prefill"
model = "qwen"
dns = "sglang-prefill:30000"
metrics = "sglang"
scrape_interval = "500ms"
refresh = "3s"
role = "prefill"
kv_total_blocks = 2048
endpoints = ["chat", "completions"]
kv_events_endpoint = "tcp://{ip}:5557?replay=tcp://{ip}:5558"
bootstrap_port = 9000
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []EnginePool{
		{Name: "vllm-a", Model: "llama", DNS: "vllm-headless.ns.svc.cluster.local:8000", Metrics: "vllm",
			ScrapeInterval: Duration(2 * time.Second), Refresh: Duration(10 * time.Second), Role: "unified", BootstrapPort: 8998},
		{Name: "sg.prefill", Model: "qwen", DNS: "sglang-prefill:30000", Metrics: "sglang",
			ScrapeInterval: Duration(500 * time.Millisecond), Refresh: Duration(3 * time.Second), Role: "prefill",
			KVTotalBlocks: 2048, Endpoints: []string{"chat", "completions"},
			KVEventsEndpoint: "tcp://{ip}:5557?replay=tcp://{ip}:5558", BootstrapPort: 9000},
	}
	if diff := cmp.Diff(want, cfg.Gateway.EnginePools); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if d := Default().Gateway.EnginePools; d != nil {
		t.Fatalf("default pools %v, want none", d)
	}
}

func TestEnginePoolErrors(t *testing.T) {
	const ok = "[[gateway.engine_pools]]\nname='p'\nmodel='m'\ndns='engines.ns:8000'\nmetrics='vllm'\n"
	if _, err := Parse([]byte(ok), env(nil)); err != nil {
		t.Fatalf("the base pool: %v", err)
	}
	tests := map[string]struct{ src, key, msg string }{
		"no name":        {strings.Replace(ok, "name='p'\n", "", 1), "gateway.engine_pools[0]", "name"},
		"upper name":     {strings.Replace(ok, "name='p'", "name='Pool'", 1), "gateway.engine_pools[0].name", "a-z"},
		"slash in name":  {strings.Replace(ok, "name='p'", "name='a/b'", 1), "gateway.engine_pools[0].name", "a-z"},
		"long name":      {strings.Replace(ok, "name='p'", "name='"+strings.Repeat("a", 64)+"'", 1), "gateway.engine_pools[0].name", ""},
		"duplicate name": {ok + ok, "gateway.engine_pools[1].name", "used twice"},
		"no model":       {strings.Replace(ok, "model='m'\n", "", 1), "gateway.engine_pools[0]", "model"},
		"no port":        {strings.Replace(ok, "engines.ns:8000", "engines.ns", 1), "gateway.engine_pools[0].dns", "NAME:PORT"},
		"port 0":         {strings.Replace(ok, "engines.ns:8000", "engines.ns:0", 1), "gateway.engine_pools[0].dns", "port"},
		"an IP":          {strings.Replace(ok, "engines.ns:8000", "10.0.0.1:8000", 1), "gateway.engine_pools[0].dns", "static worker"},
		"a scheme":       {strings.Replace(ok, "engines.ns:8000", "dns:///engines.ns:8000", 1), "gateway.engine_pools[0].dns", ""},
		"long dns":       {strings.Replace(ok, "engines.ns", strings.Repeat("a.", 127)+"aa", 1), "gateway.engine_pools[0].dns", ""},
		"bad metrics":    {strings.Replace(ok, "'vllm'", "'triton'", 1), "gateway.engine_pools[0].metrics", ""},
		"bad role":       {ok + "role='both'\n", "gateway.engine_pools[0].role", ""},
		"fast refresh":   {ok + "refresh='10ms'\n", "gateway.engine_pools[0].refresh", "at least 100ms"},
		"bad refresh":    {ok + "refresh='often'\n", "gateway.engine_pools[0].refresh", ""},
		"bad scrape":     {ok + "scrape_interval='0.1ms'\n", "gateway.engine_pools[0].scrape_interval", "at least 1ms"},
		"port 70000":     {ok + "bootstrap_port=70000\n", "gateway.engine_pools[0].bootstrap_port", ""},
		"bad endpoint":   {ok + "endpoints=['chat','video']\n", "gateway.engine_pools[0].endpoints[1]", "video"},
		"no {ip}":        {ok + "kv_events_endpoint='tcp://10.0.0.1:5557'\n", "gateway.engine_pools[0].kv_events_endpoint", "lacks {ip}"},
		"other brace":    {ok + "kv_events_endpoint='tcp://{ip}:{port}'\n", "gateway.engine_pools[0].kv_events_endpoint", "only placeholder"},
		"no scheme":      {ok + "kv_events_endpoint='{ip}:5557'\n", "gateway.engine_pools[0].kv_events_endpoint", "tcp://"},
		"bad replay":     {ok + "kv_events_endpoint='tcp://{ip}:5557?x=1'\n", "gateway.engine_pools[0].kv_events_endpoint", "replay"},
		"unknown key":    {ok + "colour='red'\n", "gateway.engine_pools[0].colour", ""},
		"static in pool": {ok + "[[gateway.static_workers]]\nid='p/10.0.0.1:8000'\nmodel='m'\nhttp_address='10.0.0.1:8000'\nmetrics='vllm'\n", "gateway.static_workers[0].id", "engine pool"},
		"too many pools": {strings.Repeat(ok, MaxEnginePools+1), "gateway.engine_pools", ""},
	}
	for name, tc := range tests {
		_, err := Parse([]byte(tc.src), env(nil))
		if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want an error naming %s with %q", name, err, tc.key, tc.msg)
		}
	}
	// The stored table (cluster) is checked by ValidateEnginePools with the same rules.
	if err := ValidateEnginePools([]EnginePool{{Name: "p", Model: "m", DNS: "e:1", Metrics: "vllm", Refresh: Duration(time.Millisecond)}}); err == nil ||
		!strings.Contains(err.Error(), "engine_pools[0].refresh") {
		t.Fatalf("ValidateEnginePools: %v", err)
	}
}

func TestPoolKVEventsEndpoint(t *testing.T) {
	for _, c := range []struct{ tmpl, ip, want string }{
		{"tcp://{ip}:5557", "10.0.0.7", "tcp://10.0.0.7:5557"},
		{"tcp://{ip}:5557?replay=tcp://{ip}:5558", "fd00::7", "tcp://[fd00::7]:5557?replay=tcp://[fd00::7]:5558"},
		{"", "10.0.0.7", ""},
	} {
		if got := PoolKVEventsEndpoint(c.tmpl, netip.MustParseAddr(c.ip)); got != c.want {
			t.Errorf("%q with %s = %q, want %q", c.tmpl, c.ip, got, c.want)
		}
	}
	if got := PoolWorkerID("p", "[fd00::7]:8000"); got != "p/[fd00::7]:8000" {
		t.Errorf("id %q", got)
	}
}

// TestEnginePoolSchemaDefaults keeps the schema's pool defaults in step with
// NormalizeEnginePools.
func TestEnginePoolSchemaDefaults(t *testing.T) {
	var schema struct {
		Properties struct {
			Gateway struct {
				Properties struct {
					EnginePools struct {
						MaxItems float64 `json:"maxItems"`
						Items    struct {
							Properties map[string]struct {
								Default any `json:"default"`
							} `json:"properties"`
						} `json:"items"`
					} `json:"engine_pools"`
				} `json:"properties"`
			} `json:"gateway"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	p := NormalizeEnginePools([]EnginePool{{}})[0]
	props := schema.Properties.Gateway.Properties.EnginePools.Items.Properties
	got := map[string]any{}
	for k, v := range props {
		if v.Default != nil {
			got[k] = v.Default
		}
	}
	want := map[string]any{
		"scrape_interval": time.Duration(p.ScrapeInterval).String(), "refresh": time.Duration(p.Refresh).String(),
		"role": p.Role, "kv_total_blocks": float64(0), "bootstrap_port": float64(p.BootstrapPort), "endpoints": []any{},
	}
	for k, v := range got {
		if s, ok := v.(string); ok {
			if d, err := time.ParseDuration(s); err == nil {
				got[k] = d.String()
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-code +schema):\n%s", diff)
	}
	if n := schema.Properties.Gateway.Properties.EnginePools.MaxItems; n != MaxEnginePools {
		t.Fatalf("schema maxItems %v, want %d", n, MaxEnginePools)
	}
}
