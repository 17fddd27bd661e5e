package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tlgw/tlgw/sim/sampler"
)

// maxStopSequences bounds an Anthropic request's stop_sequences.
const maxStopSequences = 16

// parseMessagesAPI reads an Anthropic Messages body: model, max_tokens (required), messages
// (user and assistant turns whose content is a string or text blocks), system (a string or
// text blocks), stop_sequences, temperature (0 to 1), top_p, top_k, stream. The conversation is
// rendered through the engine's chat template, the system prompt first, as chat renders it.
func parseMessagesAPI(body []byte, check modelCheck) (*request, error) {
	var w struct {
		Model         string          `json:"model"`
		MaxTokens     *int            `json:"max_tokens"`
		Messages      json.RawMessage `json:"messages"`
		System        json.RawMessage `json:"system"`
		StopSequences []string        `json:"stop_sequences"`
		Temperature   *float64        `json:"temperature"`
		TopP          *float64        `json:"top_p"`
		TopK          *int            `json:"top_k"`
		Stream        bool            `json:"stream"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if w.Model == "" {
		return nil, badRequest("model: Field required")
	}
	if err := check(w.Model); err != nil {
		return nil, err
	}
	if w.MaxTokens == nil {
		return nil, badRequest("max_tokens: Field required")
	}
	p := sampler.DefaultParams()
	if p.MaxTokens = *w.MaxTokens; p.MaxTokens < 1 {
		return nil, badRequest("max_tokens: must be at least 1")
	}
	if w.Temperature != nil {
		if !(*w.Temperature >= 0 && *w.Temperature <= 1) {
			return nil, badRequest("temperature: must be between 0 and 1")
		}
		p.Temperature = *w.Temperature
	}
	if w.TopP != nil {
		if !(*w.TopP > 0 && *w.TopP <= 1) {
			return nil, badRequest("top_p: must be in (0, 1]")
		}
		p.TopP = *w.TopP
	}
	if w.TopK != nil {
		if *w.TopK < 0 {
			return nil, badRequest("top_k: must not be negative")
		}
		p.TopK = *w.TopK
	}
	if len(w.StopSequences) > maxStopSequences {
		return nil, badRequest("stop_sequences: at most %d", maxStopSequences)
	}
	p.Stop = w.StopSequences
	var msgs []sampler.Message
	if raw := bytes.TrimSpace(w.System); len(raw) > 0 && string(raw) != "null" {
		text, err := partsText(raw, "text")
		if err != nil {
			return nil, badRequest("system: %v", err)
		}
		msgs = append(msgs, sampler.Message{Role: "system", Content: text})
	}
	var turns []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(w.Messages, &turns); err != nil || len(turns) == 0 {
		return nil, badRequest("messages: must be a non-empty array of {role, content}")
	}
	for i, t := range turns {
		if t.Role != "user" && t.Role != "assistant" {
			return nil, badRequest("messages.%d.role: must be user or assistant", i)
		}
		text, err := partsText(t.Content, "text")
		if err != nil {
			return nil, badRequest("messages.%d.content: %v", i, err)
		}
		msgs = append(msgs, sampler.Message{Role: t.Role, Content: text})
	}
	return &request{chat: true, model: w.Model, prompt: sampler.RenderChat(msgs), msgs: msgs, params: p, stream: w.Stream}, nil
}

// anthropicTypes maps a status to Anthropic's error type.
func anthropicType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	}
	return "api_error"
}

// writeAnthropicError writes err in Anthropic's error shape:
// {"type":"error","error":{"type":…,"message":…}}.
func writeAnthropicError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: 500, msg: err.Error()}
	}
	body, _ := json.Marshal(map[string]any{"type": "error",
		"error": map[string]string{"type": anthropicType(ae.status), "message": ae.msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.status)
	_, _ = w.Write(body)
}

// serveMessages answers POST /v1/messages, Anthropic's Messages API, sampled as chat is.
func (e *Engine) serveMessages(w http.ResponseWriter, r *http.Request) {
	body, ok := e.front(w, r, EndpointMessages, maxBody, writeAnthropicError)
	if !ok {
		return
	}
	req, err := parseMessagesAPI(body, e.checkModel)
	if err != nil {
		e.fail(w, EndpointMessages, err, writeAnthropicError)
		return
	}
	if e.stalled(r, EndpointMessages) {
		return
	}
	x := &run{e: e, w: w, r: r, req: req, prompt: sampler.Tokenize(req.prompt), id: newID("msg_"),
		out: messagesFormat{}, errw: writeAnthropicError}
	e.generate(EndpointMessages, x)
}

// messagesFormat is Anthropic's Messages API: one text block.
type messagesFormat struct{}

var _ format = messagesFormat{}

func stopReason(x *run) string {
	if x.finish == sampler.FinishLength {
		return "max_tokens"
	}
	return "end_turn"
}

func (messagesFormat) message(x *run, done bool) map[string]any {
	content := []any{}
	var reason any
	out := 0
	if done {
		content = append(content, map[string]string{"type": "text", "text": x.text()})
		reason, out = stopReason(x), len(x.tokens)
	}
	return map[string]any{"id": x.id, "type": "message", "role": "assistant", "model": x.req.model,
		"content": content, "stop_reason": reason, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": x.promptTokens, "output_tokens": out,
			"cache_read_input_tokens": x.cached, "cache_creation_input_tokens": 0}}
}

func (f messagesFormat) open(x *run) error {
	if err := x.namedEvent("message_start", map[string]any{"type": "message_start", "message": f.message(x, false)}); err != nil {
		return err
	}
	if err := x.namedEvent("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
		"content_block": map[string]string{"type": "text", "text": ""}}); err != nil {
		return err
	}
	return x.namedEvent("ping", map[string]string{"type": "ping"})
}

func (messagesFormat) token(x *run, tok sampler.Token) error {
	return x.namedEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
		"delta": map[string]string{"type": "text_delta", "text": tok.Text}})
}

func (messagesFormat) close(x *run) error {
	if err := x.namedEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}); err != nil {
		return err
	}
	if err := x.namedEvent("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stopReason(x), "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": len(x.tokens)}}); err != nil {
		return err
	}
	return x.namedEvent("message_stop", map[string]string{"type": "message_stop"})
}

func (f messagesFormat) whole(x *run) ([]byte, string, error) {
	b, err := json.Marshal(f.message(x, true))
	return b, "application/json", err
}
