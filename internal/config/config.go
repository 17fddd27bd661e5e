// Package config loads and validates the gateway's TOML configuration
// (SPEC B3).
//
// Parse reads TOML, checks it against contracts/runtime.schema.json, fills
// defaults, resolves API keys and other secrets given by environment variable
// (key_env, password_env, [tracing] headers_env) and runs the checks a schema
// cannot express (unique public ids and class names, accept_if syntax,
// duplicate keys, classes that keys name, and the admission classifier's own
// keys, by the parser registered for its type in
// actors/router/admission/classifiers). Every problem found is reported, one
// line each, naming its key in TOML terms:
//
//	config: gateway.heartbeat_interval: "2 parsecs" is not a duration
//	config: gateway.bogus: unknown key
//	config: gateway.routes[0].backends[1].weight: must be >= 0
package config

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/pelletier/go-toml/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tlgw/tlgw/actors/router/admission"
	// The classifier table: Parse checks a classifier's own keys with its registered parser.
	_ "github.com/tlgw/tlgw/actors/router/admission/classifiers"
)

// Route policies (R3).
const (
	PolicyLeastOutstanding = "least_outstanding"
	PolicyWeighted         = "weighted"
	PolicyAffinity         = "affinity"
	PolicyPrefixAware      = "prefix_aware"
	PolicyRoundRobin       = "round_robin"
	// PolicyPrecisePrefix reads the exact prefix index the engines' KvEvents feed (R18.2).
	PolicyPrecisePrefix = "precise_prefix"
	// PolicyPredictedLatency picks by each worker's predicted TTFT (R18.2, R18.4).
	PolicyPredictedLatency = "predicted_latency"
)

// ClassifierDefault is the admission classifier used when [admission] names none (R10). The
// others are registered by name in actors/router/admission/classifiers.
const ClassifierDefault = "default"

// API key scopes (B2).
const (
	ScopeInference = "inference"
	ScopeAdmin     = "admin"
	ScopeDebug     = "debug"
)

// Config is the gateway's whole configuration.
type Config struct {
	Gateway   Gateway   `json:"gateway"`
	Auth      Auth      `json:"auth"`
	Admission Admission `json:"admission"`
	Registry  Registry  `json:"registry"`
	Cluster   Cluster   `json:"cluster"`
	AccessLog AccessLog `json:"access_log"`
	Tracing   Tracing   `json:"tracing"`
}

// Gateway is the [gateway] table.
type Gateway struct {
	HTTPListen         string        // http_listen
	RegistryListen     string        // registry_listen
	RoutePolicy        string        // route_policy: one of the Policy constants
	AffinityLoadFactor float64       // affinity_load_factor: c of R3.3, >= 1
	HeartbeatInterval  time.Duration // heartbeat_interval: T of R1, > 0
	HeartbeatMissLimit int           // heartbeat_miss_limit: k of R1, >= 1
	MaxAttempts        int           // max_attempts: workers tried per request, >= 1
	MaxBodyBytes       int64         // max_body_bytes: larger request bodies get 413
	ShutdownGrace      time.Duration // shutdown_grace: how long in-flight work may finish, > 0
	// PrefixWarmupMinBytes is prefix_warmup_min_bytes: the least matched prompt prefix, in
	// rendered bytes, that a prefix warm-up copies (actors/router/warm.go); 0 = off.
	PrefixWarmupMinBytes int
	// HTTP trust boundary (R13.3): see gateway_http.go.
	AllowUnauthenticated bool          // allow_unauthenticated: serve without keys off loopback
	MaxInFlight          int           // max_in_flight: inference requests at once, >= 1 (503 overloaded above)
	IdleTimeout          time.Duration // idle_timeout: an idle keep-alive connection is closed, > 0
	BodyReadTimeout      time.Duration // body_read_timeout: headers and body must arrive within it, > 0
	ClientWriteTimeout   time.Duration // client_write_timeout: a client that takes no write for it is dropped, > 0
	// MaxBufferedBytes is max_buffered_bytes (R20): the bytes of non-streamed answers being
	// buffered at once, over every request; an answer beyond it is 503 overloaded, >= 1.
	MaxBufferedBytes int64
	// Engine faults (R14.1, R14.3): see gateway_faults.go.
	StreamFirstByteTimeout time.Duration // stream_first_byte_timeout: a stream's headers and first event, > 0
	RequestTimeout         time.Duration // request_timeout: a non-streamed request's total (504 upstream_timeout), > 0
	StreamIdleTimeout      time.Duration // stream_idle_timeout: between a stream's events, > 0
	ControlTimeout         time.Duration // control_timeout: tokenize, Prefill, Release, > 0
	RetryBudgetPercent     float64       // retry_budget_percent: failovers at once ≤ max(3, this % of in-flight requests)
	Outlier                Outlier       // [gateway.outlier] (R14.2)
	Routes                 []Route       // [[gateway.routes]], normalized (NormalizeRoutes); nil when none
	// StaticWorkers are [[gateway.static_workers]], normalized (NormalizeStaticWorkers).
	StaticWorkers []StaticWorker
	// EnginePools are [[gateway.engine_pools]] (R23, pools.go), normalized.
	EnginePools []EnginePool
	// R21 (gateway_lora.go): lora_load_on_demand, and [[gateway.lora_adapters]].
	LoRALoadOnDemand bool
	LoRAAdapters     []LoRAAdapter
	// R22 (gateway_kv.go): [gateway.kv_events], tokenizer, tokenizer_endpoint, tokenizer_timeout.
	KVEvents          KVEvents
	Tokenizer         string        // "estimate" (default) or "engine"
	TokenizerEndpoint string        // "render" (default) or "tokenize"
	TokenizerTimeout  time.Duration // default 50ms
}

