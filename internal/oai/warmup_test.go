package oai_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tlgw/tlgw/internal/oai"
)

// checkWarmup checks WarmupBody's contract on body: a warm-up is a valid request of the same
// kind for model, asking one token, not streamed, whose render agrees with the original's on
// its first n bytes or fewer (a chat's cut message adds its newline after them), a completion's
// no more than 3 bytes short of n unless the whole prompt fit.
func checkWarmup(t *testing.T, kind oai.Kind, body []byte, n int) (warm []byte, ok bool) {
	t.Helper()
	warm, ok = oai.WarmupBody(kind, body, n, "served")
	if !ok {
		return nil, false
	}
	req, err := oai.Parse(kind, warm)
	if err != nil {
		t.Fatalf("warm-up %s does not parse: %v", warm, err)
	}
	if req.Model != "served" || req.Stream {
		t.Fatalf("warm-up %s: model %q, stream %v", warm, req.Model, req.Stream)
	}
	if mt, _ := oai.Field(warm, "max_tokens"); string(mt) != "1" {
		t.Fatalf("warm-up %s asks max_tokens %s", warm, mt)
	}
	orig := oai.RenderPrompt(kind, body, len(body))
	got := oai.RenderPrompt(kind, warm, len(warm))
	if !utf8.Valid(orig) {
		return warm, true // the JSON decoder replaced what the render kept: no byte promise
	}
	agreed := got
	if kind == oai.Chat && !bytes.HasPrefix(orig, got) {
		agreed = got[:len(got)-1] // the cut message's own newline
	}
	longest := n
	if kind == oai.Chat {
		longest++
	}
	if len(got) > longest || !bytes.HasPrefix(orig, agreed) {
		t.Fatalf("warm-up render %q (%d bytes) does not agree with %q on its first %d bytes", got, len(got), orig, n)
	}
	// A chat may also stop short by the next message's "role\n", which is not cut.
	if len(orig) > n && len(agreed) < n-3 && kind == oai.Completions {
		t.Fatalf("warm-up render agrees on %d bytes of %d asked", len(agreed), n)
	}
	return warm, true
}

