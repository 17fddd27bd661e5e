package oai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func TestRewriteModel(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		model string
		want  string
	}{
		{"simple", `{"model":"smol","prompt":"x"}`, "smol-v3",
			`{"model":"smol-v3","prompt":"x"}`},
		{"whitespace, order and numbers preserved", "{ \"temperature\" : 1.50,\n\t\"model\"\t:\r\n \"smol\" , \"seed\":1E+03,\"max_tokens\":16 }\n", "big",
			"{ \"temperature\" : 1.50,\n\t\"model\"\t:\r\n \"big\" , \"seed\":1E+03,\"max_tokens\":16 }\n"},
		{"nested model keys untouched", `{"metadata":{"model":"keep"},"model":"smol","tools":[{"model":"keep2"}]}`, "big",
			`{"metadata":{"model":"keep"},"model":"big","tools":[{"model":"keep2"}]}`},
		{"escaped key", `{"mod\u0065l":"smol","x":"\u00e9"}`, "big",
			`{"mod\u0065l":"big","x":"\u00e9"}`},
		{"fully escaped key", `{"\u006d\u006F\u0064\u0065\u006c":"smol"}`, "big",
			`{"\u006d\u006F\u0064\u0065\u006c":"big"}`},
		{"duplicate top-level model keys", `{"model":"a","x":1,"model":"b"}`, "c",
			`{"model":"c","x":1,"model":"c"}`},
		{"other case is another key", `{"Model":"a","model":"b","models":["c"]}`, "z",
			`{"Model":"a","model":"z","models":["c"]}`},
		{"key containing model is another key", `{"model_x":"a","model":"b","xmodel":"c"}`, "z",
			`{"model_x":"a","model":"z","xmodel":"c"}`},
		{"non-string value replaced", `{"model":{"a":[1,2]},"p":null}`, "z",
			`{"model":"z","p":null}`},
		{"strings with quotes and braces", `{"p":"{\"model\":\"no\"}","model":"a","q":"]}"}`, "z",
			`{"p":"{\"model\":\"no\"}","model":"z","q":"]}"}`},
		{"model needing escapes", `{"model":"a"}`, "x\"y\\z\n\x01é",
			`{"model":"x\"y\\z\n\u0001é"}`},
		{"invalid UTF-8 in model", `{"model":"a"}`, "a\xffb",
			`{"model":"a\ufffdb"}`},
		{"long model", `{"model":"a"}`, strings.Repeat("m", 300),
			`{"model":"` + strings.Repeat("m", 300) + `"}`},
		{"empty model", `{"model":"a"}`, "",
			`{"model":""}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.body)
			got, err := RewriteModel(in, tc.model)
			if err != nil {
				t.Fatalf("RewriteModel: %v", err)
			}
			if string(got) != tc.want {
				t.Errorf("RewriteModel =\n%s\nwant\n%s", got, tc.want)
			}
			if string(in) != tc.body {
				t.Errorf("input modified: %s", in)
			}
			if !json.Valid(got) {
				t.Errorf("output is not valid JSON")
			}
		})
	}
}

func TestRewriteModelErrors(t *testing.T) {
	tests := []struct{ name, body, msg string }{
		{"empty", ``, `invalid JSON: empty body`},
		{"truncated", `{"model":"a"`, `invalid JSON: unexpected end of input`},
		{"garbage after", `{"model":"a"}x`, `invalid JSON: unexpected data after the top-level value at offset 13`},
		{"not an object", `["model","a"]`, `request body must be a JSON object`},
		{"no model", `{"metadata":{"model":"a"}}`, `"model" is required`},
		{"broken value after model", `{"model":"a","x":[}`, `invalid JSON: unexpected character '}' at offset 18`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := RewriteModel([]byte(tc.body), "z")
			if err == nil {
				t.Fatalf("RewriteModel = %s, want an error", out)
			}
			if err.Error() != tc.msg {
				t.Errorf("error = %q, want %q", err, tc.msg)
			}
		})
	}
}

// jsonGen writes a random JSON document in random but valid spellings and
// remembers where the values of its top-level "model" keys are, so a test
// knows independently of the scanner which bytes a rewrite may change.
type jsonGen struct {
	t      *rapid.T
	b      []byte
	models []span
}

func (g *jsonGen) ws() {
	g.b = append(g.b, rapid.SampledFrom([]string{"", "", " ", "\n", "\t", " \r\n  "}).Draw(g.t, "ws")...)
}

// str writes s as a JSON string, spelling each rune in a randomly chosen way.
func (g *jsonGen) str(s string) {
	g.b = append(g.b, '"')
	for _, r := range s {
		short := map[rune]string{'"': `\"`, '\\': `\\`, '\n': `\n`, '\t': `\t`, '\r': `\r`, '\b': `\b`, '\f': `\f`, '/': `\/`}[r]
		switch mode := rapid.IntRange(0, 2).Draw(g.t, "esc"); {
		case mode == 1 && short != "":
			g.b = append(g.b, short...)
		case mode == 2 || r < 0x20 || r == '"' || r == '\\':
			if r >= 0x10000 {
				r -= 0x10000
				g.b = fmt.Appendf(g.b, `\u%04x\u%04X`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			} else {
				g.b = fmt.Appendf(g.b, rapid.SampledFrom([]string{`\u%04x`, `\u%04X`}).Draw(g.t, "hex"), r)
			}
		default:
			g.b = utf8.AppendRune(g.b, r)
		}
	}
	g.b = append(g.b, '"')
}

var genText = rapid.StringOfN(rapid.SampledFrom([]rune{'a', 'm', 'o', 'd', 'e', 'l', ' ', '"', '\\', '/', '\n', '\x01', '{', '}', '[', ']', ':', ',', 'é', '€', '😀', '\u2028'}), 0, 8, -1)

var genKey = rapid.SampledFrom([]string{"model", "Model", "models", "mode", "prompt", "stream", "messages", "x", "", "é"})

func (g *jsonGen) value(depth int) {
	kind := rapid.IntRange(0, 6).Draw(g.t, "kind")
	if depth > 3 && kind >= 5 {
		kind = 0
	}
	switch kind {
	case 0:
		g.b = append(g.b, rapid.SampledFrom([]string{"null", "true", "false"}).Draw(g.t, "lit")...)
	case 1, 2:
		g.b = append(g.b, rapid.SampledFrom([]string{"0", "-0", "12", "1.50", "1e3", "1E+03", "-2.5e-10", "123456789012345678901234567890", "0.0"}).Draw(g.t, "num")...)
	case 3, 4:
		g.str(genText.Draw(g.t, "text"))
	case 5:
		g.b = append(g.b, '[')
		n := rapid.IntRange(0, 3).Draw(g.t, "len")
		for i := range n {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.ws()
			g.value(depth + 1)
			g.ws()
		}
		g.b = append(g.b, ']')
	case 6:
		g.object(depth+1, false)
	}
}

func (g *jsonGen) object(depth int, top bool) {
	g.b = append(g.b, '{')
	n := rapid.IntRange(0, 5).Draw(g.t, "members")
	for i := range n {
		if i > 0 {
			g.b = append(g.b, ',')
		}
		g.ws()
		key := genKey.Draw(g.t, "key")
		g.str(key)
		g.ws()
		g.b = append(g.b, ':')
		g.ws()
		start := len(g.b)
		g.value(depth)
		if top && key == "model" {
			g.models = append(g.models, span{start, len(g.b)})
		}
		g.ws()
	}
	g.b = append(g.b, '}')
}

func decodeAny(t *rapid.T, b []byte) map[string]any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return m
}

// TestRewriteModelProperty: on random objects, a rewrite decodes to the same
// value but for model, and only the bytes of top-level model values change.
func TestRewriteModelProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := &jsonGen{t: t}
		g.ws()
		g.object(1, true)
		g.ws()
		body := g.b
		model := rapid.String().Draw(t, "model")

		out, err := RewriteModel(body, model)
		if len(g.models) == 0 {
			if err == nil {
				t.Fatalf("no model key in %q, but RewriteModel succeeded", body)
			}
			return
		}
		if err != nil {
			t.Fatalf("RewriteModel(%q): %v", body, err)
		}

		want := decodeAny(t, body)
		want["model"] = model
		if d := cmp.Diff(want, decodeAny(t, out)); d != "" {
			t.Fatalf("decoded rewrite differs (-want +got):\n%s\nbody %q\nout  %q", d, body, out)
		}

		// Walk body and out together: equal bytes outside the model spans,
		// and each replacement is a JSON string for model.
		grow := len(out) - len(body)
		for _, sp := range g.models {
			grow += sp.end - sp.start
		}
		repl := grow / len(g.models)
		bi, oi := 0, 0
		for _, sp := range g.models {
			n := sp.start - bi
			if !bytes.Equal(body[bi:sp.start], out[oi:oi+n]) {
				t.Fatalf("bytes before a model value changed:\nbody %q\nout  %q", body, out)
			}
			oi += n
			var got string
			if err := json.Unmarshal(out[oi:oi+repl], &got); err != nil || got != model {
				t.Fatalf("replacement %q = %q (%v), want %q", out[oi:oi+repl], got, err, model)
			}
			oi += repl
			bi = sp.end
		}
		if !bytes.Equal(body[bi:], out[oi:]) {
			t.Fatalf("bytes after the last model value changed:\nbody %q\nout  %q", body, out)
		}
	})
}

