package oai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCost pins what a request is counted as before an engine sees it (R20): every prompt of a
// batch (a cheap first prompt hides nothing behind it), its choices and its max tokens — so
// a key's tpm reservation and the admission queue's cost cannot be dodged by the body's shape.
func TestCost(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		body string
		want Cost
	}{
		{"a string prompt, max_tokens absent: the completions default", Completions,
			`{"model":"m","prompt":"12345678"}`,
			Cost{PromptTokens: 2, Prompts: 1, Choices: 1, MaxTokens: DefaultMaxTokens}},
		{"a text rounds up to whole tokens", Completions,
			`{"model":"m","prompt":"123456789","max_tokens":0}`,
			Cost{PromptTokens: 3, Prompts: 1, Choices: 1}},
		{"every prompt of a batch counts, and each gets its answers", Completions,
			`{"model":"m","prompt":["a","` + strings.Repeat("x", 4000) + `","bc"],"max_tokens":10,"n":2}`,
			Cost{PromptTokens: 1001, Prompts: 3, Choices: 2, MaxTokens: 10}},
		{"token ids count one each", Completions,
			`{"model":"m","prompt":[1,2,3,4,5],"max_tokens":7}`,
			Cost{PromptTokens: 5, Prompts: 1, Choices: 1, MaxTokens: 7}},
		{"every token-id array of a batch counts", Completions,
			`{"model":"m","prompt":[[1,2],[3,4,5],[6]],"max_tokens":7}`,
			Cost{PromptTokens: 6, Prompts: 3, Choices: 1, MaxTokens: 7}},
		{"best_of above n generates best_of answers", Completions,
			`{"model":"m","prompt":"p","n":2,"best_of":5,"max_tokens":4}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: 5, MaxTokens: 4}},
		{"escapes count as written", Completions,
			`{"model":"m","prompt":"\u00e9\u00e9","max_tokens":1}`,
			Cost{PromptTokens: 3, Prompts: 1, Choices: 1, MaxTokens: 1}},
		{"chat: every message as rendered, role and newlines too", Chat,
			`{"model":"m","messages":[{"role":"system","content":"1234"},{"role":"user","content":"12345678"}]}`,
			Cost{PromptTokens: 7, Prompts: 1, Choices: 1}}, // (6+4+2 + 4+8+2) = 26 bytes
		{"chat: text parts count, images do not", Chat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"12345678"},{"type":"image_url","image_url":{"url":"` + strings.Repeat("z", 400) + `"}},{"type":"text","text":"1234"}]}],"max_tokens":3}`,
			Cost{PromptTokens: 5, Prompts: 1, Choices: 1, MaxTokens: 3}}, // 4+2+12
		{"chat: max_completion_tokens wins over max_tokens", Chat,
			`{"model":"m","messages":[{"role":"u","content":null}],"max_tokens":5,"max_completion_tokens":50,"n":3}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: 3, MaxTokens: 50}},
		{"completions ignore max_completion_tokens", Completions,
			`{"model":"m","prompt":"p","max_completion_tokens":50}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: 1, MaxTokens: DefaultMaxTokens}},
		{"a null max_completion_tokens is absent", Chat,
			`{"model":"m","messages":[{"role":"u","content":"c"}],"max_completion_tokens":null,"max_tokens":9}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: 1, MaxTokens: 9}},
		{"numbers in strings, exponents and fractions count as the engine reads them", Completions,
			`{"model":"m","prompt":"p","n":"3","best_of":2.5,"max_tokens":1e3}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: 3, MaxTokens: 1000}},
		{"unreadable, negative or NaN counts are the defaults", Completions,
			`{"model":"m","prompt":"p","n":-4,"best_of":"NaN","max_tokens":"x"}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: 1, MaxTokens: 0}},
		{"a count with escapes or of another type is the default", Completions,
			`{"model":"m","prompt":"p","n":"\u0033","best_of":[4],"max_tokens":true}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: 1, MaxTokens: 0}},
		{"a huge count is clamped", Completions,
			`{"model":"m","prompt":"p","n":1e400,"max_tokens":99999999999999999999}`,
			Cost{PromptTokens: 1, Prompts: 1, Choices: MaxCount, MaxTokens: MaxCount}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.kind, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got.Cost); d != "" {
				t.Errorf("Cost (-want +got):\n%s", d)
			}
			_, _, rerr := ParseRendered(tc.kind, []byte(tc.body), 8)
			if rerr != nil {
				t.Fatal(rerr)
			}
		})
	}
}

