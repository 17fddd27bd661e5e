package cascade

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The helpers below read the non-streamed OpenAI response bodies a cascade
// step gets back: completions (object "text_completion") and chat
// completions (object "chat.completion"). Only choices[0] is consulted for
// the accept decision, since a cascade step asks for one answer.

// firstChoice returns the fields of choices[0].
func firstChoice(body []byte) (map[string]json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("cascade: response body is not a JSON object: %w", err)
	}
	raw, ok := top["choices"]
	if !ok {
		return nil, errors.New("cascade: response has no choices")
	}
	var choices []json.RawMessage
	if isNull(raw) || json.Unmarshal(raw, &choices) != nil {
		return nil, fmt.Errorf("cascade: response choices: want an array, got %s", abbreviate(raw))
	}
	if len(choices) == 0 {
		return nil, errors.New("cascade: response choices is empty")
	}
	var choice map[string]json.RawMessage
	if isNull(choices[0]) || json.Unmarshal(choices[0], &choice) != nil {
		return nil, fmt.Errorf("cascade: choices[0]: want an object, got %s", abbreviate(choices[0]))
	}
	return choice, nil
}

// LogprobsOf returns the per-token logprobs of the first choice of a
// response body, in either shape:
//
//	completions  choices[0].logprobs.token_logprobs: [number, ...]
//	chat         choices[0].logprobs.content: [{"logprob": number, ...}, ...]
//
// An empty list is an answer with no tokens and is returned as an empty,
// non-nil slice without error. It is an error when the body is not JSON,
// has no choices, choices[0].logprobs is absent or null, the logprobs object
// has neither list (or both), a list is null, or an entry is not a finite
// number (a null entry included).
func LogprobsOf(body []byte) ([]float64, error) {
	choice, err := firstChoice(body)
	if err != nil {
		return nil, err
	}
	raw, ok := choice["logprobs"]
	if !ok || isNull(raw) {
		return nil, errors.New("cascade: choices[0].logprobs is absent or null (were logprobs requested?)")
	}
	var lp map[string]json.RawMessage
	if json.Unmarshal(raw, &lp) != nil {
		return nil, fmt.Errorf("cascade: choices[0].logprobs: want an object, got %s", abbreviate(raw))
	}
	content, isChat := lp["content"]
	tokens, isCompletion := lp["token_logprobs"]
	switch {
	case isChat && isCompletion:
		return nil, errors.New("cascade: choices[0].logprobs has both content (chat) and token_logprobs (completions)")
	case isCompletion:
		elems, err := parseArray(tokens)
		if err != nil {
			return nil, fmt.Errorf("cascade: choices[0].logprobs.token_logprobs: %w", err)
		}
		out := make([]float64, len(elems))
		for i, e := range elems {
			if out[i], err = parseNumber(e); err != nil {
				return nil, fmt.Errorf("cascade: choices[0].logprobs.token_logprobs[%d]: %w", i, err)
			}
		}
		return out, nil
	case isChat:
		elems, err := parseArray(content)
		if err != nil {
			return nil, fmt.Errorf("cascade: choices[0].logprobs.content: %w", err)
		}
		out := make([]float64, len(elems))
		for i, e := range elems {
			var entry map[string]json.RawMessage
			if isNull(e) || json.Unmarshal(e, &entry) != nil {
				return nil, fmt.Errorf("cascade: choices[0].logprobs.content[%d]: want an object, got %s", i, abbreviate(e))
			}
			v, ok := entry["logprob"]
			if !ok {
				return nil, fmt.Errorf("cascade: choices[0].logprobs.content[%d] has no logprob", i)
			}
			if out[i], err = parseNumber(v); err != nil {
				return nil, fmt.Errorf("cascade: choices[0].logprobs.content[%d].logprob: %w", i, err)
			}
		}
		return out, nil
	}
	return nil, errors.New("cascade: choices[0].logprobs has neither content (chat) nor token_logprobs (completions)")
}

