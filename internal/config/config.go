// Package config loads and validates the gateway's TOML configuration
// (SPEC B3).
//
// Parse reads TOML, checks it against contracts/runtime.schema.json, fills
// defaults, resolves API keys given by environment variable and runs the
// checks a schema cannot express (unique public ids, accept_if syntax,
// duplicate keys). Every problem found is reported, one line each, naming
// its key in TOML terms:
//
//	config: gateway.heartbeat_interval: "2 parsecs" is not a duration
//	config: gateway.bogus: unknown key
//	config: gateway.routes[0].backends[1].weight: must be >= 0
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/pelletier/go-toml/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Route policies (R3).
const (
	PolicyLeastOutstanding = "least_outstanding"
	PolicyWeighted         = "weighted"
	PolicyAffinity         = "affinity"
)

// API key scopes (B2).
const (
	ScopeInference = "inference"
	ScopeAdmin     = "admin"
	ScopeDebug     = "debug"
)

// Config is the gateway's whole configuration.
type Config struct {
	Gateway Gateway `json:"gateway"`
	Auth    Auth    `json:"auth"`
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
	Routes             []Route       // [[gateway.routes]], normalized (NormalizeRoutes); nil when none
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
	// Scopes is a non-empty list of the Scope constants.
	Scopes []string
}

// String describes the key without its secret, so that a logged Config
// never leaks one.
func (k Key) String() string {
	src := "inline"
	if k.KeyEnv != "" {
		src = "$" + k.KeyEnv
	}
	return fmt.Sprintf("{key: <redacted, %s> scopes: %v}", src, k.Scopes)
}

// Default returns the configuration an empty file gives.
func Default() *Config {
	return &Config{
		Gateway: Gateway{
			HTTPListen:         "127.0.0.1:8080",
			RegistryListen:     "127.0.0.1:9090",
			RoutePolicy:        PolicyLeastOutstanding,
			AffinityLoadFactor: 1.25,
			HeartbeatInterval:  2 * time.Second,
			HeartbeatMissLimit: 3,
			MaxAttempts:        3,
			MaxBodyBytes:       4 << 20,
			ShutdownGrace:      30 * time.Second,
		},
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
	fc.Auth.apply(&cfg.Auth, getenv, &ps)
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
	Gateway *fileGateway `json:"gateway"`
	Auth    *fileAuth    `json:"auth"`
}

type fileGateway struct {
	HTTPListen         *string  `json:"http_listen"`
	RegistryListen     *string  `json:"registry_listen"`
	RoutePolicy        *string  `json:"route_policy"`
	AffinityLoadFactor *float64 `json:"affinity_load_factor"`
	HeartbeatInterval  *string  `json:"heartbeat_interval"`
	HeartbeatMissLimit *int     `json:"heartbeat_miss_limit"`
	MaxAttempts        *int     `json:"max_attempts"`
	MaxBodyBytes       *int64   `json:"max_body_bytes"`
	ShutdownGrace      *string  `json:"shutdown_grace"`
	Routes             []Route  `json:"routes"`
}

type fileAuth struct {
	Keys []fileKey `json:"keys"`
}

type fileKey struct {
	Key    *string  `json:"key"`
	KeyEnv *string  `json:"key_env"`
	Scopes []string `json:"scopes"`
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
	duration(&g.HeartbeatInterval, fg.HeartbeatInterval, base.with(key("heartbeat_interval")), ps)
	duration(&g.ShutdownGrace, fg.ShutdownGrace, base.with(key("shutdown_grace")), ps)
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

func (fa *fileAuth) apply(a *Auth, getenv func(string) string, ps *problems) {
	if fa == nil || len(fa.Keys) == 0 {
		return
	}
	bySecret := make(map[string]int) // secret -> index of its first key
	for i, fk := range fa.Keys {
		kp := path{key("auth"), key("keys"), index(i)}
		var k Key
		var src path // where the secret came from
		switch {
		case fk.Key != nil && fk.KeyEnv != nil:
			ps.add(kp, "key and key_env are mutually exclusive; give one")
			continue
		case fk.Key != nil:
			k.Key, src = *fk.Key, kp.with(key("key"))
			if k.Key == "" {
				ps.add(src, "must not be empty")
				continue
			}
			if !printableToken(k.Key) {
				ps.add(src, "must not contain whitespace or control characters")
				continue
			}
		case fk.KeyEnv != nil:
			k.KeyEnv, src = *fk.KeyEnv, kp.with(key("key_env"))
			k.Key = getenv(k.KeyEnv)
			if k.Key == "" {
				ps.add(src, "environment variable %s is not set or is empty", k.KeyEnv)
				continue
			}
			if !printableToken(k.Key) {
				ps.add(src, "environment variable %s holds whitespace or control characters", k.KeyEnv)
				continue
			}
		default:
			ps.add(kp, "one of key or key_env is required")
			continue
		}
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
		a.Keys = append(a.Keys, k)
	}
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
