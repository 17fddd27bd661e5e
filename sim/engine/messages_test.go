package engine

import (
	"encoding/json"
	"strings"
	"testing"
)

type anthropicMessage struct {
	ID, Type, Role, Model string
	Content               []struct{ Type, Text string }
	StopReason            string  `json:"stop_reason"`
	StopSequence          *string `json:"stop_sequence"`
	Usage                 struct {
		Input  int `json:"input_tokens"`
		Output int `json:"output_tokens"`
	}
}

// TestMessagesAPI: /v1/messages answers Anthropic's message shape with chat's text for the same
// conversation (system first, the same template and sampler) and max_tokens as its stop reason
// when it hit the limit; streamed, Anthropic's named events in order whose text deltas make
// the same text.
func TestMessagesAPI(t *testing.T) {
	e := start(t, Config{})
	body := `{"model":"smol","max_tokens":5,"system":[{"type":"text","text":"be brief"}],"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]`
	resp, out := post(t, e, "/v1/messages", body+"}")
	var m anthropicMessage
	if resp.StatusCode != 200 || json.Unmarshal(out, &m) != nil || !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" ||
		m.Role != "assistant" || m.Model != "smol" || len(m.Content) != 1 || m.Content[0].Type != "text" ||
		m.StopSequence != nil || m.StopReason != "end_turn" && m.StopReason != "max_tokens" {
		t.Fatalf("message: %d %s", resp.StatusCode, out)
	}
	_, cb := post(t, e, "/v1/chat/completions", `{"model":"smol","max_tokens":5,"temperature":0,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]}`)
	var c completion
	_ = json.Unmarshal(cb, &c)
	if m.Content[0].Text != c.Choices[0].Message.Content || m.Usage.Input != c.Usage.PromptTokens || m.Usage.Output != c.Usage.CompletionTokens {
		t.Fatalf("message %s, chat %s", out, cb)
	}
	if want := map[bool]string{true: "max_tokens", false: "end_turn"}[m.Usage.Output == 5]; m.StopReason != want {
		t.Fatalf("stop_reason %q after %d of 5 tokens", m.StopReason, m.Usage.Output)
	}
	resp, out = post(t, e, "/v1/messages", body+`,"stream":true}`)
	var names []string
	var text strings.Builder
	for _, ev := range sseEvents(out) {
		var v struct {
			Type  string
			Delta struct{ Type, Text string }
		}
		if json.Unmarshal([]byte(ev.data), &v) != nil || v.Type != ev.name {
			t.Fatalf("event %q: %s", ev.name, ev.data)
		}
		if v.Type == "content_block_delta" {
			text.WriteString(v.Delta.Text)
			if names[len(names)-1] == v.Type {
				continue
			}
		}
		names = append(names, v.Type)
	}
	want := "message_start content_block_start ping content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(names, " ") != want || text.String() != m.Content[0].Text || strings.Contains(string(out), "[DONE]") {
		t.Fatalf("stream events %v text %q: %s", names, text.String(), out)
	}
	for _, bad := range []string{
		`{"model":"smol","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"smol","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"smol","max_tokens":3,"messages":[]}`,
		`{"model":"smol","max_tokens":3,"messages":[{"role":"tool","content":"x"}]}`,
		`{"model":"smol","max_tokens":3,"temperature":1.5,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":`,
	} {
		resp, b := post(t, e, "/v1/messages", bad)
		var a struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if resp.StatusCode != 400 || json.Unmarshal(b, &a) != nil || a.Type != "error" || a.Error.Type != "invalid_request_error" || a.Error.Message == "" {
			t.Errorf("%s: %d %s, want Anthropic's invalid_request_error", bad, resp.StatusCode, b)
		}
	}
}
