package engine

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestRenderIsTheEnginesTokenization: the chat render, /tokenize of the same messages, and the
// prompt a chat completion counts are the same token ids; the completions render answers one
// entry per prompt with /tokenize's ids; /detokenize inverts them. A gateway that matches
// prefixes by these ids sees what the engine caches.
func TestRenderIsTheEnginesTokenization(t *testing.T) {
	e := start(t, Config{})
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":"the cat sat on the mat"}]`
	_, out := post(t, e, "/v1/chat/completions/render", `{"model":"smol","messages":`+msgs+`}`)
	var chat struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	if json.Unmarshal(out, &chat) != nil || len(chat.TokenIDs) == 0 {
		t.Fatalf("chat render: %s", out)
	}
	_, out = post(t, e, "/tokenize", `{"model":"smol","messages":`+msgs+`}`)
	var tok struct {
		Tokens      []uint32
		Count       int
		MaxModelLen int `json:"max_model_len"`
	}
	if json.Unmarshal(out, &tok) != nil || !slices.Equal(tok.Tokens, chat.TokenIDs) || tok.Count != len(tok.Tokens) ||
		tok.MaxModelLen != e.maxModelLen() {
		t.Fatalf("/tokenize of the messages %s, the render %v", out, chat.TokenIDs)
	}
	_, out = post(t, e, "/v1/chat/completions", `{"model":"smol","max_tokens":1,"messages":`+msgs+`}`)
	var c completion
	if json.Unmarshal(out, &c) != nil || c.Usage.PromptTokens != len(chat.TokenIDs) {
		t.Fatalf("chat's prompt_tokens %s, the render has %d", out, len(chat.TokenIDs))
	}
	_, out = post(t, e, "/v1/completions/render", `{"model":"smol","prompt":["hello world","the cat"]}`)
	var batch []struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	if json.Unmarshal(out, &batch) != nil || len(batch) != 2 {
		t.Fatalf("completions render: %s", out)
	}
	for i, p := range []string{"hello world", "the cat"} {
		b, _ := json.Marshal(map[string]any{"model": "smol", "prompt": p})
		_, out := post(t, e, "/v1/tokenize", string(b))
		if json.Unmarshal(out, &tok) != nil || !slices.Equal(tok.Tokens, batch[i].TokenIDs) {
			t.Fatalf("render[%d] %v, /v1/tokenize %s", i, batch[i].TokenIDs, out)
		}
		b, _ = json.Marshal(map[string]any{"model": "smol", "tokens": tok.Tokens})
		_, out = post(t, e, "/detokenize", string(b))
		var d struct{ Prompt string }
		if json.Unmarshal(out, &d) != nil || d.Prompt != p {
			t.Fatalf("detokenize of %q's tokens: %s", p, out)
		}
	}
	for path, bad := range map[string]string{
		"/detokenize":            `{"model":"smol","tokens":[-1]}`,
		"/v1/completions/render": `{"model":"smol","prompt":[]}`,
	} {
		if resp, b := post(t, e, path, bad); resp.StatusCode != 400 {
			t.Errorf("%s %s: %d %s, want 400", path, bad, resp.StatusCode, b)
		}
	}
	if resp, b := post(t, e, "/detokenize", `{"model":"smol"}`); resp.StatusCode != 400 {
		t.Errorf("detokenize without tokens: %d %s", resp.StatusCode, b)
	}
}
