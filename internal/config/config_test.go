package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/contracts"
)

func env(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

func TestParseEmptyIsDefault(t *testing.T) {
	for _, src := range []string{"", "\n\n", "# nothing here\n", "[gateway]\n[auth]\n", "[gateway]\nroutes = []\n[auth]\nkeys = []\n"} {
		cfg, err := Parse([]byte(src), env(nil))
		if err != nil {
			t.Fatalf("Parse(%q): %v", src, err)
		}
		if diff := cmp.Diff(Default(), cfg); diff != "" {
			t.Errorf("Parse(%q) differs from Default() (-want +got):\n%s", src, diff)
		}
	}
}

// specExample is the example of SPEC B3, with one more key given by
// environment variable.
const specExample = `
[gateway]
http_listen = "127.0.0.1:8080"
registry_listen = "127.0.0.1:9090"          # gRPC: WorkerRegistry, reflection, health
route_policy = "least_outstanding"          # least_outstanding | weighted | affinity
affinity_load_factor = 1.25                 # c in R3.4
heartbeat_interval = "2s"                   # T
heartbeat_miss_limit = 3                    # k
max_attempts = 3                            # workers tried before 503 no_capacity

[[gateway.routes]]
model = "smol"                              # public id
aliases = ["small"]
backends = [{ model = "smol-v3", weight = 0.9 }, { model = "smol-v4", weight = 0.1 }]
targets = ["unified"]                       # or ["disaggregated"]

[[gateway.routes]]
model = "auto"
cascade = [{ model = "smol", accept_if = "mean_logprob > -1.2" }, { model = "big" }]

[[gateway.routes]]
model = "big-split"
backends = [{ model = "big" }]
targets = ["disaggregated"]

[[auth.keys]]
key = "sk-…"                                # or key_env = "TLGW_KEY_OPS"
scopes = ["inference", "admin", "debug"]

[[auth.keys]]
key_env = "TLGW_KEY_OPS"
scopes = ["admin"]

[admission]                                  # R10; absent = dispatch at once, no queueing
`

func TestParseSpecExample(t *testing.T) {
	cfg, err := Parse([]byte(specExample), env(map[string]string{"TLGW_KEY_OPS": "sk-ops"}))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := Default()
	want.Gateway.Routes = []Route{
		{
			Model:    "smol",
			Aliases:  []string{"small"},
			Backends: []Backend{{Model: "smol-v3", Weight: 0.9}, {Model: "smol-v4", Weight: 0.1}},
			Targets:  []string{"unified"},
		},
		{
			Model:   "auto",
			Cascade: []CascadeStep{{Model: "smol", AcceptIf: "mean_logprob > -1.2"}, {Model: "big"}},
			Targets: []string{"unified"},
		},
		{
			Model:    "big-split",
			Backends: []Backend{{Model: "big", Weight: 1}},
			Targets:  []string{"disaggregated"},
		},
	}
	want.Auth.Keys = []Key{
		{Key: "sk-…", Name: "key-0", Scopes: []string{"inference", "admin", "debug"}},
		{Key: "sk-ops", KeyEnv: "TLGW_KEY_OPS", Name: "key-1", Scopes: []string{"admin"}},
	}
	want.Admission.Enabled = true
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Fatalf("Parse (-want +got):\n%s", diff)
	}

	// The routes survive the admin API's JSON form unchanged.
	js, err := json.Marshal(cfg.Gateway.Routes)
	if err != nil {
		t.Fatal(err)
	}
	var back []Route
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if err := ValidateRoutes(back); err != nil {
		t.Fatalf("ValidateRoutes of the round-tripped table: %v", err)
	}
	if diff := cmp.Diff(cfg.Gateway.Routes, NormalizeRoutes(back)); diff != "" {
		t.Fatalf("JSON round trip (-want +got):\n%s", diff)
	}
}

