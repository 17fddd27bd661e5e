package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/router/admission"
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
priority = 1

[[admission.classes]]
name = "batch"
quantum = 1
queue_limit = 0

[[admission.classes]]
name = "v1.bulk-2_x"
max_wait = "10m"
quantum = 8192
order = "wspt"
cost = "uncached_tokens"
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
			{Name: "interactive", Quantum: 3, QueueLimit: 100, MaxWait: 5 * time.Second, Header: true, Priority: 1},
			{Name: "batch", Quantum: 1, QueueLimit: 0, MaxWait: 30 * time.Second},
			{Name: "v1.bulk-2_x", Quantum: 8192, QueueLimit: 1024, MaxWait: 10 * time.Minute,
				Order: admission.OrderWSPT, Cost: admission.CostUncachedTokens},
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
		{Key: "sk-batch", Name: "key-0", Scopes: []string{"inference"}, Class: "batch"},
		{Key: "sk-app", Name: "key-1", Scopes: []string{"inference"}},
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
		"class.priority":                           float64(c.Priority),
		"class.order":                              nameOf(admission.Orders, c.Order),
		"class.cost":                               nameOf(admission.Costs, c.Cost),
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

// nameOf is the configuration name of v in names ("" when none).
func nameOf[T comparable](names map[string]T, v T) string {
	for n, x := range names {
		if x == v {
			return n
		}
	}
	return ""
}

// TestAdmissionClassOrderDefaults: a class that leaves out priority, order
// and cost has priority 0, fcfs and requests.
func TestAdmissionClassOrderDefaults(t *testing.T) {
	for _, src := range []string{"[admission]\n", "[[admission.classes]]\nname = \"default\"\n"} {
		cfg, err := Parse([]byte(src), env(nil))
		if err != nil {
			t.Fatalf("Parse(%q): %v", src, err)
		}
		c := cfg.Admission.Classes[0]
		if c.Priority != 0 || c.Order != admission.OrderFCFS || c.Cost != admission.CostRequests {
			t.Fatalf("Parse(%q): class %+v, want priority 0, fcfs, requests", src, c)
		}
	}
	if c := DefaultAdmissionClass(); c.Priority != 0 || c.Order != admission.OrderFCFS || c.Cost != admission.CostRequests {
		t.Fatalf("DefaultAdmissionClass() = %+v", c)
	}
}

// TestAdmissionClassOrderKeys: each value of priority, order and cost is
// read into its class (the second class, to check the right one gets it).
func TestAdmissionClassOrderKeys(t *testing.T) {
	for _, c := range []struct {
		line string
		want func(*Class)
	}{
		{"priority = 0", func(*Class) {}},
		{"priority = 1", func(c *Class) { c.Priority = 1 }},
		{"priority = 1000", func(c *Class) { c.Priority = 1000 }},
		{`order = "fcfs"`, func(*Class) {}},
		{`order = "wspt"`, func(c *Class) { c.Order = admission.OrderWSPT }},
		{`cost = "requests"`, func(*Class) {}},
		{`cost = "uncached_tokens"`, func(c *Class) { c.Cost = admission.CostUncachedTokens }},
		{"priority = 7\norder = \"wspt\"\ncost = \"uncached_tokens\"\nquantum = 4096", func(c *Class) {
			c.Priority, c.Order, c.Cost, c.Quantum = 7, admission.OrderWSPT, admission.CostUncachedTokens, 4096
		}},
	} {
		src := "[[admission.classes]]\nname = \"default\"\n[[admission.classes]]\nname = \"b\"\n" + c.line + "\n"
		cfg, err := Parse([]byte(src), env(nil))
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		first, second := DefaultAdmissionClass(), DefaultAdmissionClass()
		second.Name = "b"
		c.want(&second)
		if diff := cmp.Diff([]Class{first, second}, cfg.Admission.Classes); diff != "" {
			t.Fatalf("%q (-want +got):\n%s", c.line, diff)
		}
	}
}

