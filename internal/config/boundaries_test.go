package config

import (
	"strings"
	"testing"
)

// TestValueBoundaries: numeric settings at the ends of their ranges parse, one step past them
// does not. The schema and the Go checks both bound most of these; each line here holds both.
func TestValueBoundaries(t *testing.T) {
	worker := func(extra string) string {
		return "[[gateway.static_workers]]\nid='a'\nmodel='m'\nmetrics='vllm'\n" + extra + "\n"
	}
	for _, c := range []struct {
		toml string
		ok   bool
	}{
		{"[gateway]\nretry_budget_percent = 0", true},
		{"[gateway]\nretry_budget_percent = 100", true},
		{"[gateway]\nretry_budget_percent = 100.5", false},
		{"[gateway]\nretry_budget_percent = -0.5", false},
		{"[gateway.outlier]\nmax_ejected_percent = 0", true},
		{"[gateway.outlier]\nmax_ejected_percent = 100", true},
		{"[gateway.outlier]\nmax_ejected_percent = 100.5", false},
		{"[gateway.outlier]\nmax_ejected_percent = -0.5", false},
		{"[gateway.outlier]\nconsecutive_failures = 0", true},
		{"[gateway.outlier]\nconsecutive_failures = -1", false},
		{"[gateway.outlier]\nbase_ejection = '30s'\nmax_ejection = '30s'", true},
		{"[gateway.outlier]\nbase_ejection = '30s'\nmax_ejection = '29s'", false},
		{"[gateway]\nmax_in_flight = 1", true},
		{"[gateway]\nmax_in_flight = 0", false},
		{worker("http_address='h:1'"), true},
		{worker("http_address='h:65535'"), true},
		{worker("http_address='h:0'"), false},
		{worker("http_address='h:65536'"), false},
		{worker("http_address='h:1'\nscrape_interval='1ms'"), true},
		{worker("http_address='h:1'\nscrape_interval='999us'"), false},
	} {
		cfg, err := Parse([]byte(c.toml), func(string) string { return "" })
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok=%v", c.toml, err, c.ok)
		}
		if err == nil && cfg == nil {
			t.Errorf("%q: no config", c.toml)
		}
	}
	// An accepted value is the value used.
	cfg, err := Parse([]byte("[gateway]\nretry_budget_percent = 100\nmax_in_flight = 1\n[gateway.outlier]\nmax_ejected_percent = 0\nconsecutive_failures = 0\n"),
		func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Gateway
	if g.RetryBudgetPercent != 100 || g.MaxInFlight != 1 || g.Outlier.MaxEjectedPercent != 0 || g.Outlier.ConsecutiveFailures != 0 {
		t.Fatalf("%+v %+v", g.RetryBudgetPercent, g.Outlier)
	}
}

// TestDescriptions: what a key or token prints names its source and never its secret; TLS is
// on with a CA or a client certificate; a key in a message is bare exactly when TOML allows.
func TestDescriptions(t *testing.T) {
	for _, c := range []struct {
		got, want, secret string
	}{
		{Key{Key: "sk-inline"}.String(), "<redacted, inline>", "sk-inline"},
		{Key{Key: "sk-env", KeyEnv: "TLGW_KEY"}.String(), "<redacted, $TLGW_KEY>", "sk-env"},
		{RegistryToken{Token: "rt-inline"}.String(), "<redacted, inline>", "rt-inline"},
		{RegistryToken{Token: "rt-env", TokenEnv: "TLGW_TOKEN"}.String(), "<redacted, $TLGW_TOKEN>", "rt-env"},
	} {
		if !strings.Contains(c.got, c.want) || strings.Contains(c.got, c.secret) {
			t.Errorf("%q: want it to contain %q and not %q", c.got, c.want, c.secret)
		}
	}
	for _, c := range []struct {
		c    Cluster
		want bool
	}{{Cluster{}, false}, {Cluster{TLSCA: "ca.pem"}, true}, {Cluster{TLSCert: "c.pem"}, true}} {
		if c.c.TLS() != c.want {
			t.Errorf("%+v: TLS() = %v", c.c, !c.want)
		}
	}
	for k, want := range map[string]string{
		"az_AZ-09": "az_AZ-09", "": `""`,
		"a`": "\"a`\"", "a{": `"a{"`, "a@": `"a@"`, "a[": `"a["`, "a/": `"a/"`, "a:": `"a:"`, "a.b": `"a.b"`,
	} {
		if got := tomlKey(k); got != want {
			t.Errorf("tomlKey(%q) = %s, want %s", k, got, want)
		}
	}
	if !ValidClusterPrefix("/") || ValidClusterPrefix("") || ValidReplicaID("a\x7f") || !ValidReplicaID("!~") {
		t.Error("cluster prefix or replica id edges")
	}
}
