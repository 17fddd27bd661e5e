package config

import (
	"encoding/json"
	"testing"
)

// FuzzValidateRoutesJSON feeds admin-API route tables: decoding and validation never panic,
// and a table that validates also survives a JSON round trip unchanged in meaning.
func FuzzValidateRoutesJSON(f *testing.F) {
	for _, seed := range []string{
		`[{"model":"smol","aliases":["small"],"backends":[{"model":"a","weight":0.9},{"model":"b","weight":0.1}]}]`,
		`[{"model":"auto","cascade":[{"model":"smol","accept_if":"mean_logprob > -1.0"},{"model":"big"}]}]`,
		`[{"model":"x","targets":["disaggregated"]}]`,
		`[{"model":"x","cascade":[]}]`,
		`[{"model":"","backends":[{"model":"a","weight":-1}]}]`,
		`[]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var routes []Route
		if json.Unmarshal(data, &routes) != nil {
			return
		}
		routes = NormalizeRoutes(routes)
		if ValidateRoutes(routes) != nil {
			return
		}
		again, err := json.Marshal(routes)
		if err != nil {
			t.Fatalf("marshal a valid table: %v", err)
		}
		var back []Route
		if err := json.Unmarshal(again, &back); err != nil {
			t.Fatalf("re-decode %s: %v", again, err)
		}
		if err := ValidateRoutes(NormalizeRoutes(back)); err != nil {
			t.Fatalf("a valid table became invalid after a round trip: %v\n%s", err, again)
		}
	})
}
