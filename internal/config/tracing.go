package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tlgw/tlgw/internal/tracing"
)

// Tracing is the [tracing] table (R24): the gateway's spans, exported over OTLP/gRPC
// (internal/tracing). Without the table, or with an empty otlp_endpoint, the gateway makes no
// span and forwards a client's valid traceparent/tracestate to the engines unchanged.
type Tracing struct {
	// OTLPEndpoint is the collector's host:port ("" = tracing off).
	OTLPEndpoint string
	// SampleRatio is the share of traces sampled, 0 to 1: of every request when ParentBased is
	// false, else of those whose client sent no valid traceparent.
	SampleRatio float64
	// ParentBased: a client's traceparent sampled flag decides for its request.
	ParentBased bool
	// Insecure is plaintext gRPC to the collector; false is TLS verified by the system's roots.
	Insecure bool
	// Headers are sent with every export: headers and headers_env's resolved values together,
	// names lowercase (as gRPC sends them). Values are often credentials: never marshalled
	// nor printed (String).
	Headers map[string]string `json:"-"`
	// HeadersEnv maps a header name (lowercase) to the environment variable its value came
	// from at start-up.
	HeadersEnv map[string]string
}

// Enabled reports whether the gateway traces requests.
func (t Tracing) Enabled() bool { return t.OTLPEndpoint != "" }

// Options are the tracing.Options of this table.
func (t Tracing) Options() tracing.Options {
	return tracing.Options{Endpoint: t.OTLPEndpoint, SampleRatio: t.SampleRatio, ParentBased: t.ParentBased,
		Insecure: t.Insecure, Headers: maps.Clone(t.Headers)}
}

// String describes the table with the headers' names only, so that a logged Config never
// leaks a credential.
func (t Tracing) String() string {
	names := slices.Sorted(maps.Keys(t.Headers))
	return fmt.Sprintf("{otlp_endpoint: %q sample_ratio: %v parent_based: %v insecure: %v headers: %v (values redacted) headers_env: %v}",
		t.OTLPEndpoint, t.SampleRatio, t.ParentBased, t.Insecure, names, t.HeadersEnv)
}

func defaultTracing() Tracing {
	return Tracing{SampleRatio: 0.01, ParentBased: true}
}

type fileTracing struct {
	OTLPEndpoint *string           `json:"otlp_endpoint"`
	SampleRatio  *float64          `json:"sample_ratio"`
	ParentBased  *bool             `json:"parent_based"`
	Insecure     *bool             `json:"insecure"`
	Headers      map[string]string `json:"headers"`
	HeadersEnv   map[string]string `json:"headers_env"`
}

func (ft *fileTracing) apply(t *Tracing, getenv func(string) string, ps *problems) {
	if ft == nil {
		return
	}
	base := path{key("tracing")}
	setIf(&t.OTLPEndpoint, ft.OTLPEndpoint)
	if t.OTLPEndpoint != "" && !validHostPort(t.OTLPEndpoint) {
		ps.add(base.with(key("otlp_endpoint")), "%q is not host:port (the collector's OTLP/gRPC port, e.g. \"otel-collector:4317\")", t.OTLPEndpoint)
	}
	if ft.SampleRatio != nil {
		// The schema bounds it too; this keeps Tracing's contract for any caller of apply.
		if r := *ft.SampleRatio; !(r >= 0 && r <= 1) {
			ps.add(base.with(key("sample_ratio")), "%v is not between 0 and 1", r)
		} else {
			t.SampleRatio = r
		}
	}
	setIf(&t.ParentBased, ft.ParentBased)
	setIf(&t.Insecure, ft.Insecure)

	if n := len(ft.Headers) + len(ft.HeadersEnv); n > tracing.MaxHeaders {
		ps.add(base.with(key("headers")), "%d headers with headers_env's, at most %d", n, tracing.MaxHeaders)
		return
	}
	headers := make(map[string]string, len(ft.Headers)+len(ft.HeadersEnv)) // bounded by MaxHeaders
	from := make(map[string]path, len(ft.Headers)+len(ft.HeadersEnv))      // lowercase name -> where it was given; as bounded
	add := func(at path, name, value string) {
		low := strings.ToLower(name)
		if prev, dup := from[low]; dup {
			ps.add(at, "header %s is given twice (also at %s)", name, prev)
			return
		}
		from[low] = at
		headers[low] = value
	}
	// Sorted: problems and their "also at" name the same key from run to run.
	for _, name := range slices.Sorted(maps.Keys(ft.Headers)) {
		at := base.with(key("headers"), key(name))
		if err := tracing.CheckHeaderName(name); err != nil {
			ps.add(at, "%v", err)
			continue
		}
		if err := tracing.CheckHeaderValue(ft.Headers[name]); err != nil {
			ps.add(at, "%v", err) // never quotes the value
			continue
		}
		add(at, name, ft.Headers[name])
	}
	var env map[string]string
	for _, name := range slices.Sorted(maps.Keys(ft.HeadersEnv)) {
		at := base.with(key("headers_env"), key(name))
		if err := tracing.CheckHeaderName(name); err != nil {
			ps.add(at, "%v", err)
			continue
		}
		variable := ft.HeadersEnv[name]
		v := getenv(variable)
		switch {
		case variable == "":
			ps.add(at, "must name an environment variable")
			continue
		case v == "":
			ps.add(at, "environment variable %s is not set or is empty", variable)
			continue
		}
		if err := tracing.CheckHeaderValue(v); err != nil {
			ps.add(at, "environment variable %s: %v", variable, err) // the variable, never its value
			continue
		}
		add(at, name, v)
		if env == nil {
			env = make(map[string]string, len(ft.HeadersEnv)) // bounded by MaxHeaders
		}
		env[strings.ToLower(name)] = variable
	}
	if len(headers) > 0 {
		t.Headers = headers
	}
	t.HeadersEnv = env
}
