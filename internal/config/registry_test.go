package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRegistryTable(t *testing.T) {
	env := map[string]string{"ENGINE_TOKEN": "s3cret-from-env"}
	cfg, err := Parse([]byte(`
[gateway]
registry_listen = "0.0.0.0:9090"

[registry]
tokens = [
  { token_env = "ENGINE_TOKEN", models = ["smol*", "big"], id_prefix = "pool-a-" },
  { token = "inline-token", max_workers = 7 },
]
engine_cidrs = ["10.0.0.0/8", "fd00::/8"]
max_workers = 50
certificate_max_workers = 5
max_connections_per_peer = 0
max_calls_per_peer = 9
allow_loopback_engines = true
`), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := Registry{
		Tokens: []RegistryToken{
			{Token: "s3cret-from-env", TokenEnv: "ENGINE_TOKEN", Models: []string{"smol*", "big"}, IDPrefix: "pool-a-"},
			{Token: "inline-token", Models: nil, MaxWorkers: 7},
		},
		EngineCIDRs:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
		MaxWorkers:            50,
		CertificateMaxWorkers: 5,
		MaxCallsPerPeer:       9,
		AllowLoopbackEngines:  true,
	}
	if d := cmp.Diff(want, cfg.Registry, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Fatalf("registry (-want +got):\n%s", d)
	}
	if s := cfg.Registry.Tokens[0].String(); strings.Contains(s, "s3cret") {
		t.Fatalf("String leaks the token: %s", s)
	}
	if d := Default().Registry; d.MaxWorkers != 10000 || !d.Open() || d.MaxConnectionsPerPeer != 64 || d.MaxCallsPerPeer != 256 || d.CertificateMaxWorkers != 0 || d.AllowLoopbackEngines {
		t.Fatalf("default registry %+v", d)
	}
}

func TestRegistryProblems(t *testing.T) {
	for name, c := range map[string]struct{ toml, want string }{
		"both":           {"[registry]\ntokens = [{ token = 'a', token_env = 'B' }]", "config: registry.tokens[0]: token and token_env are mutually exclusive"},
		"neither":        {"[registry]\ntokens = [{ models = ['x'] }]", "config: registry.tokens[0]: one of token or token_env is required"},
		"unset env":      {"[registry]\ntokens = [{ token_env = 'NOPE' }]", "config: registry.tokens[0].token_env: environment variable NOPE is not set"},
		"bad env name":   {"[registry]\ntokens = [{ token_env = '1X' }]", "config: registry.tokens[0].token_env"},
		"space in token": {"[registry]\ntokens = [{ token = 'a b' }]", "config: registry.tokens[0].token: must not contain whitespace"},
		"empty token":    {"[registry]\ntokens = [{ token = '' }]", "config: registry.tokens[0].token: must not be empty"},
		"duplicate":      {"[registry]\ntokens = [{ token = 'a' }, { token = 'a' }]", "config: registry.tokens[1].token: same token as registry.tokens[0]"},
		"bad glob":       {"[registry]\ntokens = [{ token = 'a', models = ['smol[' ] }]", "config: registry.tokens[0].models[0]: \"smol[\" is not a glob"},
		"unknown key":    {"[registry]\ntokens = [{ token = 'a', scopes = ['x'] }]", "config: registry.tokens[0].scopes: unknown key"},
		"bad cidr":       {"[registry]\nengine_cidrs = ['10.0.0.0/8', '10.0.0.0/99']", "config: registry.engine_cidrs[1]: \"10.0.0.0/99\" is not a CIDR"},
		"max_workers 0":  {"[registry]\nmax_workers = 0", "config: registry.max_workers: must be >= 1"},
		"token quota":    {"[registry]\ntokens = [{ token = 'a', max_workers = -1 }]", "config: registry.tokens[0].max_workers: must be >= 0"},
		"cert quota":     {"[registry]\ncertificate_max_workers = -2", "config: registry.certificate_max_workers: must be >= 0"},
		"peer conns":     {"[registry]\nmax_connections_per_peer = -1", "config: registry.max_connections_per_peer: must be >= 0"},
		"peer calls":     {"[registry]\nmax_calls_per_peer = -1", "config: registry.max_calls_per_peer: must be >= 0"},
		"cert no key":    {"[registry]\ntls_cert = 'c.pem'", "config: registry.tls_key: tls_cert and tls_key go together"},
		"ca no cert":     {"[registry]\nclient_ca = 'ca.pem'", "config: registry.client_ca: needs tls_cert and tls_key"},
		"insecure type":  {"[registry]\nallow_insecure = 'yes'", "config: registry.allow_insecure: must be a boolean"},
		"loopback type":  {"[registry]\nallow_loopback_engines = 1", "config: registry.allow_loopback_engines: must be a boolean"},
		"open off loopback": {"[gateway]\nregistry_listen = '0.0.0.0:9090'",
			"config: registry.allow_insecure: gateway.registry_listen \"0.0.0.0:9090\" is not a loopback address"},
		"open all interfaces": {"[gateway]\nregistry_listen = ':9090'", "config: registry.allow_insecure:"},
	} {
		_, err := Parse([]byte(c.toml), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// TestRegistryExposure: an open registry serves on loopback; off loopback it needs tokens,
// client_ca or allow_insecure.
func TestRegistryExposure(t *testing.T) {
	for toml, ok := range map[string]bool{
		"[gateway]\nregistry_listen = '127.0.0.1:9090'":                                                     true,
		"[gateway]\nregistry_listen = '[::1]:9090'":                                                         true,
		"[gateway]\nregistry_listen = 'localhost:9090'":                                                     true,
		"[gateway]\nregistry_listen = '10.0.0.1:9090'":                                                      false,
		"[gateway]\nregistry_listen = '0.0.0.0:9090'\n[registry]\nallow_insecure = true":                    true,
		"[gateway]\nregistry_listen = '0.0.0.0:9090'\n[registry]\ntokens = [{ token = 'x' }]":               true,
		"[gateway]\nregistry_listen = '0.0.0.0:9090'\n[registry]\ntls_cert = 'c'\ntls_key = 'k'":            false,
		"[gateway]\nregistry_listen = '0.0.0.0:9090'\n[registry]\ntls_cert='c'\ntls_key='k'\nclient_ca='a'": true,
	} {
		_, err := Parse([]byte(toml), func(string) string { return "" })
		if (err == nil) != ok {
			t.Errorf("%q: %v, want ok=%v", toml, err, ok)
		}
	}
}

// TestEngineRules (R20): loopback engines are refused exactly when the registry listens off
// loopback and allow_loopback_engines is not set; engine_cidrs are carried either way.
func TestEngineRules(t *testing.T) {
	for _, c := range []struct {
		listen         string
		allow, refused bool
	}{
		{"127.0.0.1:9090", false, false},
		{"[::1]:9090", false, false},
		{"localhost:9090", false, false},
		{"0.0.0.0:9090", false, true},
		{":9090", false, true},
		{"10.0.0.2:9090", false, true},
		{"10.0.0.2:9090", true, false},
		{"0.0.0.0:9090", true, false},
	} {
		cfg := Default()
		cfg.Gateway.RegistryListen, cfg.Registry.AllowLoopbackEngines = c.listen, c.allow
		cfg.Registry.EngineCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		r := cfg.EngineRules()
		if r.RefuseLoopback != c.refused || len(r.CIDRs) != 1 || r.CIDRs[0] != cfg.Registry.EngineCIDRs[0] {
			t.Errorf("registry_listen %s, allow_loopback_engines %v: %+v, want loopback refused %v", c.listen, c.allow, r, c.refused)
		}
	}
}

// TestExampleConfigParses: examples/tlgw.toml, with its [registry] table, is a valid file.
func TestExampleConfigParses(t *testing.T) {
	cfg, err := Load("../../examples/tlgw.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Registry.MaxWorkers != 10000 || !cfg.Registry.Open() {
		t.Fatalf("example registry %+v", cfg.Registry)
	}
}
