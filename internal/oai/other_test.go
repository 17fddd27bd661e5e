package oai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestParseOtherEndpoints pins what the gateway reads of the R21 endpoints' JSON bodies: the
// model (required, a string), stream only where the endpoint streams, the Responses fields it
// routes stored responses by, and a prompt for prefix affinity taken from the endpoint's own
// prompt field. Everything else is the engine's to judge.
func TestParseOtherEndpoints(t *testing.T) {
	for _, tc := range []struct {
		kind       Kind
		body       string
		model      string
		stream     bool
		store      bool
		previous   string
		prefix     string
		maxTokens  int64
		wantErrSub string
	}{
		{kind: Embeddings, body: `{"model":"e","input":["a","b"]}`, model: "e", prefix: `["a","b"]`},
		{kind: Embeddings, body: `{"model":"e","input":"x","stream":true}`, model: "e", prefix: `"x"`}, // no stream on embeddings
		{kind: Responses, body: `{"model":"r","input":"hi","stream":true}`, model: "r", stream: true, store: true, prefix: `"hi"`},
		{kind: Responses, body: `{"model":"r","input":"hi","store":false,"previous_response_id":"resp_1","max_output_tokens":9}`,
			model: "r", previous: "resp_1", prefix: `"hi"`, maxTokens: 9},
		{kind: Responses, body: `{"model":"r","store":"yes"}`, wantErrSub: `"store" must be a boolean`},
		{kind: Responses, body: `{"model":"r","previous_response_id":"a/b"}`, wantErrSub: "previous_response_id"},
		{kind: Responses, body: `{"model":"r","previous_response_id":7}`, wantErrSub: "previous_response_id"},
		{kind: Messages, body: `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"x"}],"stream":true}`,
			model: "m", stream: true, prefix: `[{"role":"user","content":"x"}]`, maxTokens: 64},
		{kind: ChatRender, body: `{"model":"c","messages":[]}`, model: "c", prefix: `[]`},
		{kind: CompletionsRender, body: `{"model":"c","prompt":"p"}`, model: "c", prefix: `"p"`},
		{kind: Tokenize, body: `{"model":"t","prompt":"p"}`, model: "t"},
		{kind: Rerank, body: `{"model":"k","query":"q","documents":["d"]}`, model: "k", prefix: `"q"`},
		{kind: Score, body: `{"model":"s","text_1":"a","text_2":"b"}`, model: "s"},
		{kind: Pooling, body: `{"model":"p","input":"i"}`, model: "p", prefix: `"i"`},
		{kind: Detokenize, body: `{"tokens":[1]}`, wantErrSub: `"model" is required`},
		{kind: Embeddings, body: `{"model":1}`, wantErrSub: `"model" must be a string`},
		{kind: Embeddings, body: `{"model":"a","model":"b"}`, wantErrSub: "model"},
		{kind: Embeddings, body: `{"model":"a"`, wantErrSub: "invalid JSON"},
		{kind: Transcriptions, body: `{"model":"a"}`, wantErrSub: "unknown request kind"},
	} {
		t.Run(tc.kind.String()+"/"+tc.body, func(t *testing.T) {
			r, err := Parse(tc.kind, []byte(tc.body))
			if tc.wantErrSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErrSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Model != tc.model || r.Stream != tc.stream || r.Store != tc.store || r.Previous != tc.previous {
				t.Fatalf("got model %q stream %v store %v previous %q", r.Model, r.Stream, r.Store, r.Previous)
			}
			want := tc.prefix
			if len(want) > PrefixLen {
				want = want[:PrefixLen]
			}
			if string(r.PrefixKey) != want {
				t.Fatalf("prefix key %q, want %q", r.PrefixKey, want)
			}
			if got := string(RenderPrompt(tc.kind, []byte(tc.body), 1<<10)); got != tc.prefix {
				t.Fatalf("render %q, want %q", got, tc.prefix)
			}
			if r.Cost.MaxTokens != tc.maxTokens {
				t.Fatalf("max tokens %d, want %d", r.Cost.MaxTokens, tc.maxTokens)
			}
		})
	}
}

// form builds a multipart body with the given fields (in order) and a file part.
func form(t testing.TB, fields [][2]string) ([]byte, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range fields {
		if err := mw.WriteField(f[0], f[1]); err != nil {
			t.Fatal(err)
		}
	}
	fw, err := mw.CreateFormFile("file", "a.wav")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write([]byte("RIFF\x00\x01audio--bytes\r\n--not-a-boundary"))
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), mw.FormDataContentType()
}

