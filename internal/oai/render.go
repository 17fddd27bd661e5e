package oai

import "encoding/json"

// RenderPrompt renders a request's prompt as the prefix key does (R4: the completions prompt,
// or "role\ncontent\n" per chat message) but in full, up to max bytes. It serves the
// approximate prefix index (R10), which only prefix-aware routing and the Cold Pool
// classifier read, so it favours simplicity over the hot path's hand-written scanner.
func RenderPrompt(kind Kind, body []byte, max int) []byte {
	var out []byte
	add := func(b []byte) bool {
		out = append(out, b[:min(len(b), max-len(out))]...)
		return len(out) < max
	}
	if kind == Completions {
		var w struct {
			Prompt json.RawMessage `json:"prompt"`
		}
		if json.Unmarshal(body, &w) != nil {
			return nil
		}
		var s string
		if json.Unmarshal(w.Prompt, &s) == nil {
			add([]byte(s))
			return out
		}
		var arr []string
		if json.Unmarshal(w.Prompt, &arr) == nil && len(arr) > 0 {
			add([]byte(arr[0]))
		}
		return out
	}
	var w struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &w) != nil {
		return nil
	}
	for _, m := range w.Messages {
		if !add([]byte(m.Role)) || !add([]byte{'\n'}) {
			return out
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			if !add([]byte(s)) {
				return out
			}
		} else {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(m.Content, &parts) == nil {
				for _, p := range parts {
					if p.Type == "text" && !add([]byte(p.Text)) {
						return out
					}
				}
			}
		}
		if !add([]byte{'\n'}) {
			return out
		}
	}
	return out
}
