package request_test

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/request"
)

// TestParseSampling: every sampling field with R8.3's defaults for the omitted ones; fields are
// read under their exact names (a case variant such as "Max_Tokens" is another key, as the
// engines read it, R13.4); a wrong type is an error naming the field.
func TestParseSampling(t *testing.T) {
	for _, c := range []struct {
		body   string
		want   request.Sampling
		seeded bool
	}{
		{`{"prompt":"x"}`, request.Sampling{MaxTokens: 16, Temperature: 1, TopP: 1}, false},
		{`{"max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":3,"seed":7,"logprobs":2,"stop":"\n"}`,
			request.Sampling{MaxTokens: 5, Temperature: 0.5, TopP: 0.9, TopK: 3, Seed: 7, Logprobs: true, Stop: []string{"\n"}}, true},
		{`{"max_completion_tokens":9,"max_tokens":5,"stop":["a","b"],"logprobs":false}`,
			request.Sampling{MaxTokens: 9, Temperature: 1, TopP: 1, Stop: []string{"a", "b"}}, false},
		{`{"Max_Tokens":5,"Temperature":0,"LogProbs":true,"Seed":3}`, request.Sampling{MaxTokens: 16, Temperature: 1, TopP: 1}, false},
		// Counts past the contract's integers saturate instead of wrapping: 2³² + 16 tokens is
		// not 16, and a top_k of 2³² + 1 is not 1 (greedy).
		{`{"max_tokens":4294967312,"top_k":4294967297}`,
			request.Sampling{MaxTokens: math.MaxUint32, Temperature: 1, TopP: 1, TopK: math.MaxInt32}, false},
		{`{"max_completion_tokens":4294967295,"top_k":2147483647}`,
			request.Sampling{MaxTokens: math.MaxUint32, Temperature: 1, TopP: 1, TopK: math.MaxInt32}, false},
		{`{"max_tokens":-3,"top_k":-1}`, request.Sampling{Temperature: 1, TopP: 1}, false},
		// An empty stop string stops nothing (an engine would stop at once on it); seed 0 is a seed.
		{`{"stop":"","seed":0}`, request.Sampling{MaxTokens: 16, Temperature: 1, TopP: 1}, true},
	} {
		got, seeded, err := request.ParseSampling([]byte(c.body))
		if err != nil || seeded != c.seeded {
			t.Fatalf("%s: seeded %v err %v", c.body, seeded, err)
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", c.body, diff)
		}
	}
	for _, bad := range []string{`{"max_tokens":"5"}`, `{"stop":7}`, `{"seed":"x"}`} {
		if _, _, err := request.ParseSampling([]byte(bad)); err == nil {
			t.Fatalf("%s: no error", bad)
		}
	}
}