func TestParseAllGatewayFields(t *testing.T) {
	src := `
[gateway]
http_listen = "0.0.0.0:80"
registry_listen = "[::1]:7000"
route_policy = "affinity"
affinity_load_factor = 2
heartbeat_interval = "500ms"
heartbeat_miss_limit = 5
max_attempts = 1
max_body_bytes = 1024
shutdown_grace = "1m30s"
prefix_warmup_min_bytes = 4096
allow_unauthenticated = true
max_in_flight = 7
max_buffered_bytes = 2048
idle_timeout = "5s"
body_read_timeout = "6s"
client_write_timeout = "7s"
stream_first_byte_timeout = "1s"
request_timeout = "2m"
stream_idle_timeout = "3s"
control_timeout = "4s"
retry_budget_percent = 12.5
tokenizer = "engine"
tokenizer_endpoint = "tokenize"
tokenizer_timeout = "20ms"

[gateway.kv_events]
listen = "127.0.0.1:5557"
connect = false
max_blocks_per_worker = 100
replay = false

[gateway.outlier]
consecutive_failures = 2
base_ejection = "10s"
max_ejection = "40s"
max_ejected_percent = 34

[[gateway.engine_pools]]
name = "pool"
model = "m"
dns = "engines.ns.svc:8000"
metrics = "sglang"
scrape_interval = "1s"
refresh = "5s"
role = "decode"
kv_total_blocks = 10
endpoints = ["chat"]
kv_events_endpoint = "tcp://{ip}:5557"
bootstrap_port = 9001
`
	cfg, err := Parse([]byte(src), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := Gateway{
		HTTPListen:           "0.0.0.0:80",
		RegistryListen:       "[::1]:7000",
		RoutePolicy:          PolicyAffinity,
		AffinityLoadFactor:   2,
		HeartbeatInterval:    500 * time.Millisecond,
		HeartbeatMissLimit:   5,
		MaxAttempts:          1,
		MaxBodyBytes:         1024,
		ShutdownGrace:        90 * time.Second,
		PrefixWarmupMinBytes: 4096,
		// R13.3
		AllowUnauthenticated: true,
		MaxInFlight:          7,
		MaxBufferedBytes:     2048,
		IdleTimeout:          5 * time.Second,
		BodyReadTimeout:      6 * time.Second,
		ClientWriteTimeout:   7 * time.Second,
		// R14.1, R14.3
		StreamFirstByteTimeout: time.Second,
		RequestTimeout:         2 * time.Minute,
		StreamIdleTimeout:      3 * time.Second,
		ControlTimeout:         4 * time.Second,
		RetryBudgetPercent:     12.5,
		// R14.2
		Outlier: Outlier{ConsecutiveFailures: 2, BaseEjection: 10 * time.Second, MaxEjection: 40 * time.Second, MaxEjectedPercent: 34},
		// R22
		KVEvents:  KVEvents{Listen: "127.0.0.1:5557", MaxBlocksPerWorker: 100},
		Tokenizer: TokenizerEngine, TokenizerEndpoint: TokenizerTokenize, TokenizerTimeout: 20 * time.Millisecond,
		// R23
		EnginePools: []EnginePool{{Name: "pool", Model: "m", DNS: "engines.ns.svc:8000", Metrics: "sglang",
			ScrapeInterval: Duration(time.Second), Refresh: Duration(5 * time.Second), Role: "decode", KVTotalBlocks: 10,
			Endpoints: []string{"chat"}, KVEventsEndpoint: "tcp://{ip}:5557", BootstrapPort: 9001}},
	}
	if diff := cmp.Diff(want, cfg.Gateway); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestParseErrors(t *testing.T) {
	okKey := "\n[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\"]\n"
	tests := []struct {
		name string
		src  string
		env  map[string]string
		path string // the key the error must name
		msg  string // a fragment of that problem's message
	}{
		{"unknown top-level key", "bogus = 1\n", nil, "bogus", "unknown key"},
		{"unknown top-level table", "[metrics]\nport = 1\n", nil, "metrics", "unknown key"},
		{"unknown gateway key", "[gateway]\nbogus = true\n", nil, "gateway.bogus", "unknown key"},
		{"open gateway off loopback", "[gateway]\nhttp_listen = \"0.0.0.0:8080\"\n", nil, "gateway.allow_unauthenticated", `gateway.http_listen "0.0.0.0:8080" is not a loopback address`},
		{"open gateway on every interface", "[gateway]\nhttp_listen = \":8080\"\n", nil, "gateway.allow_unauthenticated", "no [[auth.keys]]"},
		{"zero max_in_flight", "[gateway]\nmax_in_flight = 0\n", nil, "gateway.max_in_flight", "must be >= 1"},
		{"zero max_buffered_bytes", "[gateway]\nmax_buffered_bytes = 0\n", nil, "gateway.max_buffered_bytes", "must be >= 1"},
		{"max_buffered_bytes a string", "[gateway]\nmax_buffered_bytes = \"1GiB\"\n", nil, "gateway.max_buffered_bytes", "must be an integer, not a string"},
		{"negative key max_in_flight", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\"]\nmax_in_flight = -1\n", nil, "auth.keys[0].max_in_flight", "must be >= 0"},
		{"fractional key max_in_flight", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\"]\nmax_in_flight = 1.5\n", nil, "auth.keys[0].max_in_flight", "must be an integer"},
		{"negative key tpm", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\"]\ntpm = -5\n", nil, "auth.keys[0].tpm", "must be >= 0"},
		{"negative key rpm", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\"]\nrpm = -5\n", nil, "auth.keys[0].rpm", "must be >= 0"},
		{"bad idle_timeout", "[gateway]\nidle_timeout = \"soon\"\n", nil, "gateway.idle_timeout", "is not a duration"},
		{"zero body_read_timeout", "[gateway]\nbody_read_timeout = \"0s\"\n", nil, "gateway.body_read_timeout", "must be > 0"},
		{"negative client_write_timeout", "[gateway]\nclient_write_timeout = \"-1s\"\n", nil, "gateway.client_write_timeout", "is not a duration"},
		{"zero stream_first_byte_timeout", "[gateway]\nstream_first_byte_timeout = \"0s\"\n", nil, "gateway.stream_first_byte_timeout", "must be > 0"},
		{"bad request_timeout", "[gateway]\nrequest_timeout = \"later\"\n", nil, "gateway.request_timeout", "is not a duration"},
		{"negative stream_idle_timeout", "[gateway]\nstream_idle_timeout = \"-5s\"\n", nil, "gateway.stream_idle_timeout", "is not a duration"},
		{"zero control_timeout", "[gateway]\ncontrol_timeout = \"0s\"\n", nil, "gateway.control_timeout", "must be > 0"},
		{"retry_budget_percent over 100", "[gateway]\nretry_budget_percent = 150\n", nil, "gateway.retry_budget_percent", ""},
		{"negative retry_budget_percent", "[gateway]\nretry_budget_percent = -1\n", nil, "gateway.retry_budget_percent", ""},
		{"negative consecutive_failures", "[gateway.outlier]\nconsecutive_failures = -1\n", nil, "gateway.outlier.consecutive_failures", ""},
		{"zero base_ejection", "[gateway.outlier]\nbase_ejection = \"0s\"\n", nil, "gateway.outlier.base_ejection", ""},
		{"max_ejection under base", "[gateway.outlier]\nbase_ejection = \"1m\"\nmax_ejection = \"30s\"\n", nil, "gateway.outlier.max_ejection", "at least base_ejection"},
		{"max_ejected_percent over 100", "[gateway.outlier]\nmax_ejected_percent = 101\n", nil, "gateway.outlier.max_ejected_percent", ""},
		{"unknown outlier key", "[gateway.outlier]\nintervall = \"1s\"\n", nil, "gateway.outlier.intervall", "unknown key"},
		{"allow_unauthenticated type", "[gateway]\nallow_unauthenticated = \"yes\"\n", nil, "gateway.allow_unauthenticated", "must be a boolean"},
		{"quoted unknown key", "[gateway]\n\"a.b\" = 1\n", nil, `gateway."a.b"`, "unknown key"},
		{"unknown route key", "[[gateway.routes]]\nmodel = \"m\"\nweight = 1\n", nil, "gateway.routes[0].weight", "unknown key"},
		{"unknown backend key", "[[gateway.routes]]\nmodel = \"m\"\nbackends = [{model = \"a\", wieght = 1}]\n", nil, "gateway.routes[0].backends[0].wieght", "unknown key"},
		{"unknown auth key", "[auth]\nkey = \"x\"\n", nil, "auth.key", "unknown key"},
		{"bad policy", "[gateway]\nroute_policy = \"random\"\n", nil, "gateway.route_policy", `"random" is not one of "least_outstanding", "weighted", "affinity", "prefix_aware"`},
		{"wrong type", "[gateway]\nmax_attempts = \"3\"\n", nil, "gateway.max_attempts", "must be an integer, not a string"},
		{"fractional integer", "[gateway]\nmax_attempts = 2.5\n", nil, "gateway.max_attempts", "must be an integer"},
		{"table for string", "[gateway.http_listen]\nx = 1\n", nil, "gateway.http_listen", "must be a string, not a table"},
		{"empty listen address", "[gateway]\nhttp_listen = \"\"\n", nil, "gateway.http_listen", "must not be empty"},
		{"bad duration", "[gateway]\nheartbeat_interval = \"2 parsecs\"\n", nil, "gateway.heartbeat_interval", `"2 parsecs" is not a duration`},
		{"duration without unit", "[gateway]\nshutdown_grace = \"30\"\n", nil, "gateway.shutdown_grace", `"30" is not a duration`},
		{"number for duration", "[gateway]\nshutdown_grace = 30\n", nil, "gateway.shutdown_grace", "30 is not a duration"},
		{"negative duration", "[gateway]\nshutdown_grace = \"-1s\"\n", nil, "gateway.shutdown_grace", `"-1s" is not a duration`},
		{"zero duration", "[gateway]\nheartbeat_interval = \"0s\"\n", nil, "gateway.heartbeat_interval", "must be > 0"},
		{"overflowing duration", "[gateway]\nshutdown_grace = \"9999999999999h\"\n", nil, "gateway.shutdown_grace", "is not a duration"},
		{"heartbeat below a millisecond", "[gateway]\nheartbeat_interval = \"500us\"\n", nil, "gateway.heartbeat_interval", "at least 1ms"},
		{"k·T overflows", "[gateway]\nheartbeat_interval = \"1000h\"\nheartbeat_miss_limit = 9000000000000\n", nil, "gateway.heartbeat_miss_limit", "too long"},
		{"date for duration", "[gateway]\nheartbeat_interval = 1979-05-27\n", nil, "gateway.heartbeat_interval", "date or time"},
		{"zero miss limit", "[gateway]\nheartbeat_miss_limit = 0\n", nil, "gateway.heartbeat_miss_limit", "must be >= 1"},
		{"zero attempts", "[gateway]\nmax_attempts = 0\n", nil, "gateway.max_attempts", "must be >= 1"},
		{"negative warm-up bytes", "[gateway]\nprefix_warmup_min_bytes = -1\n", nil, "gateway.prefix_warmup_min_bytes", "must be >= 0"},
		{"zero body limit", "[gateway]\nmax_body_bytes = 0\n", nil, "gateway.max_body_bytes", "must be >= 1"},
		{"load factor below one", "[gateway]\naffinity_load_factor = 0.5\n", nil, "gateway.affinity_load_factor", "must be >= 1"},
		{"load factor nan", "[gateway]\naffinity_load_factor = nan\n", nil, "gateway.affinity_load_factor", "finite"},
		{"integer out of range", "[gateway]\nmax_body_bytes = 1e30\n", nil, "gateway.max_body_bytes", "out of range"},
		{"route without model", "[[gateway.routes]]\naliases = [\"x\"]\n", nil, "gateway.routes[0].model", "required"},
		{"route with empty model", "[[gateway.routes]]\nmodel = \"\"\n", nil, "gateway.routes[0].model", "must not be empty"},
		{"negative weight", "[[gateway.routes]]\nmodel = \"m\"\nbackends = [{model = \"a\"}, {model = \"b\", weight = -0.5}]\n", nil, "gateway.routes[0].backends[1].weight", "must be >= 0"},
		{"all weights zero", "[[gateway.routes]]\nmodel = \"m\"\nbackends = [{model = \"a\", weight = 0}]\n", nil, "gateway.routes[0].backends", "positive sum"},
		{"backend without model", "[[gateway.routes]]\nmodel = \"m\"\nbackends = [{weight = 1.0}]\n", nil, "gateway.routes[0].backends[0].model", "required"},
		{"empty backends", "[[gateway.routes]]\nmodel = \"m\"\nbackends = []\n", nil, "gateway.routes[0].backends", "must not be empty"},
		{"empty cascade", "[[gateway.routes]]\nmodel = \"m\"\ncascade = []\n", nil, "gateway.routes[0].cascade", "must not be empty"},
		{"bad accept_if", "[[gateway.routes]]\nmodel = \"m\"\ncascade = [{model = \"a\", accept_if = \"mean_logprob < -1\"}, {model = \"b\"}]\n", nil, "gateway.routes[0].cascade[0].accept_if", `"mean_logprob < -1": want > or >=`},
		{"accept_if missing", "[[gateway.routes]]\nmodel = \"m\"\ncascade = [{model = \"a\"}, {model = \"b\"}]\n", nil, "gateway.routes[0].cascade[0].accept_if", "required"},
		{"accept_if on last step", "[[gateway.routes]]\nmodel = \"m\"\ncascade = [{model = \"a\", accept_if = \"min_logprob >= -2\"}]\n", nil, "gateway.routes[0].cascade[0].accept_if", "last step"},
		{"duplicate alias", "[[gateway.routes]]\nmodel = \"m\"\naliases = [\"x\"]\n[[gateway.routes]]\nmodel = \"n\"\naliases = [\"x\"]\n", nil, "gateway.routes[1].aliases[0]", `"x" is already an alias of gateway.routes[0]`},
		{"alias shadows a model", "[[gateway.routes]]\nmodel = \"m\"\n[[gateway.routes]]\nmodel = \"n\"\naliases = [\"m\"]\n", nil, "gateway.routes[1].aliases[0]", `"m" is already the model of gateway.routes[0]`},
		{"duplicate route", "[[gateway.routes]]\nmodel = \"m\"\n[[gateway.routes]]\nmodel = \"m\"\n", nil, "gateway.routes[1].model", "already"},
		{"both backends and cascade", "[[gateway.routes]]\nmodel = \"m\"\nbackends = [{model = \"a\"}]\ncascade = [{model = \"b\"}]\n", nil, "gateway.routes[0]", "mutually exclusive"},
		{"two targets", "[[gateway.routes]]\nmodel = \"m\"\ntargets = [\"unified\", \"disaggregated\"]\n", nil, "gateway.routes[0].targets", "exactly one"},
		{"no targets", "[[gateway.routes]]\nmodel = \"m\"\ntargets = []\n", nil, "gateway.routes[0].targets", "exactly one"},
		{"bad target", "[[gateway.routes]]\nmodel = \"m\"\ntargets = [\"split\"]\n", nil, "gateway.routes[0].targets[0]", `"split" is not one of`},
		{"key and key_env both", "[[auth.keys]]\nkey = \"sk-a\"\nkey_env = \"K\"\nscopes = [\"admin\"]\n", map[string]string{"K": "sk-b"}, "auth.keys[0]", "mutually exclusive"},
		{"neither key nor key_env", "[[auth.keys]]\nscopes = [\"admin\"]\n", nil, "auth.keys[0]", "one of key or key_env is required"},
		{"unset key_env", okKey + "[[auth.keys]]\nkey_env = \"TLGW_KEY_OPS\"\nscopes = [\"admin\"]\n", nil, "auth.keys[1].key_env", "TLGW_KEY_OPS is not set"},
		{"empty key_env value", "[[auth.keys]]\nkey_env = \"K\"\nscopes = [\"admin\"]\n", map[string]string{"K": ""}, "auth.keys[0].key_env", "K is not set or is empty"},
		{"key_env with a newline", "[[auth.keys]]\nkey_env = \"K\"\nscopes = [\"admin\"]\n", map[string]string{"K": "sk-a\n"}, "auth.keys[0].key_env", "whitespace"},
		{"bad key_env name", "[[auth.keys]]\nkey_env = \"$HOME\"\nscopes = [\"admin\"]\n", nil, "auth.keys[0].key_env", `"$HOME" is not an environment variable name`},
		{"empty key", "[[auth.keys]]\nkey = \"\"\nscopes = [\"admin\"]\n", nil, "auth.keys[0].key", "must not be empty"},
		{"key with a space", "[[auth.keys]]\nkey = \"sk a\"\nscopes = [\"admin\"]\n", nil, "auth.keys[0].key", "whitespace"},
		{"duplicate key", okKey + okKey, nil, "auth.keys[1].key", "same key as auth.keys[0]"},
		{"duplicate key via env", okKey + "[[auth.keys]]\nkey_env = \"K\"\nscopes = [\"admin\"]\n", map[string]string{"K": "sk-a"}, "auth.keys[1].key_env", "same key as auth.keys[0]"},
		{"bad scope", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\", \"root\"]\n", nil, "auth.keys[0].scopes[1]", `"root" is not one of "inference", "admin", "debug"`},
		{"no scopes", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = []\n", nil, "auth.keys[0].scopes", "must not be empty"},
		{"scopes missing", "[[auth.keys]]\nkey = \"sk-a\"\n", nil, "auth.keys[0].scopes", "required"},
		{"prefix_aware accepted, bad policy still named", "[gateway]\nroute_policy = \"prefix\"\n", nil, "gateway.route_policy", `"prefix_aware"`},
		{"unknown admission key", "[admission]\nqueue_limit = 5\n", nil, "admission.queue_limit", "unknown key"},
		{"admission not a table", "admission = 1\n", nil, "admission", "must be a table, not a number"},
		{"negative busy threshold", "[admission]\nbusy_threshold = -1\n", nil, "admission.busy_threshold", "must be >= 0"},
		{"busy threshold a string", "[admission]\nbusy_threshold = \"4\"\n", nil, "admission.busy_threshold", "must be an integer, not a string"},
		{"empty default class", "[admission]\ndefault_class = \"\"\n", nil, "admission.default_class", `"" does not match`},
		{"default class not configured", "[admission]\ndefault_class = \"gold\"\n", nil, "admission.default_class", `"gold" is not one of the classes "default"`},
		{"implicit default class missing", "[[admission.classes]]\nname = \"batch\"\n", nil, "admission.default_class", `must name one of the classes "batch" when none is called "default"`},
		{"bad recheck", "[admission]\nrecheck = \"soon\"\n", nil, "admission.recheck", `"soon" is not a duration`},
		{"zero recheck", "[admission]\nrecheck = \"0s\"\n", nil, "admission.recheck", "must be > 0"},
		{"classes not an array", "[admission]\nclasses = \"default\"\n", nil, "admission.classes", "must be an array, not a string"},
		{"unknown class key", "[[admission.classes]]\nname = \"default\"\nweight = 1\n", nil, "admission.classes[0].weight", "unknown key"},
		{"class without name", "[[admission.classes]]\nquantum = 2\n", nil, "admission.classes[0].name", "required key is missing"},
		{"bad class name", "[[admission.classes]]\nname = \"gold class\"\n", nil, "admission.classes[0].name", `"gold class" does not match ^[A-Za-z0-9_.-]+$`},
		{"empty class name", "[[admission.classes]]\nname = \"\"\n", nil, "admission.classes[0].name", "does not match"},
		{"duplicate class name", "[[admission.classes]]\nname = \"default\"\n[[admission.classes]]\nname = \"default\"\n", nil, "admission.classes[1].name", `"default" is already the name of admission.classes[0]`},
		{"zero quantum", "[[admission.classes]]\nname = \"default\"\nquantum = 0\n", nil, "admission.classes[0].quantum", "must be >= 1"},
		{"fractional quantum", "[[admission.classes]]\nname = \"default\"\nquantum = 1.5\n", nil, "admission.classes[0].quantum", "must be an integer"},
		{"negative queue limit", "[[admission.classes]]\nname = \"default\"\nqueue_limit = -1\n", nil, "admission.classes[0].queue_limit", "must be >= 0"},
		{"bad max_wait", "[[admission.classes]]\nname = \"default\"\nmax_wait = \"30\"\n", nil, "admission.classes[0].max_wait", `"30" is not a duration`},
		{"zero max_wait", "[[admission.classes]]\nname = \"default\"\nmax_wait = \"0ms\"\n", nil, "admission.classes[0].max_wait", "must be > 0"},
		{"allow_header not a bool", "[[admission.classes]]\nname = \"default\"\nallow_header = \"yes\"\n", nil, "admission.classes[0].allow_header", "must be a boolean, not a string"},
		{"classifier without type", "[admission]\nclassifier = { workers = 2 }\n", nil, "admission.classifier.type", "required key is missing"},
		{"bad classifier type", "[admission]\nclassifier = { type = \"fifo\" }\n", nil, "admission.classifier.type", `"fifo" is not one of "default", "cold_pool", "session_serial"`},
		{"unknown classifier key", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, pool = 2 }\n", nil, "admission.classifier.pool", "unknown key"},
		{"cold pool without threshold", "[admission]\nclassifier = { type = \"cold_pool\" }\n", nil, "admission.classifier.cold_threshold_tokens", `required with type = "cold_pool"`},
		{"zero cold threshold", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 0 }\n", nil, "admission.classifier.cold_threshold_tokens", "must be >= 1"},
		{"negative pool workers", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, workers = -1 }\n", nil, "admission.classifier.workers", "must be >= 0"},
		{"bad soft drain timeout", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, soft_drain_timeout = \"-1s\" }\n", nil, "admission.classifier.soft_drain_timeout", `"-1s" is not a duration`},
		{"steer_warm not a bool", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, steer_warm = 1 }\n", nil, "admission.classifier.steer_warm", "must be a boolean, not a number"},
		{"negative cold queue limit", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, cold_queue_limit = -3 }\n", nil, "admission.classifier.cold_queue_limit", "must be >= 0"},
		{"zero cold max wait", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, cold_max_wait = \"0s\" }\n", nil, "admission.classifier.cold_max_wait", "must be > 0"},
		{"cold pool option on another type", "[admission]\nclassifier = { type = \"session_serial\", workers = 2 }\n", nil, "admission.classifier.workers", `only valid with type = "cold_pool"`},
		{"cold threshold on the default type", "[admission]\nclassifier = { type = \"default\", cold_threshold_tokens = 8 }\n", nil, "admission.classifier.cold_threshold_tokens", `only valid with type = "cold_pool"`},
		{"unknown prefix index key", "[admission]\nprefix_index = { blocks = 10 }\n", nil, "admission.prefix_index.blocks", "unknown key"},
		{"zero prefix blocks", "[admission]\nprefix_index = { blocks_per_worker = 0 }\n", nil, "admission.prefix_index.blocks_per_worker", "must be >= 1"},
		{"huge prefix blocks", "[admission]\nprefix_index = { blocks_per_worker = 2000000 }\n", nil, "admission.prefix_index.blocks_per_worker", "must be <= 1048576"},
		{"key class without admission", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\"]\nclass = \"default\"\n", nil, "auth.keys[0].class", "no [admission] table"},
		{"key class not configured", okKey + "[[auth.keys]]\nkey = \"sk-b\"\nscopes = [\"inference\"]\nclass = \"gold\"\n[admission]\n", nil, "auth.keys[1].class", `"gold" is not one of the classes "default"`},
		{"bad key class", "[[auth.keys]]\nkey = \"sk-a\"\nscopes = [\"inference\"]\nclass = \"a/b\"\n[admission]\n", nil, "auth.keys[0].class", `"a/b" does not match`},
		{"garbage TOML", "[gateway\nhttp_listen = \n", nil, "", "invalid TOML: line 1"},
		{"not TOML at all", "{\"gateway\": {}}", nil, "", "invalid TOML"},
		{"duplicate TOML key", "[gateway]\nmax_attempts = 1\nmax_attempts = 2\n", nil, "", "invalid TOML: line 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.src), env(tc.env))
			if err == nil {
				t.Fatalf("Parse succeeded (%+v); want an error naming %q", cfg, tc.path)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config alongside its error")
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T) is not a *config.Error", err, err)
			}
			found := false
			for _, p := range ce.Problems {
				if p.Path == tc.path && strings.Contains(p.Message, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Fatalf("no problem at %q containing %q in:\n%v", tc.path, tc.msg, err)
			}
			line := "config: " + tc.path + ": "
			if tc.path == "" {
				line = "config: "
			}
			if !strings.Contains(err.Error(), line) {
				t.Errorf("message %q lacks %q", err.Error(), line)
			}
			if strings.Contains(err.Error(), "sk-a") || strings.Contains(err.Error(), "sk-b") {
				t.Errorf("message %q leaks a secret", err.Error())
			}
		})
	}
}

func TestParseReportsEveryProblemOnePerLine(t *testing.T) {
	src := "[gateway]\nbogus = 1\nmax_attempts = 0\nroute_policy = \"x\"\n[admission]\nbogus = 2\n"
	_, err := Parse([]byte(src), env(nil))
	if err == nil {
		t.Fatal("want an error")
	}
	want := strings.Join([]string{
		"config: admission.bogus: unknown key",
		"config: gateway.bogus: unknown key",
		"config: gateway.max_attempts: must be >= 1",
		`config: gateway.route_policy: "x" is not one of "least_outstanding", "weighted", "affinity", "prefix_aware", "round_robin", "precise_prefix", "predicted_latency"`,
	}, "\n")
	if err.Error() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", err, want)
	}
}

func TestValidateRoutesJSON(t *testing.T) {
	tests := []struct {
		name string
		json string
		want []string // every problem, as printed; nil = valid
	}{
		{"valid table", `[
			{"model":"smol","aliases":["small"],"backends":[{"model":"smol-v3","weight":0.9},{"model":"smol-v4","weight":0.1}]},
			{"model":"auto","cascade":[{"model":"smol","accept_if":"min_logprob>=-2"},{"model":"big"}],"targets":["unified"]},
			{"model":"big","targets":["disaggregated"]}]`, nil},
		{"empty table", `[]`, nil},
		{"weight defaults to 1", `[{"model":"m","backends":[{"model":"a"}]}]`, nil},
		{"null cascade is absent", `[{"model":"m","cascade":null}]`, nil},
		{"empty cascade", `[{"model":"m"},{"model":"n"},{"model":"o","cascade":[]}]`,
			[]string{"routes[2].cascade: must not be empty"}},
		{"empty backends", `[{"model":"m","backends":[]}]`,
			[]string{"routes[0].backends: must not be empty"}},
		{"malformed accept_if", `[{"model":"m"},{"model":"n"},{"model":"o","cascade":[{"model":"a","accept_if":"mean_logprob > lots"},{"model":"b"}]}]`,
			[]string{`routes[2].cascade[0].accept_if: "mean_logprob > lots": want a finite number after mean_logprob >, got "lots"`}},
		{"negative weight", `[{"model":"m","backends":[{"model":"a","weight":-1},{"model":"b","weight":2}]}]`,
			[]string{"routes[0].backends[0].weight: must be >= 0"}},
		{"zero sum", `[{"model":"m","backends":[{"model":"a","weight":0},{"model":"b","weight":0}]}]`,
			[]string{"routes[0].backends: weights must have a positive sum"}},
		{"several problems", `[{"model":"","aliases":["x",""]},{"model":"x","backends":[{"model":""}],"cascade":[{"model":"a","accept_if":"min_logprob > 0"}],"targets":["both"]}]`,
			[]string{
				"routes[0].aliases[1]: must not be empty",
				"routes[0].model: must not be empty",
				"routes[1]: backends and cascade are mutually exclusive; give at most one",
				"routes[1].backends[0].model: must not be empty",
				"routes[1].cascade[0].accept_if: must not be set on the last step, whose answer is always kept",
				`routes[1].model: "x" is already an alias of routes[0]`,
				`routes[1].targets[0]: "both" is not one of "unified", "disaggregated"`,
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var routes []Route
			if err := json.Unmarshal([]byte(tc.json), &routes); err != nil {
				t.Fatal(err)
			}
			err := ValidateRoutes(routes)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("ValidateRoutes: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ValidateRoutes succeeded; want %q", tc.want)
			}
			if got := strings.Split(err.Error(), "\n"); !cmp.Equal(got, tc.want) {
				t.Fatalf("(-want +got):\n%s", cmp.Diff(tc.want, got))
			}
		})
	}
}

