package config

import (
	"fmt"
	"net"
	"net/netip"
	pathpkg "path"
	"strings"

	"github.com/tlgw/tlgw/internal/engineaddr"
)

// Registry is the [registry] table (R13.1, R13.2): who may heartbeat, and what they may say.
type Registry struct {
	// Tokens are the bearer tokens engines present; with none (and no ClientCA) the registry
	// is open to anyone who reaches registry_listen.
	Tokens []RegistryToken
	// TLSCert and TLSKey are PEM files for the registry's TLS; ClientCA, when set, makes
	// client certificates required and the certificate's identity a credential.
	TLSCert, TLSKey, ClientCA string
	// AllowInsecure lets an unauthenticated registry listen outside loopback.
	AllowInsecure bool
	// EngineCIDRs restricts IP addresses in heartbeats; empty = any.
	EngineCIDRs []netip.Prefix
	// MaxWorkers caps the registered workers (default 10000).
	MaxWorkers int
	// CertificateMaxWorkers caps the workers one client-certificate identity registers (0 =
	// only MaxWorkers), as RegistryToken.MaxWorkers does for a token (R20).
	CertificateMaxWorkers int
	// MaxConnectionsPerPeer and MaxCallsPerPeer bound the connections held from, and the calls
	// run at once for, one peer address on registry_listen (0 = no bound; defaults 64, 256).
	MaxConnectionsPerPeer, MaxCallsPerPeer int
	// AllowLoopbackEngines lets a registry that listens off loopback take engines at loopback
	// addresses (R20); a registry on loopback always does.
	AllowLoopbackEngines bool
}

// RegistryToken is one [[registry.tokens]] entry.
type RegistryToken struct {
	// Token is the secret, resolved from TokenEnv when the file names one. Never marshalled.
	Token    string `json:"-"`
	TokenEnv string
	// Models are path.Match globs a worker's model must match; empty = any model.
	Models []string
	// IDPrefix is what every worker id sent with this token must start with.
	IDPrefix string
	// MaxWorkers caps the workers registered with this token at once (0 = only the
	// registry's max_workers).
	MaxWorkers int
}

// String describes the token without its secret.
func (t RegistryToken) String() string {
	src := "inline"
	if t.TokenEnv != "" {
		src = "$" + t.TokenEnv
	}
	return fmt.Sprintf("{token: <redacted, %s> models: %v id_prefix: %q max_workers: %d}", src, t.Models, t.IDPrefix, t.MaxWorkers)
}

// Open reports whether the registry takes heartbeats from anyone (no tokens, no client CA).
func (r *Registry) Open() bool { return len(r.Tokens) == 0 && r.ClientCA == "" }

func defaultRegistry() Registry {
	return Registry{MaxWorkers: 10000, MaxConnectionsPerPeer: 64, MaxCallsPerPeer: 256}
}

type fileRegistry struct {
	Tokens        []fileRegistryToken `json:"tokens"`
	TLSCert       *string             `json:"tls_cert"`
	TLSKey        *string             `json:"tls_key"`
	ClientCA      *string             `json:"client_ca"`
	AllowInsecure *bool               `json:"allow_insecure"`
	EngineCIDRs   []string            `json:"engine_cidrs"`
	MaxWorkers    *int                `json:"max_workers"`
	CertMax       *int                `json:"certificate_max_workers"`
	ConnsPerPeer  *int                `json:"max_connections_per_peer"`
	CallsPerPeer  *int                `json:"max_calls_per_peer"`
	// AllowLoopbackEngines: see Registry.
	AllowLoopbackEngines *bool `json:"allow_loopback_engines"`
}

type fileRegistryToken struct {
	Token    *string  `json:"token"`
	TokenEnv *string  `json:"token_env"`
	Models   []string `json:"models"`
	IDPrefix *string  `json:"id_prefix"`
	MaxWork  *int     `json:"max_workers"`
}

