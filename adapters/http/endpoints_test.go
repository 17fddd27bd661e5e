package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
)

// pathEngine is a stand-in engine that records the method and path of every call, and answers
// with h.
type pathEngine struct {
	*engine
	mu    sync.Mutex
	paths []string
}

func newPathEngine(t *testing.T, h func(w http.ResponseWriter, r *http.Request, body []byte)) *pathEngine {
	pe := &pathEngine{}
	pe.engine = newEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		pe.mu.Lock()
		pe.paths = append(pe.paths, r.Method+" "+r.URL.Path)
		pe.mu.Unlock()
		h(w, r, body)
	})
	return pe
}

func (pe *pathEngine) calls() []string {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	return append([]string(nil), pe.paths...)
}

// echoModel answers JSON naming the model and path the engine was asked for.
func echoModel(w http.ResponseWriter, r *http.Request, body []byte) {
	var m struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &m)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"model":%q,"path":%q}`, m.Model, r.URL.Path)
}

// TestEveryEndpointIsRoutedByModel (R21): each serving endpoint reaches the engine on its own
// path with the route's served model in place of the public one, and the engine's answer
// comes back; the endpoint label counts it.
func TestEveryEndpointIsRoutedByModel(t *testing.T) {
	s := newStack(t, stackOpt{routes: []config.Route{{Model: "pub", Targets: []string{"unified"},
		Backends: []config.Backend{{Model: "served", Weight: 1}}}}})
	e := newPathEngine(t, echoModel)
	s.beat("w1", "served", e.engine)
	for _, k := range oai.Kinds() {
		if k.Multipart() {
			continue
		}
		body := `{"model":"pub","input":"x","prompt":"p","messages":[{"role":"user","content":"hi"}],"query":"q"}`
		resp, b := s.do(t, "POST", k.Path(), "", body)
		var got struct{ Model, Path string }
		if resp.StatusCode != 200 || json.Unmarshal(b, &got) != nil || got.Model != "served" || got.Path != k.Path() {
			t.Fatalf("%s: %d %s", k.Path(), resp.StatusCode, b)
		}
	}
	if m := s.metricsText(t); !strings.Contains(m, `tlgw_requests_total{code="200",endpoint="rerank",model="served",route="pub"} 1`) {
		t.Fatalf("no endpoint label:\n%s", m)
	}
}

// audioForm is a transcription form: model, a field after it, and the file.
func audioForm(t *testing.T, model string) ([]byte, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("model", model)
	_ = mw.WriteField("language", "en")
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write([]byte("RIFF\x00\xffaudio"))
	_ = mw.Close()
	return buf.Bytes(), mw.FormDataContentType()
}

// TestAudioFormsAreRelayedByteForByte (R21): a transcription's form reaches the engine with the
// client's Content-Type (its boundary) and every byte as sent but the model's value, which is
// the served model's.
func TestAudioFormsAreRelayedByteForByte(t *testing.T) {
	s := newStack(t, stackOpt{routes: []config.Route{{Model: "whisper", Targets: []string{"unified"},
		Backends: []config.Backend{{Model: "whisper-v3", Weight: 1}}}}})
	var gotType string
	e := newPathEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		gotType = r.Header.Get("Content-Type")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"text":"hello"}`)
	})
	s.beat("w1", "whisper-v3", e.engine)
	body, ct := audioForm(t, "whisper")
	resp, b := s.do(t, "POST", "/v1/audio/transcriptions", "", string(body), "Content-Type", ct)
	if resp.StatusCode != 200 || string(b) != `{"text":"hello"}` {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	want, _ := audioForm(t, "whisper-v3")
	boundary := strings.TrimPrefix(ct, "multipart/form-data; boundary=")
	want = bytes.ReplaceAll(want, []byte(strings.Split(string(want), "\r\n")[0][2:]), []byte(boundary))
	if calls := e.engine.calls(); len(calls) != 1 || !bytes.Equal(calls[0], want) || gotType != ct {
		t.Fatalf("engine got %q (%s), want %q (%s)", calls, gotType, want, ct)
	}
	text := newPathEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello")
	})
	s.beat("w2", "plain-v1", text.engine)
	body, ct = audioForm(t, "plain-v1")
	if resp, b := s.do(t, "POST", "/v1/audio/translations", "", string(body), "Content-Type", ct); resp.StatusCode != 200 ||
		resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" || string(b) != "hello" {
		t.Fatalf("a text transcript: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	if resp, b := s.do(t, "POST", "/v1/embeddings", "", `{"model":"plain-v1","input":"x"}`); resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("a text answer on another endpoint kept its label: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	if resp, b := s.do(t, "POST", "/v1/audio/translations", "", `{"model":"whisper"}`); resp.StatusCode != 400 {
		t.Fatalf("a JSON body on an audio endpoint: %d %s", resp.StatusCode, b)
	}
}

