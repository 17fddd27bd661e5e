package oai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// This file holds test-only reference implementations built on
// encoding/json: an oracle for the fuzz and property tests, and the
// struct-of-RawMessage decoder that the benchmarks compare the scanner with.

// refRequest decodes body with encoding/json, using a map so that keys
// compare exactly (as the scanner does) and the last duplicate wins.
func refRequest(kind Kind, body []byte) (Request, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return Request{}, err
	}
	if top == nil {
		return Request{}, errors.New("not an object")
	}
	if err := refDuplicateKey(body); err != nil {
		return Request{}, err
	}
	var r Request
	if err := unmarshalOpt(top["model"], &r.Model); err != nil || r.Model == "" {
		return Request{}, errors.New("model")
	}
	if err := unmarshalOpt(top["stream"], &r.Stream); err != nil {
		return Request{}, err
	}
	if err := unmarshalOpt(top["user"], &r.User); err != nil {
		return Request{}, err
	}
	var render []byte
	var err error
	if kind == Chat {
		render, err = refRenderChat(top["messages"])
	} else {
		render, err = refRenderPrompt(top["prompt"])
	}
	if err != nil {
		return Request{}, err
	}
	r.PrefixKey = render[:min(len(render), PrefixLen)]
	r.Cost = refCost(kind, top)
	return r, nil
}

// refCost is Cost from a body encoding/json decoded (one whose prompt is well formed): every
// prompt's strings as written (their raw length less the quotes), token ids, and the counts.
func refCost(kind Kind, top map[string]json.RawMessage) Cost {
	var text, ids, prompts int64
	str := func(raw json.RawMessage) int64 { return int64(len(raw) - 2) }
	if kind == Chat {
		var msgs []map[string]json.RawMessage
		_ = json.Unmarshal(top["messages"], &msgs)
		prompts = 1
		for _, m := range msgs {
			text += str(m["role"]) + 2
			c := m["content"]
			switch {
			case isNullRaw(c):
			case c[0] == '"':
				text += str(c)
			default:
				var parts []map[string]json.RawMessage
				_ = json.Unmarshal(c, &parts)
				for _, p := range parts {
					var typ string
					if _ = json.Unmarshal(p["type"], &typ); typ == "text" {
						text += str(p["text"])
					}
				}
			}
		}
	} else {
		raw := top["prompt"]
		var elems []json.RawMessage
		switch {
		case raw[0] == '"':
			prompts, text = 1, str(raw)
		case json.Unmarshal(raw, &elems) == nil && elems[0][0] == '"':
			for _, e := range elems {
				prompts, text = prompts+1, text+str(e)
			}
		case elems[0][0] == '[':
			for _, e := range elems {
				var inner []json.RawMessage
				_ = json.Unmarshal(e, &inner)
				prompts, ids = prompts+1, ids+int64(len(inner))
			}
		default:
			prompts, ids = 1, int64(len(elems))
		}
	}
	c := Cost{PromptTokens: (text+3)/4 + ids, Prompts: prompts,
		Choices: max(refCount(top["n"], 1), refCount(top["best_of"], 1), 1)}
	switch {
	case kind == Chat && !isNullRaw(top["max_completion_tokens"]):
		c.MaxTokens = refCount(top["max_completion_tokens"], 0)
	case !isNullRaw(top["max_tokens"]):
		c.MaxTokens = refCount(top["max_tokens"], 0)
	case kind == Completions:
		c.MaxTokens = DefaultMaxTokens
	}
	return c
}

// refCount reads a count as Cost documents it: a JSON number or a string without escapes
// holding a number strconv reads, a fraction up to the next integer, clamped to MaxCount;
// else def.
func refCount(raw json.RawMessage, def int64) int64 {
	if isNullRaw(raw) {
		return def
	}
	var s string
	switch {
	case raw[0] == '"' && !bytes.ContainsRune(raw, '\\'):
		_ = json.Unmarshal(raw, &s)
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		s = string(raw)
	default:
		return def
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case math.IsInf(f, 1):
		return MaxCount
	case err != nil || math.IsNaN(f) || f < 0:
		return def
	case f > MaxCount:
		return MaxCount
	}
	return int64(math.Ceil(f))
}

