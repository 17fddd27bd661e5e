package config

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/vllmkv"
)

// StaticWorker is one [[gateway.static_workers]] entry (or one of the admin API's
// PUT /admin/v1/static-workers): an engine that does not heartbeat, whose liveness and load
// come from scraping its Prometheus metrics.
type StaticWorker struct {
	ID          string `json:"id"`
	Model       string `json:"model"`
	HTTPAddress string `json:"http_address"`
	// Role is unified (default), prefill or decode.
	Role string `json:"role,omitempty"`
	// Metrics says which metric names to read: vllm, sglang or tlengine.
	Metrics string `json:"metrics"`
	// MetricsURL defaults to http://<http_address>/metrics.
	MetricsURL string `json:"metrics_url,omitempty"`
	// ScrapeInterval is how often the metrics are read (default 2s); the worker is evicted
	// once heartbeat_miss_limit intervals pass without a successful scrape (R1).
	ScrapeInterval Duration `json:"scrape_interval,omitempty"`
	// KVTotalBlocks is used when the engine does not report its KV capacity.
	KVTotalBlocks int64 `json:"kv_total_blocks,omitempty"`
	// Endpoints are the serving endpoints the engine answers, by their names in the endpoint
	// catalogue (internal/oai: "completions", "chat", "embeddings", …), as a heartbeat's
	// endpoints (R21); none = not said: every endpoint is tried.
	Endpoints []string `json:"endpoints,omitempty"`
	// KVEventsEndpoint is where the engine publishes vLLM-format KV events (R22):
	// "tcp://HOST:PORT", optionally "?replay=tcp://HOST:PORT" for its replay endpoint. The
	// gateway connects to it when [gateway.kv_events] connect is on.
	KVEventsEndpoint string `json:"kv_events_endpoint,omitempty"`
	// BootstrapPort is the engine's SGLang bootstrap port (R22: a prefill worker of a
	// pd_protocol = "sglang" route), 1–65535; 0 in the table is DefaultBootstrapPort.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
}

// DefaultBootstrapPort is SGLang's default bootstrap port: a static worker's when it names
// none, and every heartbeating worker's (WorkerStatus has no field for it).
const DefaultBootstrapPort = 8998

// Duration is a time.Duration written as a Go duration string ("2s") in TOML and JSON.
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration must be a string such as \"2s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration", s)
	}
	*d = Duration(v)
	return nil
}

// NormalizeStaticWorkers fills defaults: role unified, scrape interval 2s, metrics URL,
// bootstrap port 8998.
func NormalizeStaticWorkers(ws []StaticWorker) []StaticWorker {
	out := make([]StaticWorker, len(ws))
	for i, w := range ws {
		if w.Role == "" {
			w.Role = "unified"
		}
		if w.ScrapeInterval == 0 {
			w.ScrapeInterval = Duration(2 * time.Second)
		}
		if w.BootstrapPort == 0 {
			w.BootstrapPort = DefaultBootstrapPort
		}
		if w.MetricsURL == "" && w.HTTPAddress != "" {
			w.MetricsURL = "http://" + w.HTTPAddress + "/metrics"
		}
		out[i] = w
	}
	return out
}

// ValidateStaticWorkers checks a static worker table: ids present and unique, a model, an
// HTTP address that follows the engine address rules (a plain host:port: no scheme, path,
// query or userinfo, no link-local or unspecified IP), a known role and metrics kind, an
// http(s) metrics URL, a positive scrape interval, no negative capacity, endpoints from the
// catalogue, none twice. Its messages name
// fields like "static_workers[1].metrics". The rules of one configuration (engine_cidrs,
// loopback) are StaticWorkerAddresses'.
func ValidateStaticWorkers(ws []StaticWorker) error {
	var ps problems
	validateStaticWorkers(ws, nil, &ps)
	if ps.empty() {
		return nil
	}
	return &Error{Problems: ps.sorted()}
}

