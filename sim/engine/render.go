package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/tlgw/tlgw/sim/sampler"
)

// The tokenizer's endpoints: /tokenize, /detokenize and the render endpoints answer with the
// token ids the engine itself computes its KV and prefix cache over (sampler.Tokenize of the
// prompt, a chat's through the engine's chat template), so a gateway can match them. They do
// no model work: they neither queue nor run.

// maxInputs bounds the inputs of one batch (prompts, documents, texts), as OpenAI bounds an
// embeddings batch.
const maxInputs = 2048

// input is one prompt of a batch: its text (as given, or the detokenized ids) and token ids.
type input struct {
	text string
	ids  []uint32
}

// parseInputs reads a prompt or input field: a string, an array of strings, an array of token
// ids, or an array of arrays of ids; each string is tokenized with the engine's tokenizer. An
// empty batch, an empty string and an id outside the vocabulary are refused, naming field.
func parseInputs(raw json.RawMessage, field string) ([]input, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid(`%q is required`, field)
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return checkInputs([]input{{text: one, ids: sampler.Tokenize(one)}}, field)
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err == nil {
		if len(texts) > maxInputs {
			return nil, invalid("%q has %d entries, at most %d", field, len(texts), maxInputs)
		}
		out := make([]input, len(texts))
		for i, t := range texts {
			out[i] = input{text: t, ids: sampler.Tokenize(t)}
		}
		return checkInputs(out, field)
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		in, err := idsInput(ids, field)
		if err != nil {
			return nil, err
		}
		return checkInputs([]input{in}, field)
	}
	var batch [][]int64
	if err := json.Unmarshal(raw, &batch); err != nil {
		return nil, invalid("%q must be a string, an array of strings, an array of token ids or an array of arrays of token ids", field)
	}
	if len(batch) > maxInputs {
		return nil, invalid("%q has %d entries, at most %d", field, len(batch), maxInputs)
	}
	out := make([]input, len(batch))
	for i, b := range batch {
		in, err := idsInput(b, field)
		if err != nil {
			return nil, err
		}
		out[i] = in
	}
	return checkInputs(out, field)
}

func checkInputs(in []input, field string) ([]input, error) {
	if len(in) == 0 {
		return nil, invalid("%q must not be empty", field)
	}
	for i, x := range in {
		if len(x.ids) == 0 {
			return nil, invalid("%q[%d] is empty", field, i)
		}
	}
	return in, nil
}

// idsInput checks token ids against the vocabulary.
func idsInput(ids []int64, field string) (input, error) {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(sampler.VocabSize) {
			return input{}, invalid("%q: token id %d is outside the vocabulary [0, %d)", field, id, sampler.VocabSize)
		}
		out[i] = uint32(id)
	}
	return input{text: sampler.Detokenize(out), ids: out}, nil
}

// writeJSON answers 200 with v.
func writeJSON(w http.ResponseWriter, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, err = w.Write(b)
	return err
}

// answer counts a finished request of endpoint and writes v, or the error.
func (e *Engine) answer(w http.ResponseWriter, endpoint string, v any, err error) {
	if err != nil {
		e.fail(w, endpoint, err, writeAPIError)
		return
	}
	e.met.request(endpoint, writeJSON(w, v))
}

// modelOf reads a body's "model" (required) and checks it.
func (e *Engine) modelOf(body []byte) (string, error) {
	var m struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return "", invalid("invalid JSON body: %v", err)
	}
	if m.Model == "" {
		return "", invalid(`"model" is required`)
	}
	return m.Model, e.checkModel(m.Model)
}

// serveTokenize answers POST /tokenize (and /v1/tokenize) like vLLM: {"count","max_model_len",
// "tokens","token_strs"}. The body has "prompt" (completions) or "messages" (chat, rendered
// through the template).
func (e *Engine) serveTokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := e.front(w, r, EndpointTokenize, maxBody, writeAPIError)
	if !ok {
		return
	}
	var probe struct {
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(body, &probe)
	// A tokenize body is a completions or chat body without sampling fields; the same parser
	// checks it (model, prompt or messages) with the sampling defaults.
	req, err := parseRequest(body, len(bytes.TrimSpace(probe.Messages)) > 0, e.checkModel)
	if err != nil || e.stalled(r, EndpointTokenize) {
		if err != nil {
			e.fail(w, EndpointTokenize, err, writeAPIError)
		}
		return
	}
	ids := sampler.Tokenize(req.prompt)
	e.answer(w, EndpointTokenize, map[string]any{
		"count": len(ids), "max_model_len": e.maxModelLen(), "tokens": ids, "token_strs": nil,
	}, nil)
}

// serveDetokenize answers POST /detokenize: {"model","tokens"} → {"prompt"}.
func (e *Engine) serveDetokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := e.front(w, r, EndpointDetokenize, maxBody, writeAPIError)
	if !ok {
		return
	}
	text, err := e.parseDetokenize(body)
	if err == nil && e.stalled(r, EndpointDetokenize) {
		return
	}
	e.answer(w, EndpointDetokenize, map[string]any{"prompt": text}, err)
}

// parseDetokenize reads a detokenize body and returns the text of its tokens.
func (e *Engine) parseDetokenize(body []byte) (string, error) {
	if _, err := e.modelOf(body); err != nil {
		return "", err
	}
	var req struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "", invalid(`"tokens" must be an array of token ids: %v`, err)
	}
	if req.Tokens == nil {
		return "", invalid(`"tokens" is required`)
	}
	in, err := idsInput(req.Tokens, "tokens")
	return in.text, err
}

// serveCompletionsRender answers POST /v1/completions/render: one {"request_id","token_ids"} per
// prompt of the batch, the ids the completion would run on.
func (e *Engine) serveCompletionsRender(w http.ResponseWriter, r *http.Request) {
	body, ok := e.front(w, r, EndpointCompletionsRender, maxBody, writeAPIError)
	if !ok {
		return
	}
	out, err := e.renderCompletions(body)
	if err == nil && e.stalled(r, EndpointCompletionsRender) {
		return
	}
	e.answer(w, EndpointCompletionsRender, out, err)
}

func (e *Engine) renderCompletions(body []byte) ([]map[string]any, error) {
	if _, err := e.modelOf(body); err != nil {
		return nil, err
	}
	var req struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	_ = json.Unmarshal(body, &req) // modelOf parsed it
	in, err := parseInputs(req.Prompt, "prompt")
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, len(in))
	for i, x := range in {
		out[i] = map[string]any{"request_id": fmt.Sprintf("cmpl-%s-%d-%d", e.cfg.ID, reqSeq.Add(1), i), "token_ids": x.ids}
	}
	return out, nil
}

// serveChatRender answers POST /v1/chat/completions/render: {"request_id","token_ids"}, the
// messages through the engine's chat template, tokenized.
func (e *Engine) serveChatRender(w http.ResponseWriter, r *http.Request) {
	body, ok := e.front(w, r, EndpointChatRender, maxBody, writeAPIError)
	if !ok {
		return
	}
	req, err := parseRequest(body, true, e.checkModel)
	if err == nil && e.stalled(r, EndpointChatRender) {
		return
	}
	var out map[string]any
	if err == nil {
		out = map[string]any{"request_id": fmt.Sprintf("chatcmpl-%s-%d", e.cfg.ID, reqSeq.Add(1)),
			"token_ids": sampler.Tokenize(req.prompt)}
	}
	e.answer(w, EndpointChatRender, out, err)
}
