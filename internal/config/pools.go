package config

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// EnginePool is one [[gateway.engine_pools]] entry (R23): unmodified engines found by DNS.
// Every A/AAAA record of DNS's name is a scraped worker with id "<name>/<ip:port>", held to the
// static workers' rules (scraped before it gets traffic, evicted after k·scrape_interval
// without a good scrape); a record that vanishes drains its worker, which is removed once
// nothing is in flight on it. The name is resolved again every Refresh.
type EnginePool struct {
	// Name names the pool: the prefix of its workers' ids and the pool label of its metrics.
	Name  string `json:"name"`
	Model string `json:"model"`
	// DNS is NAME:PORT: a DNS name (a Kubernetes headless service) and the engines' HTTP port.
	DNS string `json:"dns"`
	// Metrics says which metric names to read: vllm, sglang or tlengine.
	Metrics string `json:"metrics"`
	// ScrapeInterval is each engine's scrape interval (default 2s), as a static worker's.
	ScrapeInterval Duration `json:"scrape_interval,omitempty"`
	// Refresh is how often the name is resolved again (default 10s).
	Refresh Duration `json:"refresh,omitempty"`
	// Role is unified (default), prefill or decode.
	Role string `json:"role,omitempty"`
	// KVTotalBlocks is used when an engine does not report its KV capacity.
	KVTotalBlocks int64 `json:"kv_total_blocks,omitempty"`
	// Endpoints are the serving endpoints the engines answer (R21), as a static worker's.
	Endpoints []string `json:"endpoints,omitempty"`
	// KVEventsEndpoint is a template of each engine's KV-event endpoint (R22): a static
	// worker's kv_events_endpoint in which every "{ip}" stands for the record's address as it
	// is written in a host:port (an IPv6 address in brackets):
	//
	//	"tcp://{ip}:5557"                             10.0.0.7 → tcp://10.0.0.7:5557
	//	"tcp://{ip}:5557?replay=tcp://{ip}:5558"     fd00::7 → tcp://[fd00::7]:5557?replay=tcp://[fd00::7]:5558
	//
	// "{ip}" is the only placeholder, and it must appear; any other brace is an error.
	KVEventsEndpoint string `json:"kv_events_endpoint,omitempty"`
	// BootstrapPort is the engines' SGLang bootstrap port (R22), 1–65535; 0 in the table is
	// DefaultBootstrapPort.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
}

// Bounds of the engine pools (R19: every table says what bounds it).
const (
	// MaxEnginePools bounds [[gateway.engine_pools]].
	MaxEnginePools = 64
	// MaxPoolNameBytes bounds a pool's name (a metrics label and an id prefix).
	MaxPoolNameBytes = 63
	// MaxPoolDNSBytes bounds a pool's dns name (without the port): DNS's own limit.
	MaxPoolDNSBytes = 253
	// MaxPoolWorkers bounds one pool's workers: the records past it (in address order) are
	// dropped, counted and logged at each resolve.
	MaxPoolWorkers = 1024
	// MinPoolRefresh is the shortest refresh: a name is not asked more often.
	MinPoolRefresh = 100 * time.Millisecond
)

// DefaultPoolRefresh is a pool's refresh when it names none.
const DefaultPoolRefresh = 10 * time.Second

// PoolIPPlaceholder is kv_events_endpoint's placeholder for a record's address.
const PoolIPPlaceholder = "{ip}"

// PoolWorkerID is the id of pool's worker at addr ("10.0.0.7:8000", "[fd00::7]:8000").
func PoolWorkerID(pool, addr string) string { return pool + "/" + addr }

// PoolKVEventsEndpoint fills a valid template with ip ("" for no template).
func PoolKVEventsEndpoint(template string, ip netip.Addr) string {
	if template == "" {
		return ""
	}
	host := ip.String()
	if ip.Is6() && !ip.Is4In6() {
		host = "[" + host + "]"
	}
	return strings.ReplaceAll(template, PoolIPPlaceholder, host)
}

// NormalizeEnginePools fills defaults: role unified, scrape interval 2s, refresh 10s,
// bootstrap port 8998.
func NormalizeEnginePools(ps []EnginePool) []EnginePool {
	out := make([]EnginePool, len(ps))
	for i, p := range ps {
		if p.Role == "" {
			p.Role = "unified"
		}
		if p.ScrapeInterval == 0 {
			p.ScrapeInterval = Duration(2 * time.Second)
		}
		if p.Refresh == 0 {
			p.Refresh = Duration(DefaultPoolRefresh)
		}
		if p.BootstrapPort == 0 {
			p.BootstrapPort = DefaultBootstrapPort
		}
		out[i] = p
	}
	return out
}

// ValidateEnginePools checks a pool table as [[gateway.engine_pools]] (or the cluster's stored
// table) gives it; its messages name fields like "engine_pools[1].dns".
func ValidateEnginePools(pools []EnginePool) error {
	var ps problems
	validateEnginePools(pools, nil, &ps)
	if ps.empty() {
		return nil
	}
	return &Error{Problems: ps.sorted()}
}

// validPoolName: 1–63 bytes of lower-case letters, digits, '-', '_' and '.', starting with a
// letter or a digit: safe as a metrics label, in an actor name and before the id's '/'.
func validPoolName(s string) bool {
	if s == "" || len(s) > MaxPoolNameBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '_' || c == '.') && i > 0:
		default:
			return false
		}
	}
	return true
}

