package app

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
)

// TestAdmissionWiring: the configured classifier is built from its own keys, and the prefix
// index is on when the route policy, the classifier or a class's order or cost reads it.
func TestAdmissionWiring(t *testing.T) {
	for _, c := range []struct {
		name, src string
		policy    bool // a policy (not the default's nil)
		blocks    int
	}{
		{"no admission", "", false, 0},
		{"no admission, prefix_aware", "[gateway]\nroute_policy = \"prefix_aware\"\n", false, 4096},
		{"default", "[admission]\n", false, 0},
		{"session_serial", "[admission]\nclassifier = { type = \"session_serial\" }\n", true, 0},
		{"cold_pool", "[admission]\nprefix_index = { blocks_per_worker = 64 }\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8 }\n", true, 64},
		{"cold_pool baseline", "[admission]\nclassifier = { type = \"cold_pool\", cold_threshold_tokens = 8, workers = 0 }\n", true, 4096},
		{"a wspt class", "[[admission.classes]]\nname = \"default\"\norder = \"wspt\"\n", false, 4096},
		{"a class charged by tokens", "[[admission.classes]]\nname = \"default\"\ncost = \"uncached_tokens\"\n", false, 4096},
		{"an fcfs class by requests", "[[admission.classes]]\nname = \"default\"\npriority = 2\n", false, 0},
	} {
		cfg, err := config.Parse([]byte(c.src), func(string) string { return "" })
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		adm, err := admissionConfig(cfg, clock.Real{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if (adm != nil && adm.Queue.Policy != nil) != c.policy {
			t.Errorf("%s: admission %+v", c.name, adm)
		}
		if got := prefixIndexBlocks(cfg, adm); got != c.blocks {
			t.Errorf("%s: prefix index blocks %d, want %d", c.name, got, c.blocks)
		}
	}
}

// TestAdmissionClassWiring: every key of [[admission.classes]] reaches the queue's ClassConfig.
func TestAdmissionClassWiring(t *testing.T) {
	src := `[[admission.classes]]
name = "default"
quantum = 4096
queue_limit = 7
max_wait = "2s"
priority = 3
order = "wspt"
cost = "uncached_tokens"

[[admission.classes]]
name = "batch"
`
	cfg, err := config.Parse([]byte(src), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admissionConfig(cfg, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	want := []admission.ClassConfig{
		{Name: "default", Quantum: 4096, QueueLimit: 7, MaxWait: 2 * time.Second, Priority: 3, Order: admission.OrderWSPT, Cost: admission.CostUncachedTokens},
		{Name: "batch", Quantum: 1, QueueLimit: 1024, MaxWait: 30 * time.Second, Priority: 0, Order: admission.OrderFCFS, Cost: admission.CostRequests},
	}
	if diff := cmp.Diff(want, adm.Queue.Classes); diff != "" {
		t.Fatalf("classes (-want +got):\n%s", diff)
	}
}

// TestAdmissionWiringBadOptions: a Config built by hand (not through config.Parse) with bad
// classifier keys fails start-up naming the key.
func TestAdmissionWiringBadOptions(t *testing.T) {
	cfg := config.Default()
	cfg.Admission.Enabled = true
	cfg.Admission.Classifier = config.Classifier{Type: "cold_pool", Options: map[string]any{"cold_threshold_tokens": 0}}
	_, err := admissionConfig(cfg, clock.Real{})
	if err == nil || !strings.Contains(err.Error(), "admission.classifier.cold_threshold_tokens: must be >= 1") {
		t.Fatalf("got %v", err)
	}
}
