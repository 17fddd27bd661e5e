package config

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/contracts"
)

// TestPDProtocol (R22): a disaggregated route names its protocol (default tl); an unknown one,
// or one on a route that is not disaggregated, is refused naming the key.
func TestPDProtocol(t *testing.T) {
	cfg, err := Parse([]byte(`
[[gateway.routes]]
model = "a"
targets = ["disaggregated"]
pd_protocol = "vllm"

[[gateway.routes]]
model = "b"
targets = ["disaggregated"]
pd_protocol = "sglang"

[[gateway.routes]]
model = "c"
targets = ["disaggregated"]

[[gateway.routes]]
model = "d"
targets = ["disaggregated"]
pd_protocol = "tl"
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range cfg.Gateway.Routes {
		got = append(got, r.PD())
	}
	if diff := cmp.Diff([]string{PDVLLM, PDSGLang, PDTL, PDTL}, got); diff != "" {
		t.Fatalf("protocols (-want +got):\n%s", diff)
	}
	if cfg.Gateway.Routes[2].PDProtocol != "" {
		t.Fatalf("an absent pd_protocol is kept absent, got %q", cfg.Gateway.Routes[2].PDProtocol)
	}
	for _, c := range []struct{ src, key, msg string }{
		{"[[gateway.routes]]\nmodel = \"m\"\ntargets = [\"disaggregated\"]\npd_protocol = \"nixl\"\n", "gateway.routes[0].pd_protocol", "nixl"},
		{"[[gateway.routes]]\nmodel = \"m\"\npd_protocol = \"vllm\"\n", "gateway.routes[0].pd_protocol", "only for a disaggregated route"},
		{"[[gateway.routes]]\nmodel = \"m\"\ntargets = [\"unified\"]\npd_protocol = \"tl\"\n", "gateway.routes[0].pd_protocol", "only for a disaggregated route"},
	} {
		_, err := Parse([]byte(c.src), env(nil))
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: error %v, want one naming %s and saying %q", c.src, err, c.key, c.msg)
		}
	}
	// The admin API's JSON form is validated by ValidateRoutes alone (no schema).
	for _, rs := range [][]Route{
		{{Model: "m", PDProtocol: "nixl", Targets: []string{TargetDisaggregated}}},
		{{Model: "m", PDProtocol: PDSGLang}},
	} {
		if err := ValidateRoutes(rs); err == nil || !strings.Contains(err.Error(), "routes[0].pd_protocol") {
			t.Errorf("ValidateRoutes(%+v): %v, want an error naming routes[0].pd_protocol", rs, err)
		}
	}
	if err := ValidateRoutes([]Route{{Model: "m", PDProtocol: PDVLLM, Targets: []string{TargetDisaggregated}}}); err != nil {
		t.Fatal(err)
	}
	// NormalizeRoutes keeps it.
	if n := NormalizeRoutes([]Route{{Model: "m", PDProtocol: PDSGLang, Targets: []string{TargetDisaggregated}}}); n[0].PDProtocol != PDSGLang {
		t.Fatalf("NormalizeRoutes dropped pd_protocol: %+v", n)
	}
}

// TestStaticBootstrapPort (R22): a static worker's bootstrap_port, 1–65535, default 8998.
func TestStaticBootstrapPort(t *testing.T) {
	const w = "[[gateway.static_workers]]\nid = \"p\"\nmodel = \"m\"\nhttp_address = \"127.0.0.1:8000\"\nrole = \"prefill\"\nmetrics = \"sglang\"\n"
	for _, c := range []struct {
		src  string
		want int
	}{{w, DefaultBootstrapPort}, {w + "bootstrap_port = 1\n", 1}, {w + "bootstrap_port = 65535\n", 65535}, {w + "bootstrap_port = 9100\n", 9100}} {
		cfg, err := Parse([]byte(c.src), env(nil))
		if err != nil {
			t.Fatalf("%q: %v", c.src, err)
		}
		if got := cfg.Gateway.StaticWorkers[0].BootstrapPort; got != c.want {
			t.Errorf("%q: bootstrap_port %d, want %d", c.src, got, c.want)
		}
	}
	for _, v := range []string{"0", "65536", "-1", "\"8998\""} {
		src := w + "bootstrap_port = " + v + "\n"
		if _, err := Parse([]byte(src), env(nil)); err == nil || !strings.Contains(err.Error(), "gateway.static_workers[0].bootstrap_port") {
			t.Errorf("bootstrap_port = %s: %v, want an error naming gateway.static_workers[0].bootstrap_port", v, err)
		}
	}
	// The admin API's JSON table is checked by ValidateStaticWorkers.
	if err := ValidateStaticWorkers([]StaticWorker{{ID: "p", Model: "m", HTTPAddress: "127.0.0.1:8000", Metrics: "sglang", BootstrapPort: 70000}}); err == nil ||
		!strings.Contains(err.Error(), "static_workers[0].bootstrap_port") {
		t.Fatalf("port 70000: %v", err)
	}
}

// TestPDSchemaDefaults keeps the schema's defaults of pd_protocol and bootstrap_port in step
// with the code's.
func TestPDSchemaDefaults(t *testing.T) {
	var schema struct {
		Properties struct {
			Gateway struct {
				Properties struct {
					StaticWorkers struct {
						Items struct {
							Properties map[string]struct {
								Default any `json:"default"`
							} `json:"properties"`
						} `json:"items"`
					} `json:"static_workers"`
				} `json:"properties"`
			} `json:"gateway"`
		} `json:"properties"`
		Defs struct {
			Route struct {
				Properties map[string]struct {
					Default any   `json:"default"`
					Enum    []any `json:"enum"`
				} `json:"properties"`
			} `json:"route"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	pd := schema.Defs.Route.Properties["pd_protocol"]
	if pd.Default != (Route{}).PD() || !cmp.Equal(pd.Enum, []any{PDTL, PDVLLM, PDSGLang}) {
		t.Fatalf("schema pd_protocol: default %v enum %v", pd.Default, pd.Enum)
	}
	if d := schema.Properties.Gateway.Properties.StaticWorkers.Items.Properties["bootstrap_port"].Default; d != float64(DefaultBootstrapPort) {
		t.Fatalf("schema bootstrap_port default %v, want %d", d, DefaultBootstrapPort)
	}
}
