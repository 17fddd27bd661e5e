package config

import (
	"strings"
	"testing"
)

// TestPlaintextCredentials (R20): registry tokens on a registry without TLS listening beyond
// loopback, and an etcd password to a member off loopback without TLS, are each named once;
// TLS, loopback or no credential names nothing.
func TestPlaintextCredentials(t *testing.T) {
	tokens := []RegistryToken{{Token: "t"}}
	for _, c := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"tokens, plaintext, every address", Config{Gateway: Gateway{RegistryListen: "0.0.0.0:9090"}, Registry: Registry{Tokens: tokens}}, []string{"registry tokens"}},
		{"tokens with TLS", Config{Gateway: Gateway{RegistryListen: "0.0.0.0:9090"}, Registry: Registry{Tokens: tokens, TLSCert: "c.pem"}}, nil},
		{"tokens on loopback", Config{Gateway: Gateway{RegistryListen: "127.0.0.1:9090"}, Registry: Registry{Tokens: tokens}}, nil},
		{"no tokens", Config{Gateway: Gateway{RegistryListen: "0.0.0.0:9090"}}, nil},
		{"etcd password, plaintext, off loopback", Config{Gateway: Gateway{RegistryListen: "127.0.0.1:9090"},
			Cluster: Cluster{EtcdEndpoints: []string{"127.0.0.1:2379", "10.0.0.5:2379"}, Username: "u", PasswordEnv: "P"}}, []string{"etcd password", "10.0.0.5:2379"}},
		{"etcd password on loopback", Config{Cluster: Cluster{EtcdEndpoints: []string{"127.0.0.1:2379"}, Username: "u", PasswordEnv: "P"}, Gateway: Gateway{RegistryListen: "127.0.0.1:1"}}, nil},
		{"tracing headers, plaintext, off loopback", Config{Gateway: Gateway{RegistryListen: "127.0.0.1:1"},
			Tracing: Tracing{OTLPEndpoint: "otel:4317", Insecure: true, Headers: map[string]string{"authorization": "Bearer sekret"}}}, []string{"tracing headers authorization", "otel:4317"}},
		{"tracing headers over TLS", Config{Gateway: Gateway{RegistryListen: "127.0.0.1:1"},
			Tracing: Tracing{OTLPEndpoint: "otel:4317", Headers: map[string]string{"authorization": "Bearer sekret"}}}, nil},
		{"tracing headers on loopback", Config{Gateway: Gateway{RegistryListen: "127.0.0.1:1"},
			Tracing: Tracing{OTLPEndpoint: "127.0.0.1:4317", Insecure: true, Headers: map[string]string{"authorization": "Bearer sekret"}}}, nil},
		{"tracing without headers", Config{Gateway: Gateway{RegistryListen: "127.0.0.1:1"}, Tracing: Tracing{OTLPEndpoint: "otel:4317", Insecure: true}}, nil},
		{"etcd password with TLS", Config{Cluster: Cluster{EtcdEndpoints: []string{"10.0.0.5:2379"}, Username: "u", PasswordEnv: "P", TLSCA: "ca.pem"}, Gateway: Gateway{RegistryListen: "127.0.0.1:1"}}, nil},
	} {
		got := c.cfg.PlaintextCredentials()
		if len(c.want) == 0 {
			if len(got) != 0 {
				t.Errorf("%s: %q, want nothing", c.name, got)
			}
			continue
		}
		if len(got) != 1 {
			t.Errorf("%s: %q, want one warning", c.name, got)
			continue
		}
		if strings.Contains(got[0], "sekret") {
			t.Errorf("%s: %q holds a header's value", c.name, got[0])
		}
		for _, w := range c.want {
			if !strings.Contains(got[0], w) {
				t.Errorf("%s: %q does not say %q", c.name, got[0], w)
			}
		}
	}
}
