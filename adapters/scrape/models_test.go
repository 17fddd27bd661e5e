package scrape

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/router"
)

// vllmModels is a model list as vLLM serves it with LoRA enabled: the base model (parent null,
// max_model_len) and its adapters (parent the base, root their path).
func vllmModels(base string, maxLen string, adapters ...string) string {
	entries := []string{fmt.Sprintf(`{"id":%q,"object":"model","created":1700000000,"owned_by":"vllm","root":%q,"parent":null,"max_model_len":%s,"permission":[{"id":"modelperm-1","object":"model_permission","allow_sampling":true}]}`, base, base, maxLen)}
	for _, a := range adapters {
		entries = append(entries, fmt.Sprintf(`{"id":%q,"object":"model","created":1700000000,"owned_by":"vllm","root":%q,"parent":%q,"max_model_len":null,"permission":[]}`, a, "/adapters/"+a, base))
	}
	return `{"object":"list","data":[` + strings.Join(entries, ",") + `]}`
}

// entries is a model list of n entries of other models.
func entries(n int) string {
	es := make([]string, n)
	for i := range es {
		es[i] = fmt.Sprintf(`{"id":"o-%d"}`, i)
	}
	return `{"object":"list","data":[` + strings.Join(es, ",") + `]}`
}

// TestReadModels pins how an engine's GET /v1/models becomes a worker's LoRA adapters and
// context length (R21): the adapters are the entries whose parent is the worker's model, held
// to a heartbeat's name rule and bound; max_model_len is the model's own entry's, when it is a
// plausible one; and a body that is not a model list, or is past its bounds, is an error with
// a reason (the scraper then keeps the last good list).
func TestReadModels(t *testing.T) {
	many := seq(1100)
	slices.Reverse(many)
	for _, c := range []struct {
		name     string
		body     string
		adapters []string
		maxLen   int64
		invalid  int
		over     int
		reason   string
	}{
		{name: "vLLM with two adapters", body: vllmModels(llama, "32768", "sql-lora", "chat-lora"),
			adapters: []string{"chat-lora", "sql-lora"}, maxLen: 32768},
		{name: "no adapters", body: vllmModels(llama, "8192"), maxLen: 8192},
		{name: "another model's adapters are not ours",
			body:     `{"data":[{"id":"x-lora","parent":"other"},{"id":"y-lora","parent":"` + llama + `"},{"id":"other","max_model_len":5}]}`,
			adapters: []string{"y-lora"}},
		{name: "root is not parent", body: `{"data":[{"id":"z","root":"` + llama + `"}]}`},
		{name: "duplicates fold", body: vllmModels(llama, "1", "a", "b", "a"), adapters: []string{"a", "b"}, maxLen: 1},
		{name: "bad names are dropped and counted",
			body:     vllmModels(llama, "1", "ok", "", "a b", "caf\u00e9", strings.Repeat("n", MaxNameBytes+1), llama, "tab\t", strings.Repeat("n", MaxNameBytes)),
			adapters: []string{strings.Repeat("n", MaxNameBytes), "ok"}, maxLen: 1, invalid: 6},
		{name: "more adapters than the bound: the first in sorted order", body: vllmModels(llama, "1", many...),
			adapters: seq(router.MaxLoRAAdapters), maxLen: 1, over: 1100 - router.MaxLoRAAdapters},
		{name: "max_model_len at the bound", body: vllmModels(llama, "16777216"), maxLen: 1 << 24},
		{name: "max_model_len over the bound", body: vllmModels(llama, "16777217")},
		{name: "max_model_len 0", body: vllmModels(llama, "0")},
		{name: "max_model_len negative", body: vllmModels(llama, "-4096")},
		{name: "max_model_len fractional", body: vllmModels(llama, "4096.5")},
		{name: "max_model_len in exponent form", body: vllmModels(llama, "4e3")},
		{name: "max_model_len a string", body: vllmModels(llama, `"4096"`)},
		{name: "max_model_len null", body: vllmModels(llama, "null")},
		{name: "max_model_len absent", body: `{"data":[{"id":"` + llama + `"}]}`},
		{name: "the first entry of the model counts", body: `{"data":[{"id":"` + llama + `","max_model_len":100},{"id":"` + llama + `","max_model_len":200}]}`, maxLen: 100},
		{name: "an adapter's max_model_len is not the model's", body: `{"data":[{"id":"a","parent":"` + llama + `","max_model_len":7}]}`, adapters: []string{"a"}},
		{name: "other fields are skipped", body: `{"object":"list","extra":{"data":[{"id":"hidden","parent":"` + llama + `"}]},"data":[{"id":"a","parent":"` + llama + `","x":[1,{"y":null}]}],"more":[]}`,
			adapters: []string{"a"}},
		{name: "an empty list", body: `{"object":"list","data":[]}`},
		{name: "entries at the bound", body: entries(MaxModelsEntries)},
		{name: "entries over the bound", body: entries(MaxModelsEntries + 1), reason: ReasonTooLarge},
		{name: "not JSON", body: `<html>`, reason: ReasonParse},
		{name: "empty", body: ``, reason: ReasonParse},
		{name: "an array", body: `[{"id":"a"}]`, reason: ReasonParse},
		{name: "no data", body: `{"object":"list"}`, reason: ReasonParse},
		{name: "data null", body: `{"data":null}`, reason: ReasonParse},
		{name: "data an object", body: `{"data":{"id":"a"}}`, reason: ReasonParse},
		{name: "data twice", body: `{"data":[],"data":[{"id":"a","parent":"` + llama + `"}]}`, reason: ReasonParse},
		{name: "an entry not an object", body: `{"data":["a"]}`, reason: ReasonParse},
		{name: "an id not a string", body: `{"data":[{"id":5}]}`, reason: ReasonParse},
		{name: "a parent not a string", body: `{"data":[{"id":"a","parent":5}]}`, reason: ReasonParse},
		{name: "cut short", body: `{"data":[{"id":"a"}`, reason: ReasonParse},
		{name: "unclosed list", body: `{"data":[{"id":"a"}]`, reason: ReasonParse},
		{name: "data after the list", body: `{"data":[]} {}`, reason: ReasonParse},
		{name: "a bad skipped field", body: `{"x":[1,],"data":[]}`, reason: ReasonParse},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := readModels(llama, []byte(c.body))
			if c.reason != "" {
				if err == nil || reasonOf(err) != c.reason {
					t.Fatalf("err %v (reason %q), want reason %q", err, reasonOf(err), c.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := modelsRead{adapters: c.adapters, maxModelLen: c.maxLen, invalid: c.invalid, over: c.over}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(modelsRead{})); diff != "" {
				t.Fatalf("-want +got:\n%s", diff)
			}
		})
	}
}