// TestParseMultipart pins the audio form's routing fields: the model from the form, stream,
// and the refusals that keep the gateway and the engine reading the same form.
func TestParseMultipart(t *testing.T) {
	body, ct := form(t, [][2]string{{"model", "whisper"}, {"language", "en"}, {"stream", "true"}})
	r, err := ParseMultipart(Transcriptions, ct, body)
	if err != nil || r.Model != "whisper" || !r.Stream {
		t.Fatalf("got %+v, %v", r, err)
	}
	for name, tc := range map[string]struct {
		fields [][2]string
		ct     string
		want   string
	}{
		"no model":     {fields: [][2]string{{"language", "en"}}, want: `"model" is required`},
		"two models":   {fields: [][2]string{{"model", "a"}, {"model", "b"}}, want: "model"},
		"bad stream":   {fields: [][2]string{{"model", "a"}, {"stream", "maybe"}}, want: "stream"},
		"long model":   {fields: [][2]string{{"model", strings.Repeat("m", 300)}}, want: "model"},
		"space model":  {fields: [][2]string{{"model", "a b"}}, want: "model"},
		"not a form":   {fields: [][2]string{{"model", "a"}}, ct: "application/json", want: "multipart/form-data"},
		"no boundary":  {fields: [][2]string{{"model", "a"}}, ct: "multipart/form-data", want: "boundary"},
		"wrong border": {fields: [][2]string{{"model", "a"}}, ct: "multipart/form-data; boundary=zzz", want: `"model" is required`},
	} {
		t.Run(name, func(t *testing.T) {
			body, ct := form(t, tc.fields)
			if tc.ct != "" {
				ct = tc.ct
			}
			_, err := ParseMultipart(Translations, ct, body)
			var e *Error
			if err == nil || !errors.As(err, &e) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want an *Error containing %q", err, tc.want)
			}
		})
	}
	var many [][2]string
	for range MaxFormParts + 1 {
		many = append(many, [2]string{"x", "y"})
	}
	body, ct = form(t, append([][2]string{{"model", "a"}}, many...))
	if _, err := ParseMultipart(Transcriptions, ct, body); err == nil || !strings.Contains(err.Error(), "64 parts") {
		t.Fatalf("a form of %d parts: %v", MaxFormParts+2, err)
	}
}

// readForm is every part of a form as the standard library reads it: name and raw bytes.
func readForm(body []byte, boundary string) ([][2]string, error) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var out [][2]string
	for range 1000 {
		p, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(p)
		if err != nil {
			return nil, err
		}
		out = append(out, [2]string{p.FormName(), string(b)})
	}
	return out, nil
}

// TestRewriteFormField: the served model replaces the form's model value and nothing else
// changes, as the standard library's reader sees the form.
func TestRewriteFormField(t *testing.T) {
	body, ct := form(t, [][2]string{{"language", "en"}, {"model", "public"}, {"prompt", "model"}})
	b, _ := FormBoundary(ct)
	out, err := RewriteFormField(body, b, "model", "served-v2")
	if err != nil {
		t.Fatal(err)
	}
	checkRewrite(t, body, out, b, "served-v2")
	if _, err := RewriteFormField(body, b, "absent", "x"); err == nil {
		t.Fatal("a missing field was rewritten")
	}
}

func checkRewrite(t testing.TB, body, out []byte, boundary, value string) {
	before, err := readForm(body, boundary)
	if err != nil {
		t.Fatal(err)
	}
	after, err := readForm(out, boundary)
	if err != nil {
		t.Fatalf("the rewritten form does not parse: %v", err)
	}
	if len(before) != len(after) {
		t.Fatalf("parts %d → %d", len(before), len(after))
	}
	for i := range before {
		want := before[i]
		if want[0] == "model" {
			want[1] = value
		}
		if after[i] != want {
			t.Fatalf("part %d: %q, want %q", i, after[i], want)
		}
	}
}

// FuzzMultipart holds ParseMultipart and RewriteFormField to the standard library's reader:
// whatever form is accepted, its model is the one the reader sees, and a rewrite changes that
// value only.
func FuzzMultipart(f *testing.F) {
	body, ct := form(f, [][2]string{{"model", "m"}, {"stream", "false"}})
	b, _ := FormBoundary(ct)
	f.Add(body, b)
	f.Add([]byte("--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--x--\r\n"), "x")
	f.Add([]byte("--x\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nA\r\n--xY\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nevil\r\n--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nreal\r\n--x--\r\n"), "x")
	f.Add([]byte("preamble\r\n--x\r\n\r\nno headers\r\n--x\r\nContent-Disposition: form-data; name=model\r\n\r\nq\r\n--x--"), "x")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		ct := "multipart/form-data; boundary=\"" + strings.ReplaceAll(boundary, `"`, "") + "\""
		r, err := ParseMultipart(Transcriptions, ct, body)
		if err != nil {
			return
		}
		bd, _ := FormBoundary(ct)
		parts, err := readForm(body, bd)
		if err != nil {
			t.Fatalf("accepted a form the reader refuses: %v", err)
		}
		found := false
		for _, p := range parts {
			if p[0] == "model" {
				if found || p[1] != r.Model {
					t.Fatalf("model %q, the reader sees %q", r.Model, p[1])
				}
				found = true
			}
		}
		out, err := RewriteFormField(body, bd, "model", "rewritten")
		if err != nil {
			t.Fatalf("could not rewrite an accepted form's model: %v", err)
		}
		checkRewrite(t, body, out, bd, "rewritten")
		out2, err := RewriteMultipartModel(Transcriptions, ct, body, "rewritten")
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("RewriteMultipartModel: %v, or another result than RewriteFormField's", err)
		}
	})
}