// TestAnEngineWithoutTheEndpointIsSkipped (R21): an engine whose server answers an endpoint with
// its own 404 is no failure: the request goes to another worker at once, the next requests for
// that endpoint skip it, it still serves the others; an engine's API 404 (an unknown model) is
// the client's answer; and with no worker left that serves the endpoint the client gets a 404
// naming it.
func TestAnEngineWithoutTheEndpointIsSkipped(t *testing.T) {
	s := newStack(t, stackOpt{})
	noEmb := newPathEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == "/v1/embeddings" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
			return
		}
		echoModel(w, r, body)
	})
	full := newPathEngine(t, echoModel)
	w1 := gwtest.Worker("a-noemb", "m", 0)
	w1.HTTPAddress = noEmb.addr()
	s.Beat(w1)
	w2 := gwtest.Worker("b-full", "m", 5) // busier: least_outstanding tries a-noemb first
	w2.HTTPAddress = full.addr()
	s.Beat(w2)
	for i := range 3 {
		resp, b := s.do(t, "POST", "/v1/embeddings", "", `{"model":"m","input":"x"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("embeddings %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if got := noEmb.calls(); len(got) != 1 {
		t.Fatalf("the engine without embeddings was asked %d times: %v", len(got), got)
	}
	if resp, _ := s.do(t, "POST", "/v1/completions", "", `{"model":"m","prompt":"x"}`); resp.StatusCode != 200 || len(noEmb.calls()) != 2 {
		t.Fatalf("completions: %d, calls %v", resp.StatusCode, noEmb.calls())
	}
	if v, _ := s.View("a-noemb"); !v.Routable || v.FailLoad != 0 {
		t.Fatalf("a missing endpoint counted against the worker: %+v", v)
	}
	apiNotFound := newPathEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(404)
		_, _ = io.WriteString(w, `{"error":{"message":"The model does not exist.","type":"NotFoundError","code":404}}`)
	})
	w3 := gwtest.Worker("c-api", "other", 0)
	w3.HTTPAddress = apiNotFound.addr()
	s.Beat(w3)
	if resp, b := s.do(t, "POST", "/v1/score", "", `{"model":"other","text_1":"a","text_2":"b"}`); resp.StatusCode != 404 ||
		!strings.Contains(string(b), "does not exist") || len(apiNotFound.calls()) != 1 {
		t.Fatalf("an engine's API 404: %d %s after %d calls", resp.StatusCode, b, len(apiNotFound.calls()))
	}
	s.Beat(w1)
	s.Beat(w2)
	// Both engines of m refuse rerank now: the answer says no worker serves it.
	both := newPathEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) { w.WriteHeader(405) })
	w2.HTTPAddress = both.addr()
	s.Beat(w2)
	w1.HTTPAddress = both.addr()
	s.Beat(w1)
	resp, b := s.do(t, "POST", "/v1/rerank", "", `{"model":"m","query":"q","documents":["d"]}`)
	if resp.StatusCode != 404 || !strings.Contains(string(b), "serves /v1/rerank") {
		t.Fatalf("no engine serves rerank: %d %s", resp.StatusCode, b)
	}
}

// TestStoredResponsesGoBackToTheirWorker (R21): a stored Responses answer (JSON or stream) is
// retrieved, continued and deleted through the gateway at the worker that holds it, by the key
// that stored it only; after the DELETE the gateway answers 404 itself.
func TestStoredResponsesGoBackToTheirWorker(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	var mu sync.Mutex
	n := 0
	mk := func(name string) *pathEngine {
		return newPathEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			mu.Lock()
			n++
			id := fmt.Sprintf("resp_%s_%d", name, n)
			mu.Unlock()
			switch {
			case r.Method == "POST" && r.URL.Path == "/v1/responses" && bytes.Contains(body, []byte(`"stream":true`)):
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q}}\n\n", id)
				fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q}}\n\n", id)
			case r.Method == "POST":
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":%q,"object":"response","engine":%q}`, id, name)
			default:
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"engine":%q,"path":%q}`, name, r.URL.Path)
			}
		})
	}
	ea, eb := mk("a"), mk("b")
	s.beat("wa", "m", ea.engine)
	s.beat("wb", "m", eb.engine)
	resp, b := s.do(t, "POST", "/v1/responses", "sk-inference", `{"model":"m","input":"hi"}`)
	var r1 struct{ ID, Engine string }
	if resp.StatusCode != 200 || json.Unmarshal(b, &r1) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	for range 3 {
		resp, b := s.do(t, "GET", "/v1/responses/"+r1.ID, "sk-inference", "")
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"engine":"`+r1.Engine+`"`) {
			t.Fatalf("GET went elsewhere: %d %s, want engine %s", resp.StatusCode, b, r1.Engine)
		}
	}
	if resp, b := s.do(t, "GET", "/v1/responses/"+r1.ID, "sk-debug", ""); resp.StatusCode != 404 {
		t.Fatalf("another key read the response: %d %s", resp.StatusCode, b)
	}
	body := fmt.Sprintf(`{"model":"m","input":"more","previous_response_id":%q}`, r1.ID)
	for range 3 {
		resp, b := s.do(t, "POST", "/v1/responses", "sk-inference", body)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"engine":"`+r1.Engine+`"`) {
			t.Fatalf("a continuation went elsewhere: %d %s", resp.StatusCode, b)
		}
	}
	// A stored stream: its id is read from response.created; it ends whole without [DONE].
	resp, b = s.do(t, "POST", "/v1/responses", "sk-inference", `{"model":"m","input":"s","stream":true}`)
	if resp.StatusCode != 200 || strings.Contains(string(b), "event: error") {
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	var created struct {
		Response struct{ ID string } `json:"response"`
	}
	ev := sseEvents(t, b)[0]
	_ = json.Unmarshal([]byte(ev[strings.Index(ev, "data: ")+6:]), &created)
	if resp, _ := s.do(t, "GET", "/v1/responses/"+created.Response.ID, "sk-inference", ""); resp.StatusCode != 200 {
		t.Fatalf("the streamed response %q is not known: %d", created.Response.ID, resp.StatusCode)
	}
	if resp, b := s.do(t, "DELETE", "/v1/responses/"+r1.ID, "sk-inference", ""); resp.StatusCode != 200 {
		t.Fatalf("delete: %d %s", resp.StatusCode, b)
	}
	resp, b = s.do(t, "GET", "/v1/responses/"+r1.ID, "sk-inference", "")
	if resp.StatusCode != 404 || !strings.Contains(string(b), "no stored response") {
		t.Fatalf("after delete: %d %s", resp.StatusCode, b)
	}
	if resp, _ := s.do(t, "GET", "/v1/responses/a%2Fb", "sk-inference", ""); resp.StatusCode != 400 && resp.StatusCode != 404 {
		t.Fatalf("an id with a slash: %d", resp.StatusCode)
	}
}

// TestStreamsEndOnTheirOwnLastEvent (R21): a Responses or Messages stream cut before its last
// event gets its API's own error event; a whole one gets none.
func TestStreamsEndOnTheirOwnLastEvent(t *testing.T) {
	s := newStack(t, stackOpt{})
	cut := true
	e := newPathEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Path == "/v1/messages" {
			_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
			if !cut {
				_, _ = io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
			}
			return
		}
		_, _ = io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\"}}\n\n")
		if !cut {
			_, _ = io.WriteString(w, "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n")
		}
	})
	s.beat("w1", "m", e.engine)
	for _, c := range []struct {
		path, body, errData string
	}{
		{"/v1/messages", `{"model":"m","max_tokens":5,"messages":[],"stream":true}`, `{"type":"error","error":{"type":"api_error"`},
		{"/v1/responses", `{"model":"m","input":"x","stream":true,"store":false}`, `{"type":"error","code":"stream_interrupted"`},
	} {
		cut = true
		_, b := s.do(t, "POST", c.path, "", c.body)
		evs := sseEvents(t, b)
		if last := evs[len(evs)-1]; !strings.HasPrefix(last, "event: error\ndata: "+c.errData) {
			t.Fatalf("%s cut: last event %q", c.path, last)
		}
		cut = false
		if _, b := s.do(t, "POST", c.path, "", c.body); strings.Contains(string(b), "event: error") {
			t.Fatalf("%s whole: %s", c.path, b)
		}
	}
}

// TestAnthropicKeysAndErrors (R21): /v1/messages takes the key as x-api-key, and answers its
// errors in Anthropic's shape; the admin API does not take x-api-key.
func TestAnthropicKeysAndErrors(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	s.beat("w1", "m", newPathEngine(t, echoModel).engine)
	body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	if resp, b := s.do(t, "POST", "/v1/messages", "", body, "X-Api-Key", "sk-inference"); resp.StatusCode != 200 {
		t.Fatalf("x-api-key: %d %s", resp.StatusCode, b)
	}
	for _, c := range []struct {
		key, model string
		status     int
		typ        string
	}{
		{"", "m", 401, "authentication_error"},
		{"sk-admin", "m", 403, "permission_error"},
		{"sk-inference", "nope", 404, "not_found_error"},
	} {
		resp, b := s.do(t, "POST", "/v1/messages", "", strings.Replace(body, `"m"`, `"`+c.model+`"`, 1), "X-Api-Key", c.key)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if resp.StatusCode != c.status || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != c.typ || e.Error.Message == "" {
			t.Fatalf("%q %s: %d %s, want %d %s", c.key, c.model, resp.StatusCode, b, c.status, c.typ)
		}
	}
	if resp, _ := s.do(t, "GET", "/admin/v1/workers", "", "", "X-Api-Key", "sk-admin"); resp.StatusCode != 401 {
		t.Fatalf("admin with x-api-key: %d", resp.StatusCode)
	}
}

// TestAudioCostsWhatItsAnswerReports (R20, R21): an audio form's bytes are audio, not prompt
// text: a key's tpm is charged what the answer reports (here: no token usage), not the form's
// size at 4 bytes a token, so a 40 KiB clip does not spend a 1,000-token minute.
func TestAudioCostsWhatItsAnswerReports(t *testing.T) {
	s := newStack(t, stackOpt{keys: []config.Key{{Key: "sk-tpm", Scopes: []string{"inference"}, TPM: 1000}}})
	e := newPathEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"text":"hi","usage":{"type":"duration","seconds":3}}`)
	})
	s.beat("w1", "whisper", e.engine)
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("model", "whisper")
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write(bytes.Repeat([]byte{0x7f}, 40<<10))
	_ = mw.Close()
	for i := range 5 {
		resp, b := s.do(t, "POST", "/v1/audio/transcriptions", "sk-tpm", buf.String(), "Content-Type", mw.FormDataContentType())
		if resp.StatusCode != 200 {
			t.Fatalf("clip %d: %d %s (remaining %s)", i, resp.StatusCode, b, resp.Header.Get("X-Ratelimit-Remaining-Tokens"))
		}
	}
}