func TestValidateRoutesGoValues(t *testing.T) {
	err := ValidateRoutes([]Route{
		{Model: "m", Backends: []Backend{{Model: "a", Weight: 1}}, Targets: []string{}},
		{Model: "n", Backends: []Backend{{Model: "a"}}}, // weight 0 from Go: no default here
	})
	want := "routes[0].targets: must have exactly one item\nroutes[1].backends: weights must have a positive sum"
	if err == nil || err.Error() != want {
		t.Fatalf("ValidateRoutes = %v, want\n%s", err, want)
	}
}

func TestBackendJSON(t *testing.T) {
	var b Backend
	if err := json.Unmarshal([]byte(`{"model":"a","weight":0}`), &b); err != nil || b != (Backend{"a", 0}) {
		t.Fatalf("explicit zero weight: %+v, %v", b, err)
	}
	if err := json.Unmarshal([]byte(`{"model":"a"}`), &b); err != nil || b != (Backend{"a", 1}) {
		t.Fatalf("absent weight: %+v, %v", b, err)
	}
	if err := json.Unmarshal([]byte(`{"model":"a","wieght":2}`), &b); err == nil {
		t.Fatal("unknown field accepted")
	}
	if err := json.Unmarshal([]byte(`{"model":"a","weight":"2"}`), &b); err == nil {
		t.Fatal("string weight accepted")
	}
}

