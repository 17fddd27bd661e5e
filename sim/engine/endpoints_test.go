package engine

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/sim/faults"
)

// TestEndpointNamesMatchTheCatalogue: the simulator's endpoint names are the gateway's, in the
// same order, so a heartbeat's endpoints mean to the gateway what the engine serves.
func TestEndpointNamesMatchTheCatalogue(t *testing.T) {
	var want []string
	for _, k := range oai.Kinds() {
		want = append(want, k.Endpoint())
	}
	if !slices.Equal(AllEndpoints, want) {
		t.Fatalf("AllEndpoints %v, the catalogue %v", AllEndpoints, want)
	}
}

// audioForm is a multipart transcription form: file, then the fields in order (name, value).
func audioForm(t *testing.T, file []byte, fields ...string) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, err := mw.CreateFormFile("file", "a.wav")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write(file)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = mw.WriteField(fields[i], fields[i+1])
	}
	_ = mw.Close()
	return mw.FormDataContentType(), b.Bytes()
}

// call is one request to an engine endpoint.
type call struct {
	endpoint, method, path, ctype string
	body                          []byte
}

// calls are a valid request to every serving endpoint for model, each its first route.
func calls(t *testing.T, model string) []call {
	ct, form := audioForm(t, []byte("RIFF some audio bytes"), "model", model)
	j := func(endpoint, path, body string) call {
		return call{endpoint, "POST", path, "application/json", []byte(strings.ReplaceAll(body, "MODEL", model))}
	}
	return []call{
		j(EndpointCompletions, "/v1/completions", `{"model":"MODEL","prompt":"hello","max_tokens":3}`),
		j(EndpointChat, "/v1/chat/completions", `{"model":"MODEL","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`),
		j(EndpointEmbeddings, "/v1/embeddings", `{"model":"MODEL","input":"hello"}`),
		j(EndpointResponses, "/v1/responses", `{"model":"MODEL","input":"hello","max_output_tokens":3}`),
		j(EndpointMessages, "/v1/messages", `{"model":"MODEL","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`),
		j(EndpointCompletionsRender, "/v1/completions/render", `{"model":"MODEL","prompt":"hello"}`),
		j(EndpointChatRender, "/v1/chat/completions/render", `{"model":"MODEL","messages":[{"role":"user","content":"hi"}]}`),
		j(EndpointTokenize, "/tokenize", `{"model":"MODEL","prompt":"hello"}`),
		j(EndpointDetokenize, "/detokenize", `{"model":"MODEL","tokens":[1,2,3]}`),
		j(EndpointRerank, "/v1/rerank", `{"model":"MODEL","query":"a cat","documents":["a cat sat","dogs"]}`),
		j(EndpointScore, "/v1/score", `{"model":"MODEL","text_1":"a cat","text_2":["a cat sat","dogs"]}`),
		j(EndpointPooling, "/pooling", `{"model":"MODEL","input":"hello"}`),
		{EndpointTranscriptions, "POST", "/v1/audio/transcriptions", ct, form},
		{EndpointTranslations, "POST", "/v1/audio/translations", ct, form},
	}
}

func do(t *testing.T, e *Engine, c call) (*http.Response, []byte) {
	t.Helper()
	return send(t, e, c.method, c.path, c.ctype, c.body)
}

func send(t *testing.T, e *Engine, method, path, ctype string, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+e.HTTPAddr+path, bytes.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp, b.Bytes()
}

// TestEveryEndpointServesAndChecksItsModel: each serving endpoint answers a valid request 200 for
// the base model and for an adapter, and an unknown model with vLLM's 404 (Anthropic's on
// /v1/messages), counted under its endpoint label, leaving nothing running or queued.
func TestEveryEndpointServesAndChecksItsModel(t *testing.T) {
	e := start(t, Config{LoRAs: []LoRA{{Name: "sql", Path: "/a/sql"}}})
	for _, model := range []string{"smol", "sql"} {
		for _, c := range calls(t, model) {
			if resp, b := do(t, e, c); resp.StatusCode != 200 {
				t.Errorf("%s for %s: %d %s", c.endpoint, model, resp.StatusCode, b)
			}
		}
	}
	for _, c := range calls(t, "gpt-9") {
		resp, b := do(t, e, c)
		if resp.StatusCode != 404 {
			t.Errorf("%s, unknown model: %d %s", c.endpoint, resp.StatusCode, b)
			continue
		}
		if c.endpoint == EndpointMessages {
			var a struct {
				Type  string
				Error struct{ Type, Message string }
			}
			if json.Unmarshal(b, &a) != nil || a.Type != "error" || a.Error.Type != "not_found_error" || !strings.Contains(a.Error.Message, "gpt-9") {
				t.Errorf("messages, unknown model: %s, want Anthropic's not_found_error", b)
			}
			continue
		}
		var v struct {
			Error struct {
				Message, Type, Param string
				Code                 int
			}
		}
		if json.Unmarshal(b, &v) != nil || v.Error.Message != "The model `gpt-9` does not exist." ||
			v.Error.Type != "NotFoundError" || v.Error.Param != "model" || v.Error.Code != 404 {
			t.Errorf("%s, unknown model: %s, want vLLM's NotFoundError", c.endpoint, b)
		}
		if got := requestsWith(t, e, c.endpoint, "404"); got != 1 {
			t.Errorf("%s: %v requests counted 404, want 1", c.endpoint, got)
		}
	}
	if st := e.Status(); st.Running != 0 || st.QueueDepth != 0 {
		t.Fatalf("state left behind: %+v", st)
	}
}