func TestWarmupBodyCompletions(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"abcdefghij","stream":true,"max_tokens":99,"temperature":0.5}`)
	warm, ok := checkWarmup(t, oai.Completions, body, 4)
	if !ok || string(warm) != `{"model":"served","prompt":"abcd","max_tokens":1}` {
		t.Fatalf("warm-up %s, %v", warm, ok)
	}
	// The whole prompt when it is shorter than asked.
	if warm, _ := checkWarmup(t, oai.Completions, body, 100); !strings.Contains(string(warm), `"prompt":"abcdefghij"`) {
		t.Fatalf("warm-up %s", warm)
	}
	// A cut inside a character moves back to its start: "é" is 2 bytes.
	if warm, _ := checkWarmup(t, oai.Completions, []byte(`{"model":"m","prompt":"aéb"}`), 2); !strings.Contains(string(warm), `"prompt":"a"`) {
		t.Fatalf("warm-up %s", warm)
	}
	for _, b := range []string{
		`{"model":"m","prompt":[1,2,3]}`,    // token ids
		`{"model":"m","prompt":["ab","c"]}`, // an array of prompts
		`{"model":"m","prompt":"éé"}`,       // nothing fits in 1 byte
	} {
		if warm, ok := checkWarmup(t, oai.Completions, []byte(b), 1); ok {
			t.Errorf("%s: warm-up %s", b, warm)
		}
	}
}

func TestWarmupBodyChat(t *testing.T) {
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"system","content":"0123456789"},` +
		`{"role":"user","name":"u","content":"hello"}]}`)
	// render: "system\n0123456789\n" (18 bytes) then "user\nhello\n" (11).
	for n, want := range map[int]string{
		29:  `[{"role":"system","content":"0123456789"},{"role":"user","content":"hello"}]`,
		100: `[{"role":"system","content":"0123456789"},{"role":"user","content":"hello"}]`,
		18:  `[{"role":"system","content":"0123456789"}]`,
		27:  `[{"role":"system","content":"0123456789"},{"role":"user","content":"hell"}]`,
		12:  `[{"role":"system","content":"01234"}]`,
		17:  `[{"role":"system","content":"0123456789"}]`,
		22:  `[{"role":"system","content":"0123456789"}]`, // "user\n" would end at 23: not cut
	} {
		warm, ok := checkWarmup(t, oai.Chat, body, n)
		if !ok {
			t.Fatalf("n = %d: no warm-up", n)
		}
		if got, _ := oai.Field(warm, "messages"); string(got) != want {
			t.Errorf("n = %d: messages %s, want %s", n, got, want)
		}
	}
	// Three messages: the second whole when only its newline is past n, the third cut.
	three := []byte(`{"model":"m","messages":[{"role":"system","content":"0123456789"},` +
		`{"role":"user","content":"hello"},{"role":"assistant","content":"abc"}]}`)
	// render: "system\n0123456789\n" (18), "user\nhello\n" (11), "assistant\nabc\n" (14).
	for n, want := range map[int]string{
		28: `[{"role":"system","content":"0123456789"},{"role":"user","content":"hello"}]`,
		41: `[{"role":"system","content":"0123456789"},{"role":"user","content":"hello"},{"role":"assistant","content":"ab"}]`,
	} {
		warm, ok := checkWarmup(t, oai.Chat, three, n)
		if got, _ := oai.Field(warm, "messages"); !ok || string(got) != want {
			t.Errorf("n = %d: messages %s, want %s", n, got, want)
		}
	}
	// A message whose content is not a string ends the copy before it.
	parts := []byte(`{"model":"m","messages":[{"role":"system","content":"abc"},{"role":"user","content":[{"type":"text","text":"x"}]}]}`)
	if warm, _ := checkWarmup(t, oai.Chat, parts, 100); !strings.Contains(string(warm), `"messages":[{"role":"system","content":"abc"}]`) {
		t.Fatalf("warm-up %s", warm)
	}
	for _, tc := range []struct {
		body string
		n    int
	}{
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`, 100},
		{`{"model":"m","messages":[{"role":"system","content":"abc"}]}`, 7}, // "system\n" leaves no room
		{`{"model":"m","messages":[{"role":"system","content":null}]}`, 100},
	} {
		if warm, ok := checkWarmup(t, oai.Chat, []byte(tc.body), tc.n); ok {
			t.Errorf("%s within %d: warm-up %s", tc.body, tc.n, warm)
		}
	}
	if _, ok := oai.WarmupBody(oai.Kind(99), body, 10, "m"); ok {
		t.Error("a warm-up for an unknown kind")
	}
}

// FuzzWarmupBody: for any body Parse accepts and any length, a warm-up is either refused or
// keeps checkWarmup's contract.
func FuzzWarmupBody(f *testing.F) {
	f.Add(true, []byte(`{"model":"m","messages":[{"role":"system","content":"0123456789"},{"role":"user","content":"hé"}]}`), 20)
	f.Add(false, []byte(`{"model":"m","prompt":"a\u00e9\ud83d\ude00b"}`), 5)
	f.Add(true, []byte(`{"model":"m","messages":[{"role":"u\nser","content":"x\"y"}]}`), 9)
	f.Fuzz(func(t *testing.T, chat bool, body []byte, n int) {
		kind := oai.Completions
		if chat {
			kind = oai.Chat
		}
		if _, err := oai.Parse(kind, body); err != nil {
			return
		}
		warm, ok := checkWarmup(t, kind, body, n%4096)
		if ok && !json.Valid(warm) {
			t.Fatalf("warm-up %q is not JSON", warm)
		}
	})
}

// TestTokenWarmupBody (R22): a warm-up cut in tokens is a completions request for the model,
// one token, not streamed, whose prompt is exactly the first n ids, for every n in 1…len; any
// other n builds nothing.
func TestTokenWarmupBody(t *testing.T) {
	ids := []uint32{0, 7, 4294967295, 31, 100000}
	for n := 1; n <= len(ids); n++ {
		warm, ok := oai.TokenWarmupBody(ids, n, `se"rved`)
		if !ok {
			t.Fatalf("n = %d: nothing built", n)
		}
		req, err := oai.Parse(oai.Completions, warm)
		if err != nil {
			t.Fatalf("warm-up %s does not parse: %v", warm, err)
		}
		var got struct {
			Model     string   `json:"model"`
			Prompt    []uint32 `json:"prompt"`
			MaxTokens int      `json:"max_tokens"`
		}
		if err := json.Unmarshal(warm, &got); err != nil {
			t.Fatal(err)
		}
		if req.Stream || got.Model != `se"rved` || got.MaxTokens != 1 || !slices.Equal(got.Prompt, ids[:n]) {
			t.Fatalf("n = %d: warm-up %s", n, warm)
		}
	}
	if warm, _ := oai.TokenWarmupBody(ids, 2, "m"); string(warm) != `{"model":"m","prompt":[0,7],"max_tokens":1}` {
		t.Fatalf("warm-up %s", warm)
	}
	for _, n := range []int{0, -1, len(ids) + 1} {
		if warm, ok := oai.TokenWarmupBody(ids, n, "m"); ok || warm != nil {
			t.Fatalf("n = %d built %s", n, warm)
		}
	}
	if _, ok := oai.TokenWarmupBody(nil, 1, "m"); ok {
		t.Fatal("a warm-up of no ids")
	}
}
