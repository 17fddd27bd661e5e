package request_test

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/internal/oai"
)

// FuzzParseSampling: over bodies the gateway admits (oai.Parse accepts them: one JSON object,
// no repeated key), ParseSampling never panics, agrees with encoding/json's exact-key reading of
// max_tokens, max_completion_tokens, top_k and seed (counts saturate into the contract's
// integers, never wrap), and what it returns is a fixed point: written back as a body and read
// again, it is the same Sampling.
func FuzzParseSampling(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"x"}`,
		`{"model":"m","prompt":"x","max_tokens":4294967312,"top_k":4294967297,"seed":-1}`,
		`{"model":"m","prompt":"x","max_completion_tokens":7,"max_tokens":9,"temperature":0,"top_p":0.5}`,
		`{"model":"m","prompt":"x","stop":["a",null,""],"logprobs":0}`,
		`{"model":"m","prompt":"x","stop":"","logprobs":null,"seed":0,"top_k":-9223372036854775808}`,
		`{"model":"m","prompt":"x","Max_Tokens":3,"max_tokens":"3"}`,
		`{"model":"m","prompt":"x","\u006dax_tokens":-1}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, err := oai.Parse(oai.Completions, body); err != nil {
			if _, err := oai.Parse(oai.Chat, body); err != nil {
				return
			}
		}
		s, seeded, err := request.ParseSampling(body)
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil {
			t.Fatalf("%q: oai.Parse accepted what encoding/json refuses", body)
		}
		if err != nil {
			return
		}
		if s.TopK < 0 {
			t.Fatalf("%q: top_k %d", body, s.TopK)
		}
		if seed, ok := m["seed"]; seeded != (ok && string(seed) != "null") {
			t.Fatalf("%q: seeded %v", body, seeded)
		}
		count := func(key string) (int64, bool) {
			raw, ok := m[key]
			if !ok || string(raw) == "null" {
				return 0, false
			}
			n, err := strconv.ParseInt(string(raw), 10, 64)
			if err != nil {
				t.Fatalf("%q: %s %s accepted", body, key, raw)
			}
			return n, true
		}
		want := int64(16)
		if n, ok := count("max_completion_tokens"); ok {
			want = n
		} else if n, ok := count("max_tokens"); ok {
			want = n
		}
		if got := int64(s.MaxTokens); got != min(max(want, 0), math.MaxUint32) {
			t.Fatalf("%q: max_tokens %d, want %d saturated", body, got, want)
		}
		if k, ok := count("top_k"); ok && int64(s.TopK) != min(max(k, 0), math.MaxInt32) {
			t.Fatalf("%q: top_k %d, want %d saturated", body, s.TopK, k)
		}

		var again bytes.Buffer
		fields := map[string]any{"max_tokens": s.MaxTokens, "temperature": s.Temperature, "top_p": s.TopP,
			"top_k": s.TopK, "logprobs": s.Logprobs, "stop": s.Stop}
		if seeded {
			fields["seed"] = int64(s.Seed)
		}
		if err := json.NewEncoder(&again).Encode(fields); err != nil {
			t.Fatal(err)
		}
		s2, seeded2, err := request.ParseSampling(again.Bytes())
		if err != nil || seeded2 != seeded {
			t.Fatalf("%q read back from %s: seeded %v, %v", body, again.Bytes(), seeded2, err)
		}
		if s.Stop == nil {
			s.Stop = []string{} // written as null, read as none
		}
		if s2.Stop == nil {
			s2.Stop = []string{}
		}
		if diff := cmp.Diff(s, s2); diff != "" {
			t.Fatalf("%q read back from %s (-first +again):\n%s", body, again.Bytes(), diff)
		}
	})
}
