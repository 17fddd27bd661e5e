package oai

// The endpoints other than completions and chat (R21) are routed by their "model" and relayed
// as the client wrote them: the gateway checks the body is one JSON object with a string model
// (and a boolean "stream" where the endpoint streams), and reads no more of the endpoint's own
// shape than it routes on. The engine validates the rest and answers its own 400.
//
// Their prompt, for prefix affinity and the prefix index, is the raw JSON text of the
// endpoint's prompt field ("input", "messages", "prompt" or "query"): a hash key, not text, so
// two requests that share a system prompt and a first message written the same way share a
// prefix, and nothing is decoded.

// MaxResponseIDLen bounds a "previous_response_id" (and a response id in a path).
const MaxResponseIDLen = 256

// rawPrompt is the raw JSON value of the kind's prompt field (nil when absent).
func (f *fields) rawPrompt(body []byte) []byte {
	if !f.raw.present() {
		return nil
	}
	return body[f.raw.start:f.raw.end]
}

// other checks the fields of an endpoint other than completions and chat and fills what the
// gateway reads of them into r (all but the strings, built after every check).
func (f *fields) other(kind Kind, body []byte, p *prefix, r *Request) error {
	p.write(f.rawPrompt(body))
	if kind != Responses {
		return nil
	}
	r.Store = true
	if !absent(body, f.store) {
		switch body[f.store.start] {
		case 't':
		case 'f':
			r.Store = false
		default:
			return mustBe("store", "a boolean")
		}
	}
	if !absent(body, f.previous) {
		if body[f.previous.start] != '"' {
			return mustBe("previous_response_id", "a string")
		}
		raw, esc := contents(body, f.previous)
		if esc || len(raw) == 0 || len(raw) > MaxResponseIDLen || !ValidResponseID(string(raw)) {
			return mustBe("previous_response_id", "a response id (1 to 256 printable ASCII characters)")
		}
		r.Previous = string(raw)
	}
	return nil
}

// ValidResponseID reports whether id can name a stored response: 1 to MaxResponseIDLen
// printable ASCII bytes without spaces, '/', '?' or '#' (so it is one path segment).
func ValidResponseID(id string) bool {
	if id == "" || len(id) > MaxResponseIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c <= ' ' || c > '~' || c == '/' || c == '?' || c == '#' || c == '%' {
			return false
		}
	}
	return true
}

// otherCost sizes a request of another endpoint: its prompt field's bytes (the whole body
// when it has none) at 4 bytes a token, and what it may generate: "max_tokens" for Anthropic's
// Messages, "max_output_tokens" for Responses, nothing for the endpoints that generate no
// tokens.
func (f *fields) otherCost(kind Kind, body []byte) Cost {
	n := len(body)
	if f.raw.present() {
		n = f.raw.end - f.raw.start
	}
	c := Cost{PromptTokens: (int64(n) + 3) / 4, Prompts: 1, Choices: 1}
	switch kind {
	case Messages:
		c.MaxTokens = count(body, f.maxTokens, 0)
	case Responses:
		c.MaxTokens = count(body, f.maxOutput, 0)
	}
	return c
}