// Outlier is [gateway.outlier] (R14.2): a worker that fails ConsecutiveFailures times in a row
// is ejected (not routable) for BaseEjection × 2^(ejections−1), at most MaxEjection; never more
// than MaxEjectedPercent of a model's live workers at once, and at least one stays routable.
type Outlier struct {
	ConsecutiveFailures int           // consecutive_failures: ≥ 0; 0 = ejection off
	BaseEjection        time.Duration // base_ejection: > 0
	MaxEjection         time.Duration // max_ejection: ≥ base_ejection
	MaxEjectedPercent   float64       // max_ejected_percent: 0–100
}

// Auth is the [auth] table. With no keys the gateway serves without auth.
type Auth struct {
	Keys []Key
}

// Key is one [[auth.keys]] entry.
type Key struct {
	// Key is the bearer token. After Parse or Load it holds the resolved
	// secret, also when the file named it by key_env. It is never marshalled.
	Key string `json:"-"`
	// KeyEnv is the environment variable the secret came from, or "".
	KeyEnv string
	// Name identifies the key where the secret must not appear (the access log): the
	// configured name (1 to MaxKeyNameLen printable ASCII characters, no spaces, unique), else
	// "key-<index>", its place in [[auth.keys]] from 0. Never derived from the secret.
	Name string
	// Scopes is a non-empty list of the Scope constants.
	Scopes []string
	// Class is the admission class of the key's requests (the name of one of
	// Admission.Classes), or "" for Admission.DefaultClass.
	Class string
	// RPM and TPM limit the key's requests and tokens per sliding 60 s window (R13.5);
	// 0 = no limit. TPM reserves each request's most tokens while it is served (R20).
	RPM int64
	TPM int64
	// MaxInFlight is max_in_flight (R20): the key's inference requests served at once;
	// one more is 429 rate_limited. 0 = no limit.
	MaxInFlight int64
}

// String describes the key without its secret, so that a logged Config
// never leaks one.
func (k Key) String() string {
	src := "inline"
	if k.KeyEnv != "" {
		src = "$" + k.KeyEnv
	}
	if k.Class != "" {
		return fmt.Sprintf("{key: <redacted, %s> scopes: %v class: %s}", src, k.Scopes, k.Class)
	}
	return fmt.Sprintf("{key: <redacted, %s> scopes: %v}", src, k.Scopes)
}