// TextOf returns the answer text of the first choice: choices[0].text for
// completions, choices[0].message.content for chat. It is an error when the
// body is not JSON, has no choices, the choice has neither field (or both),
// or the text is not a string (a null chat content included).
func TextOf(body []byte) (string, error) {
	choice, err := firstChoice(body)
	if err != nil {
		return "", err
	}
	msg, isChat := choice["message"]
	text, isCompletion := choice["text"]
	var s string
	switch {
	case isChat && isCompletion:
		return "", errors.New("cascade: choices[0] has both message (chat) and text (completions)")
	case isCompletion:
		if isNull(text) || json.Unmarshal(text, &s) != nil {
			return "", fmt.Errorf("cascade: choices[0].text: want a string, got %s", abbreviate(text))
		}
		return s, nil
	case isChat:
		var m map[string]json.RawMessage
		if isNull(msg) || json.Unmarshal(msg, &m) != nil {
			return "", fmt.Errorf("cascade: choices[0].message: want an object, got %s", abbreviate(msg))
		}
		c, ok := m["content"]
		if !ok {
			return "", errors.New("cascade: choices[0].message has no content")
		}
		if isNull(c) || json.Unmarshal(c, &s) != nil {
			return "", fmt.Errorf("cascade: choices[0].message.content: want a string, got %s", abbreviate(c))
		}
		return s, nil
	}
	return "", errors.New("cascade: choices[0] has neither message (chat) nor text (completions)")
}

// StripLogprobs returns a copy of a response body in which the value of
// every choices[i].logprobs is replaced by null, for a client that did not
// ask for logprobs when the gateway forced them on.
//
// The edit preserves bytes: everything outside the replaced values (field
// order, spacing, number spellings, escapes, other fields of the choices)
// is copied unchanged. A choice without a logprobs field is left as it is,
// as is a body whose choices field is absent or null. It is an error when
// the body is not valid JSON or not an object, choices is neither an array
// nor null, or a choice is not an object. If a choice repeats the logprobs
// field, every occurrence is replaced.
func StripLogprobs(body []byte) ([]byte, error) {
	if !json.Valid(body) {
		return nil, errors.New("cascade: response body is not valid JSON")
	}
	spans, err := logprobsSpans(body)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body))
	last := 0
	for _, sp := range spans {
		out = append(out, body[last:sp[0]]...)
		out = append(out, "null"...)
		last = sp[1]
	}
	return append(out, body[last:]...), nil
}

// logprobsSpans returns the byte ranges [start, end) of the values of the
// choices[i].logprobs fields, in order. body is valid JSON.
func logprobsSpans(body []byte) ([][2]int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("cascade: response body: %w", err)
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("cascade: response body: want a JSON object, got %s", describeToken(tok))
	}
	var spans [][2]int
	skip := func() error {
		var raw json.RawMessage
		return dec.Decode(&raw)
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, err
		}
		if key != "choices" {
			if err := skip(); err != nil {
				return nil, err
			}
			continue
		}
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		if tok == nil {
			continue // "choices": null
		}
		if tok != json.Delim('[') {
			return nil, fmt.Errorf("cascade: response choices: want an array, got %s", describeToken(tok))
		}
		for i := 0; dec.More(); i++ {
			tok, err := dec.Token()
			if err != nil {
				return nil, err
			}
			if tok != json.Delim('{') {
				return nil, fmt.Errorf("cascade: choices[%d]: want an object, got %s", i, describeToken(tok))
			}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				if k != "logprobs" {
					if err := skip(); err != nil {
						return nil, err
					}
					continue
				}
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					return nil, err
				}
				// The decoder stops right after the value, and a RawMessage
				// holds the value's bytes exactly, so the value starts
				// len(raw) bytes back. Check it rather than trust it.
				end := int(dec.InputOffset())
				start := end - len(raw)
				if start < 0 || !bytes.Equal(body[start:end], raw) {
					return nil, fmt.Errorf("cascade: choices[%d].logprobs: could not locate the value in the body", i)
				}
				spans = append(spans, [2]int{start, end})
			}
			if _, err := dec.Token(); err != nil { // '}'
				return nil, err
			}
		}
		if _, err := dec.Token(); err != nil { // ']'
			return nil, err
		}
	}
	return spans, nil
}