// TestRewriteSkipsADelimiterLookalike: a file whose bytes hold the boundary followed by other
// characters (no delimiter to the standard reader), then a fake model part, is rewritten at
// the real model field, and the result reads back with the new model.
func TestRewriteSkipsADelimiterLookalike(t *testing.T) {
	body := []byte("--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nAAA" +
		"\r\n--xY\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nevil" +
		"\r\n--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nreal\r\n--x--\r\n")
	ct := `multipart/form-data; boundary=x`
	r, err := ParseMultipart(Transcriptions, ct, body)
	if err != nil || r.Model != "real" {
		t.Fatalf("parse: %+v %v", r, err)
	}
	out, err := RewriteMultipartModel(Transcriptions, ct, body, "served")
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Replace(body, []byte("\r\n\r\nreal\r\n"), []byte("\r\n\r\nserved\r\n"), 1)
	if !bytes.Equal(out, want) {
		t.Fatalf("rewritten:\n%q\nwant\n%q", out, want)
	}
	// Transport padding after a delimiter is a delimiter still.
	padded := []byte("--x  \r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--x \t\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nz\r\n--x--")
	if out, err := RewriteMultipartModel(Transcriptions, ct, padded, "n"); err != nil || !bytes.Contains(out, []byte("\r\n\r\nn\r\n--x \t")) {
		t.Fatalf("padded delimiters: %q %v", out, err)
	}
	// A form the rewrite cannot land in is refused, not relayed.
	if _, err := RewriteMultipartModel(Transcriptions, ct, []byte("--x--"), "n"); err == nil {
		t.Fatal("a form without a model rewritten")
	}
}