// Admission is the [admission] table (R10): the admission queue, its
// classes and its classifier. Without the table Enabled is false and every
// request is dispatched at once with no queueing; the other fields then
// hold their defaults (PrefixIndex is still read by route_policy =
// "prefix_aware").
//
// How a request gets its class: its API key's Class, else DefaultClass.
// When that class has Header set, an X-TL-Class header naming another
// configured class picks that class instead (a header naming no class is a
// client error; the header is ignored for classes without Header).
type Admission struct {
	// Enabled is true when the [admission] table is present.
	Enabled bool
	// BusyThreshold is the per-worker load (R2: in flight + queue depth) at
	// which a worker counts as full; 0 = no threshold (never full).
	BusyThreshold int64
	// DefaultClass names the class of requests that name none.
	DefaultClass string
	// Classes are the request classes, in file order; never empty. With no
	// [[admission.classes]] there is one, DefaultAdmissionClass().
	Classes []Class
	// Classifier is the classifier and gate policy.
	Classifier Classifier
	// PrefixIndex sizes the approximate prefix index.
	PrefixIndex PrefixIndexConfig
	// Recheck is how often held queue heads are asked again with no other
	// wake; > 0.
	Recheck time.Duration
}

// Class is one [[admission.classes]] entry.
type Class struct {
	Name string // name: unique, matching ^[A-Za-z0-9_.-]+$
	// Quantum is the class's deficit-round-robin weight, >= 1: requests per
	// round with Cost requests, uncached prompt tokens per round with Cost
	// uncached_tokens.
	Quantum int
	// QueueLimit is how many requests of the class may wait, >= 0; 0 = the
	// class never queues (dispatched when capacity exists, else 429).
	QueueLimit int
	// MaxWait is how long a request may wait before 503 queue_timeout; > 0.
	MaxWait time.Duration
	// Header (allow_header) lets a request whose class is this one pick
	// another configured class with X-TL-Class.
	Header bool
	// Priority orders classes strictly, 0 to MaxClassPriority (default 0):
	// higher classes drain first; classes of equal priority share by DRR.
	Priority int
	// Order (order) is how the class's waiting requests are ordered: fcfs
	// (default, oldest first) or wspt (fewest estimated uncached prompt
	// tokens first, ties by arrival).
	Order admission.Order
	// Cost (cost) is what a dispatch costs the class's DRR credit: requests
	// (default, one per request) or uncached_tokens (its estimated uncached
	// prompt tokens, at least 1; Quantum is then tokens per round).
	Cost admission.Cost
}

// MaxClassPriority is the largest [[admission.classes]] priority.
const MaxClassPriority = 1000

// Classifier is admission.classifier: which classifier, and its own keys.
// The config package does not know those keys: each classifier parses and
// validates them (admission.NewPolicy with the classifier's registered
// factory), and Parse has already run that parser, so a bad key fails the
// load naming it.
type Classifier struct {
	// Type is a registered classifier name (ClassifierDefault when the table
	// is absent).
	Type string
	// Options are the table's other keys as TOML decodes them (integers are
	// int64, durations strings); nil when there are none.
	Options map[string]any
}

// DefaultPrefixWarmupMinBytes is gateway.prefix_warmup_min_bytes's default.
const DefaultPrefixWarmupMinBytes = 12288

// PrefixIndexConfig is admission.prefix_index.
type PrefixIndexConfig struct {
	// BlocksPerWorker bounds the chunk hashes remembered per worker (each
	// stands for 64 prompt bytes); 1 to 1048576.
	BlocksPerWorker int
}

// DefaultAdmissionClass is the class that exists when [admission] names
// none.
func DefaultAdmissionClass() Class {
	return Class{Name: "default", Quantum: 1, QueueLimit: 1024, MaxWait: 30 * time.Second}
}

// defaultAdmission is the [admission] table's defaults, with Enabled false.
func defaultAdmission() Admission {
	return Admission{
		DefaultClass: "default",
		Classes:      []Class{DefaultAdmissionClass()},
		Classifier:   Classifier{Type: ClassifierDefault},
		PrefixIndex:  PrefixIndexConfig{BlocksPerWorker: 4096},
		Recheck:      time.Second,
	}
}

