package coldpool

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/contracts"
)

// TestParseConfig: the keys of [admission] classifier as TOML decodes them (integers are
// int64), with their defaults when absent.
func TestParseConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		raw  map[string]any
		want Config
	}{
		{
			// The threshold alone takes the defaults.
			"threshold only", map[string]any{"cold_threshold_tokens": int64(4096)},
			Config{ColdThresholdTokens: 4096, Workers: 1, SteerWarm: true, QueueLimit: 256, MaxWait: 60 * time.Second},
		},
		{
			"every key", map[string]any{"cold_threshold_tokens": int64(2048), "workers": int64(2), "soft_drain_timeout": "1.5s",
				"steer_warm": false, "cold_queue_limit": int64(0), "cold_max_wait": "2m"},
			Config{ColdThresholdTokens: 2048, Workers: 2, SoftDrainTimeout: 1500 * time.Millisecond, SteerWarm: false,
				QueueLimit: 0, MaxWait: 2 * time.Minute},
		},
		{
			// soft_drain_timeout may be zero, and workers (the baseline); the other durations may not.
			"zeros", map[string]any{"cold_threshold_tokens": int64(1), "soft_drain_timeout": "0s", "workers": int64(0)},
			Config{ColdThresholdTokens: 1, Workers: 0, SteerWarm: true, QueueLimit: 256, MaxWait: 60 * time.Second},
		},
	} {
		got, err := ParseConfig(c.raw)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", c.name, diff)
		}
	}
}

// TestParseConfigErrors: each bad key is named, with today's rule and message.
func TestParseConfigErrors(t *testing.T) {
	base := map[string]any{"cold_threshold_tokens": int64(8)}
	with := func(k string, v any) map[string]any {
		m := maps.Clone(base)
		m[k] = v
		return m
	}
	for _, c := range []struct {
		name string
		raw  map[string]any
		want string
	}{
		{"unknown key", with("pool", int64(2)), "admission.classifier.pool: unknown key"},
		{"no threshold", nil, `admission.classifier.cold_threshold_tokens: required with type = "cold_pool"`},
		{"zero threshold", with("cold_threshold_tokens", int64(0)), "admission.classifier.cold_threshold_tokens: must be >= 1"},
		{"threshold not an integer", with("cold_threshold_tokens", "8"), "admission.classifier.cold_threshold_tokens: must be an integer, not a string"},
		{"negative workers", with("workers", int64(-1)), "admission.classifier.workers: must be >= 0"},
		{"negative soft drain", with("soft_drain_timeout", "-1s"), "admission.classifier.soft_drain_timeout: must be >= 0"},
		{"soft drain not a duration", with("soft_drain_timeout", "soon"), `admission.classifier.soft_drain_timeout: "soon" is not a duration`},
		{"steer_warm not a bool", with("steer_warm", int64(1)), "admission.classifier.steer_warm: must be a boolean, not a number"},
		{"negative cold queue limit", with("cold_queue_limit", int64(-3)), "admission.classifier.cold_queue_limit: must be >= 0"},
		{"zero cold max wait", with("cold_max_wait", "0s"), "admission.classifier.cold_max_wait: must be > 0"},
		{"every problem", map[string]any{"workers": int64(-1), "cold_max_wait": "0s"},
			"admission.classifier.cold_max_wait: must be > 0\n" +
				`admission.classifier.cold_threshold_tokens: required with type = "cold_pool"` + "\n" +
				"admission.classifier.workers: must be >= 0"},
	} {
		_, err := ParseConfig(c.raw)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s: got %v, want %s", c.name, err, c.want)
			continue
		}
		var oe *admission.OptionError
		if !errors.As(err, &oe) {
			t.Errorf("%s: %T is not an *admission.OptionError", c.name, err)
		}
		if _, ferr := Factory(c.raw, admission.Env{}); ferr == nil || ferr.Error() != c.want {
			t.Errorf("%s: Factory: %v", c.name, ferr)
		}
	}
}

func TestFactory(t *testing.T) {
	now := func() time.Time { return cpT0 }
	pol, err := Factory(map[string]any{"cold_threshold_tokens": int64(10), "cold_queue_limit": int64(3)}, admission.Env{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	p, ok := pol.(*Policy)
	if !ok || !admission.NeedsPrefixIndex(p) || p.now() != cpT0 {
		t.Fatalf("Factory built %T", pol)
	}
	if diff := cmp.Diff(Config{ColdThresholdTokens: 10, Workers: 1, SteerWarm: true, QueueLimit: 3, MaxWait: time.Minute}, p.cfg); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

// TestSchemaDocumentsConfig keeps the classifier keys and defaults documented in
// contracts/runtime.schema.json in step with ParseConfig and DefaultConfig.
func TestSchemaDocumentsConfig(t *testing.T) {
	var schema struct {
		Defs struct {
			Classifier struct {
				Properties map[string]struct {
					Default     any    `json:"default"`
					Description string `json:"description"`
				} `json:"properties"`
			} `json:"classifier"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	// cold_pool's keys are those the schema describes as cold_pool's.
	props := schema.Defs.Classifier.Properties
	maps.DeleteFunc(props, func(k string, p struct {
		Default     any    `json:"default"`
		Description string `json:"description"`
	}) bool {
		return k != "type" && !strings.HasPrefix(p.Description, "cold_pool:")
	})
	keys := slices.Sorted(maps.Keys(props))
	want := []string{"cold_max_wait", "cold_queue_limit", "cold_threshold_tokens", "soft_drain_timeout", "steer_warm", "type", "workers"}
	if !slices.Equal(keys, want) {
		t.Fatalf("schema classifier keys %v, want %v", keys, want)
	}
	// The schema's defaults, read as the config loader hands them over, give DefaultConfig.
	raw := map[string]any{"cold_threshold_tokens": int64(1)}
	for k, p := range props {
		switch v := p.Default.(type) {
		case nil:
			if k != "type" && k != "cold_threshold_tokens" {
				t.Fatalf("schema: %s has no default", k)
			}
		case float64:
			raw[k] = int64(v)
		default:
			raw[k] = v
		}
	}
	got, err := ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultConfig()
	def.ColdThresholdTokens = 1
	if diff := cmp.Diff(def, got); diff != "" {
		t.Fatalf("schema defaults differ from DefaultConfig (-DefaultConfig +schema):\n%s", diff)
	}
}
