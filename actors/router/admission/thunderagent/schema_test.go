package thunderagent

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/contracts"
)

// TestSchemaDocumentsConfig keeps the thunderagent keys and defaults documented in
// contracts/runtime.schema.json in step with ParseConfig and DefaultConfig.
func TestSchemaDocumentsConfig(t *testing.T) {
	type prop struct {
		Default     any    `json:"default"`
		Description string `json:"description"`
	}
	var schema struct {
		Defs struct {
			Classifier struct {
				Properties map[string]prop `json:"properties"`
			} `json:"classifier"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	props := schema.Defs.Classifier.Properties
	maps.DeleteFunc(props, func(_ string, p prop) bool { return !strings.HasPrefix(p.Description, "thunderagent:") })
	want := []string{"acting_decay_tau", "acting_token_weight", "buffer_per_program", "max_tracked_requests",
		"pause_target", "pause_threshold", "resume_hysteresis", "resume_timeout", "session_retention"}
	if keys := slices.Sorted(maps.Keys(props)); !slices.Equal(keys, want) {
		t.Fatalf("schema thunderagent keys %v, want %v", keys, want)
	}
	raw := map[string]any{}
	for k, p := range props {
		switch v := p.Default.(type) {
		case nil:
			t.Fatalf("schema: %s has no default", k)
		case float64:
			if v == float64(int64(v)) && (k == "buffer_per_program" || k == "max_tracked_requests") {
				raw[k] = int64(v)
			} else {
				raw[k] = v
			}
		default:
			raw[k] = v
		}
	}
	got, err := ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DefaultConfig(), got); diff != "" {
		t.Fatalf("schema defaults differ from DefaultConfig (-DefaultConfig +schema):\n%s", diff)
	}
}
