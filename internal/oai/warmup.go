package oai

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// WarmupBody builds a prefix warm-up (actors/router/warm.go) from body, a request of kind that
// Parse accepted: a one-token, non-streamed request of the same kind for model whose rendered
// prompt (RenderPrompt) agrees with body's on its first n bytes or fewer, so that its chunk ids
// are body's. A completions prompt is cut at n bytes; a chat keeps its leading messages whole
// while they fit and cuts the content of the first that does not at n (its render then has
// that message's newline after the n bytes). Cuts fall on whole UTF-8 characters, so the
// agreement may end up to 3 bytes short of n. ok is false when there is nothing worth
// sending: a prompt that is not text (token ids, an array of prompts; a chat message whose
// content is not a string ends the copy before it), or nothing that fits in n.
//
// The warm-up is sent with the engine's own kind, so an engine that renders a chat through its
// template puts the copied messages through the same template and caches the same tokens as the
// original's.
func WarmupBody(kind Kind, body []byte, n int, model string) (out []byte, ok bool) {
	switch kind {
	case Completions:
		raw, found := Field(body, "prompt")
		var prompt string
		if !found || json.Unmarshal(raw, &prompt) != nil { // token ids and arrays do not decode
			return nil, false
		}
		prompt = cutText(prompt, n)
		if prompt == "" {
			return nil, false
		}
		out, err := json.Marshal(warmCompletion{Model: model, Prompt: prompt, MaxTokens: 1})
		return out, err == nil
	case Chat:
		raw, found := Field(body, "messages")
		var msgs []json.RawMessage
		if !found || json.Unmarshal(raw, &msgs) != nil {
			return nil, false
		}
		var keep []warmMessage
		at := 0
		for _, m := range msgs {
			role, content, ok := textMessage(m)
			if !ok {
				break
			}
			head := len(role) + 1
			if at+head+len(content) <= n {
				keep = append(keep, warmMessage{Role: role, Content: content})
				at += head + len(content) + 1
				continue
			}
			if content = cutText(content, n-at-head); content != "" {
				keep = append(keep, warmMessage{Role: role, Content: content})
			}
			break
		}
		if len(keep) == 0 {
			return nil, false
		}
		out, err := json.Marshal(warmChat{Model: model, Messages: keep, MaxTokens: 1})
		return out, err == nil
	}
	return nil, false
}

// TokenWarmupBody builds a prefix warm-up cut in tokens (R22, actors/router/warm.go): a
// one-token, non-streamed completions request for model whose prompt is the first n of ids (a
// request's token ids as its engines tokenize it, whatever the request's own kind). An engine
// takes a prompt of token ids as it is (no chat template, no special tokens added), so the
// copy fills exactly the KV blocks those ids make. ok is false when n is not in 1…len(ids).
//
// Example: TokenWarmupBody([]uint32{7, 8, 9}, 2, "m") is
// {"model":"m","prompt":[7,8],"max_tokens":1}.
func TokenWarmupBody(ids []uint32, n int, model string) (out []byte, ok bool) {
	if n <= 0 || n > len(ids) {
		return nil, false
	}
	name, err := json.Marshal(model)
	if err != nil {
		return nil, false
	}
	// n ≤ len(ids), which the render answer bounds (enginetok.MaxTokens); at most
	// 10 digits and a comma an id.
	out = make([]byte, 0, len(name)+11*n+40)
	out = append(append(append(out, `{"model":`...), name...), `,"prompt":[`...)
	for i, id := range ids[:n] {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendUint(out, uint64(id), 10)
	}
	return append(out, `],"max_tokens":1}`...), true
}

type warmCompletion struct {
	Model     string `json:"model"`
	Prompt    string `json:"prompt"`
	MaxTokens int    `json:"max_tokens"`
}

type warmChat struct {
	Model     string        `json:"model"`
	Messages  []warmMessage `json:"messages"`
	MaxTokens int           `json:"max_tokens"`
}

type warmMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// textMessage reads a chat message's role and string content, as the render reads them.
func textMessage(m []byte) (role, content string, ok bool) {
	r, found := Field(m, "role")
	if !found || json.Unmarshal(r, &role) != nil {
		return "", "", false
	}
	c, found := Field(m, "content")
	if !found || len(c) == 0 || c[0] != '"' || json.Unmarshal(c, &content) != nil {
		return "", "", false
	}
	return role, content, true
}

// cutText is s cut to at most n bytes on a character boundary ("" for n ≤ 0).
func cutText(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