// TestEndpointsFlagRestricts: --endpoints serves only the endpoints named; another's path is
// FastAPI's 404 {"detail":"Not Found"}, a served path with the wrong method its 405, and the
// heartbeat lists exactly the served ones. A gateway routes by that list.
func TestEndpointsFlagRestricts(t *testing.T) {
	served, err := ParseEndpointList("embeddings, chat,embeddings")
	if err != nil || !slices.Equal(served, []string{EndpointChat, EndpointEmbeddings}) {
		t.Fatalf("ParseEndpointList: %v %v", served, err)
	}
	if _, err := ParseEndpointList("chat,nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("an unknown name: %v", err)
	}
	fr, addr := startRegistry(t)
	e := start(t, Config{Endpoints: served, Gateways: []string{addr}, Clock: clock.NewFake(time.Unix(0, 0))})
	for _, c := range calls(t, "smol") {
		resp, b := do(t, e, c)
		switch {
		case slices.Contains(served, c.endpoint):
			if resp.StatusCode != 200 {
				t.Errorf("%s served: %d %s", c.endpoint, resp.StatusCode, b)
			}
		case resp.StatusCode != 404 || string(b) != `{"detail":"Not Found"}`:
			t.Errorf("%s not served: %d %s, want FastAPI's 404", c.endpoint, resp.StatusCode, b)
		}
	}
	if resp, b := send(t, e, "GET", "/v1/embeddings", "", nil); resp.StatusCode != 405 || string(b) != `{"detail":"Method Not Allowed"}` {
		t.Errorf("GET /v1/embeddings: %d %s, want FastAPI's 405", resp.StatusCode, b)
	}
	if resp, b := send(t, e, "GET", "/v1/nothing", "", nil); resp.StatusCode != 404 || string(b) != `{"detail":"Not Found"}` {
		t.Errorf("GET /v1/nothing: %d %s", resp.StatusCode, b)
	}
	gwtest.Eventually(t, "a heartbeat", func() bool { return fr.count() > 0 })
	if got := fr.last().GetEndpoints(); !slices.Equal(got, served) {
		t.Fatalf("heartbeat endpoints %v, want %v", got, served)
	}
	e2 := start(t, Config{ID: "e2", Gateways: []string{addr}, Clock: clock.NewFake(time.Unix(0, 0))})
	gwtest.Eventually(t, "e2's heartbeat", func() bool { return fr.last().GetWorkerId() == "e2" })
	if got := fr.last().GetEndpoints(); !slices.Equal(got, AllEndpoints) {
		t.Fatalf("default heartbeat endpoints %v, want all", got)
	}
	_ = e2
}

// TestEveryEndpointMeetsTheFaults: the request-level faults reach every serving endpoint as they
// reach completions — 503 answers 503, bad-headers puts its headers on the answer, and
// slow-headers writes nothing until D has passed on the engine's clock.
func TestEveryEndpointMeetsTheFaults(t *testing.T) {
	e503 := start(t, Config{Fault: faults.Fault{Kind: faults.Unavailable}})
	bad := start(t, Config{ID: "e2", Fault: faults.Fault{Kind: faults.BadHeaders}})
	fc := clock.NewFake(time.Unix(0, 0))
	slow := start(t, Config{ID: "e3", Clock: fc, Fault: faults.Fault{Kind: faults.SlowHeaders, D: 3 * time.Second}})
	for _, c := range calls(t, "smol") {
		if resp, b := do(t, e503, c); resp.StatusCode != 503 {
			t.Errorf("%s under 503: %d %s", c.endpoint, resp.StatusCode, b)
		}
		if resp, _ := do(t, bad, c); resp.Header.Get("X-TL-Route") != "spoofed" || resp.Header.Get("Set-Cookie") == "" {
			t.Errorf("%s under bad-headers: headers %v", c.endpoint, resp.Header)
		}
		got := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest(c.method, "http://"+slow.HTTPAddr+c.path, bytes.NewReader(c.body))
			req.Header.Set("Content-Type", c.ctype)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				got <- 0
				return
			}
			resp.Body.Close()
			got <- resp.StatusCode
		}()
		gwtest.Eventually(t, c.endpoint+" waiting on the clock", func() bool { return fc.Pending() >= 1 })
		select {
		case code := <-got:
			t.Fatalf("%s answered %d before D", c.endpoint, code)
		default:
		}
		fc.Advance(3 * time.Second)
		if code := <-got; code != 200 {
			t.Errorf("%s under slow-headers: %d after D", c.endpoint, code)
		}
	}
}