// FuzzReadModels: whatever an engine answers, readModels returns an error with a reason or a
// list a heartbeat could carry (valid, sorted, unique, bounded names, never the model) with a
// context length within bounds; and when the body is a plain model list, the adapters are
// those encoding/json finds in it.
func FuzzReadModels(f *testing.F) {
	f.Add([]byte(vllmModels(llama, "32768", "sql-lora", "chat-lora")), llama)
	f.Add([]byte(`{"data":[{"id":"a","parent":"m"},{"id":"m","max_model_len":9}]}`), "m")
	f.Add([]byte(`{"object":"list","data":[{"id":"a b","parent":"m"},{"id":"m","parent":"m"}],"x":{}}`), "m")
	f.Add([]byte(`{"data":[],"data":[]}`), "")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		got, err := readModels(model, body)
		if err != nil {
			if r := reasonOf(err); r != ReasonParse && r != ReasonTooLarge {
				t.Fatalf("reason %q: %v", r, err)
			}
			return
		}
		checkNames(t, got.adapters, model)
		if got.maxModelLen < 0 || got.maxModelLen > MaxModelLen {
			t.Fatalf("max_model_len %d", got.maxModelLen)
		}
		// encoding/json on the whole body: the same adapters.
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) != nil {
			t.Fatalf("read %+v from a body encoding/json refuses: %q", got, body)
		}
		var data []modelEntry
		if err := json.Unmarshal(top["data"], &data); err != nil {
			t.Fatalf("read %+v from a body whose data encoding/json refuses: %q", got, body)
		}
		ns := names{model: model}
		for _, e := range data {
			if e.Parent != nil && *e.Parent == model && e.ID != model {
				ns.add(e.ID)
			}
		}
		if want := ns.list(); !slices.Equal(want, got.adapters) {
			t.Fatalf("adapters %q, encoding/json finds %q in %q", got.adapters, want, body)
		}
	})
}