func TestRewriteModelAllocs(t *testing.T) {
	body := []byte(completionsBody)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := RewriteModel(body, "smol-v3"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 1 {
		t.Errorf("RewriteModel allocates %v times, want 1", allocs)
	}
}

func TestParseAllocs(t *testing.T) {
	body := []byte(chatBody)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Parse(Chat, body); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 { // Model, User, PrefixKey
		t.Errorf("Parse allocates %v times, want at most 3", allocs)
	}
}

// TestDeleteField: a top-level member goes with its comma, wherever it sits; nested ones and
// other bytes stay; a body without it is returned as is; bad JSON is an error.
func TestDeleteField(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":1,"stream_options":{"include_usage":true},"b":2}`, `{"a":1,"b":2}`},
		{`{"stream_options":null, "a":1}`, `{"a":1}`},
		{`{"a":1 , "stream_options":{}}`, `{"a":1}`},
		{`{"stream_options":{}}`, `{}`},
		{`{"stream\u005foptions":1,"a":{"stream_options":1}}`, `{"a":{"stream_options":1}}`},
		{`{"a":1,"stream_options":1,"stream_options":2,"b":3}`, `{"a":1,"b":3}`},
		{`{"stream_options":1,"stream_options":2}`, `{}`},
		{`{"a":1}`, `{"a":1}`},
	} {
		got, err := DeleteField([]byte(c.in), "stream_options")
		if err != nil || string(got) != c.want {
			t.Errorf("DeleteField(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
		if !json.Valid(got) {
			t.Errorf("DeleteField(%s) = %s: not JSON", c.in, got)
		}
	}
	for _, bad := range []string{``, `[1]`, `{"a":}`, `{"a":1} x`} {
		if _, err := DeleteField([]byte(bad), "a"); err == nil {
			t.Errorf("DeleteField(%q): no error", bad)
		}
	}
}