// TestAdmissionClassOrderProblems: a bad priority, order or cost fails Parse
// with a problem at its key naming what is allowed, alongside the others.
func TestAdmissionClassOrderProblems(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"priority = -1", "admission.classes[1].priority: must be >= 0"},
		{"priority = 1001", "admission.classes[1].priority: must be <= 1000"},
		{"priority = 1.5", "admission.classes[1].priority: must be an integer, not a number"},
		{`priority = "high"`, "admission.classes[1].priority: must be an integer, not a string"},
		{`order = "lifo"`, `admission.classes[1].order: "lifo" is not one of "fcfs", "wspt"`},
		{`order = "FCFS"`, `admission.classes[1].order: "FCFS" is not one of "fcfs", "wspt"`},
		{"order = 1", `admission.classes[1].order: 1 is not one of "fcfs", "wspt"`},
		{`cost = "tokens"`, `admission.classes[1].cost: "tokens" is not one of "requests", "uncached_tokens"`},
		{`cost = ""`, `admission.classes[1].cost: "" is not one of "requests", "uncached_tokens"`},
	} {
		src := "[[admission.classes]]\nname = \"default\"\n[[admission.classes]]\nname = \"b\"\n" + c.line + "\n"
		_, err := Parse([]byte(src), env(nil))
		if want := "config: " + c.want; err == nil || err.Error() != want {
			t.Fatalf("%q: got\n%v\nwant\n%s", c.line, err, want)
		}
	}

	src := "[admission]\nrecheck = \"0s\"\n[[admission.classes]]\nname = \"default\"\npriority = 2000\norder = \"sjf\"\ncost = \"bytes\"\n"
	_, err := Parse([]byte(src), env(nil))
	want := strings.Join([]string{
		`config: admission.classes[0].cost: "bytes" is not one of "requests", "uncached_tokens"`,
		`config: admission.classes[0].order: "sjf" is not one of "fcfs", "wspt"`,
		`config: admission.classes[0].priority: must be <= 1000`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("got:\n%v\nwant:\n%s", err, want)
	}
}

// TestAdmissionClassOrderApplyChecks: the checks behind the schema's (apply
// on its own, which the schema normally shields) reject the same values at
// the same keys and leave the defaults.
func TestAdmissionClassOrderApplyChecks(t *testing.T) {
	ptr := func(s string) *string { return &s }
	for _, c := range []struct {
		fc   fileClass
		want string
	}{
		{fileClass{Name: "default", Priority: new(-1)}, "admission.classes[0].priority: -1 is not between 0 and 1000"},
		{fileClass{Name: "default", Priority: new(1001)}, "admission.classes[0].priority: 1001 is not between 0 and 1000"},
		{fileClass{Name: "default", Order: ptr("lifo")}, `admission.classes[0].order: "lifo" is not one of "fcfs", "wspt"`},
		{fileClass{Name: "default", Cost: ptr("tokens")}, `admission.classes[0].cost: "tokens" is not one of "requests", "uncached_tokens"`},
	} {
		a := defaultAdmission()
		var ps problems
		(&fileAdmission{Classes: []fileClass{c.fc}}).apply(&a, nil, &ps)
		got := ps.sorted()
		if len(got) != 1 || got[0].String() != c.want {
			t.Fatalf("%+v: problems %v, want %s", c.fc, got, c.want)
		}
		if diff := cmp.Diff([]Class{DefaultAdmissionClass()}, a.Classes); diff != "" {
			t.Fatalf("%+v: classes (-want +got):\n%s", c.fc, diff)
		}
	}
	a := defaultAdmission()
	var ps problems
	fc := fileClass{Name: "default", Priority: new(1000), Order: ptr("wspt"), Cost: ptr("uncached_tokens")}
	(&fileAdmission{Classes: []fileClass{fc}}).apply(&a, nil, &ps)
	if !ps.empty() {
		t.Fatalf("problems %v", ps.sorted())
	}
	if c := a.Classes[0]; c.Priority != 1000 || c.Order != admission.OrderWSPT || c.Cost != admission.CostUncachedTokens {
		t.Fatalf("class %+v", c)
	}
}

// TestAdmissionThunderagent: the thunderagent classifier's keys load; one valid only by the
// schema's bounds but not by the classifier's own rules (pause_target above pause_threshold)
// fails naming its key; a cold_pool key is refused with it.
func TestAdmissionThunderagent(t *testing.T) {
	src := "[admission]\nclassifier = { type = \"thunderagent\", pause_threshold = 0.9, session_retention = \"5m\", max_tracked_requests = 50 }\n"
	cfg, err := Parse([]byte(src), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"pause_threshold": 0.9, "session_retention": "5m", "max_tracked_requests": int64(50)}
	if diff := cmp.Diff(want, cfg.Admission.Classifier.Options); diff != "" || cfg.Admission.Classifier.Type != "thunderagent" {
		t.Fatalf("%s (-want +got):\n%s", cfg.Admission.Classifier.Type, diff)
	}
	for _, c := range []struct{ src, want string }{
		{"[admission]\nclassifier = { type = \"thunderagent\", pause_threshold = 0.5 }\n", "admission.classifier.pause_target: must be <= pause_threshold (0.5)"},
		{"[admission]\nclassifier = { type = \"thunderagent\", workers = 1 }\n", "admission.classifier"},
		{"[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 1, pause_target = 0.5 }\n", "admission.classifier"},
	} {
		if _, err := Parse([]byte(c.src), env(nil)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}
