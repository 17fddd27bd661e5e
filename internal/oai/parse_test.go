package oai

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestPrefixKey(t *testing.T) {
	long := strings.Repeat("abcdefghij", 10) // 100 bytes
	tests := []struct {
		name string
		kind Kind
		body string
		want string
	}{
		{"chat role and content in order", Chat,
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
			"system\nBe brief.\nuser\nHi\n"},
		{"chat keys in any order", Chat,
			`{"messages":[{"content":"Hi","role":"user","name":"bob"}],"model":"m"}`,
			"user\nHi\n"},
		{"chat cut at 64 bytes", Chat,
			`{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`,
			("user\n" + long)[:64]},
		{"chat cut inside a later message", Chat,
			`{"model":"m","messages":[{"role":"system","content":"` + long[:50] + `"},{"role":"user","content":"xyz"}]}`,
			("system\n" + long[:50] + "\nuser\nxyz\n")[:64]},
		{"chat null and missing content", Chat,
			`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[]},{"role":"tool"}]}`,
			"assistant\n\ntool\n\n"},
		{"chat text parts concatenated, other parts skipped", Chat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Look "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"here"}]}]}`,
			"user\nLook here\n"},
		{"chat escapes decoded", Chat,
			`{"model":"m","messages":[{"r\u006fle":"user","content":"caf\u00e9\n\"q\" \ud83d\ude00"}]}`,
			"user\ncafé\n\"q\" 😀\n"},
		{"chat cut may split a UTF-8 sequence", Chat,
			`{"model":"m","messages":[{"role":"user","content":"` + long[:58] + `é"}]}`,
			("user\n" + long[:58] + "é")[:64]},
		{"chat escaped part type", Chat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"t\u0065xt","text":"ok"}]}]}`,
			"user\nok\n"},
		{"completions string", Completions,
			`{"model":"m","prompt":"Once upon a time"}`,
			"Once upon a time"},
		{"completions string cut", Completions,
			`{"model":"m","prompt":"` + long + `"}`,
			long[:64]},
		{"completions empty string", Completions,
			`{"model":"m","prompt":""}`,
			""},
		{"completions escaped string", Completions,
			`{"model":"m","prompt":"a\tb\\c\/d"}`,
			"a\tb\\c/d"},
		{"completions array of strings takes the first", Completions,
			`{"model":"m","prompt":["first","second"]}`,
			"first"},
		{"completions token ids", Completions,
			`{"model":"m","prompt":[1, 22 ,333,0,4294967295]}`,
			"1 22 333 0 4294967295"},
		{"completions token-id arrays take the first", Completions,
			`{"model":"m","prompt":[[10,20],[30]]}`,
			"10 20"},
		{"completions token ids cut", Completions,
			`{"model":"m","prompt":[` + strings.Repeat("123456789,", 20) + `1]}`,
			strings.Repeat("123456789 ", 7)[:64]},
		{"duplicate prompt: last wins (Parse refuses it)", Completions,
			`{"prompt":"old","prompt":"new"}`,
			"new"},
		{"no model needed for the key", Completions,
			`{"prompt":"p"}`,
			"p"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PrefixKey(tc.kind, []byte(tc.body))
			if err != nil {
				t.Fatalf("PrefixKey: %v", err)
			}
			if string(got) != tc.want {
				t.Errorf("PrefixKey = %q, want %q", got, tc.want)
			}
			if len(got) > PrefixLen {
				t.Errorf("len = %d > %d", len(got), PrefixLen)
			}
			if got == nil {
				t.Errorf("PrefixKey is nil")
			}
			if strings.Contains(tc.body, `"model"`) {
				r, err := Parse(tc.kind, []byte(tc.body))
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if string(r.PrefixKey) != tc.want {
					t.Errorf("Parse PrefixKey = %q, want %q", r.PrefixKey, tc.want)
				}
			}
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		body string
		want Request
	}{
		{"minimal chat", Chat,
			`{"model":"smol","messages":[{"role":"user","content":"hi"}]}`,
			Request{Model: "smol", PrefixKey: []byte("user\nhi\n")}},
		{"stream and user", Completions,
			` {"user":"u-1","stream":true,"model":"smol","prompt":"x","max_tokens":5} `,
			Request{Model: "smol", Stream: true, User: "u-1", PrefixKey: []byte("x")}},
		{"nulls are absent", Completions,
			`{"model":"smol","stream":null,"user":null,"prompt":"x"}`,
			Request{Model: "smol", PrefixKey: []byte("x")}},
		{"stream false", Completions,
			`{"model":"smol","stream":false,"prompt":"x"}`,
			Request{Model: "smol", PrefixKey: []byte("x")}},
		{"escaped model and key", Completions,
			`{"mod\u0065l":"sm\u006fl\/v1","prompt":"x"}`,
			Request{Model: "smol/v1", PrefixKey: []byte("x")}},
		{"case variants are other keys", Completions,
			`{"model":"a","logprobs":1,"LogProbs":null,"LOGPROBS":2,"prompt":"x"}`,
			Request{Model: "a", PrefixKey: []byte("x")}},
		{"nested objects may repeat keys", Completions,
			`{"model":"a","metadata":{"k":1,"k":2},"prompt":"x"}`,
			Request{Model: "a", PrefixKey: []byte("x")}},
		{"keys are case-sensitive", Completions,
			`{"Model":"a","model":"b","STREAM":"yes","prompt":"x"}`,
			Request{Model: "b", PrefixKey: []byte("x")}},
		{"nested model ignored", Completions,
			`{"model":"b","metadata":{"model":5},"prompt":"x"}`,
			Request{Model: "b", PrefixKey: []byte("x")}},
		{"unknown fields of any shape", Chat,
			`{"model":"m","messages":[{"role":"user","content":"c"}],"logprobs":true,"seed":-1.5e3,"stop":["\n"],"x":{"y":[[],{}]}}`,
			Request{Model: "m", PrefixKey: []byte("user\nc\n")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.kind, []byte(tc.body))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			// The Cost has its own tests (cost_test.go).
			if d := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(Request{}, "Cost")); d != "" {
				t.Errorf("Parse (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name      string
		kind      Kind
		body      string
		msg       string // the exact message, or a prefix ending in "…"
		wantParam string
	}{
		{"empty", Chat, ``, `invalid JSON: empty body`, ""},
		{"whitespace only", Chat, " \n", `invalid JSON: empty body`, ""},
		{"truncated", Chat, `{"model":"m"`, `invalid JSON: unexpected end of input`, ""},
		{"bad token", Chat, `{"model":x}`, `invalid JSON: unexpected character 'x' at offset 9`, ""},
		{"trailing comma", Chat, `{"model":"m",}`, `invalid JSON: unexpected character '}' at offset 13`, ""},
		{"trailing data", Chat, `{"model":"m"} {}`, `invalid JSON: unexpected data after the top-level value at offset 14`, ""},
		{"stray byte", Chat, "{\"model\":\"m\"\x01}", `invalid JSON: unexpected byte 0x1 at offset 12`, ""},
		{"stray DEL", Chat, "{\"model\":\"m\"\x7f}", `invalid JSON: unexpected byte 0x7f at offset 12`, ""},
		{"stray tilde", Chat, "{\"model\":\"m\"~}", `invalid JSON: unexpected character '~' at offset 12`, ""},
		{"single quotes", Chat, `{'model':'m'}`, `invalid JSON: unexpected character '\'' at offset 1`, ""},
		{"bad escape", Chat, `{"model":"\x"}`, `invalid JSON: invalid escape character 'x' at offset 11`, ""},
		{"bad unicode escape", Chat, `{"model":"\u12g4"}`, `invalid JSON: invalid \u escape at offset 14`, ""},
		{"raw newline in string", Chat, "{\"model\":\"a\nb\"}", `invalid JSON: control character in string at offset 11`, ""},
		{"invalid UTF-8", Chat, "{\"model\":\"a\xffb\"}", `invalid JSON: invalid UTF-8 in string at offset 11`, ""},
		{"bad number", Chat, `{"model":"m","n":01}`, `invalid JSON: unexpected character '1' at offset 18`, ""},
		{"bad exponent", Chat, `{"model":"m","n":1e}`, `invalid JSON: invalid number at offset 19`, ""},
		{"error deep in an unknown field", Chat, `{"model":"m","x":[{"a":[tru]}]}`, `invalid JSON: unexpected character ']' at offset 27`, ""},
		{"too deep", Chat, `{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`, `invalid JSON: nesting too deep at offset 10004`, ""},
		{"array body", Chat, `[{"model":"m"}]`, `request body must be a JSON object`, ""},
		{"string body", Chat, `"model"`, `request body must be a JSON object`, ""},
		{"null body", Chat, `null`, `request body must be a JSON object`, ""},
		{"duplicate model", Chat, `{"model":"a","model":"b"}`, `duplicate key "model" in the request body`, "model"},
		{"duplicate escaped key", Chat, `{"model":"a","mod\u0065l":"a"}`, `duplicate key "model" in the request body`, "model"},
		{"duplicate unknown key", Chat, `{"model":"a","logprobs":true,"x":1,"logprobs":false}`, `duplicate key "logprobs" in the request body`, "logprobs"},
		{"duplicate among many keys", Chat, `{` + manyKeys(40) + `,"k7":0}`, `duplicate key "k7" in the request body`, "k7"},
		{"duplicate key of the quoted length", Chat, `{"model":"a","` + strings.Repeat("k", 64) + `":1,"` + strings.Repeat("k", 64) + `":2}`,
			`duplicate key "` + strings.Repeat("k", 64) + `" in the request body`, strings.Repeat("k", 64)},
		{"duplicate key longer than quoted", Chat, `{"model":"a","` + strings.Repeat("k", 65) + `":1,"` + strings.Repeat("k", 65) + `":2}`,
			`duplicate key "` + strings.Repeat("k", 64) + `…" in the request body`, strings.Repeat("k", 64) + "…"},
		{"duplicate before a syntax error", Chat, `{"model":"a","model":"b",}`, `invalid JSON: unexpected character '}' at offset 25`, ""},
		// A wrong shape is kept while the rest of the body is validated: a syntax error after
		// it, anywhere, is the body's error.
		{"messages shape then syntax", Chat, `{"model":"m","messages":5,"x":tru}`, `invalid JSON: unexpected character '}' at offset 33`, ""},
		{"content shape then syntax", Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":1}],"x":tru}]}`, `invalid JSON: unexpected character '}' at offset 70`, ""},
		{"part shape then syntax in the parts", Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":1},{"text":"a"]}]}`, `invalid JSON: unexpected character ']' at offset 73`, ""},
		{"prompt shape then syntax", Completions, `{"model":"m","prompt":[1,"a"],"x":[}`, `invalid JSON: unexpected character '}' at offset 35`, ""},
		{"model missing", Chat, `{"messages":[{"role":"user","content":"x"}]}`, `"model" is required`, "model"},
		{"model null", Chat, `{"model":null}`, `"model" is required`, "model"},
		{"model empty", Chat, `{"model":""}`, `"model" is required`, "model"},
		{"model number", Chat, `{"model":5}`, `"model" must be a string`, "model"},
		{"model object", Chat, `{"model":{"id":"m"}}`, `"model" must be a string`, "model"},
		{"model wrong case only", Chat, `{"Model":"m"}`, `"model" is required`, "model"},
		{"stream string", Chat, `{"model":"m","stream":"yes"}`, `"stream" must be a boolean`, "stream"},
		{"stream number", Chat, `{"model":"m","stream":1}`, `"stream" must be a boolean`, "stream"},
		{"user number", Chat, `{"model":"m","user":7}`, `"user" must be a string`, "user"},
		{"messages missing", Chat, `{"model":"m"}`, `"messages" is required`, "messages"},
		{"messages null", Chat, `{"model":"m","messages":null}`, `"messages" is required`, "messages"},
		{"messages empty", Chat, `{"model":"m","messages":[]}`, `"messages" must be a non-empty array of message objects`, "messages"},
		{"messages object", Chat, `{"model":"m","messages":{}}`, `"messages" must be a non-empty array of message objects`, "messages"},
		{"message not object", Chat, `{"model":"m","messages":[{"role":"user"},"hi"]}`, `"messages[1]" must be an object`, "messages[1]"},
		{"role missing", Chat, `{"model":"m","messages":[{"content":"hi"}]}`, `"messages[0].role" is required`, "messages[0].role"},
		{"role number", Chat, `{"model":"m","messages":[{"role":1,"content":"hi"}]}`, `"messages[0].role" must be a string`, "messages[0].role"},
		{"content number", Chat, `{"model":"m","messages":[{"role":"user","content":1}]}`, `"messages[0].content" must be a string, null, or an array of content parts`, "messages[0].content"},
		{"content object", Chat, `{"model":"m","messages":[{"role":"user","content":{"text":"x"}}]}`, `"messages[0].content" must be a string, null, or an array of content parts`, "messages[0].content"},
		{"part not object", Chat, `{"model":"m","messages":[{"role":"user","content":["x"]}]}`, `"messages[0].content[0]" must be an object`, "messages[0].content[0]"},
		{"part type missing", Chat, `{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}`, `"messages[0].content[0].type" is required`, "messages[0].content[0].type"},
		{"part type number", Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":1}]}]}`, `"messages[0].content[0].type" must be a string`, "messages[0].content[0].type"},
		{"text part without text", Chat, `{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"a"},{"type":"text"}]}]}`, `"messages[0].content[1].text" must be a string`, "messages[0].content[1].text"},
		{"prompt missing", Completions, `{"model":"m"}`, `"prompt" is required`, "prompt"},
		{"prompt null", Completions, `{"model":"m","prompt":null}`, `"prompt" is required`, "prompt"},
		{"prompt number", Completions, `{"model":"m","prompt":5}`, `"prompt" must be a string, an array of strings, an array of token ids, or an array of token-id arrays`, "prompt"},
		{"prompt empty array", Completions, `{"model":"m","prompt":[]}`, `"prompt" must be non-empty`, "prompt"},
		{"prompt mixed array", Completions, `{"model":"m","prompt":["a",1]}`, `"prompt" must be a string, an array of strings, an array of token ids, or an array of token-id arrays`, "prompt"},
		{"prompt null element", Completions, `{"model":"m","prompt":["a",null]}`, `"prompt" must be a string, an array of strings, an array of token ids, or an array of token-id arrays`, "prompt"},
		{"negative token id", Completions, `{"model":"m","prompt":[1,-2]}`, `"prompt[1]" must be a token id (an integer from 0 to 4294967295)`, "prompt[1]"},
		{"fractional token id", Completions, `{"model":"m","prompt":[1.0]}`, `"prompt[0]" must be a token id (an integer from 0 to 4294967295)`, "prompt[0]"},
		{"token id too large", Completions, `{"model":"m","prompt":[4294967296]}`, `"prompt[0]" must be a token id (an integer from 0 to 4294967295)`, "prompt[0]"},
		{"empty token-id array", Completions, `{"model":"m","prompt":[[1],[]]}`, `"prompt[1]" must be non-empty`, "prompt[1]"},
		{"bad nested token id", Completions, `{"model":"m","prompt":[[1],[2,"3"]]}`, `"prompt[1][1]" must be a token id (an integer from 0 to 4294967295)`, "prompt[1][1]"},
		{"unknown kind", Kind(0), `{"model":"m"}`, `unknown request kind Kind(0)`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.kind, []byte(tc.body))
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if err.Error() != tc.msg {
				t.Errorf("error = %q, want %q", err, tc.msg)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *Error", err)
			}
			if e.Param != tc.wantParam {
				t.Errorf("Param = %q, want %q", e.Param, tc.wantParam)
			}
		})
	}
}

