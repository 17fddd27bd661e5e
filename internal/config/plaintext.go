package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// PlaintextCredentials names each credential this configuration would accept or send over a
// plaintext connection off loopback (R20): registry tokens on a registry without TLS that
// listens beyond loopback, an etcd password sent to an etcd member off loopback without TLS,
// and [tracing] headers (an authorization, say) sent to a collector off loopback with
// insecure = true. Start-up logs each once; none stops it (a private network may be trusted).
func (c *Config) PlaintextCredentials() []string {
	var out []string
	if len(c.Registry.Tokens) > 0 && c.Registry.TLSCert == "" && !LoopbackListen(c.Gateway.RegistryListen) {
		out = append(out, fmt.Sprintf("registry tokens are accepted over plaintext gRPC on %s: anyone on the path can read them (set [registry] tls_cert and tls_key, or listen on loopback)", c.Gateway.RegistryListen))
	}
	if c.Cluster.PasswordEnv != "" && !c.Cluster.TLS() {
		var off []string
		for _, e := range c.Cluster.EtcdEndpoints {
			if !LoopbackListen(e) {
				off = append(off, e)
			}
		}
		if len(off) > 0 {
			out = append(out, fmt.Sprintf("the etcd password is sent over plaintext to %s (set [cluster] tls_ca)", strings.Join(off, ", ")))
		}
	}
	if t := c.Tracing; t.Enabled() && t.Insecure && len(t.Headers) > 0 && !LoopbackListen(t.OTLPEndpoint) {
		out = append(out, fmt.Sprintf("the tracing headers %s are sent over plaintext gRPC to %s (set [tracing] insecure = false)",
			strings.Join(slices.Sorted(maps.Keys(t.Headers)), ", "), t.OTLPEndpoint))
	}
	return out
}
