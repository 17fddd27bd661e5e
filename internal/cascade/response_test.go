package cascade

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Response bodies in the two shapes, with logprobs, as an engine returns
// them for a non-streamed request.
const (
	completionBody = `{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"small",` +
		`"choices":[{"index":0,"text":"Paris.","logprobs":{"tokens":["Paris","."],"token_logprobs":[-0.125,-0.5],` +
		`"top_logprobs":null,"text_offset":[0,5]},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`
	chatBody = `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"small",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},` +
		`"logprobs":{"content":[{"token":"Paris","logprob":-0.125,"bytes":[80,97,114,105,115],"top_logprobs":[]},` +
		`{"token":".","logprob":-0.5,"bytes":[46],"top_logprobs":[]}]},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`
)

func TestLogprobsOf(t *testing.T) {
	good := []struct {
		name, body string
		want       []float64
	}{
		{"completions", completionBody, []float64{-0.125, -0.5}},
		{"chat", chatBody, []float64{-0.125, -0.5}},
		{"completions, no tokens", `{"choices":[{"text":"","logprobs":{"tokens":[],"token_logprobs":[]}}]}`, []float64{}},
		{"chat, no tokens", `{"choices":[{"message":{"content":""},"logprobs":{"content":[]}}]}`, []float64{}},
		{"first choice only", `{"choices":[{"logprobs":{"token_logprobs":[-1]}},{"logprobs":{"token_logprobs":[-2]}}]}`, []float64{-1}},
	}
	for _, tc := range good {
		got, err := LogprobsOf([]byte(tc.body))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got == nil || !cmp.Equal(tc.want, got) {
			t.Errorf("%s: got %#v, want %#v", tc.name, got, tc.want)
		}
	}

	bad := []struct{ name, body, want string }{
		{"not JSON", `{"choices":`, "not a JSON object"},
		{"array", `[1]`, "not a JSON object"},
		{"no choices", `{"error":{"message":"x"}}`, "no choices"},
		{"null choices", `{"choices":null}`, "choices: want an array, got null"},
		{"empty choices", `{"choices":[]}`, "choices is empty"},
		{"choice not an object", `{"choices":[1]}`, "choices[0]: want an object, got 1"},
		{"logprobs absent", `{"choices":[{"text":"x"}]}`, "logprobs is absent or null"},
		{"logprobs null", `{"choices":[{"text":"x","logprobs":null}]}`, "logprobs is absent or null"},
		{"logprobs not an object", `{"choices":[{"logprobs":[-1]}]}`, "logprobs: want an object"},
		{"neither list", `{"choices":[{"logprobs":{"tokens":["a"]}}]}`, "neither content"},
		{"both lists", `{"choices":[{"logprobs":{"content":[],"token_logprobs":[]}}]}`, "both content"},
		{"null token_logprobs", `{"choices":[{"logprobs":{"token_logprobs":null}}]}`, "token_logprobs: want an array, got null"},
		{"null entry", `{"choices":[{"logprobs":{"token_logprobs":[-1,null]}}]}`, "token_logprobs[1]: want a number, got null"},
		{"string entry", `{"choices":[{"logprobs":{"token_logprobs":["-1"]}}]}`, `token_logprobs[0]: want a number, got "-1"`},
		{"overflowing entry", `{"choices":[{"logprobs":{"token_logprobs":[-1e999]}}]}`, "token_logprobs[0]: want a finite number"},
		{"null content", `{"choices":[{"logprobs":{"content":null}}]}`, "content: want an array, got null"},
		{"content entry not an object", `{"choices":[{"logprobs":{"content":[-1]}}]}`, "content[0]: want an object, got -1"},
		{"content entry without logprob", `{"choices":[{"logprobs":{"content":[{"logprob":-1},{"token":"a"}]}}]}`, "content[1] has no logprob"},
		{"content logprob null", `{"choices":[{"logprobs":{"content":[{"logprob":null}]}}]}`, "content[0].logprob: want a number, got null"},
	}
	for _, tc := range bad {
		got, err := LogprobsOf([]byte(tc.body))
		if err == nil {
			t.Errorf("%s: got %v; want an error containing %q", tc.name, got, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q; want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func TestTextOf(t *testing.T) {
	good := []struct{ name, body, want string }{
		{"completions", completionBody, "Paris."},
		{"chat", chatBody, "Paris."},
		{"completions, empty", `{"choices":[{"text":""}]}`, ""},
		{"chat, escaped", `{"choices":[{"message":{"role":"assistant","content":"a\nb \u00e9"}}]}`, "a\nb é"},
	}
	for _, tc := range good {
		got, err := TextOf([]byte(tc.body))
		if err != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	bad := []struct{ name, body, want string }{
		{"no choices", `{}`, "no choices"},
		{"neither", `{"choices":[{"index":0}]}`, "neither message"},
		{"both", `{"choices":[{"text":"a","message":{"content":"b"}}]}`, "both message"},
		{"null text", `{"choices":[{"text":null}]}`, "text: want a string, got null"},
		{"number text", `{"choices":[{"text":1}]}`, "text: want a string, got 1"},
		{"null message", `{"choices":[{"message":null}]}`, "message: want an object, got null"},
		{"no content", `{"choices":[{"message":{"role":"assistant"}}]}`, "message has no content"},
		{"null content", `{"choices":[{"message":{"role":"assistant","content":null}}]}`, "content: want a string, got null"},
	}
	for _, tc := range bad {
		got, err := TextOf([]byte(tc.body))
		if err == nil {
			t.Errorf("%s: got %q; want an error containing %q", tc.name, got, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q; want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func TestStripLogprobs(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"completions", completionBody,
			`{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"small",` +
				`"choices":[{"index":0,"text":"Paris.","logprobs":null,"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`},
		{"chat", chatBody,
			`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"small",` +
				`"choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},` +
				`"logprobs":null,"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`},
		// Spacing, field order, number spellings and escapes outside the
		// replaced values stay byte for byte; every choice is stripped; a
		// "logprobs" key elsewhere is not a choice's and stays.
		{"layout preserved",
			"{ \"model\" : \"s\\u006dall\",\n  \"logprobs\": {\"keep\": 1},\n  \"choices\" : [\n" +
				"    { \"logprobs\" :\t{ \"content\": [ {\"logprob\": -1.50e0} ] } , \"index\": 0 },\n" +
				"    {\"index\":1,\"message\":{\"content\":\"x\",\"logprobs\":[1]},\"logprobs\":{\"token_logprobs\":[-2]}}\n" +
				"  ], \"usage\": {\"total_tokens\": 1E1}\n}\n",
			"{ \"model\" : \"s\\u006dall\",\n  \"logprobs\": {\"keep\": 1},\n  \"choices\" : [\n" +
				"    { \"logprobs\" :\tnull , \"index\": 0 },\n" +
				"    {\"index\":1,\"message\":{\"content\":\"x\",\"logprobs\":[1]},\"logprobs\":null}\n" +
				"  ], \"usage\": {\"total_tokens\": 1E1}\n}\n"},
		{"already null", `{"choices":[{"text":"a","logprobs":null}]}`, `{"choices":[{"text":"a","logprobs":null}]}`},
		{"scalar logprobs", `{"choices":[{"logprobs":5}]}`, `{"choices":[{"logprobs":null}]}`},
		{"no logprobs field", `{"choices":[{"text":"a"}]}`, `{"choices":[{"text":"a"}]}`},
		{"no choices", `{"error":{"message":"x"}}`, `{"error":{"message":"x"}}`},
		{"null choices", `{"choices":null,"x":1}`, `{"choices":null,"x":1}`},
		{"empty choices", `{"choices":[]}`, `{"choices":[]}`},
	}
	for _, tc := range cases {
		got, err := StripLogprobs([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
		if !json.Valid(got) {
			t.Errorf("%s: result is not valid JSON", tc.name)
		}
	}

	// The stripped bodies still read as answers, without logprobs.
	for _, body := range []string{completionBody, chatBody} {
		out, err := StripLogprobs([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if text, err := TextOf(out); err != nil || text != "Paris." {
			t.Errorf("TextOf(stripped) = %q, %v", text, err)
		}
		if lps, err := LogprobsOf(out); err == nil {
			t.Errorf("LogprobsOf(stripped) = %v; want an error", lps)
		}
		// Apart from logprobs, the decoded body is unchanged.
		var before, after map[string]any
		if err := json.Unmarshal([]byte(body), &before); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatal(err)
		}
		before["choices"].([]any)[0].(map[string]any)["logprobs"] = nil
		if diff := cmp.Diff(before, after); diff != "" {
			t.Errorf("stripped body differs beyond logprobs (-want +got):\n%s", diff)
		}
	}

	// The input is not modified.
	in := []byte(completionBody)
	if _, err := StripLogprobs(in); err != nil || string(in) != completionBody {
		t.Errorf("StripLogprobs changed its input (err %v)", err)
	}

	bad := []struct{ name, in, want string }{
		{"not JSON", `{"choices":[`, "not valid JSON"},
		{"trailing garbage", `{"choices":[]} x`, "not valid JSON"},
		{"array body", `[{"logprobs":1}]`, "want a JSON object"},
		{"choices not an array", `{"choices":{"logprobs":1}}`, "choices: want an array"},
		{"choice not an object", `{"choices":[{"logprobs":1},"x"]}`, `choices[1]: want an object, got "x"`},
	}
	for _, tc := range bad {
		got, err := StripLogprobs([]byte(tc.in))
		if err == nil {
			t.Errorf("%s: got %s; want an error containing %q", tc.name, got, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q; want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func FuzzStripLogprobs(f *testing.F) {
	for _, s := range []string{completionBody, chatBody, `{"choices":[{"logprobs":  [1, {"a": "}"}] }]}`, `{}`, `[]`, `{"choices":null}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := StripLogprobs([]byte(s))
		if err != nil {
			if strings.Contains(err.Error(), "could not locate") {
				t.Fatalf("StripLogprobs(%q): %v", s, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("StripLogprobs(%q) = %q, not valid JSON", s, out)
		}
		// Stripping is idempotent.
		again, err := StripLogprobs(out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("second strip of %q gave %q, %v; want %q", s, again, err, out)
		}
	})
}
