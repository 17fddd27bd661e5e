package oai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

var fuzzSeeds = []string{
	chatBody,
	completionsBody,
	// Keys written entirely in escapes: "messages" takes 48 raw bytes, the most a looked-up
	// name may; one more raw byte can only be another key. And the same key twice, escaped once.
	`{"model":"m","\u006d\u0065\u0073\u0073\u0061\u0067\u0065\u0073":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","\u006d\u0065\u0073\u0073\u0061\u0067\u0065\u0073x":[{"role":"user","content":"hi"}],"messages":[{"role":"user","content":"yo"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"\u006d\u0065\u0073\u0073\u0061\u0067\u0065\u0073":[{"role":"user","content":"yo"}]}`,
	`{"model":"m","prompt":[1,2,3]}`,
	`{"model":"m","prompt":[[1,2],[3]]}`,
	`{"model":"m","prompt":["a","b"]}`,
	`{"mod\u0065l":"m","model":"n","messages":[{"role":"user","content":[{"type":"t\u0065xt","text":"\ud83d\ude00"}]}]}`,
	`{"model":"m","metadata":{"model":"x"},"stream":true,"user":"u"}`,
	`{"model":"\ud800x","prompt":"\udc00\ud800\udc00"}`,
	`{"model":5}`,
	`[1,2]`,
	`{"model":"m"`,
	"{\"model\":\"a\xffb\"}",
	`{"model":"m","n":-0.5e+10}`,
	`{"model":"m","model":"n","prompt":"p"}`,
	`{"model":"m","mod\u0065l":"m","prompt":"p"}`,
	`{"model":"m","logprobs":1,"LogProbs":2,"prompt":"p","messages":[{"role":"u","content":"c"}]}`,
}

// FuzzParse: Parse never panics and agrees with encoding/json on what is
// valid JSON and on every field it returns.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		in := []byte(body)
		stdValid := json.Valid(in) && utf8.Valid(in)
		for _, kind := range []Kind{Completions, Chat} {
			r, err := Parse(kind, in)
			key, keyErr := PrefixKey(kind, in)
			if syntax := err != nil && strings.HasPrefix(err.Error(), "invalid JSON"); syntax == stdValid {
				t.Fatalf("Parse(%v, %q) error %v, but encoding/json validity is %v", kind, body, err, stdValid)
			}
			if keyErr != nil && err == nil {
				t.Fatalf("PrefixKey error %v, but Parse succeeded", keyErr)
			}
			// ParseRendered is Parse plus the whole rendered prompt: the same answer, a render
			// that extends the prefix key, fits in the body, equals RenderPrompt's and is cut,
			// not changed, by a smaller limit.
			rr, rendered, rerr := ParseRendered(kind, in, len(in))
			if (rerr == nil) != (err == nil) || (err != nil && rerr.Error() != err.Error()) {
				t.Fatalf("ParseRendered error %v, Parse error %v", rerr, err)
			}
			if err == nil {
				if d := cmp.Diff(r, rr); d != "" {
					t.Fatalf("ParseRendered(%v, %q) differs from Parse (-Parse +got):\n%s", kind, body, d)
				}
				if !bytes.HasPrefix(rendered, r.PrefixKey) || len(rendered) > len(in) ||
					(len(r.PrefixKey) < PrefixLen && len(rendered) != len(r.PrefixKey)) {
					t.Fatalf("render %q of %q does not extend the key %q", rendered, body, r.PrefixKey)
				}
				if full := RenderPrompt(kind, in, len(in)); !bytes.Equal(full, rendered) {
					t.Fatalf("RenderPrompt %q != ParseRendered's %q", full, rendered)
				}
				if _, cut, _ := ParseRendered(kind, in, 70); !bytes.Equal(cut, rendered[:min(70, len(rendered))]) {
					t.Fatalf("a 70-byte render %q is not the full render's start %q", cut, rendered)
				}
			}
			if string(in) != body {
				t.Fatal("input modified")
			}
			if !stdValid {
				continue // encoding/json would decode invalid UTF-8 as U+FFFD
			}
			ref, refErr := refRequest(kind, in)
			if (err == nil) != (refErr == nil) {
				t.Fatalf("Parse(%v, %q): error %v, reference error %v", kind, body, err, refErr)
			}
			if err != nil {
				continue
			}
			if d := cmp.Diff(ref, r); d != "" {
				t.Fatalf("Parse(%v, %q) differs from the reference (-ref +got):\n%s", kind, body, d)
			}
			if !bytes.Equal(key, r.PrefixKey) {
				t.Fatalf("PrefixKey %q != Parse's %q", key, r.PrefixKey)
			}
			// Field reads a body Parse accepted exactly as encoding/json into a map does.
			var top map[string]json.RawMessage
			if err := json.Unmarshal(in, &top); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"logprobs", "seed", "model"} {
				got, ok := Field(in, name)
				want, wok := top[name]
				if ok != wok || !bytes.Equal(got, want) {
					t.Fatalf("Field(%q) = %q, %v; encoding/json reads %q, %v", name, got, ok, want, wok)
				}
			}
		}
	})
}

// FuzzRewriteModel: RewriteModel never panics; what it returns is valid
// JSON with the new model and every other top-level value byte-identical,
// and Parse reads the same request from it but for the model.
func FuzzRewriteModel(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, "smol-v3")
		f.Add(s, "q\"\\\n\x00é\xff")
	}
	f.Fuzz(func(t *testing.T, body, model string) {
		in := []byte(body)
		out, err := RewriteModel(in, model)
		if string(in) != body {
			t.Fatal("input modified")
		}
		if err != nil {
			if out != nil {
				t.Fatalf("output %q with error %v", out, err)
			}
			return
		}
		if !json.Valid(in) || !utf8.Valid(in) {
			t.Fatalf("RewriteModel accepted invalid JSON %q", body)
		}
		if !json.Valid(out) {
			t.Fatalf("RewriteModel(%q, %q) = %q, not valid JSON", body, model, out)
		}
		var before, after map[string]json.RawMessage
		if err := json.Unmarshal(in, &before); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := json.Unmarshal(after["model"], &got); err != nil || got != validUTF8Model(model) {
			t.Fatalf("model reads back as %q (%v), want %q", got, err, model)
		}
		delete(before, "model")
		delete(after, "model")
		if d := cmp.Diff(before, after); d != "" {
			t.Fatalf("other members changed (-before +after):\n%s", d)
		}
		for _, kind := range []Kind{Completions, Chat} {
			r1, err1 := Parse(kind, in)
			if err1 != nil {
				continue
			}
			r2, err2 := Parse(kind, out)
			if model == "" {
				if err2 == nil {
					t.Fatalf("Parse accepted an empty model")
				}
				continue
			}
			if err2 != nil {
				t.Fatalf("Parse after rewrite: %v", err2)
			}
			r1.Model = validUTF8Model(model)
			if d := cmp.Diff(r1, r2); d != "" {
				t.Fatalf("Parse after rewrite differs (-want +got):\n%s", d)
			}
		}
	})
}