// Default returns the configuration an empty file gives.
func Default() *Config {
	return &Config{
		Gateway: Gateway{
			HTTPListen:           "127.0.0.1:8080",
			RegistryListen:       "127.0.0.1:9090",
			RoutePolicy:          PolicyLeastOutstanding,
			AffinityLoadFactor:   1.25,
			HeartbeatInterval:    2 * time.Second,
			HeartbeatMissLimit:   3,
			MaxAttempts:          3,
			MaxBodyBytes:         4 << 20,
			ShutdownGrace:        30 * time.Second,
			PrefixWarmupMinBytes: DefaultPrefixWarmupMinBytes,
			MaxInFlight:          10000,
			MaxBufferedBytes:     DefaultMaxBufferedBytes,
			IdleTimeout:          120 * time.Second,
			BodyReadTimeout:      30 * time.Second,
			ClientWriteTimeout:   30 * time.Second,

			StreamFirstByteTimeout: 60 * time.Second,
			RequestTimeout:         10 * time.Minute,
			StreamIdleTimeout:      60 * time.Second,
			ControlTimeout:         30 * time.Second,
			KVEvents:               defaultKVEvents(),
			Tokenizer:              TokenizerEstimate,
			TokenizerEndpoint:      TokenizerRender,
			TokenizerTimeout:       50 * time.Millisecond,
			RetryBudgetPercent:     20,
			Outlier: Outlier{
				ConsecutiveFailures: 5,
				BaseEjection:        30 * time.Second,
				MaxEjection:         5 * time.Minute,
				MaxEjectedPercent:   50,
			},
		},
		Admission: defaultAdmission(),
		Registry:  defaultRegistry(),
		Cluster:   defaultCluster(),
		AccessLog: defaultAccessLog(),
		Tracing:   defaultTracing(),
	}
}

// Load reads the TOML file at path and parses it with os.Getenv as the
// environment. Problems with the contents are returned as by Parse; the
// caller may want to name the file when reporting them.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, os.Getenv)
}

// Parse parses and validates a TOML configuration. getenv resolves key_env
// (nil means os.Getenv). The error, if any, is an *Error listing every
// problem found in the phase that failed: TOML syntax, then the schema, then
// the semantic checks.
func Parse(data []byte, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	fail := func(ps []Problem) (*Config, error) {
		return nil, &Error{Problems: ps, prefix: "config: "}
	}

	var tree map[string]any
	if err := toml.Unmarshal(data, &tree); err != nil {
		return fail([]Problem{syntaxProblem(err)})
	}

	// TOML -> JSON -> schema.
	placeholder := make(map[string]string)
	js, err := json.Marshal(toJSON(tree, nil, placeholder))
	if err != nil {
		return nil, fmt.Errorf("config: internal: %w", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return nil, fmt.Errorf("config: internal: %w", err)
	}
	var ps problems
	if err := validateSchema(doc, placeholder, &ps); err != nil {
		return nil, fmt.Errorf("config: internal: %w", err)
	}
	if ps.empty() && len(placeholder) > 0 {
		// Unreachable while every field of the schema is typed; kept so a
		// value without a JSON form can never pass as absent.
		for p, msg := range placeholder {
			ps.list = append(ps.list, located{Problem: Problem{Path: p, Message: msg}})
		}
	}
	if !ps.empty() {
		return fail(ps.sorted())
	}

	// JSON -> structs, defaults, semantic checks.
	var fc fileConfig
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		return fail([]Problem{decodeProblem(err)})
	}
	cfg := Default()
	fc.Gateway.apply(&cfg.Gateway, &ps)
	fc.Admission.apply(&cfg.Admission, classifierOptions(tree), &ps)
	fc.Auth.apply(&cfg.Auth, &cfg.Admission, getenv, &ps)
	fc.Registry.apply(&cfg.Registry, getenv, &ps)
	fc.Cluster.apply(&cfg.Cluster, getenv, &ps)
	fc.AccessLog.apply(&cfg.AccessLog, &ps)
	fc.Tracing.apply(&cfg.Tracing, getenv, &ps)
	if ps.empty() {
		checkRegistryExposure(cfg, &ps)
		checkHTTPExposure(cfg, &ps)
		staticWorkerAddresses(cfg.Gateway.StaticWorkers, path{key("gateway")}, cfg.EngineRules(), &ps)
	}
	if !ps.empty() {
		return fail(ps.sorted())
	}
	return cfg, nil
}

// syntaxProblem reports a TOML decoding error with its position.
func syntaxProblem(err error) Problem {
	msg := strings.TrimPrefix(err.Error(), "toml: ")
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		msg = fmt.Sprintf("line %d, column %d: %s", row, col, msg)
	}
	return Problem{Message: "invalid TOML: " + msg}
}

