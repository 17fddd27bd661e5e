package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/contracts"
	"github.com/tlgw/tlgw/internal/tracing"
)

// TestTracingDefaults: without the table, and with an empty otlp_endpoint, tracing is off;
// the defaults are the schema's.
func TestTracingDefaults(t *testing.T) {
	for _, src := range []string{"", "[tracing]\n", "[tracing]\notlp_endpoint = \"\"\nheaders = {}\nheaders_env = {}\n"} {
		cfg, err := Parse([]byte(src), env(nil))
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if diff := cmp.Diff(Tracing{SampleRatio: 0.01, ParentBased: true}, cfg.Tracing); diff != "" || cfg.Tracing.Enabled() {
			t.Errorf("%q (-want +got):\n%s", src, diff)
		}
	}
	var schema struct {
		Properties struct {
			Tracing struct {
				Properties map[string]struct {
					Default any `json:"default"`
				} `json:"properties"`
			} `json:"tracing"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	d := Default().Tracing
	want := map[string]any{"otlp_endpoint": d.OTLPEndpoint, "sample_ratio": d.SampleRatio, "parent_based": d.ParentBased,
		"insecure": d.Insecure, "headers": map[string]any{}, "headers_env": map[string]any{}}
	if len(d.Headers) != 0 || len(d.HeadersEnv) != 0 {
		t.Fatalf("Default() has headers: %v", d)
	}
	got := map[string]any{}
	for k, p := range schema.Properties.Tracing.Properties {
		got[k] = p.Default
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("schema defaults differ from Default() (-Default +schema):\n%s", diff)
	}
}

// TestTracingTable: every key, headers' names lowercased, headers_env's values read from the
// environment at parse time; Options carries them to internal/tracing.
func TestTracingTable(t *testing.T) {
	cfg, err := Parse([]byte(`
[tracing]
otlp_endpoint = "otel-collector.observability:4317"
sample_ratio = 0.25
parent_based = false
insecure = true
headers = { "X-Tenant" = "team-a" }
headers_env = { Authorization = "OTEL_AUTH" }
`), env(map[string]string{"OTEL_AUTH": "Bearer s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Tracing{OTLPEndpoint: "otel-collector.observability:4317", SampleRatio: 0.25, Insecure: true,
		Headers:    map[string]string{"x-tenant": "team-a", "authorization": "Bearer s3cret"},
		HeadersEnv: map[string]string{"authorization": "OTEL_AUTH"}}
	if diff := cmp.Diff(want, cfg.Tracing); diff != "" || !cfg.Tracing.Enabled() {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	o := cfg.Tracing.Options()
	if o.Endpoint != want.OTLPEndpoint || o.SampleRatio != 0.25 || o.ParentBased || !o.Insecure || !maps.Equal(o.Headers, want.Headers) {
		t.Fatalf("options %+v", o)
	}
	o.Headers["x-tenant"] = "changed"
	if cfg.Tracing.Headers["x-tenant"] != "team-a" {
		t.Fatal("Options shares the headers map")
	}
	// Neither a printed nor a marshalled configuration holds a header's value.
	js, err := json.Marshal(cfg.Tracing)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprint(cfg.Tracing), fmt.Sprintf("%v", *cfg), string(js)} {
		if strings.Contains(s, "s3cret") || strings.Contains(s, "team-a") {
			t.Errorf("%s holds a header's value", s)
		}
	}
	for _, r := range []string{"0", "1", "0.5"} {
		if _, err := Parse([]byte("[tracing]\nsample_ratio = "+r+"\n"), nil); err != nil {
			t.Errorf("sample_ratio %s: %v", r, err)
		}
	}
}

func TestTracingProblems(t *testing.T) {
	many := func(n int) string {
		var b strings.Builder
		b.WriteString("[tracing]\nheaders = {")
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "x-h%d = \"v\"", i)
		}
		b.WriteString("}\n")
		return b.String()
	}
	vars := env(map[string]string{"AUTH": "Bearer s3cret", "BAD": "Bearer s3cret\x01"})
	for name, c := range map[string]struct{ toml, key, msg string }{
		"ratio 1.5":             {"[tracing]\nsample_ratio = 1.5\n", "tracing.sample_ratio", "<= 1"},
		"ratio negative":        {"[tracing]\nsample_ratio = -0.5\n", "tracing.sample_ratio", ">= 0"},
		"ratio string":          {"[tracing]\nsample_ratio = \"1%\"\n", "tracing.sample_ratio", "number"},
		"ratio nan":             {"[tracing]\nsample_ratio = nan\n", "tracing.sample_ratio", "finite"},
		"endpoint URL":          {"[tracing]\notlp_endpoint = \"http://otel:4317\"\n", "tracing.otlp_endpoint", "not host:port"},
		"endpoint no port":      {"[tracing]\notlp_endpoint = \"otel\"\n", "tracing.otlp_endpoint", "not host:port"},
		"endpoint port 70000":   {"[tracing]\notlp_endpoint = \"otel:70000\"\n", "tracing.otlp_endpoint", "not host:port"},
		"parent_based string":   {"[tracing]\nparent_based = \"yes\"\n", "tracing.parent_based", "boolean"},
		"bad header name":       {"[tracing]\nheaders = { \"x tenant\" = \"a\" }\n", `tracing.headers."x tenant"`, "HTTP header token"},
		"header name colon":     {"[tracing]\nheaders = { \":authority\" = \"a\" }\n", `tracing.headers.":authority"`, "HTTP header token"},
		"reserved header":       {"[tracing]\nheaders = { grpc-timeout = \"1S\" }\n", "tracing.headers.grpc-timeout", "reserved"},
		"header value number":   {"[tracing]\nheaders = { x-a = 1 }\n", "tracing.headers.x-a", "string"},
		"header value too long": {"[tracing]\nheaders = { x-a = \"" + strings.Repeat("a", tracing.MaxHeaderValueLen+1) + "\" }\n", "tracing.headers.x-a", "at most 4096"},
		"header value empty":    {"[tracing]\nheaders = { x-a = \"\" }\n", "tracing.headers.x-a", "printable ASCII"},
		"too many headers":      {many(tracing.MaxHeaders + 1), "tracing.headers", "32"},
		"headers with env too many": {strings.TrimSuffix(many(tracing.MaxHeaders), "\n") + "\nheaders_env = { authorization = \"AUTH\" }\n",
			"tracing.headers", "at most 32"},
		"same header twice":   {"[tracing]\nheaders = { authorization = \"a\" }\nheaders_env = { Authorization = \"AUTH\" }\n", "tracing.headers_env.Authorization", "given twice"},
		"same header by case": {"[tracing]\nheaders = { X-A = \"a\", x-a = \"b\" }\n", "tracing.headers.x-a", "given twice"},
		"env unset":           {"[tracing]\nheaders_env = { authorization = \"OTEL_TOKEN\" }\n", "tracing.headers_env.authorization", "environment variable OTEL_TOKEN is not set"},
		"env empty name":      {"[tracing]\nheaders_env = { authorization = \"\" }\n", "tracing.headers_env.authorization", "must not be empty"},
		"env bad value":       {"[tracing]\nheaders_env = { authorization = \"BAD\" }\n", "tracing.headers_env.authorization", "environment variable BAD: the value must be"},
		"env bad header name": {"[tracing]\nheaders_env = { \"a b\" = \"AUTH\" }\n", `tracing.headers_env."a b"`, "HTTP header token"},
		"unknown key":         {"[tracing]\nendpoint = \"otel:4317\"\n", "tracing.endpoint", "unknown key"},
	} {
		_, err := Parse([]byte(c.toml), vars)
		if !hasProblem(err, c.key, c.msg) {
			t.Errorf("%s: %v, want a problem at %s saying %q", name, err, c.key, c.msg)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the problem names a header's value: %v", name, err)
		}
	}
	// apply keeps the contract without the schema.
	var ps problems
	tr := defaultTracing()
	(&fileTracing{SampleRatio: new(1.5), Headers: map[string]string{"x-a": "a\nb"}}).apply(&tr, env(nil), &ps)
	if len(ps.list) != 2 || tr.SampleRatio != 0.01 || tr.Headers != nil {
		t.Errorf("apply: %+v, %v", ps.list, tr)
	}
}