// TestCostTokens: the total a tpm reservation takes is the prompt plus every answer's most,
// and saturates instead of overflowing on the largest counts a body can carry.
func TestCostTokens(t *testing.T) {
	for _, tc := range []struct {
		c    Cost
		want int64
	}{
		{Cost{PromptTokens: 100, Prompts: 3, Choices: 2, MaxTokens: 10}, 160},
		{Cost{PromptTokens: 100, Prompts: 1, Choices: 1}, 100},
		{Cost{Prompts: 1, Choices: 1, MaxTokens: 1}, 1},
		{Cost{PromptTokens: 5, Prompts: MaxCount, Choices: 1 << 20, MaxTokens: 1}, 5 + MaxCount<<20},
		{Cost{PromptTokens: 5, Prompts: MaxCount, Choices: MaxCount, MaxTokens: MaxCount}, MaxCost},
		{Cost{PromptTokens: MaxCost - 1, Prompts: 1, Choices: 1, MaxTokens: 1}, MaxCost},
		{Cost{PromptTokens: MaxCost - 2, Prompts: 1, Choices: 1, MaxTokens: 1}, MaxCost - 1},
		{Cost{PromptTokens: 7, Prompts: MaxCost, Choices: 2, MaxTokens: 0}, 7},
		{Cost{Prompts: MaxCost / 2, Choices: 2, MaxTokens: 1}, MaxCost - 1}, // the largest product below the bound
		{Cost{PromptTokens: 7, Prompts: 0, Choices: 2, MaxTokens: 9}, 7},
	} {
		if got := tc.c.Tokens(); got != tc.want {
			t.Errorf("%+v.Tokens() = %d, want %d", tc.c, got, tc.want)
		}
	}
}

// FuzzCost: for any batch of prompts and any counts written in any way, the Cost that Parse
// reads agrees with encoding/json's reading (refCost), counts every prompt, stays within its
// bounds, and its Tokens never overflow — the parser reads client bytes that size a key's
// reservation, so no body may make it wrap or undercount.
func FuzzCost(f *testing.F) {
	f.Add("hello", uint8(3), `2`, `"16"`, `null`, false)
	f.Add("a\\u00e9b", uint8(1), `1e400`, `-1`, `1.5`, true)
	f.Add("", uint8(0), `"x"`, `99999999999999999999`, `0`, false)
	f.Add(strings.Repeat("long ", 100), uint8(40), `4294967297`, `1e-400`, `"NaN"`, true)
	f.Fuzz(func(t *testing.T, text string, prompts uint8, n, maxTokens, bestOf string, chat bool) {
		quoted, _ := json.Marshal(text)
		var b strings.Builder
		b.WriteString(`{"model":"m",`)
		if chat {
			b.WriteString(`"messages":[`)
		} else {
			b.WriteString(`"prompt":[`)
		}
		for i := range int(prompts) {
			if i > 0 {
				b.WriteByte(',')
			}
			if chat {
				b.WriteString(`{"role":"user","content":` + string(quoted) + `}`)
			} else {
				b.Write(quoted)
			}
		}
		b.WriteString(`],"n":` + n + `,"best_of":` + bestOf + `,"max_tokens":` + maxTokens + `}`)
		body := []byte(b.String())
		kind := Completions
		if chat {
			kind = Chat
		}
		r, err := Parse(kind, body)
		if err != nil {
			return // the counts were no JSON, or an empty batch
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("Parse accepted %q, encoding/json does not: %v", body, err)
		}
		c := r.Cost
		if d := cmp.Diff(refCost(kind, top), c); d != "" {
			t.Fatalf("Cost of %q (-ref +got):\n%s", body, d)
		}
		perPrompt := int64(len(quoted) - 2)
		wantPrompts, wantText := int64(prompts), int64(prompts)*perPrompt
		if chat {
			wantPrompts, wantText = 1, int64(prompts)*(perPrompt+int64(len("user"))+2)
		}
		if c.Prompts != wantPrompts || c.PromptTokens != (wantText+3)/4 {
			t.Fatalf("%q: %d prompts of %d tokens, want %d of %d", body, c.Prompts, c.PromptTokens, wantPrompts, (wantText+3)/4)
		}
		if c.Choices < 1 || c.Choices > MaxCount || c.MaxTokens < 0 || c.MaxTokens > MaxCount {
			t.Fatalf("%q: counts out of bounds %+v", body, c)
		}
		tok := c.Tokens()
		if tok < c.PromptTokens || (c.MaxTokens > 0 && tok < c.PromptTokens+c.MaxTokens) {
			t.Fatalf("%q: Tokens %d below the prompt and one answer of %+v", body, tok, c)
		}
		if exact := c.PromptTokens + c.Prompts*c.Choices*c.MaxTokens; c.Prompts*c.Choices*c.MaxTokens < 1<<62 && tok != exact {
			t.Fatalf("%q: Tokens %d, want %d", body, tok, exact)
		}
	})
}

// TestCostReadsNoMoreThanParse: counting adds no allocation to Parse (it runs on every
// request).
func TestCostReadsNoMoreThanParse(t *testing.T) {
	body := []byte(`{"model":"m","prompt":["a","b","c"],"n":"2","best_of":3.5,"max_tokens":1e2}`)
	plain := []byte(`{"model":"m","prompt":["a","b","c"]}`)
	with := testing.AllocsPerRun(100, func() { _, _ = Parse(Completions, body) })
	without := testing.AllocsPerRun(100, func() { _, _ = Parse(Completions, plain) })
	if with != without {
		t.Fatalf("Parse allocates %v times with counts, %v without", with, without)
	}
	if r, _ := Parse(Completions, body); r.Cost.Tokens() != 1+3*4*100 {
		t.Fatalf("cost %+v = %d", r.Cost, r.Cost.Tokens())
	}
}
