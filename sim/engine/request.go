package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/tlgw/tlgw/sim/sampler"
)

// apiError is an OpenAI-shaped error with its HTTP status.
type apiError struct {
	status int
	typ    string
	code   string // "" = the HTTP status as a number, as vLLM writes its own errors
	param  string // the request field at fault; "" = null
	msg    string
}

// vllmError is an error in vLLM's own terms: its type names the exception class
// (BadRequestError, NotFoundError), its code is the HTTP status.
func vllmError(status int, typ, format string, args ...any) *apiError {
	return &apiError{status: status, typ: typ, msg: fmt.Sprintf(format, args...)}
}

// invalid is a 400 in vLLM's terms.
func invalid(format string, args ...any) *apiError {
	return vllmError(400, "BadRequestError", format, args...)
}

// modelNotFound is vLLM's answer to a model it does not serve (neither the base model nor an
// adapter).
func modelNotFound(model string) *apiError {
	return &apiError{status: 404, typ: "NotFoundError", param: "model",
		msg: fmt.Sprintf("The model `%s` does not exist.", model)}
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: 400, typ: "invalid_request_error", code: "invalid_request", msg: fmt.Sprintf(format, args...)}
}

// request is a parsed completions or chat request.
type request struct {
	chat         bool
	model        string
	prompt       string            // the rendered prompt (chat: through the chat template)
	msgs         []sampler.Message // chat: the messages prompt renders
	params       sampler.Params
	seeded       bool
	stream       bool
	includeUsage bool
	logprobs     bool // completions: logprobs ≥ 0 given; chat: logprobs = true
	topLogprobs  int
}

// wireRequest is the JSON the engine accepts: OpenAI completions and chat, plus top_k as vLLM
// does. Fields it does not know are ignored, as engines do.
type wireRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs *int            `json:"top_logprobs"`
	N           *int            `json:"n"`
}

// modelCheck answers whether a request may name model: nil, or the error to answer.
type modelCheck func(model string) error

// parseRequest validates a body; served checks its model.
func parseRequest(body []byte, chat bool, served modelCheck) (*request, error) {
	var w wireRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&w); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if w.Model == "" {
		return nil, badRequest(`"model" is required`)
	}
	if err := served(w.Model); err != nil {
		return nil, err
	}
	r := &request{chat: chat, model: w.Model, stream: w.Stream}
	r.includeUsage = w.StreamOptions != nil && w.StreamOptions.IncludeUsage
	p := sampler.DefaultParams()
	switch {
	case w.MaxCompletionTokens != nil:
		p.MaxTokens = *w.MaxCompletionTokens
	case w.MaxTokens != nil:
		p.MaxTokens = *w.MaxTokens
	}
	if p.MaxTokens <= 0 {
		return nil, badRequest(`"max_tokens" must be at least 1, got %d`, p.MaxTokens)
	}
	if w.Temperature != nil {
		if *w.Temperature < 0 || *w.Temperature > 2 {
			return nil, badRequest(`"temperature" must be between 0 and 2`)
		}
		p.Temperature = *w.Temperature
	}
	if w.TopP != nil {
		if *w.TopP <= 0 || *w.TopP > 1 {
			return nil, badRequest(`"top_p" must be in (0, 1]`)
		}
		p.TopP = *w.TopP
	}
	if w.TopK != nil {
		if *w.TopK < 0 && *w.TopK != -1 {
			return nil, badRequest(`"top_k" must be ≥ 0 (or -1 for off)`)
		}
		if *w.TopK > 0 {
			p.TopK = *w.TopK
		}
	}
	if w.N != nil && *w.N != 1 {
		return nil, badRequest(`"n" other than 1 is not supported`)
	}
	if w.Seed != nil {
		p.Seed, r.seeded = uint64(*w.Seed), true
	}
	stop, err := parseStop(w.Stop)
	if err != nil {
		return nil, err
	}
	p.Stop = stop
	if err := r.parseLogprobs(w); err != nil {
		return nil, err
	}
	if chat {
		msgs, err := parseMessages(w.Messages)
		if err != nil {
			return nil, err
		}
		r.prompt, r.msgs = sampler.RenderChat(msgs), msgs
	} else {
		prompt, err := parsePrompt(w.Prompt)
		if err != nil {
			return nil, err
		}
		r.prompt = prompt
	}
	r.params = p
	return r, nil
}

// parseLogprobs reads logprobs and, for chat, top_logprobs, which asks for alternatives of
// tokens whose logprobs were asked for: a positive top_logprobs without "logprobs": true is
// refused, as OpenAI-compatible servers refuse it.
func (r *request) parseLogprobs(w wireRequest) error {
	raw := bytes.TrimSpace(w.Logprobs)
	absent := len(raw) == 0 || string(raw) == "null"
	if r.chat {
		if !absent {
			var on bool
			if err := json.Unmarshal(raw, &on); err != nil {
				return badRequest(`"logprobs" must be a boolean for chat`)
			}
			r.logprobs = on
		}
		if w.TopLogprobs != nil {
			if *w.TopLogprobs < 0 || *w.TopLogprobs > 20 {
				return badRequest(`"top_logprobs" must be between 0 and 20`)
			}
			if *w.TopLogprobs > 0 && !r.logprobs {
				return badRequest(`"top_logprobs" needs "logprobs": true`)
			}
			r.topLogprobs = *w.TopLogprobs
		}
		return nil
	}
	if absent {
		return nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 || n > 5 {
		return badRequest(`"logprobs" must be an integer between 0 and 5 for completions`)
	}
	r.logprobs, r.topLogprobs = true, n
	return nil
}

func parseStop(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil || len(many) > 4 {
		return nil, badRequest(`"stop" must be a string or an array of up to 4 strings`)
	}
	return many, nil
}

// parsePrompt accepts a string, an array holding one string, or an array of token ids
// (batched prompts are not supported by the simulator: one request, one sequence).
func parsePrompt(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", badRequest(`"prompt" is required`)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var arr []string
	if err := json.Unmarshal(raw, &arr); err == nil && len(arr) == 1 {
		return arr[0], nil
	}
	// Token ids (as vLLM takes them; the gateway's warm-ups cut in tokens send them): the
	// prompt is their text, which tokenizes back to the same ids.
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		in, err := idsInput(ids, "prompt")
		if err != nil {
			return "", err
		}
		return in.text, nil
	}
	return "", badRequest(`"prompt" must be a string, an array with one string, or an array of token ids`)
}

func parseMessages(raw json.RawMessage) ([]sampler.Message, error) {
	var wire []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, badRequest(`"messages" is required`)
	}
	if err := json.Unmarshal(raw, &wire); err != nil {
		return nil, badRequest(`"messages" must be an array of {role, content}: %v`, err)
	}
	if len(wire) == 0 {
		return nil, badRequest(`"messages" must not be empty`)
	}
	out := make([]sampler.Message, 0, len(wire))
	for i, m := range wire {
		if m.Role == "" {
			return nil, badRequest(`messages[%d].role is required`, i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		out = append(out, sampler.Message{Role: m.Role, Content: text})
	}
	return out, nil
}

// contentText reads a message content: a string, null, or text parts.
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}
