package classifiers_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/tlgw/tlgw/actors/router/admission"
	_ "github.com/tlgw/tlgw/actors/router/admission/classifiers"
	"github.com/tlgw/tlgw/actors/router/admission/coldpool"
	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
	"github.com/tlgw/tlgw/contracts"
)

// TestTable: the registered names, what each builds, and a second registration of a name
// panics.
func TestTable(t *testing.T) {
	if got, want := admission.Names(), []string{"cold_pool", "default", "session_serial", "thunderagent"}; !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, c := range []struct {
		name   string
		raw    map[string]any
		check  func(admission.Policy) bool
		prefix bool
	}{
		{"default", nil, func(p admission.Policy) bool { return p == nil }, false},
		{"session_serial", nil, func(p admission.Policy) bool { _, ok := p.(*sessionserial.Policy); return ok }, false},
		{"cold_pool", map[string]any{"cold_threshold_tokens": int64(8)}, func(p admission.Policy) bool { _, ok := p.(*coldpool.Policy); return ok }, true},
		{"thunderagent", map[string]any{"pause_threshold": 0.9}, func(p admission.Policy) bool { _, ok := p.(*thunderagent.Policy); return ok }, false},
	} {
		p, err := admission.NewPolicy(c.name, c.raw, admission.Env{})
		if err != nil || !c.check(p) || admission.NeedsPrefixIndex(p) != c.prefix {
			t.Errorf("%s: %T, %v", c.name, p, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering cold_pool twice did not panic")
		}
	}()
	admission.Register("cold_pool", coldpool.Factory)
}

// TestSchemaListsTheTable: contracts/runtime.schema.json, the documented contract, accepts
// exactly the registered classifier types.
func TestSchemaListsTheTable(t *testing.T) {
	var schema struct {
		Defs struct {
			Classifier struct {
				Properties struct {
					Type struct {
						Enum []string `json:"enum"`
					} `json:"type"`
				} `json:"properties"`
			} `json:"classifier"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	enum := slices.Sorted(slices.Values(schema.Defs.Classifier.Properties.Type.Enum))
	if !slices.Equal(enum, admission.Names()) {
		t.Fatalf("schema classifier types %v, registered %v", enum, admission.Names())
	}
}
