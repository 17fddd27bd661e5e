package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/responses"
)

// sseEvent is one server-sent event: its event: name (or "") and data.
type sseEvent struct{ name, data string }

func sseEvents(body []byte) []sseEvent {
	var out []sseEvent
	for _, block := range strings.Split(string(body), "\n\n") {
		var ev sseEvent
		for _, line := range strings.Split(block, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				ev.name = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				ev.data = v
			}
		}
		if ev.data != "" {
			out = append(out, ev)
		}
	}
	return out
}

// TestResponsesParseWithTheOpenAIClient: a Responses answer unmarshals into openai-go's
// responses.Response with its id, object, status, one assistant message of output_text and
// usage filled; its text is chat's for the same conversation and seed (the same sampler over
// the same template).
func TestResponsesParseWithTheOpenAIClient(t *testing.T) {
	e := start(t, Config{})
	resp, out := post(t, e, "/v1/responses", `{"model":"smol","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}],"max_output_tokens":6,"seed":9,"temperature":1}`)
	var r responses.Response
	if resp.StatusCode != 200 || r.UnmarshalJSON(out) != nil {
		t.Fatalf("responses: %d %s", resp.StatusCode, out)
	}
	if !strings.HasPrefix(r.ID, "resp_") || string(r.Object) != "response" || r.Status != "completed" && r.Status != "incomplete" ||
		r.Model != "smol" || len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" ||
		len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" || r.CreatedAt == 0 {
		t.Fatalf("response %s", out)
	}
	_, cb := post(t, e, "/v1/chat/completions", `{"model":"smol","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}],"max_tokens":6,"seed":9}`)
	var c completion
	_ = json.Unmarshal(cb, &c)
	if r.OutputText() != c.Choices[0].Message.Content || r.Usage.InputTokens != int64(c.Usage.PromptTokens) ||
		r.Usage.OutputTokens != int64(c.Usage.CompletionTokens) || r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Fatalf("responses %q %+v, chat %q %+v", r.OutputText(), r.Usage, c.Choices[0].Message.Content, c.Usage)
	}
}

// TestResponsesStream: the SSE answer is OpenAI's event sequence, each event named and numbered
// in order, the deltas making the text of the non-streamed answer, with no [DONE] line.
func TestResponsesStream(t *testing.T) {
	e := start(t, Config{})
	body := `{"model":"smol","input":"tell me","max_output_tokens":5,"seed":4,"stream":STREAM}`
	_, whole := post(t, e, "/v1/responses", strings.Replace(body, "STREAM", "false", 1))
	var r responses.Response
	_ = r.UnmarshalJSON(whole)
	resp, out := post(t, e, "/v1/responses", strings.Replace(body, "STREAM", "true", 1))
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") || strings.Contains(string(out), "[DONE]") {
		t.Fatalf("stream: %s %s", ct, out)
	}
	evs := sseEvents(out)
	var names []string
	var text strings.Builder
	for i, ev := range evs {
		var v struct {
			Type     string
			Sequence *int `json:"sequence_number"`
			Delta    string
		}
		if err := json.Unmarshal([]byte(ev.data), &v); err != nil || v.Type != ev.name || v.Sequence == nil || *v.Sequence != i {
			t.Fatalf("event %d %q: %s", i, ev.name, ev.data)
		}
		if v.Type == "response.output_text.delta" {
			text.WriteString(v.Delta)
			if names[len(names)-1] == v.Type {
				continue
			}
		}
		names = append(names, v.Type)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.done response.content_part.done response.output_item.done"
	last := names[len(names)-1]
	if got := strings.Join(names[:len(names)-1], " "); got != want || last != "response.completed" && last != "response.incomplete" {
		t.Fatalf("events %v", names)
	}
	if text.String() != r.OutputText() {
		t.Fatalf("deltas %q, the JSON answer %q", text.String(), r.OutputText())
	}
}