// validateStaticWorkers adds the problems of ws to ps, under base.static_workers.
func validateStaticWorkers(ws []StaticWorker, base path, ps *problems) {
	seen := map[string]bool{}
	for i, w := range ws {
		at := func(field string) path {
			return base.with(key("static_workers"), index(i), key(field))
		}
		switch {
		case w.ID == "":
			ps.add(at("id"), "is required")
		case seen[w.ID]:
			ps.add(at("id"), "%q is used twice", w.ID)
		}
		seen[w.ID] = true
		if w.Model == "" {
			ps.add(at("model"), "is required")
		}
		// The address becomes http://<http_address>/v1/…: a path or query here would reach
		// the engine's URLs, a scheme or userinfo another host.
		if err := (engineaddr.Rules{}).HostPort(w.HTTPAddress); err != nil {
			ps.add(at("http_address"), "%v", err)
		}
		switch w.Role {
		case "", "unified", "prefill", "decode":
		default:
			ps.add(at("role"), "%q is not unified, prefill or decode", w.Role)
		}
		switch w.Metrics {
		case "vllm", "sglang", "tlengine":
		default:
			ps.add(at("metrics"), "%q is not vllm, sglang or tlengine", w.Metrics)
		}
		if w.MetricsURL != "" {
			if err := checkMetricsURL(w.MetricsURL, engineaddr.Rules{}); err != nil {
				ps.add(at("metrics_url"), "%v", err)
			}
		}
		if w.ScrapeInterval < 0 || (w.ScrapeInterval > 0 && time.Duration(w.ScrapeInterval) < time.Millisecond) {
			ps.add(at("scrape_interval"), "must be at least 1ms")
		}
		if w.KVTotalBlocks < 0 {
			ps.add(at("kv_total_blocks"), "must be >= 0")
		}
		if w.BootstrapPort < 0 || w.BootstrapPort > 65535 {
			ps.add(at("bootstrap_port"), "%d is not a port: want 1 to 65535", w.BootstrapPort)
		}
		if _, err := vllmkv.ParseEndpoint(w.KVEventsEndpoint); err != nil {
			ps.add(at("kv_events_endpoint"), "%v", err)
		}
		validateEndpointNames(w.Endpoints, at("endpoints"), ps)
	}
}

// validateEndpointNames checks endpoint names (a static worker's, a pool's): each from the
// catalogue, none twice.
func validateEndpointNames(names []string, at path, ps *problems) {
	var set oai.EndpointSet
	for j, name := range names {
		k, ok := oai.KindByEndpoint(name)
		switch {
		case !ok:
			ps.add(at.with(index(j)), "%q is not an endpoint: want one of %s", name, endpointNames)
		case set.Has(k):
			ps.add(at.with(index(j)), "%q is listed twice", name)
		}
		set = set.With(k)
	}
}

// endpointNames lists the catalogue's endpoint names for messages.
var endpointNames = func() string {
	var all oai.EndpointSet
	for _, k := range oai.Kinds() {
		all = all.With(k)
	}
	return strings.ReplaceAll(all.String(), ",", ", ")
}()

// StaticEndpoints is the endpoint set of a valid static worker's Endpoints (names outside the
// catalogue, which ValidateStaticWorkers refuses, are skipped).
func StaticEndpoints(names []string) oai.EndpointSet {
	set, _, _ := oai.ParseEndpoints(names) // valid: no error, and no name it would skip
	return set
}

// StaticWorkerAddresses checks a valid static worker table's addresses against one
// configuration's engine rules (Config.EngineRules: engine_cidrs, loopback off a registry off
// loopback), as heartbeated addresses are: the start-up configuration and every table PUT or
// read from the cluster's store. Its messages name fields like "static_workers[1].http_address".
func StaticWorkerAddresses(ws []StaticWorker, rules engineaddr.Rules) error {
	var ps problems
	staticWorkerAddresses(ws, nil, rules, &ps)
	if ps.empty() {
		return nil
	}
	return &Error{Problems: ps.sorted()}
}

func staticWorkerAddresses(ws []StaticWorker, base path, rules engineaddr.Rules, ps *problems) {
	for i, w := range ws {
		at := func(field string) path { return base.with(key("static_workers"), index(i), key(field)) }
		if err := rules.HostPort(w.HTTPAddress); err != nil {
			ps.add(at("http_address"), "%v", err)
		}
		if w.MetricsURL != "" {
			if err := checkMetricsURL(w.MetricsURL, rules); err != nil {
				ps.add(at("metrics_url"), "%v", err)
			}
		}
	}
}

// checkMetricsURL: an http(s) URL without userinfo whose host follows the engine address
// rules of R13.2 (engineaddr), so a static worker cannot point the scraper at link-local
// metadata services or at an unspecified address.
func checkMetricsURL(s string, rules engineaddr.Rules) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return fmt.Errorf("%q is not an http(s) URL", s)
	}
	if u.User != nil {
		return fmt.Errorf("%q carries userinfo", s)
	}
	check := func() error { return rules.Host(u.Hostname()) }
	if u.Port() != "" {
		check = func() error { return rules.HostPort(u.Host) }
	}
	if err := check(); err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	return nil
}
