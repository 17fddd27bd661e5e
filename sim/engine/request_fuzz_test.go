package engine

import (
	"errors"
	"testing"
)

// FuzzParseRequest: a body the engine accepts has every parameter inside the range the engine
// documents (max_tokens ≥ 1, temperature in [0, 2], top_p in (0, 1], top_k ≥ 0 once read, at
// most 4 stop strings, top_logprobs in [0, 20], completions' logprobs in [0, 5]) and the served
// model; a body it refuses is a 400 or, for another model, a 404. Nothing panics.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"smol","prompt":"hi","max_tokens":3,"temperature":0.5,"top_p":0.9,"top_k":4,"seed":-1,"stop":["a","b"],"logprobs":2}`,
		`{"model":"smol","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":true,"top_logprobs":20,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"smol","prompt":["one"],"max_completion_tokens":1,"max_tokens":0,"top_k":-1,"n":1}`,
		`{"model":"big","prompt":"x"}`,
		`{"model":"smol","prompt":"x","stop":["a","b","c","d","e"]}`,
		`{"model":"smol","prompt":"x","temperature":2.0000001,"top_p":0}`,
		`{"model":"smol","messages":[]}`,
		`{"model":"smol","prompt":"x"} trailing`,
		`[]`,
		`{"model":"smol","messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":3}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		r, err := parseRequest(body, chat, only("smol"))
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || (ae.status != 400 && ae.status != 404) || ae.msg == "" {
				t.Fatalf("%q: error %v is not a 400 or 404 with a message", body, err)
			}
			if r != nil {
				t.Fatalf("%q: a request beside the error %v", body, err)
			}
			return
		}
		p := r.params
		switch {
		case r.model != "smol" || r.chat != chat:
			t.Fatalf("%q: model %q chat %v", body, r.model, r.chat)
		case p.MaxTokens < 1:
			t.Fatalf("%q: max_tokens %d", body, p.MaxTokens)
		case !(p.Temperature >= 0 && p.Temperature <= 2):
			t.Fatalf("%q: temperature %v", body, p.Temperature)
		case !(p.TopP > 0 && p.TopP <= 1):
			t.Fatalf("%q: top_p %v", body, p.TopP)
		case p.TopK < 0:
			t.Fatalf("%q: top_k %d", body, p.TopK)
		case len(p.Stop) > 4:
			t.Fatalf("%q: %d stop strings", body, len(p.Stop))
		case r.topLogprobs < 0 || r.topLogprobs > 20 || (!chat && r.topLogprobs > 5):
			t.Fatalf("%q: top logprobs %d", body, r.topLogprobs)
		case !r.logprobs && r.topLogprobs != 0:
			t.Fatalf("%q: top logprobs %d without logprobs", body, r.topLogprobs)
		case chat && len(r.msgs) == 0:
			t.Fatalf("%q: a chat request without messages", body)
		}
	})
}

// TestTopLogprobs: chat's top_logprobs is read only beside "logprobs": true; a positive one
// without it, or one outside [0, 20], is refused.
func TestTopLogprobs(t *testing.T) {
	const msgs = `{"model":"smol","messages":[{"role":"user","content":"x"}]`
	for _, c := range []struct {
		extra string
		ok    bool
		top   int
	}{
		{`,"logprobs":true,"top_logprobs":3`, true, 3},
		{`,"logprobs":true,"top_logprobs":20`, true, 20},
		{`,"logprobs":false,"top_logprobs":0`, true, 0},
		{`,"top_logprobs":0`, true, 0},
		{`,"logprobs":false,"top_logprobs":3`, false, 0},
		{`,"top_logprobs":1`, false, 0},
		{`,"logprobs":null,"top_logprobs":1`, false, 0},
		{`,"logprobs":true,"top_logprobs":21`, false, 0},
		{`,"logprobs":true,"top_logprobs":-1`, false, 0},
	} {
		r, err := parseRequest([]byte(msgs+c.extra+"}"), true, only("smol"))
		if (err == nil) != c.ok || (err == nil && r.topLogprobs != c.top) {
			t.Errorf("%s: %+v, %v", c.extra, r, err)
		}
	}
}