// FuzzParseOther holds Parse of the R21 JSON endpoints to encoding/json: the same validity, and
// for an accepted body the model, stream and Responses fields encoding/json reads, and a prefix
// key cut from the prompt field's raw value.
func FuzzParseOther(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Add(`{"model":"r","input":"hi","store":false,"previous_response_id":"resp_1","stream":true}`)
	f.Add(`{"model":"m","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		in := []byte(body)
		stdValid := json.Valid(in) && utf8.Valid(in)
		for _, kind := range Kinds() {
			if kind <= Chat || kind.Multipart() {
				continue
			}
			r, err := Parse(kind, in)
			if syntax := err != nil && strings.HasPrefix(err.Error(), "invalid JSON"); syntax == stdValid {
				t.Fatalf("Parse(%v, %q) error %v, but encoding/json validity is %v", kind, body, err, stdValid)
			}
			if err != nil || !stdValid {
				continue
			}
			var top map[string]json.RawMessage
			if err := json.Unmarshal(in, &top); err != nil {
				t.Fatal(err)
			}
			var model string
			if err := json.Unmarshal(top["model"], &model); err != nil || model != r.Model {
				t.Fatalf("model %q, encoding/json reads %q (%v)", r.Model, model, err)
			}
			var stream bool
			_ = json.Unmarshal(top["stream"], &stream)
			if r.Stream != (stream && kind.Streams()) {
				t.Fatalf("%v: stream %v, encoding/json reads %v", kind, r.Stream, stream)
			}
			if kind == Responses {
				store := true
				if v, ok := top["store"]; ok && string(v) != "null" {
					_ = json.Unmarshal(v, &store)
				}
				var prev string
				_ = json.Unmarshal(top["previous_response_id"], &prev)
				if r.Store != store || r.Previous != prev {
					t.Fatalf("store %v previous %q, encoding/json reads %v %q", r.Store, r.Previous, store, prev)
				}
			}
			var raw json.RawMessage
			if name := endpoints[kind].prompt; name != "" {
				raw = top[name]
			}
			if !bytes.HasPrefix(raw, r.PrefixKey) || len(r.PrefixKey) != min(len(raw), PrefixLen) {
				t.Fatalf("%v: prefix key %q is not the start of %q", kind, r.PrefixKey, raw)
			}
		}
	})
}

// TestMultipartBounds pins the form's edges: a 70-character boundary and 64 parts are
// accepted, 71 and 65 are not; a 256-byte model is, 257 is not; '~' is a model character.
func TestMultipartBounds(t *testing.T) {
	if _, err := FormBoundary("multipart/form-data; boundary=" + strings.Repeat("b", 70)); err != nil {
		t.Fatalf("70: %v", err)
	}
	if _, err := FormBoundary("multipart/form-data; boundary=" + strings.Repeat("b", 71)); err == nil {
		t.Fatal("a 71-character boundary accepted")
	}
	parts := func(n int) [][2]string { // the model and the file make 2
		out := [][2]string{{"model", "m~1"}}
		for range n - 2 {
			out = append(out, [2]string{"x", "y"})
		}
		return out
	}
	body, ct := form(t, parts(MaxFormParts))
	if r, err := ParseMultipart(Transcriptions, ct, body); err != nil || r.Model != "m~1" {
		t.Fatalf("%d parts: %v %v", MaxFormParts, r, err)
	}
	body, ct = form(t, parts(MaxFormParts+1))
	if _, err := ParseMultipart(Transcriptions, ct, body); err == nil {
		t.Fatalf("%d parts accepted", MaxFormParts+1)
	}
	for n, ok := range map[int]bool{256: true, 257: false} {
		body, ct := form(t, [][2]string{{"model", strings.Repeat("m", n)}})
		if _, err := ParseMultipart(Transcriptions, ct, body); (err == nil) != ok {
			t.Fatalf("a %d-byte model: %v", n, err)
		}
	}
}

// TestRewriteFormFieldShapes: the rewrite finds the model after the shapes a form may take
// before it — a preamble line, transport padding after a delimiter, a part without headers, an
// empty value — as the standard library's reader does.
func TestRewriteFormFieldShapes(t *testing.T) {
	for name, body := range map[string]string{
		"preamble":      "\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nold\r\n--b--\r\n",
		"padding":       "--b  \r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b \t\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nold\r\n--b--\r\n",
		"no headers":    "--b\r\n\r\nanonymous\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nold\r\n--b--\r\n",
		"empty value":   "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nold\r\n--b--\r\n",
		"model is last": "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\nContent-Type: audio/wav\r\n\r\n--bx\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nold\r\n--b--\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseMultipart(Transcriptions, "multipart/form-data; boundary=b", []byte(body)); err != nil {
				t.Fatalf("not a form the gateway accepts: %v", err)
			}
			out, err := RewriteFormField([]byte(body), "b", "model", "new")
			if err != nil {
				t.Fatal(err)
			}
			checkRewrite(t, []byte(body), out, "b", "new")
		})
	}
}

// TestValidResponseIDBounds: 1 to MaxResponseIDLen bytes from '!' to '~', without '/', '?',
// '#' or '%'.
func TestValidResponseIDBounds(t *testing.T) {
	for _, c := range []struct {
		id   string
		want bool
	}{
		{"", false}, {"a", true}, {strings.Repeat("a", MaxResponseIDLen), true}, {strings.Repeat("a", MaxResponseIDLen+1), false},
		{"!", true}, {"~", true}, {" ", false}, {"\x7f", false}, {"a b", false}, {"a/b", false}, {"a?b", false},
		{"a#b", false}, {"a%2F", false}, {"resp_abc-123", true},
	} {
		if got := ValidResponseID(c.id); got != c.want {
			t.Errorf("ValidResponseID(%q) = %v, want %v", c.id, got, c.want)
		}
		body := `{"model":"m","input":"x","previous_response_id":"` + c.id + `"}`
		r, err := Parse(Responses, []byte(body))
		if c.want != (err == nil) || (err == nil && r.Previous != c.id) {
			t.Errorf("Parse with previous_response_id %q: %v %q", c.id, err, r.Previous)
		}
	}
}

// TestOtherCostCountsThePromptField: an endpoint's prompt is its prompt field's raw bytes
// (quotes included) at 4 bytes a token, rounded up; Messages and Responses add what they may
// generate.
func TestOtherCostCountsThePromptField(t *testing.T) {
	for _, c := range []struct {
		kind   Kind
		body   string
		prompt int64
		max    int64
	}{
		{Embeddings, `{"model":"m","input":"ab"}`, 1, 0},     // "ab" is 4 bytes
		{Embeddings, `{"model":"m","input":"abc"}`, 2, 0},    // 5 bytes
		{Embeddings, `{"model":"m","input":"abcdef"}`, 2, 0}, // 8 bytes
		{Responses, `{"model":"m","input":"abcdefg","max_output_tokens":9}`, 3, 9},
		{Messages, `{"model":"m","max_tokens":7,"messages":[]}`, 1, 7},
	} {
		r, err := Parse(c.kind, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if r.Cost.PromptTokens != c.prompt || r.Cost.MaxTokens != c.max {
			t.Errorf("%s: prompt %d max %d, want %d and %d", c.body, r.Cost.PromptTokens, r.Cost.MaxTokens, c.prompt, c.max)
		}
	}
}