func isNullRaw(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// unmarshalOpt decodes raw into v unless it is absent or null, refusing a
// null-to-zero conversion that encoding/json would silently do.
func unmarshalOpt(raw json.RawMessage, v any) error {
	if isNullRaw(raw) {
		return nil
	}
	return json.Unmarshal(raw, v)
}

func refRenderPrompt(raw json.RawMessage) ([]byte, error) {
	if isNullRaw(raw) {
		return nil, errors.New("prompt required")
	}
	var s string
	if raw[0] == '"' {
		err := json.Unmarshal(raw, &s)
		return []byte(s), err
	}
	var elems []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &elems) != nil || len(elems) == 0 {
		return nil, errors.New("bad prompt")
	}
	switch elems[0][0] {
	case '"':
		for _, e := range elems {
			if e[0] != '"' {
				return nil, errors.New("mixed prompt")
			}
		}
		err := json.Unmarshal(elems[0], &s)
		return []byte(s), err
	case '[':
		var first []byte
		for i, e := range elems {
			var ids []json.RawMessage
			if e[0] != '[' || json.Unmarshal(e, &ids) != nil || len(ids) == 0 || !refIDs(ids) {
				return nil, errors.New("bad token-id array")
			}
			if i == 0 {
				first = joinIDs(ids)
			}
		}
		return first, nil
	default:
		if !refIDs(elems) {
			return nil, errors.New("bad token ids")
		}
		return joinIDs(elems), nil
	}
}

func refIDs(ids []json.RawMessage) bool {
	for _, id := range ids {
		if !tokenID(id) {
			return false
		}
	}
	return true
}

func joinIDs(ids []json.RawMessage) []byte {
	var b []byte
	for i, id := range ids {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, id...)
	}
	return b
}

func refRenderChat(raw json.RawMessage) ([]byte, error) {
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil || len(msgs) == 0 {
		return nil, errors.New("bad messages")
	}
	var b []byte
	for _, m := range msgs {
		if m == nil {
			return nil, errors.New("message not an object")
		}
		var role string
		if isNullRaw(m["role"]) || json.Unmarshal(m["role"], &role) != nil {
			return nil, errors.New("bad role")
		}
		b = append(append(b, role...), '\n')
		c := m["content"]
		if !isNullRaw(c) {
			var s string
			if err := json.Unmarshal(c, &s); err == nil {
				b = append(b, s...)
			} else {
				var parts []map[string]json.RawMessage
				if err := json.Unmarshal(c, &parts); err != nil || c[0] != '[' {
					return nil, errors.New("bad content")
				}
				for _, p := range parts {
					var typ, text string
					if p == nil || isNullRaw(p["type"]) || json.Unmarshal(p["type"], &typ) != nil {
						return nil, errors.New("bad part")
					}
					if typ != "text" {
						continue
					}
					if isNullRaw(p["text"]) || json.Unmarshal(p["text"], &text) != nil {
						return nil, errors.New("bad text")
					}
					b = append(b, text...)
				}
			}
		}
		b = append(b, '\n')
	}
	return b, nil
}

// stdlibParse is the encoding/json design the scanner was measured against:
// one struct of json.RawMessage fields, then each needed field decoded.
// It is for the benchmarks only (its keys match case-insensitively).
func stdlibParse(kind Kind, body []byte) (Request, error) {
	var top struct {
		Model    json.RawMessage `json:"model"`
		Stream   json.RawMessage `json:"stream"`
		User     json.RawMessage `json:"user"`
		Prompt   json.RawMessage `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &top); err != nil {
		return Request{}, err
	}
	var r Request
	if err := unmarshalOpt(top.Model, &r.Model); err != nil || r.Model == "" {
		return Request{}, errors.New("model")
	}
	if err := unmarshalOpt(top.Stream, &r.Stream); err != nil {
		return Request{}, err
	}
	if err := unmarshalOpt(top.User, &r.User); err != nil {
		return Request{}, err
	}
	var p prefix
	if kind == Chat {
		var msgs []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(top.Messages, &msgs); err != nil || len(msgs) == 0 {
			return Request{}, errors.New("messages")
		}
		for _, m := range msgs {
			p.write([]byte(m.Role))
			p.writeByte('\n')
			var s string
			if len(m.Content) > 0 && m.Content[0] == '"' {
				if err := json.Unmarshal(m.Content, &s); err != nil {
					return Request{}, err
				}
				p.write([]byte(s))
			} else if len(m.Content) > 0 && m.Content[0] == '[' {
				var parts []struct{ Type, Text string }
				if err := json.Unmarshal(m.Content, &parts); err != nil {
					return Request{}, err
				}
				for _, pt := range parts {
					if pt.Type == "text" {
						p.write([]byte(pt.Text))
					}
				}
			}
			p.writeByte('\n')
		}
	} else {
		b, err := refRenderPrompt(top.Prompt)
		if err != nil {
			return Request{}, err
		}
		p.write(b)
	}
	r.PrefixKey = p.key()
	return r, nil
}

// validUTF8Model is what a decoder reads back for model after quote: each
// invalid byte becomes U+FFFD.
func validUTF8Model(model string) string {
	var b strings.Builder
	for _, r := range model {
		b.WriteRune(r)
	}
	return b.String()
}

// refDuplicateKey walks the top-level object's members with encoding/json's tokenizer and
// reports the first key that repeats (keys compare on their decoded text).
func refDuplicateKey(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // '{'
		return err
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		k := tok.(string)
		if seen[k] {
			return errors.New("duplicate key " + k)
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
	}
	return nil
}