// TestAnEngineThatLostTheAdapterIsSkipped (R21): an engine that lists an adapter but answers
// 404 for it (restarted without it) sends the request on to another worker that lists it, is
// not asked for it again for a while and is not failed; the base model still goes there; when
// every lister has refused, the answer is a 404 naming the adapter.
func TestAnEngineThatLostTheAdapterIsSkipped(t *testing.T) {
	s := newStack(t, stackOpt{})
	lost := newPathEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if bytes.Contains(body, []byte(`"model":"a"`)) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"error":{"message":"The model `+"`a`"+` does not exist.","type":"NotFoundError","param":"model","code":404}}`)
			return
		}
		echoModel(w, r, body)
	})
	has := newPathEngine(t, echoModel)
	w1 := gwtest.Worker("a-lost", "m", 0)
	w1.HTTPAddress, w1.LoRAAdapters, w1.MaxLoRAs = lost.addr(), []string{"a"}, 2
	s.Beat(w1)
	w2 := gwtest.Worker("b-has", "m", 5) // busier: least_outstanding tries a-lost first
	w2.HTTPAddress, w2.LoRAAdapters, w2.MaxLoRAs = has.addr(), []string{"a"}, 2
	s.Beat(w2)
	for i := range 3 {
		resp, b := s.do(t, "POST", "/v1/completions", "", `{"model":"a","prompt":"x"}`)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"model":"a"`) {
			t.Fatalf("adapter request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if got := lost.calls(); len(got) != 1 {
		t.Fatalf("the engine without the adapter was asked %d times: %v", len(got), got)
	}
	if resp, _ := s.do(t, "POST", "/v1/completions", "", `{"model":"m","prompt":"x"}`); resp.StatusCode != 200 || len(lost.calls()) != 2 {
		t.Fatalf("the base model: %d, calls %v", resp.StatusCode, lost.calls())
	}
	if v, _ := s.View("a-lost"); !v.Routable || v.FailLoad != 0 {
		t.Fatalf("a lost adapter counted against the worker: %+v", v)
	}
	w2.HTTPAddress = lost.addr()
	s.Beat(w2)
	resp, b := s.do(t, "POST", "/v1/chat/completions", "", `{"model":"a","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 404 || !strings.Contains(string(b), "LoRA adapter") || !strings.Contains(string(b), "model_not_found") {
		t.Fatalf("every lister lost the adapter: %d %s", resp.StatusCode, b)
	}
}