// checkPoolDNS checks NAME:PORT: a DNS name (not an IP: one address is a static worker) of
// at most MaxPoolDNSBytes, and a port 1–65535.
func checkPoolDNS(s string) error {
	host, _, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return fmt.Errorf("%q is not NAME:PORT", s)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return fmt.Errorf("%q names an IP address: a pool needs a DNS name (one address is a static worker)", s)
	}
	if len(strings.TrimSuffix(host, ".")) > MaxPoolDNSBytes {
		return fmt.Errorf("the name is longer than %d bytes", MaxPoolDNSBytes)
	}
	if err := (engineaddr.Rules{}).HostPort(s); err != nil {
		return err
	}
	return nil
}

// checkPoolKVTemplate checks a kv_events_endpoint template: "{ip}" present, no other brace,
// and the endpoint it gives for the longest IPv4 and IPv6 addresses a valid one.
func checkPoolKVTemplate(t string) error {
	if t == "" {
		return nil
	}
	if !strings.Contains(t, PoolIPPlaceholder) {
		return fmt.Errorf("%q lacks %s: every engine of a pool has its own address", t, PoolIPPlaceholder)
	}
	if rest := strings.ReplaceAll(t, PoolIPPlaceholder, ""); strings.ContainsAny(rest, "{}") {
		return fmt.Errorf("%q: %s is the only placeholder", t, PoolIPPlaceholder)
	}
	for _, ip := range []netip.Addr{netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")} {
		if _, err := vllmkv.ParseEndpoint(PoolKVEventsEndpoint(t, ip)); err != nil {
			return fmt.Errorf("with %s = %s: %v", PoolIPPlaceholder, ip, err)
		}
	}
	return nil
}

// validateEnginePools adds the problems of pools to ps, under base.engine_pools.
func validateEnginePools(pools []EnginePool, base path, ps *problems) {
	if len(pools) > MaxEnginePools {
		ps.add(base.with(key("engine_pools")), "%d pools: at most %d", len(pools), MaxEnginePools)
	}
	seen := map[string]bool{} // bounded by the table's entries
	for i, p := range pools {
		at := func(field string) path { return base.with(key("engine_pools"), index(i), key(field)) }
		switch {
		case !validPoolName(p.Name):
			ps.add(at("name"), "%q must be 1 to %d bytes of a-z, 0-9, '-', '_', '.', starting with a letter or digit", p.Name, MaxPoolNameBytes)
		case seen[p.Name]:
			ps.add(at("name"), "%q is used twice", p.Name)
		}
		seen[p.Name] = true
		if p.Model == "" {
			ps.add(at("model"), "is required")
		}
		if err := checkPoolDNS(p.DNS); err != nil {
			ps.add(at("dns"), "%v", err)
		}
		switch p.Role {
		case "", "unified", "prefill", "decode":
		default:
			ps.add(at("role"), "%q is not unified, prefill or decode", p.Role)
		}
		switch p.Metrics {
		case "vllm", "sglang", "tlengine":
		default:
			ps.add(at("metrics"), "%q is not vllm, sglang or tlengine", p.Metrics)
		}
		if p.ScrapeInterval < 0 || (p.ScrapeInterval > 0 && time.Duration(p.ScrapeInterval) < time.Millisecond) {
			ps.add(at("scrape_interval"), "must be at least 1ms")
		}
		if p.Refresh < 0 || (p.Refresh > 0 && time.Duration(p.Refresh) < MinPoolRefresh) {
			ps.add(at("refresh"), "must be at least %v", MinPoolRefresh)
		}
		if p.KVTotalBlocks < 0 {
			ps.add(at("kv_total_blocks"), "must be >= 0")
		}
		if p.BootstrapPort < 0 || p.BootstrapPort > 65535 {
			ps.add(at("bootstrap_port"), "%d is not a port: want 1 to 65535", p.BootstrapPort)
		}
		if err := checkPoolKVTemplate(p.KVEventsEndpoint); err != nil {
			ps.add(at("kv_events_endpoint"), "%v", err)
		}
		validateEndpointNames(p.Endpoints, at("endpoints"), ps)
	}
}

// checkPoolIDs refuses a static worker id inside a pool's id space ("<pool>/…"): the two
// would name one worker.
func checkPoolIDs(g *Gateway, base path, ps *problems) {
	for i, w := range g.StaticWorkers {
		for _, p := range g.EnginePools {
			if strings.HasPrefix(w.ID, p.Name+"/") {
				ps.add(base.with(key("static_workers"), index(i), key("id")), "%q lies in engine pool %q's ids (%s/<ip:port>)", w.ID, p.Name, p.Name)
			}
		}
	}
}

// PoolIDConflict is checkPoolIDs for two tables set apart (PUT /admin/v1/engine-pools or
// /admin/v1/static-workers): the first static worker whose id lies in a pool's id space, or nil.
func PoolIDConflict(ws []StaticWorker, pools []EnginePool) error {
	for _, w := range ws {
		for _, p := range pools {
			if strings.HasPrefix(w.ID, p.Name+"/") {
				return fmt.Errorf("static worker %q lies in engine pool %q's ids (%s/<ip:port>)", w.ID, p.Name, p.Name)
			}
		}
	}
	return nil
}

// fileGatewayPools is the [gateway] key of R23's engine pools.
type fileGatewayPools struct {
	EnginePools []EnginePool `json:"engine_pools"`
}

func (fp *fileGatewayPools) apply(g *Gateway, base path, ps *problems) {
	if len(fp.EnginePools) == 0 {
		return
	}
	validateEnginePools(fp.EnginePools, base, ps)
	g.EnginePools = NormalizeEnginePools(fp.EnginePools)
	checkPoolIDs(g, base, ps)
}