// decodeProblem reports a JSON decoding error after the schema passed: in
// practice only an integer too large for its field.
func decodeProblem(err error) Problem {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return Problem{Path: te.Field, Message: "value out of range"}
	}
	return Problem{Message: err.Error()}
}

// fileConfig mirrors the file; pointers tell absent fields (default) from
// given ones.
type fileConfig struct {
	Gateway   *fileGateway   `json:"gateway"`
	Auth      *fileAuth      `json:"auth"`
	Admission *fileAdmission `json:"admission"`
	Registry  *fileRegistry  `json:"registry"`
	Cluster   *fileCluster   `json:"cluster"`
	AccessLog *fileAccessLog `json:"access_log"`
	Tracing   *fileTracing   `json:"tracing"`
}

type fileGateway struct {
	HTTPListen         *string        `json:"http_listen"`
	RegistryListen     *string        `json:"registry_listen"`
	RoutePolicy        *string        `json:"route_policy"`
	AffinityLoadFactor *float64       `json:"affinity_load_factor"`
	HeartbeatInterval  *string        `json:"heartbeat_interval"`
	HeartbeatMissLimit *int           `json:"heartbeat_miss_limit"`
	MaxAttempts        *int           `json:"max_attempts"`
	MaxBodyBytes       *int64         `json:"max_body_bytes"`
	PrefixWarmupMin    *int           `json:"prefix_warmup_min_bytes"`
	ShutdownGrace      *string        `json:"shutdown_grace"`
	Routes             []Route        `json:"routes"`
	StaticWorkers      []StaticWorker `json:"static_workers"`
	fileGatewayHTTP
	fileGatewayFaults
	fileGatewayLoRA
	fileGatewayKV
	fileGatewayPools
}

type fileAuth struct {
	Keys []fileKey `json:"keys"`
}

type fileKey struct {
	Key    *string  `json:"key"`
	KeyEnv *string  `json:"key_env"`
	Name   *string  `json:"name"`
	Scopes []string `json:"scopes"`
	Class  *string  `json:"class"`
	RPM    *int64   `json:"rpm"`
	TPM    *int64   `json:"tpm"`
	// MaxInFlight is max_in_flight (R20).
	MaxInFlight *int64 `json:"max_in_flight"`
}

type fileAdmission struct {
	BusyThreshold *int64          `json:"busy_threshold"`
	DefaultClass  *string         `json:"default_class"`
	Classes       []fileClass     `json:"classes"`
	Classifier    *fileClassifier `json:"classifier"`
	PrefixIndex   *filePrefix     `json:"prefix_index"`
	Recheck       *string         `json:"recheck"`
}

type fileClass struct {
	Name       string  `json:"name"`
	Quantum    *int    `json:"quantum"`
	QueueLimit *int    `json:"queue_limit"`
	MaxWait    *string `json:"max_wait"`
	Header     *bool   `json:"allow_header"`
	Priority   *int    `json:"priority"`
	Order      *string `json:"order"`
	Cost       *string `json:"cost"`
}

// fileClassifier is the classifier's type; its other keys are the
// classifier's own, taken from the TOML tree (classifierOptions).
type fileClassifier struct {
	Type string
}

// UnmarshalJSON reads the type and leaves the other keys to the classifier.
func (fc *fileClassifier) UnmarshalJSON(b []byte) error {
	var v struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	fc.Type = v.Type
	return nil
}

// classifierOptions is the TOML table admission.classifier without its type
// (nil when it has no other keys), as go-toml decoded it: integers stay
// int64 rather than becoming JSON's float64.
func classifierOptions(tree map[string]any) map[string]any {
	adm, _ := tree["admission"].(map[string]any)
	tbl, _ := adm["classifier"].(map[string]any)
	var out map[string]any
	for k, v := range tbl {
		if k == "type" {
			continue
		}
		if out == nil {
			out = make(map[string]any, len(tbl))
		}
		out[k] = v
	}
	return out
}

type filePrefix struct {
	BlocksPerWorker *int `json:"blocks_per_worker"`
}

func setIf[T any](dst *T, src *T) {
	if src != nil {
		*dst = *src
	}
}

