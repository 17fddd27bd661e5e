package engine

import (
	"bytes"
	"container/list"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/tlgw/tlgw/sim/sampler"
)

// Stored responses (store: true, the default) are kept in memory for GET, DELETE and
// previous_response_id: at most maxStoredResponses of them and maxStoredResponseBytes of their
// answers and conversations together; past either bound the oldest are dropped.
const (
	maxStoredResponses     = 4096
	maxStoredResponseBytes = 64 << 20
)

// storedResponse is one stored answer: its JSON, and the conversation a follow-up continues
// (the input messages, the previous conversation's included, and the answer).
type storedResponse struct {
	id      string
	body    []byte
	history []sampler.Message
	size    int
}

// responseStore is the stored responses, oldest first.
type responseStore struct {
	mu            sync.Mutex
	maxN, maxSize int
	size          int
	byID          map[string]*list.Element // of *storedResponse; at most maxN
	order         *list.List
}

func newResponseStore(maxN, maxSize int) *responseStore {
	return &responseStore{maxN: maxN, maxSize: maxSize, byID: make(map[string]*list.Element), order: list.New()}
}

func (s *responseStore) put(r *storedResponse) {
	r.size = len(r.body)
	for _, m := range r.history {
		r.size += len(m.Role) + len(m.Content)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.size > s.maxSize {
		return // larger than the whole store: not kept
	}
	for s.order.Len() > 0 && (s.order.Len() >= s.maxN || s.size+r.size > s.maxSize) {
		s.removeLocked(s.order.Front())
	}
	s.byID[r.id] = s.order.PushBack(r)
	s.size += r.size
}

func (s *responseStore) get(id string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.byID[id]
	if !ok {
		return nil, false
	}
	return el.Value.(*storedResponse), true
}

func (s *responseStore) remove(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.byID[id]
	if ok {
		s.removeLocked(el)
	}
	return ok
}

func (s *responseStore) removeLocked(el *list.Element) {
	r := s.order.Remove(el).(*storedResponse)
	delete(s.byID, r.id)
	s.size -= r.size
}

func (s *responseStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}

// responsesRequest is a parsed POST /v1/responses body.
type responsesRequest struct {
	req          *request
	instructions *string
	input        []sampler.Message // this request's input
	history      []sampler.Message // the previous response's conversation
	previous     *string
	store        bool
	maxOutput    *int
	temperature  float64
	topP         float64
}

// maxResponseItems bounds a Responses input's items.
const maxResponseItems = 4096

// parseResponses reads a Responses body: model, input (a string or message items whose content
// is a string or text parts), instructions, max_output_tokens, temperature, top_p, seed,
// stream, store and previous_response_id (looked up in stored).
func parseResponses(body []byte, check modelCheck, stored func(string) (*storedResponse, bool)) (*responsesRequest, error) {
	var w struct {
		Model           string          `json:"model"`
		Input           json.RawMessage `json:"input"`
		Instructions    *string         `json:"instructions"`
		MaxOutputTokens *int            `json:"max_output_tokens"`
		Temperature     *float64        `json:"temperature"`
		TopP            *float64        `json:"top_p"`
		Seed            *int64          `json:"seed"`
		Stream          bool            `json:"stream"`
		Store           *bool           `json:"store"`
		Previous        *string         `json:"previous_response_id"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if w.Model == "" {
		return nil, badRequest(`"model" is required`)
	}
	if err := check(w.Model); err != nil {
		return nil, err
	}
	rr := &responsesRequest{store: w.Store == nil || *w.Store, instructions: w.Instructions, previous: w.Previous,
		maxOutput: w.MaxOutputTokens}
	p := sampler.DefaultParams()
	if w.MaxOutputTokens != nil {
		if *w.MaxOutputTokens < 1 {
			return nil, badRequest(`"max_output_tokens" must be at least 1`)
		}
		p.MaxTokens = *w.MaxOutputTokens
	} else {
		p.MaxTokens = 256
	}
	if w.Temperature != nil {
		if !(*w.Temperature >= 0 && *w.Temperature <= 2) {
			return nil, badRequest(`"temperature" must be between 0 and 2`)
		}
		p.Temperature = *w.Temperature
	}
	if w.TopP != nil {
		if !(*w.TopP > 0 && *w.TopP <= 1) {
			return nil, badRequest(`"top_p" must be in (0, 1]`)
		}
		p.TopP = *w.TopP
	}
	rr.temperature, rr.topP = p.Temperature, p.TopP
	input, err := responseInput(w.Input)
	if err != nil {
		return nil, err
	}
	rr.input = input
	if w.Previous != nil {
		prev, ok := stored(*w.Previous)
		if !ok {
			return nil, &apiError{status: 404, typ: "invalid_request_error", param: "previous_response_id",
				code: "previous_response_not_found", msg: "Previous response with id '" + *w.Previous + "' not found."}
		}
		rr.history = prev.history
	}
	var msgs []sampler.Message
	if w.Instructions != nil {
		msgs = append(msgs, sampler.Message{Role: "system", Content: *w.Instructions})
	}
	msgs = append(append(msgs, rr.history...), rr.input...)
	rr.req = &request{model: w.Model, prompt: sampler.RenderChat(msgs), msgs: msgs, params: p, stream: w.Stream}
	if w.Seed != nil {
		rr.req.params.Seed, rr.req.seeded = uint64(*w.Seed), true
	}
	return rr, nil
}

// responseInput reads input: a string (one user message) or an array of message items.
func responseInput(raw json.RawMessage) ([]sampler.Message, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest(`"input" is required`)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []sampler.Message{{Role: "user", Content: s}}, nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest(`"input" must be a string or an array of message items`)
	}
	if len(items) == 0 || len(items) > maxResponseItems {
		return nil, badRequest(`"input" must have 1 to %d items`, maxResponseItems)
	}
	out := make([]sampler.Message, len(items))
	for i, it := range items {
		if it.Type != "" && it.Type != "message" {
			return nil, badRequest(`input[%d]: items of type %q are not supported`, i, it.Type)
		}
		switch it.Role {
		case "user", "assistant", "system", "developer":
		default:
			return nil, badRequest(`input[%d].role must be user, assistant, system or developer`, i)
		}
		text, err := partsText(it.Content, "input_text", "output_text", "text")
		if err != nil {
			return nil, badRequest("input[%d].content: %v", i, err)
		}
		out[i] = sampler.Message{Role: it.Role, Content: text}
	}
	return out, nil
}

// partsText reads a content: a string, or parts of which those of the given types carry text.
func partsText(raw json.RawMessage, types ...string) (string, error) {
	raw = bytes.TrimSpace(raw)
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errString("must be a string or an array of text parts")
	}
	var b bytes.Buffer
	for _, p := range parts {
		for _, t := range types {
			if p.Type == t {
				b.WriteString(p.Text)
				break
			}
		}
	}
	return b.String(), nil
}

type errString string

func (e errString) Error() string { return string(e) }

// newID is prefix and 24 random hex digits, as OpenAI's and Anthropic's ids look.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// serveResponses answers POST /v1/responses: the chat template over the instructions, the
// previous response's conversation and the input, sampled as chat is.
func (e *Engine) serveResponses(w http.ResponseWriter, r *http.Request) {
	body, ok := e.front(w, r, EndpointResponses, maxBody, writeAPIError)
	if !ok {
		return
	}
	rr, err := parseResponses(body, e.checkModel, e.responses.get)
	if err != nil {
		e.fail(w, EndpointResponses, err, writeAPIError)
		return
	}
	if e.stalled(r, EndpointResponses) {
		return
	}
	x := &run{e: e, w: w, r: r, req: rr.req, prompt: sampler.Tokenize(rr.req.prompt), id: newID("resp_"),
		out: &responsesFormat{rr: rr, itemID: newID("msg_")}, errw: writeAPIError}
	e.generate(EndpointResponses, x)
}

// responsesFormat is OpenAI's Responses API: one message item with one output_text part.
type responsesFormat struct {
	rr     *responsesRequest
	itemID string
	seq    int // the next event's sequence_number
}

var _ format = (*responsesFormat)(nil)

func (f *responsesFormat) status(x *run, done bool) string {
	switch {
	case !done:
		return "in_progress"
	case x.finish == sampler.FinishLength:
		return "incomplete"
	}
	return "completed"
}

func (f *responsesFormat) part(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
}

func (f *responsesFormat) item(x *run, done bool) map[string]any {
	content := []any{}
	if done {
		content = append(content, f.part(x.text()))
	}
	return map[string]any{"type": "message", "id": f.itemID, "status": f.status(x, done), "role": "assistant",
		"content": content}
}

// response is the response object, in progress or done.
func (f *responsesFormat) response(x *run, done bool) map[string]any {
	rr := f.rr
	out := []any{}
	var usage, incomplete any
	if done {
		out = append(out, f.item(x, true))
		usage = map[string]any{"input_tokens": x.promptTokens, "input_tokens_details": map[string]int{"cached_tokens": x.cached},
			"output_tokens": len(x.tokens), "output_tokens_details": map[string]int{"reasoning_tokens": 0},
			"total_tokens": x.promptTokens + len(x.tokens)}
		if x.finish == sampler.FinishLength {
			incomplete = map[string]string{"reason": "max_output_tokens"}
		}
	}
	return map[string]any{"id": x.id, "object": "response", "created_at": x.created, "status": f.status(x, done),
		"error": nil, "incomplete_details": incomplete, "instructions": rr.instructions, "max_output_tokens": rr.maxOutput,
		"model": x.req.model, "output": out, "parallel_tool_calls": true, "previous_response_id": rr.previous,
		"reasoning": map[string]any{"effort": nil, "summary": nil}, "store": rr.store, "temperature": rr.temperature,
		"text": map[string]any{"format": map[string]string{"type": "text"}}, "tool_choice": "auto", "tools": []any{},
		"top_p": rr.topP, "truncation": "disabled", "usage": usage, "metadata": map[string]any{}}
}

// keep stores the finished response when asked to, with the conversation a follow-up continues.
func (f *responsesFormat) keep(x *run, resp []byte) {
	if !f.rr.store {
		return
	}
	history := append(append([]sampler.Message(nil), f.rr.history...), f.rr.input...)
	history = append(history, sampler.Message{Role: "assistant", Content: x.text()})
	x.e.responses.put(&storedResponse{id: x.id, body: resp, history: history})
}

func (f *responsesFormat) event(x *run, typ string, fields map[string]any) error {
	fields["type"], fields["sequence_number"] = typ, f.seq
	f.seq++
	return x.namedEvent(typ, fields)
}

func (f *responsesFormat) open(x *run) error {
	if err := f.event(x, "response.created", map[string]any{"response": f.response(x, false)}); err != nil {
		return err
	}
	if err := f.event(x, "response.in_progress", map[string]any{"response": f.response(x, false)}); err != nil {
		return err
	}
	if err := f.event(x, "response.output_item.added", map[string]any{"output_index": 0, "item": f.item(x, false)}); err != nil {
		return err
	}
	return f.event(x, "response.content_part.added", map[string]any{"item_id": f.itemID, "output_index": 0,
		"content_index": 0, "part": f.part("")})
}

func (f *responsesFormat) token(x *run, tok sampler.Token) error {
	return f.event(x, "response.output_text.delta", map[string]any{"item_id": f.itemID, "output_index": 0,
		"content_index": 0, "delta": tok.Text, "logprobs": []any{}})
}

func (f *responsesFormat) close(x *run) error {
	text := x.text()
	if err := f.event(x, "response.output_text.done", map[string]any{"item_id": f.itemID, "output_index": 0,
		"content_index": 0, "text": text, "logprobs": []any{}}); err != nil {
		return err
	}
	if err := f.event(x, "response.content_part.done", map[string]any{"item_id": f.itemID, "output_index": 0,
		"content_index": 0, "part": f.part(text)}); err != nil {
		return err
	}
	if err := f.event(x, "response.output_item.done", map[string]any{"output_index": 0, "item": f.item(x, true)}); err != nil {
		return err
	}
	resp := f.response(x, true)
	b, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	f.keep(x, b)
	last := "response.completed"
	if x.finish == sampler.FinishLength {
		last = "response.incomplete"
	}
	return f.event(x, last, map[string]any{"response": resp})
}

func (f *responsesFormat) whole(x *run) ([]byte, string, error) {
	b, err := json.Marshal(f.response(x, true))
	if err == nil {
		f.keep(x, b)
	}
	return b, "application/json", err
}

// serveStoredResponse answers GET /v1/responses/{id} with a stored response.
func (e *Engine) serveStoredResponse(w http.ResponseWriter, r *http.Request) {
	if _, ok := e.front(w, r, EndpointResponses, maxBody, writeAPIError); !ok || e.stalled(r, EndpointResponses) {
		return
	}
	s, ok := e.responses.get(r.PathValue("id"))
	if !ok {
		e.fail(w, EndpointResponses, responseNotFound(r.PathValue("id")), writeAPIError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, err := w.Write(s.body)
	e.met.request(EndpointResponses, err)
}

// deleteStoredResponse answers DELETE /v1/responses/{id}.
func (e *Engine) deleteStoredResponse(w http.ResponseWriter, r *http.Request) {
	if _, ok := e.front(w, r, EndpointResponses, maxBody, writeAPIError); !ok || e.stalled(r, EndpointResponses) {
		return
	}
	id := r.PathValue("id")
	if !e.responses.remove(id) {
		e.fail(w, EndpointResponses, responseNotFound(id), writeAPIError)
		return
	}
	e.answer(w, EndpointResponses, map[string]any{"id": id, "object": "response", "deleted": true}, nil)
}

func responseNotFound(id string) *apiError {
	return &apiError{status: 404, typ: "invalid_request_error", code: "not_found",
		msg: "Response with id '" + id + "' not found."}
}