func TestNormalizeRoutes(t *testing.T) {
	if NormalizeRoutes(nil) != nil {
		t.Fatal("NormalizeRoutes(nil) != nil")
	}
	in := []Route{
		{Model: "m", Aliases: []string{"a"}, Backends: []Backend{{Model: "x", Weight: 0.25}}},
		{Model: "n", Targets: []string{}},
		{Model: "o", Targets: []string{TargetDisaggregated}},
	}
	out := NormalizeRoutes(in)
	want := []Route{
		{Model: "m", Aliases: []string{"a"}, Backends: []Backend{{Model: "x", Weight: 0.25}}, Targets: []string{"unified"}},
		{Model: "n", Targets: []string{"unified"}},
		{Model: "o", Targets: []string{"disaggregated"}},
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	// The copy is deep: changing it leaves the input alone.
	out[0].Aliases[0] = "changed"
	out[0].Backends[0].Weight = 9
	out[2].Targets[0] = "changed"
	if in[0].Aliases[0] != "a" || in[0].Backends[0].Weight != 0.25 || in[2].Targets[0] != TargetDisaggregated {
		t.Fatalf("NormalizeRoutes shares memory with its input: %+v", in)
	}
	if in[0].Targets != nil {
		t.Fatal("NormalizeRoutes modified its input")
	}
}

// TestSchemaDefaults keeps the defaults written in the schema and Default()
// in step.
func TestSchemaDefaults(t *testing.T) {
	var schema struct {
		Properties struct {
			Gateway struct {
				Properties map[string]struct {
					Default    any `json:"default"`
					Properties map[string]struct {
						Default any `json:"default"`
					} `json:"properties"`
				} `json:"properties"`
			} `json:"gateway"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	g := Default().Gateway
	want := map[string]any{
		"http_listen":                  g.HTTPListen,
		"registry_listen":              g.RegistryListen,
		"route_policy":                 g.RoutePolicy,
		"affinity_load_factor":         g.AffinityLoadFactor,
		"heartbeat_interval":           g.HeartbeatInterval.String(),
		"heartbeat_miss_limit":         float64(g.HeartbeatMissLimit),
		"max_attempts":                 float64(g.MaxAttempts),
		"max_body_bytes":               float64(g.MaxBodyBytes),
		"shutdown_grace":               g.ShutdownGrace.String(),
		"prefix_warmup_min_bytes":      float64(g.PrefixWarmupMinBytes),
		"allow_unauthenticated":        g.AllowUnauthenticated,
		"max_in_flight":                float64(g.MaxInFlight),
		"max_buffered_bytes":           float64(g.MaxBufferedBytes),
		"idle_timeout":                 g.IdleTimeout.String(),
		"body_read_timeout":            g.BodyReadTimeout.String(),
		"client_write_timeout":         g.ClientWriteTimeout.String(),
		"stream_first_byte_timeout":    g.StreamFirstByteTimeout.String(),
		"request_timeout":              g.RequestTimeout.String(),
		"stream_idle_timeout":          g.StreamIdleTimeout.String(),
		"control_timeout":              g.ControlTimeout.String(),
		"retry_budget_percent":         g.RetryBudgetPercent,
		"outlier.consecutive_failures": float64(g.Outlier.ConsecutiveFailures),
		"outlier.base_ejection":        g.Outlier.BaseEjection.String(),
		"outlier.max_ejection":         g.Outlier.MaxEjection.String(),
		"outlier.max_ejected_percent":  g.Outlier.MaxEjectedPercent,
		"routes":                       []any{},
		"static_workers":               []any{},
		"engine_pools":                 []any{},
		"lora_load_on_demand":          g.LoRALoadOnDemand,
		"lora_adapters":                []any{},
		// R22
		"kv_events.listen":                g.KVEvents.Listen,
		"kv_events.connect":               g.KVEvents.Connect,
		"kv_events.max_blocks_per_worker": float64(g.KVEvents.MaxBlocksPerWorker),
		"kv_events.replay":                g.KVEvents.Replay,
		"tokenizer":                       g.Tokenizer,
		"tokenizer_endpoint":              g.TokenizerEndpoint,
		"tokenizer_timeout":               g.TokenizerTimeout.String(),
	}
	got := make(map[string]any)
	put := func(name string, def any) {
		got[name] = def
		if s, ok := def.(string); ok {
			if d, err := time.ParseDuration(s); err == nil {
				got[name] = d.String() // "120s" in the schema is Default()'s 2m0s
			}
		}
	}
	for name, p := range schema.Properties.Gateway.Properties {
		if p.Properties != nil {
			for sub, sp := range p.Properties {
				put(name+"."+sub, sp.Default)
			}
			continue
		}
		put(name, p.Default)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("schema defaults differ from Default() (-Default +schema):\n%s", diff)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tlgw.toml")
	if err := os.WriteFile(file, []byte("[gateway]\nmax_attempts = 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.MaxAttempts != 5 {
		t.Fatalf("MaxAttempts = %d, want 5", cfg.Gateway.MaxAttempts)
	}
	if _, err := Load(filepath.Join(dir, "missing.toml")); err == nil || !strings.HasPrefix(err.Error(), "config: ") {
		t.Fatalf("Load of a missing file: %v", err)
	}
}

// TestParseKeyLimits (R13.5, R20): a key's rpm, tpm and max_in_flight are read as written, and
// each is 0 (no limit) when absent or written 0, so a key listed without limits is not
// limited; the smallest max_buffered_bytes, 1, is accepted.
func TestParseKeyLimits(t *testing.T) {
	cfg, err := Parse([]byte(`
[[auth.keys]]
key = "sk-a"
scopes = ["inference"]
rpm = 60
tpm = 100000
max_in_flight = 8

[[auth.keys]]
key = "sk-b"
scopes = ["inference"]

[[auth.keys]]
key = "sk-c"
scopes = ["inference"]
rpm = 0
tpm = 0
max_in_flight = 0

[gateway]
max_buffered_bytes = 1
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []Key{
		{Key: "sk-a", Name: "key-0", Scopes: []string{"inference"}, RPM: 60, TPM: 100000, MaxInFlight: 8},
		{Key: "sk-b", Name: "key-1", Scopes: []string{"inference"}},
		{Key: "sk-c", Name: "key-2", Scopes: []string{"inference"}},
	}
	if diff := cmp.Diff(want, cfg.Auth.Keys); diff != "" {
		t.Fatalf("keys (-want +got):\n%s", diff)
	}
	if cfg.Gateway.MaxBufferedBytes != 1 {
		t.Fatalf("max_buffered_bytes = 1 read as %d", cfg.Gateway.MaxBufferedBytes)
	}
}

func TestKeyStringRedacts(t *testing.T) {
	cfg, err := Parse([]byte("[[auth.keys]]\nkey = \"sk-secret\"\nscopes = [\"admin\"]\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{cfg.Auth.Keys[0].String(), sprintV(cfg), sprintV(*cfg)} {
		if strings.Contains(s, "sk-secret") {
			t.Fatalf("%q leaks the key", s)
		}
	}
	js, _ := json.Marshal(cfg)
	if strings.Contains(string(js), "sk-secret") {
		t.Fatalf("JSON %s leaks the key", js)
	}
}

func sprintV(v any) string { return fmt.Sprintf("%v %+v", v, v) }

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", specExample, "[admission]\n", "[gateway\n", "[gateway]\nheartbeat_interval = \"2 parsecs\"\n",
		"[[gateway.routes]]\nmodel = \"m\"\ncascade = [{model = \"a\", accept_if = \"mean_logprob > -1\"}, {model = \"b\"}]\n",
		"[[gateway.routes]]\nmodel = \"m\"\nbackends = [{model = \"a\", weight = -1}]\n",
		"[[auth.keys]]\nkey_env = \"K\"\nscopes = [\"admin\"]\n",
		"[gateway]\nheartbeat_interval = 1979-05-27T07:32:00Z\naffinity_load_factor = inf\n",
		"a.b.c = [[1, 2], {x = 3}]\n",
		admissionExample,
		"[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 1, soft_drain_timeout = \"0s\" }\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, env(map[string]string{"K": "sk-k"}))
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || len(ce.Problems) == 0 {
				t.Fatalf("error %v (%T) is not a *config.Error with problems", err, err)
			}
			for _, p := range ce.Problems {
				if p.Message == "" || strings.ContainsAny(p.String(), "\r\n") {
					t.Fatalf("problem %q is not one non-empty line", p.String())
				}
			}
			return
		}
		if err := ValidateRoutes(cfg.Gateway.Routes); err != nil {
			t.Fatalf("Parse accepted routes that ValidateRoutes rejects: %v", err)
		}
		if cfg.Gateway.HeartbeatInterval <= 0 || cfg.Gateway.ShutdownGrace <= 0 || cfg.Gateway.MaxAttempts < 1 {
			t.Fatalf("Parse accepted out-of-range values: %+v", cfg.Gateway)
		}
		a := cfg.Admission
		if len(a.Classes) == 0 || a.ClassIndex(a.DefaultClass) < 0 || a.Recheck <= 0 || a.PrefixIndex.BlocksPerWorker < 1 {
			t.Fatalf("Parse accepted an inconsistent admission table: %+v", a)
		}
		if _, err := admission.NewPolicy(a.Classifier.Type, a.Classifier.Options, admission.Env{}); err != nil {
			t.Fatalf("Parse accepted a classifier its own parser rejects: %v", err)
		}
		for _, c := range a.Classes {
			if c.Quantum < 1 || c.QueueLimit < 0 || c.MaxWait <= 0 || c.Priority < 0 || c.Priority > MaxClassPriority ||
				nameOf(admission.Orders, c.Order) == "" || nameOf(admission.Costs, c.Cost) == "" {
				t.Fatalf("Parse accepted an out-of-range class: %+v", c)
			}
		}
		for _, k := range cfg.Auth.Keys {
			if k.Class != "" && (!a.Enabled || a.ClassIndex(k.Class) < 0) {
				t.Fatalf("Parse accepted key class %q", k.Class)
			}
		}
	})
}

// TestLoRAAdapterConfig (R21): [[gateway.lora_adapters]] and lora_load_on_demand are read, and
// every bad entry is refused naming its key.
func TestLoRAAdapterConfig(t *testing.T) {
	cfg, err := Parse([]byte("[gateway]\nlora_load_on_demand = true\n[[gateway.lora_adapters]]\nname = \"sql\"\npath = \"/adapters/sql\"\nbase_model = \"llama\"\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Gateway.LoRALoadOnDemand || len(cfg.Gateway.LoRAAdapters) != 1 ||
		cfg.Gateway.LoRAAdapters[0] != (LoRAAdapter{Name: "sql", Path: "/adapters/sql", BaseModel: "llama"}) {
		t.Fatalf("got %+v", cfg.Gateway)
	}
	for _, c := range []struct{ toml, key string }{
		{"name = \"a b\"\npath = \"p\"\nbase_model = \"m\"", "gateway.lora_adapters[0].name"},
		{"name = \"a\"\npath = \"\"\nbase_model = \"m\"", "gateway.lora_adapters[0].path"},
		{"name = \"m\"\npath = \"p\"\nbase_model = \"m\"", "gateway.lora_adapters[0].name"},
		{"name = \"a\"\npath = \"p\"", "base_model"},
	} {
		_, err := Parse([]byte("[[gateway.lora_adapters]]\n"+c.toml+"\n"), nil)
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Fatalf("%q: %v, want an error naming %s", c.toml, err, c.key)
		}
	}
	if _, err := Parse([]byte("[[gateway.lora_adapters]]\nname = \"a\"\npath = \"p\"\nbase_model = \"m\"\n[[gateway.lora_adapters]]\nname = \"a\"\npath = \"q\"\nbase_model = \"m\"\n"), nil); err == nil || !strings.Contains(err.Error(), "repeats") {
		t.Fatalf("a repeated adapter: %v", err)
	}
}