func (fg *fileGateway) apply(g *Gateway, ps *problems) {
	if fg == nil {
		return
	}
	base := path{key("gateway")}
	setIf(&g.HTTPListen, fg.HTTPListen)
	setIf(&g.RegistryListen, fg.RegistryListen)
	setIf(&g.RoutePolicy, fg.RoutePolicy)
	setIf(&g.AffinityLoadFactor, fg.AffinityLoadFactor)
	setIf(&g.HeartbeatMissLimit, fg.HeartbeatMissLimit)
	setIf(&g.MaxAttempts, fg.MaxAttempts)
	setIf(&g.MaxBodyBytes, fg.MaxBodyBytes)
	setIf(&g.PrefixWarmupMinBytes, fg.PrefixWarmupMin)
	duration(&g.HeartbeatInterval, fg.HeartbeatInterval, base.with(key("heartbeat_interval")), ps)
	duration(&g.ShutdownGrace, fg.ShutdownGrace, base.with(key("shutdown_grace")), ps)
	fg.fileGatewayHTTP.apply(g, base, ps)
	fg.fileGatewayFaults.apply(g, base, ps)
	fg.fileGatewayLoRA.apply(g, base, ps)
	fg.fileGatewayKV.apply(g, base, ps)
	if fg.HeartbeatInterval != nil {
		// Workers are told T in whole milliseconds (a uint32), and the
		// registry computes k·T, which must fit a time.Duration.
		switch T := g.HeartbeatInterval; {
		case T < time.Millisecond:
			ps.add(base.with(key("heartbeat_interval")), "must be at least 1ms")
		case T/time.Millisecond > math.MaxUint32:
			ps.add(base.with(key("heartbeat_interval")), "must be at most %v", time.Duration(math.MaxUint32)*time.Millisecond)
		}
	}
	if k := time.Duration(g.HeartbeatMissLimit); k > 0 && g.HeartbeatInterval > math.MaxInt64/k {
		ps.add(base.with(key("heartbeat_miss_limit")), "heartbeat_interval × heartbeat_miss_limit is too long")
	}
	if len(fg.Routes) > 0 {
		validateRoutes(fg.Routes, base, ps)
		g.Routes = NormalizeRoutes(fg.Routes)
	}
	if len(fg.StaticWorkers) > 0 {
		validateStaticWorkers(fg.StaticWorkers, base, ps)
		g.StaticWorkers = NormalizeStaticWorkers(fg.StaticWorkers)
	}
	fg.fileGatewayPools.apply(g, base, ps) // after the static workers: their ids are checked against the pools'
}

// named sets dst to the value called *src in names; an unknown name is a
// problem at p listing the names (in value order).
func named[T cmp.Ordered](dst *T, names map[string]T, src *string, p path, ps *problems) {
	if src == nil {
		return
	}
	if v, ok := names[*src]; ok {
		*dst = v
		return
	}
	all := slices.SortedFunc(maps.Keys(names), func(a, b string) int { return cmp.Compare(names[a], names[b]) })
	for i, n := range all {
		all[i] = strconv.Quote(n)
	}
	ps.add(p, "%q is not one of %s", *src, strings.Join(all, ", "))
}

// duration parses a duration field, which must be positive.
func duration(dst *time.Duration, src *string, p path, ps *problems) {
	if src == nil {
		return
	}
	d, err := time.ParseDuration(*src)
	switch {
	case err != nil:
		ps.add(p, "%q is not a duration", *src)
	case d <= 0:
		ps.add(p, "must be > 0")
	default:
		*dst = d
	}
}