// TestStoredResponses: a stored response is served by GET and gone after DELETE; store false
// keeps nothing; a previous_response_id this engine does not hold is 404 in OpenAI's shape —
// a follow-up sent to another worker fails instead of answering without its history — and one
// it holds continues that conversation.
func TestStoredResponses(t *testing.T) {
	e, other := start(t, Config{}), start(t, Config{ID: "e2"})
	_, out := post(t, e, "/v1/responses", `{"model":"smol","input":"first","max_output_tokens":4}`)
	var r responses.Response
	if r.UnmarshalJSON(out) != nil {
		t.Fatalf("%s", out)
	}
	resp, got := send(t, e, "GET", "/v1/responses/"+r.ID, "", nil)
	if resp.StatusCode != 200 || string(got) != string(out) {
		t.Fatalf("GET: %d %s, want %s", resp.StatusCode, got, out)
	}
	follow := fmt.Sprintf(`{"model":"smol","input":"second","previous_response_id":%q,"max_output_tokens":4}`, r.ID)
	resp, b := post(t, other, "/v1/responses", follow)
	if resp.StatusCode != 404 || errCodeOf(t, b) != "previous_response_not_found" {
		t.Fatalf("a follow-up on the wrong worker: %d %s", resp.StatusCode, b)
	}
	resp, b = post(t, e, "/v1/responses", follow)
	var f responses.Response
	if resp.StatusCode != 200 || f.UnmarshalJSON(b) != nil || f.Usage.InputTokens <= r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Fatalf("a follow-up on its worker: %d %s (it must carry the first turn's %d tokens)", resp.StatusCode, b,
			r.Usage.InputTokens+r.Usage.OutputTokens)
	}
	resp, b = send(t, e, "DELETE", "/v1/responses/"+r.ID, "", nil)
	var d struct {
		ID, Object string
		Deleted    bool
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &d) != nil || d.ID != r.ID || d.Object != "response" || !d.Deleted {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if resp, b := send(t, e, m, "/v1/responses/"+r.ID, "", nil); resp.StatusCode != 404 || errCodeOf(t, b) == "" {
			t.Fatalf("%s after DELETE: %d %s", m, resp.StatusCode, b)
		}
	}
	n := e.responses.len()
	_, out = post(t, e, "/v1/responses", `{"model":"smol","input":"x","store":false,"max_output_tokens":2}`)
	_ = r.UnmarshalJSON(out)
	if resp, _ := send(t, e, "GET", "/v1/responses/"+r.ID, "", nil); resp.StatusCode != http.StatusNotFound || e.responses.len() != n {
		t.Fatalf("store false: GET %d, %d stored (was %d)", resp.StatusCode, e.responses.len(), n)
	}
}

// TestResponseStoreBounds: the store keeps at most its count and its bytes, dropping the oldest
// first, and never keeps an answer larger than itself: a long-running engine's memory stays
// bounded however many responses it serves.
func TestResponseStoreBounds(t *testing.T) {
	s := newResponseStore(3, 100)
	for i := range 5 {
		s.put(&storedResponse{id: fmt.Sprint(i), body: make([]byte, 10)})
	}
	for i, want := range []bool{false, false, true, true, true} {
		if _, ok := s.get(fmt.Sprint(i)); ok != want {
			t.Fatalf("after 5 puts into 3 places: %d kept %v", i, ok)
		}
	}
	s.put(&storedResponse{id: "big", body: make([]byte, 85)})
	if s.len() != 2 || s.size != 95 {
		t.Fatalf("after 85 bytes: %d kept, %d bytes; want 2 and 95", s.len(), s.size)
	}
	if _, ok := s.get("4"); !ok {
		t.Fatal("the newest small one was dropped though the big one fit beside it")
	}
	s.put(&storedResponse{id: "huge", body: make([]byte, 101)})
	if _, ok := s.get("huge"); ok || s.len() != 2 {
		t.Fatal("an answer larger than the store was kept")
	}
	if !s.remove("big") || s.remove("big") || s.size != 10 {
		t.Fatalf("remove: size %d", s.size)
	}
}