func (fr *fileRegistry) apply(r *Registry, getenv func(string) string, ps *problems) {
	if fr == nil {
		return
	}
	base := path{key("registry")}
	setIf(&r.TLSCert, fr.TLSCert)
	setIf(&r.TLSKey, fr.TLSKey)
	setIf(&r.ClientCA, fr.ClientCA)
	setIf(&r.AllowInsecure, fr.AllowInsecure)
	setIf(&r.MaxWorkers, fr.MaxWorkers)
	setIf(&r.CertificateMaxWorkers, fr.CertMax)
	setIf(&r.MaxConnectionsPerPeer, fr.ConnsPerPeer)
	setIf(&r.MaxCallsPerPeer, fr.CallsPerPeer)
	setIf(&r.AllowLoopbackEngines, fr.AllowLoopbackEngines)
	if (r.TLSCert == "") != (r.TLSKey == "") {
		ps.add(base.with(key("tls_key")), "tls_cert and tls_key go together; give both or neither")
	}
	if r.ClientCA != "" && r.TLSCert == "" {
		ps.add(base.with(key("client_ca")), "needs tls_cert and tls_key: client certificates are only asked for over TLS")
	}
	for i, s := range fr.EngineCIDRs {
		p, err := engineaddr.ParseCIDRs([]string{s})
		if err != nil {
			ps.add(base.with(key("engine_cidrs"), index(i)), "%v", err)
			continue
		}
		r.EngineCIDRs = append(r.EngineCIDRs, p...)
	}
	bySecret := make(map[string]int)
	for i, ft := range fr.Tokens {
		tp := base.with(key("tokens"), index(i))
		var t RegistryToken
		secret, env, src, ok := resolveSecret(ps, getenv, tp, "token", ft.Token, ft.TokenEnv)
		if !ok {
			continue
		}
		t.Token, t.TokenEnv = secret, env
		if prev, dup := bySecret[t.Token]; dup {
			ps.add(src, "same token as registry.tokens[%d]", prev)
		} else {
			bySecret[t.Token] = i
		}
		for j, g := range ft.Models {
			if _, err := pathpkg.Match(g, ""); err != nil || g == "" {
				ps.add(tp.with(key("models"), index(j)), "%q is not a glob such as \"smol*\"", g)
			}
		}
		t.Models = append([]string(nil), ft.Models...)
		setIf(&t.IDPrefix, ft.IDPrefix)
		setIf(&t.MaxWorkers, ft.MaxWork)
		r.Tokens = append(r.Tokens, t)
	}
}

// checkRegistryExposure refuses an unauthenticated registry_listen outside loopback (R13.1).
func checkRegistryExposure(cfg *Config, ps *problems) {
	if err := RegistryExposure(cfg); err != nil {
		ps.add(path{key("registry"), key("allow_insecure")}, "%v", err)
	}
}

// RegistryExposure is the start-up rule of R13.1: a registry_listen outside loopback with
// neither registry tokens nor client_ca is an error unless registry.allow_insecure is true.
// Parse applies it; app.Start applies it again for configurations built in code.
func RegistryExposure(cfg *Config) error {
	r := &cfg.Registry
	if !r.Open() || r.AllowInsecure || LoopbackListen(cfg.Gateway.RegistryListen) {
		return nil
	}
	return fmt.Errorf("gateway.registry_listen %q is not a loopback address and the registry has neither tokens nor client_ca; anyone who reaches it could register workers (set registry.allow_insecure = true to serve it anyway)", cfg.Gateway.RegistryListen)
}

// EngineRules are the address rules engines are held to (R13.2, R20): [registry] engine_cidrs,
// and loopback refused when gateway.registry_listen is off loopback unless
// [registry] allow_loopback_engines. Heartbeats are checked against them as written, static
// workers when their table is set, and every connection to an engine at dial time.
func (c *Config) EngineRules() engineaddr.Rules {
	return engineaddr.Rules{
		CIDRs:          c.Registry.EngineCIDRs,
		RefuseLoopback: !c.Registry.AllowLoopbackEngines && !LoopbackListen(c.Gateway.RegistryListen),
	}
}

// LoopbackListen reports whether a listen address binds only loopback: localhost or a
// loopback IP. An empty host (":9090") binds every interface.
func LoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