func (fa *fileAdmission) apply(a *Admission, classifierOpts map[string]any, ps *problems) {
	if fa == nil {
		return
	}
	base := path{key("admission")}
	a.Enabled = true
	setIf(&a.BusyThreshold, fa.BusyThreshold)
	setIf(&a.DefaultClass, fa.DefaultClass)
	duration(&a.Recheck, fa.Recheck, base.with(key("recheck")), ps)
	if fa.PrefixIndex != nil {
		setIf(&a.PrefixIndex.BlocksPerWorker, fa.PrefixIndex.BlocksPerWorker)
	}

	if len(fa.Classes) > 0 {
		a.Classes = make([]Class, 0, len(fa.Classes))
		byName := make(map[string]int) // name -> index of its first class
		for i, fc := range fa.Classes {
			cp := base.with(key("classes"), index(i))
			c := DefaultAdmissionClass()
			c.Name = fc.Name
			if prev, dup := byName[c.Name]; dup {
				ps.add(cp.with(key("name")), "%q is already the name of %s", c.Name, base.with(key("classes"), index(prev)))
			} else {
				byName[c.Name] = i
			}
			setIf(&c.Quantum, fc.Quantum)
			setIf(&c.QueueLimit, fc.QueueLimit)
			setIf(&c.Header, fc.Header)
			duration(&c.MaxWait, fc.MaxWait, cp.with(key("max_wait")), ps)
			if p := fc.Priority; p != nil {
				// The schema bounds it too; this keeps Class's contract for
				// any caller of apply.
				if *p < 0 || *p > MaxClassPriority {
					ps.add(cp.with(key("priority")), "%d is not between 0 and %d", *p, MaxClassPriority)
				} else {
					c.Priority = *p
				}
			}
			named(&c.Order, admission.Orders, fc.Order, cp.with(key("order")), ps)
			named(&c.Cost, admission.Costs, fc.Cost, cp.with(key("cost")), ps)
			a.Classes = append(a.Classes, c)
		}
	}
	if a.ClassIndex(a.DefaultClass) < 0 {
		if fa.DefaultClass != nil {
			ps.add(base.with(key("default_class")), "%q is not one of the classes %s", a.DefaultClass, a.classList())
		} else {
			// The implicit "default" goes missing only when classes are given.
			ps.add(base.with(key("default_class")), "must name one of the classes %s when none is called %q", a.classList(), a.DefaultClass)
		}
	}

	if fc := fa.Classifier; fc != nil {
		a.Classifier = Classifier{Type: fc.Type, Options: classifierOpts}
		// The classifier's own parser checks its keys. The policy built here
		// is dropped: the app builds the one it runs, on the gateway's clock.
		_, err := admission.NewPolicy(fc.Type, classifierOpts, admission.Env{})
		classifierProblems(err, base.with(key("classifier")), ps)
	}
}

// classifierProblems adds a problem per *admission.OptionError in err (one
// or several joined), at its key under p; anything else is a problem at p.
func classifierProblems(err error, p path, ps *problems) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			classifierProblems(e, p, ps)
		}
		return
	}
	var oe *admission.OptionError
	if errors.As(err, &oe) {
		ps.add(p.with(key(oe.Key)), "%s", oe.Message)
		return
	}
	ps.add(p, "%v", err)
}

// ClassIndex returns the index of the class called name in a.Classes, or
// -1.
func (a *Admission) ClassIndex(name string) int {
	return slices.IndexFunc(a.Classes, func(c Class) bool { return c.Name == name })
}

// classList renders the class names for a message: "a", "b".
func (a *Admission) classList() string {
	var names []string
	for _, c := range a.Classes {
		if q := strconv.Quote(c.Name); !slices.Contains(names, q) {
			names = append(names, q)
		}
	}
	return strings.Join(names, ", ")
}

// apply fills a from fa; adm is the parsed admission table, against which
// key classes are checked.
func (fa *fileAuth) apply(a *Auth, adm *Admission, getenv func(string) string, ps *problems) {
	if fa == nil || len(fa.Keys) == 0 {
		return
	}
	bySecret := make(map[string]int) // secret -> index of its first key
	byName := keyNames(fa.Keys, ps)
	for i, fk := range fa.Keys {
		kp := path{key("auth"), key("keys"), index(i)}
		var k Key
		k.Name = byName[i]
		secret, env, src, ok := resolveSecret(ps, getenv, kp, "key", fk.Key, fk.KeyEnv)
		if !ok {
			continue
		}
		k.Key, k.KeyEnv = secret, env
		if prev, dup := bySecret[k.Key]; dup {
			ps.add(src, "same key as auth.keys[%d]", prev)
		} else {
			bySecret[k.Key] = i
		}

		if len(fk.Scopes) == 0 {
			ps.add(kp.with(key("scopes")), "must not be empty")
		}
		for j, s := range fk.Scopes {
			if s != ScopeInference && s != ScopeAdmin && s != ScopeDebug {
				ps.add(kp.with(key("scopes"), index(j)), "%q is not one of %q, %q, %q", s, ScopeInference, ScopeAdmin, ScopeDebug)
			}
		}
		k.Scopes = slices.Clone(fk.Scopes)
		if fk.Class != nil {
			k.Class = *fk.Class
			switch {
			case !adm.Enabled:
				ps.add(kp.with(key("class")), "%q names an admission class, but there is no [admission] table", k.Class)
			case adm.ClassIndex(k.Class) < 0:
				ps.add(kp.with(key("class")), "%q is not one of the classes %s", k.Class, adm.classList())
			}
		}
		for _, l := range []struct {
			name string
			v    *int64
			to   *int64
		}{{"rpm", fk.RPM, &k.RPM}, {"tpm", fk.TPM, &k.TPM}, {"max_in_flight", fk.MaxInFlight, &k.MaxInFlight}} {
			if l.v == nil {
				continue
			}
			if *l.v < 0 {
				ps.add(kp.with(key(l.name)), "must be >= 0 (0 = no limit)")
				continue
			}
			*l.to = *l.v
		}
		a.Keys = append(a.Keys, k)
	}
}

