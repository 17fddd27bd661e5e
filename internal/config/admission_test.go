package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/contracts"
)

func TestAdmissionAbsentMeansNoQueue(t *testing.T) {
	cfg, err := Parse([]byte("[gateway]\nroute_policy = \"prefix_aware\"\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Admission.Enabled {
		t.Fatal("Enabled without an [admission] table")
	}
	if cfg.Gateway.RoutePolicy != PolicyPrefixAware {
		t.Fatalf("RoutePolicy = %q", cfg.Gateway.RoutePolicy)
	}
	// The defaults are still there for readers such as the prefix index.
	if cfg.Admission.PrefixIndex.BlocksPerWorker != 4096 {
		t.Fatalf("BlocksPerWorker = %d, want 4096", cfg.Admission.PrefixIndex.BlocksPerWorker)
	}
}

func TestAdmissionDefaults(t *testing.T) {
	want := Admission{
		Enabled:      true,
		DefaultClass: "default",
		Classes:      []Class{{Name: "default", Quantum: 1, QueueLimit: 1024, MaxWait: 30 * time.Second}},
		Classifier:   Classifier{Type: ClassifierDefault},
		PrefixIndex:  PrefixIndexConfig{BlocksPerWorker: 4096},
		Recheck:      time.Second,
	}
	for _, src := range []string{"[admission]\n", "[admission]\nclasses = []\n", "admission = {}\n"} {
		cfg, err := Parse([]byte(src), env(nil))
		if err != nil {
			t.Fatalf("Parse(%q): %v", src, err)
		}
		if diff := cmp.Diff(want, cfg.Admission); diff != "" {
			t.Fatalf("Parse(%q) (-want +got):\n%s", src, diff)
		}
	}

	// A class given by name alone takes the default class's settings; a
	// cold_pool classifier's keys are passed on as written (its defaults are
	// its own: coldpool.ParseConfig).
	src := "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 4096 }\n[[admission.classes]]\nname = \"default\"\n"
	cfg, err := Parse([]byte(src), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want.Classifier = Classifier{Type: "cold_pool", Options: map[string]any{"cold_threshold_tokens": int64(4096)}}
	if diff := cmp.Diff(want, cfg.Admission); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

const admissionExample = `
[gateway]
route_policy = "prefix_aware"

[[auth.keys]]
key = "sk-batch"
scopes = ["inference"]
class = "batch"

[[auth.keys]]
key = "sk-app"
scopes = ["inference"]

[admission]
busy_threshold = 8
default_class = "interactive"
recheck = "250ms"
classifier = { type = "cold_pool", cold_threshold_tokens = 2048, workers = 2, soft_drain_timeout = "1.5s", steer_warm = false, cold_queue_limit = 0, cold_max_wait = "2m" }
prefix_index = { blocks_per_worker = 512 }

[[admission.classes]]
name = "interactive"
quantum = 3
queue_limit = 100
max_wait = "5s"
allow_header = true

[[admission.classes]]
name = "batch"
quantum = 1
queue_limit = 0

[[admission.classes]]
name = "v1.bulk-2_x"
max_wait = "10m"
`

func TestAdmissionFullExample(t *testing.T) {
	cfg, err := Parse([]byte(admissionExample), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := Admission{
		Enabled:       true,
		BusyThreshold: 8,
		DefaultClass:  "interactive",
		Classes: []Class{
			{Name: "interactive", Quantum: 3, QueueLimit: 100, MaxWait: 5 * time.Second, Header: true},
			{Name: "batch", Quantum: 1, QueueLimit: 0, MaxWait: 30 * time.Second},
			{Name: "v1.bulk-2_x", Quantum: 1, QueueLimit: 1024, MaxWait: 10 * time.Minute},
		},
		Classifier: Classifier{Type: "cold_pool", Options: map[string]any{
			"cold_threshold_tokens": int64(2048), "workers": int64(2), "soft_drain_timeout": "1.5s",
			"steer_warm": false, "cold_queue_limit": int64(0), "cold_max_wait": "2m",
		}},
		PrefixIndex: PrefixIndexConfig{BlocksPerWorker: 512},
		Recheck:     250 * time.Millisecond,
	}
	if diff := cmp.Diff(want, cfg.Admission); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	wantKeys := []Key{
		{Key: "sk-batch", Scopes: []string{"inference"}, Class: "batch"},
		{Key: "sk-app", Scopes: []string{"inference"}},
	}
	if diff := cmp.Diff(wantKeys, cfg.Auth.Keys); diff != "" {
		t.Fatalf("keys (-want +got):\n%s", diff)
	}
	if got := cfg.Admission.ClassIndex("batch"); got != 1 {
		t.Fatalf("ClassIndex(batch) = %d", got)
	}
	if got := cfg.Admission.ClassIndex("nope"); got != -1 {
		t.Fatalf("ClassIndex(nope) = %d", got)
	}
	if s := cfg.Auth.Keys[0].String(); !strings.Contains(s, "class: batch") || strings.Contains(s, "sk-batch") {
		t.Fatalf("Key.String() = %q", s)
	}
}

func TestAdmissionOtherClassifiers(t *testing.T) {
	for _, typ := range []string{ClassifierDefault, "session_serial"} {
		cfg, err := Parse([]byte("[admission]\nclassifier = { type = \""+typ+"\" }\n"), env(nil))
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if c := cfg.Admission.Classifier; c.Type != typ || c.Options != nil {
			t.Fatalf("%s: %+v", typ, c)
		}
	}
	// soft_drain_timeout may be zero; the other durations may not (the
	// values themselves: coldpool's TestParseConfig).
	src := "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 1, soft_drain_timeout = \"0s\", workers = 0 }\n"
	cfg, err := Parse([]byte(src), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"cold_threshold_tokens": int64(1), "soft_drain_timeout": "0s", "workers": int64(0)}
	if diff := cmp.Diff(want, cfg.Admission.Classifier.Options); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

// TestAdmissionClassifierParserRuns: a value only the classifier's own parser
// rejects (the schema allows it) still fails Parse, naming its key, with the
// other problems of the file.
func TestAdmissionClassifierParserRuns(t *testing.T) {
	src := "[admission]\nrecheck = \"0s\"\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, cold_max_wait = \"0s\" }\n"
	_, err := Parse([]byte(src), env(nil))
	want := strings.Join([]string{
		`config: admission.classifier.cold_max_wait: must be > 0`,
		`config: admission.recheck: must be > 0`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("got:\n%v\nwant:\n%s", err, want)
	}
}

func TestAdmissionReportsEveryProblem(t *testing.T) {
	src := `
[[auth.keys]]
key = "sk-a"
scopes = ["inference"]
class = "gold"

[admission]
default_class = "silver"
recheck = "0s"

[[admission.classes]]
name = "bronze"
max_wait = "0s"
`
	_, err := Parse([]byte(src), env(nil))
	want := strings.Join([]string{
		`config: admission.classes[0].max_wait: must be > 0`,
		`config: admission.default_class: "silver" is not one of the classes "bronze"`,
		`config: admission.recheck: must be > 0`,
		`config: auth.keys[0].class: "gold" is not one of the classes "bronze"`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("got:\n%v\nwant:\n%s", err, want)
	}
}

// TestAdmissionSchemaDefaults keeps the defaults written in the schema's
// admission part and the Go defaults in step.
func TestAdmissionSchemaDefaults(t *testing.T) {
	type props map[string]struct {
		Default    any   `json:"default"`
		Properties props `json:"properties"`
	}
	var schema struct {
		Properties struct {
			Admission struct {
				Properties props `json:"properties"`
			} `json:"admission"`
		} `json:"properties"`
		Defs struct {
			Class      struct{ Properties props } `json:"class"`
			Classifier struct{ Properties props } `json:"classifier"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	a := Default().Admission
	c := DefaultAdmissionClass()
	got := map[string]any{}
	for name, p := range schema.Properties.Admission.Properties {
		got["admission."+name] = p.Default
		for sub, q := range p.Properties {
			got["admission."+name+"."+sub] = q.Default
		}
	}
	for name, p := range schema.Defs.Class.Properties {
		got["class."+name] = p.Default
	}
	// The other classifier keys are the classifiers' own: coldpool's
	// TestSchemaDocumentsConfig checks their defaults.
	got["classifier.type"] = schema.Defs.Classifier.Properties["type"].Default
	want := map[string]any{
		"admission.busy_threshold":                 float64(a.BusyThreshold),
		"admission.default_class":                  a.DefaultClass,
		"admission.classes":                        []any{},
		"admission.classifier":                     nil, // a $ref; its fields carry the defaults
		"admission.prefix_index":                   nil,
		"admission.prefix_index.blocks_per_worker": float64(a.PrefixIndex.BlocksPerWorker),
		"admission.recheck":                        a.Recheck.String(),
		"class.name":                               nil,
		"class.quantum":                            float64(c.Quantum),
		"class.queue_limit":                        float64(c.QueueLimit),
		"class.max_wait":                           c.MaxWait.String(),
		"class.allow_header":                       c.Header,
		"classifier.type":                          nil, // required inside the table; default when absent
	}
	for k, v := range got {
		// Durations compare by value: the schema may write "60s" for 1m0s.
		if s, ok := v.(string); ok {
			if d, err := time.ParseDuration(s); err == nil {
				got[k] = d.String()
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("schema defaults differ from Default() (-Default +schema):\n%s", diff)
	}
	if a.Classifier.Type != ClassifierDefault || a.Enabled {
		t.Fatalf("Default().Admission = %+v", a)
	}
}