func TestValidRequestID(t *testing.T) {
	tests := []struct {
		id   string
		want bool
	}{
		{"a", true},
		{"req-123_ABC.xyz:9", true},
		{"with space", true},
		{"~!@#$%^&*()", true},
		{strings.Repeat("x", 128), true},
		{"", false},
		{strings.Repeat("x", 129), false},
		{"a\r\nSet-Cookie: x=y", false},
		{"a\nb", false},
		{"tab\there", false},
		{"nul\x00", false},
		{"del\x7f", false},
		{"café", false},
		{"\xff", false},
	}
	for _, tc := range tests {
		if got := ValidRequestID(tc.id); got != tc.want {
			t.Errorf("ValidRequestID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}

// manyKeys is `"k0":0,"k1":0,…` with n distinct keys, more than keySet holds in place.
func manyKeys(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = `"k` + strconv.Itoa(i) + `":0`
	}
	return strings.Join(parts, ",")
}

func TestField(t *testing.T) {
	body := []byte(`{"LogProbs":1, "logprobs" : [1, {"a":2}] ,"x":{"logprobs":3},"mod\u0065l":"m","a_much_longer_key":null}`)
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"logprobs", `[1, {"a":2}]`, true},
		{"LogProbs", `1`, true},
		{"model", `"m"`, true},
		{"a_much_longer_key", `null`, true},
		{"LOGPROBS", ``, false},
		{"a", ``, false},
	} {
		got, ok := Field(body, tc.name)
		if string(got) != tc.want || ok != tc.ok {
			t.Errorf("Field(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := Field([]byte(`[1]`), "logprobs"); ok {
		t.Error("Field of a non-object found a key")
	}
}

// TestErrorsAtEveryByte cuts valid bodies at every byte and corrupts every byte in turn. A
// cut body ends too early: "unexpected end of input", or, cut inside a multi-byte UTF-8
// sequence, that sequence is invalid at its first byte. A control byte or 0xff written over
// any byte is reported at that byte's offset (at its sequence's first byte when the byte was
// inside one): the message points at the fault, wherever the scanner's fast paths stood.
func TestErrorsAtEveryByte(t *testing.T) {
	bodies := []struct {
		kind Kind
		body string
	}{
		{Chat, `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are \"helpful\"\n\u00e9\ud83d\ude00 and long enough to pass eight"},{"role":"user","content":[{"type":"text","text":"hi there"}]}],"stream":true,"temperature":0.7,"max_tokens":-12e+3,"x":[true,false,null,{"y":[1.5E-2]}]}`},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"café 😀 ok"}]}`},
		{Completions, `{"model":"m","prompt":[[1,2,3],[4]],"n":1,"logit_bias":{"50256":-100}}`},
		{Completions, ` { "model" : "m" , "prompt" : "abcdefghijklmnopqrstuvwxyz0123456789\\\/\b\f\r\t" } `},
	}
	// seqStart is the offset of the UTF-8 sequence byte k of b belongs to.
	seqStart := func(b string, k int) int {
		for k > 0 && b[k]&0xc0 == 0x80 {
			k--
		}
		return k
	}
	for _, tc := range bodies {
		if _, err := Parse(tc.kind, []byte(tc.body)); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		start, end := len(tc.body)-len(strings.TrimLeft(tc.body, " ")), len(strings.TrimRight(tc.body, " "))
		for k := start + 1; k < end; k++ {
			want := "invalid JSON: unexpected end of input"
			if s := seqStart(tc.body, k); s != k {
				want = "invalid JSON: invalid UTF-8 in string at offset " + strconv.Itoa(s)
			}
			if _, err := Parse(tc.kind, []byte(tc.body[:k])); err == nil || err.Error() != want {
				t.Errorf("cut at %d (…%q): %v, want %s", k, tc.body[max(0, k-10):k], err, want)
			}
		}
		for _, bad := range []byte{0x01, 0x1f, 0xff} {
			for k := 0; k < end; k++ {
				b := []byte(tc.body)
				b[k] = bad
				want := " at offset " + strconv.Itoa(seqStart(tc.body, k))
				if _, err := Parse(tc.kind, b); err == nil || !strings.HasSuffix(err.Error(), want) {
					t.Errorf("%#x at %d (…%q): %v, want …%s", bad, k, tc.body[max(0, k-10):k+1], err, want)
				}
			}
		}
	}
}

// TestNestingLimit: a body nested exactly maxDepth containers deep (the top-level object
// counted) parses; one container more is refused where it opens.
func TestNestingLimit(t *testing.T) {
	const head = `{"model":"m","messages":[{"role":"user","content":"x"}],"x":`
	for _, c := range []struct{ open, close string }{{"[", "]"}, {`{"a":`, "}"}} {
		for _, extra := range []int{0, 1} {
			n := maxDepth - 1 + extra // containers inside the top-level object
			body := head + strings.Repeat(c.open, n) + "1" + strings.Repeat(c.close, n) + "}"
			_, err := Parse(Chat, []byte(body))
			if extra == 0 && err != nil {
				t.Errorf("%d levels of %s: %v", maxDepth, c.open, err)
			}
			want := "invalid JSON: nesting too deep at offset " + strconv.Itoa(len(head)+(maxDepth-1)*len(c.open))
			if extra == 1 && (err == nil || err.Error() != want) {
				t.Errorf("%d levels of %s: %v, want %s", maxDepth+1, c.open, err, want)
			}
		}
	}
}