// MaxKeyNameLen bounds an [[auth.keys]] name.
const MaxKeyNameLen = 64

// keyNames is each key's name (by index): its name, else "key-<index>". A name that is not
// 1 to MaxKeyNameLen printable ASCII characters without spaces, or that another key's name
// (given or fallen back to) already is, is a problem.
func keyNames(keys []fileKey, ps *problems) []string {
	names := make([]string, len(keys))
	for i, fk := range keys {
		names[i] = "key-" + strconv.Itoa(i)
		if fk.Name != nil {
			names[i] = *fk.Name
		}
	}
	first := make(map[string]int, len(keys)) // name -> index of its first key; bounded by the keys
	for i, n := range names {
		np := path{key("auth"), key("keys"), index(i), key("name")}
		if keys[i].Name != nil && !ValidKeyName(n) {
			ps.add(np, "must be 1 to %d printable ASCII characters without spaces", MaxKeyNameLen)
			continue
		}
		if prev, dup := first[n]; dup {
			switch {
			case keys[i].Name == nil:
				ps.add(np[:len(np)-1], "its default name %q is already the name of auth.keys[%d]; give this key a name", n, prev)
			case keys[prev].Name == nil:
				ps.add(np, "%q is already the default name of auth.keys[%d]", n, prev)
			default:
				ps.add(np, "%q is already the name of auth.keys[%d]", n, prev)
			}
			continue
		}
		first[n] = i
	}
	return names
}

// ValidKeyName reports whether s may name an API key: 1 to MaxKeyNameLen printable ASCII
// characters, no spaces.
func ValidKeyName(s string) bool {
	if len(s) == 0 || len(s) > MaxKeyNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// printableToken reports whether s can be sent as a bearer token: no
// whitespace, no control characters (a trailing newline read from a secret
// file is the usual culprit).
func printableToken(s string) bool {
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return false
		}
	}
	return true
}

// resolveSecret reads a secret given inline (name) or by environment variable (name_env, read
// with getenv),
// exactly one of the two: non-empty, with no whitespace or control characters. It returns the
// secret, the variable it came from ("" inline) and the key it came from; ok is false after
// an error has been added to ps.
func resolveSecret(ps *problems, getenv func(string) string, at path, name string, inline, env *string) (secret, envVar string, src path, ok bool) {
	switch {
	case inline != nil && env != nil:
		ps.add(at, "%s and %s_env are mutually exclusive; give one", name, name)
		return "", "", nil, false
	case inline != nil:
		src = at.with(key(name))
		if *inline == "" {
			ps.add(src, "must not be empty")
			return "", "", nil, false
		}
		if !printableToken(*inline) {
			ps.add(src, "must not contain whitespace or control characters")
			return "", "", nil, false
		}
		return *inline, "", src, true
	case env != nil:
		src = at.with(key(name + "_env"))
		v := getenv(*env)
		if v == "" {
			ps.add(src, "environment variable %s is not set or is empty", *env)
			return "", "", nil, false
		}
		if !printableToken(v) {
			ps.add(src, "environment variable %s holds whitespace or control characters", *env)
			return "", "", nil, false
		}
		return v, *env, src, true
	}
	ps.add(at, "one of %s or %s_env is required", name, name)
	return "", "", nil, false
}
