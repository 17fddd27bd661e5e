package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tlgw/tlgw/internal/proctest"
)

// servingKey is an inference key with the debug scope (X-TL-Route names the worker).
const servingKey = "sk-serving-e2e"

const servingConfig = fastHeartbeats + `
[[auth.keys]]
key = "` + servingKey + `"
scopes = ["inference", "admin", "debug"]
`

// post sends a body to the gateway with the serving key and returns the status, the worker that
// served it (X-TL-Route) and the body.
func (f *fleet) post(t *testing.T, path, contentType string, body []byte) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", f.base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Authorization", "Bearer "+servingKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("X-TL-Route"), b
}

// TestServingAPIThroughTheGateway (R21): two tlengines serving base-model with LoRA adapters,
// behind tlgw with an API key; every serving endpoint answers through the gateway — the
// OpenAI SDK for embeddings and Responses (JSON, stream, a stored response read back and
// continued at its worker, then deleted), Anthropic's SDK for Messages (x-api-key, JSON and a
// stream), plain HTTP for the rest — and /v1/models lists the adapters with their parent.
func TestServingAPIThroughTheGateway(t *testing.T) {
	f := startFleetWithKey(t, servingKey, servingConfig,
		[]string{"e1", "--model", "base-model", "--lora", "lora-a,lora-b"},
		[]string{"e2", "--model", "base-model", "--lora", "lora-a,lora-b"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	oc := openai.NewClient(option.WithBaseURL(f.base+"/v1"), option.WithAPIKey(servingKey), option.WithMaxRetries(0))

	emb, err := oc.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "base-model",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a cat", "a dog"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Data) != 2 || len(emb.Data[0].Embedding) == 0 || emb.Usage.PromptTokens == 0 {
		t.Fatalf("embeddings %+v", emb)
	}

	r1, err := oc.Responses.New(ctx, responses.ResponseNewParams{Model: "base-model",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me a story")}, MaxOutputTokens: openai.Int(16)})
	if err != nil {
		t.Fatal(err)
	}
	if r1.ID == "" || r1.OutputText() == "" {
		t.Fatalf("response %+v", r1)
	}
	for range 4 { // whichever worker least_outstanding would pick, the stored one answers
		got, err := oc.Responses.Get(ctx, r1.ID, responses.ResponseGetParams{})
		if err != nil || got.ID != r1.ID || got.OutputText() != r1.OutputText() {
			t.Fatalf("stored response read back: %v %+v", err, got)
		}
		next, err := oc.Responses.New(ctx, responses.ResponseNewParams{Model: "base-model", PreviousResponseID: openai.String(r1.ID),
			Store: openai.Bool(false), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and then?")}, MaxOutputTokens: openai.Int(8)})
		if err != nil || next.OutputText() == "" {
			t.Fatalf("a continuation of the stored response: %v %+v", err, next)
		}
	}
	stream := oc.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "lora-a",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Stream it")}, MaxOutputTokens: openai.Int(12)})
	var text strings.Builder
	var completed string
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			completed = ev.Response.ID
		}
	}
	if err := stream.Err(); err != nil || completed == "" || text.Len() == 0 {
		t.Fatalf("responses stream: err %v, completed %q, text %q", err, completed, text.String())
	}
	if got, err := oc.Responses.Get(ctx, completed, responses.ResponseGetParams{}); err != nil || got.ID != completed {
		t.Fatalf("the streamed response read back: %v", err)
	}
	if err := oc.Responses.Delete(ctx, r1.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := oc.Responses.Get(ctx, r1.ID, responses.ResponseGetParams{}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a deleted response: %v, want 404", err)
	}

	ac := anthropic.NewClient(aoption.WithBaseURL(f.base), aoption.WithAPIKey(servingKey), aoption.WithMaxRetries(0))
	params := anthropic.MessageNewParams{Model: "base-model", MaxTokens: 16,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello, Claude"))}}
	msg, err := ac.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) == 0 || msg.Content[0].Text == "" || msg.Usage.OutputTokens == 0 {
		t.Fatalf("message %+v", msg)
	}
	ms := ac.Messages.NewStreaming(ctx, params)
	acc := anthropic.Message{}
	for ms.Next() {
		if err := acc.Accumulate(ms.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := ms.Err(); err != nil || len(acc.Content) == 0 || acc.Content[0].Text == "" || acc.StopReason == "" {
		t.Fatalf("messages stream: %v %+v", err, acc)
	}
	bad := anthropic.NewClient(aoption.WithBaseURL(f.base), aoption.WithAPIKey("sk-wrong"), aoption.WithMaxRetries(0))
	if _, err := bad.Messages.New(ctx, params); err == nil || !strings.Contains(err.Error(), "authentication_error") {
		t.Fatalf("a wrong x-api-key: %v", err)
	}

	for _, c := range []struct{ path, body, want string }{
		{"/v1/completions/render", `{"model":"base-model","prompt":"Hello there"}`, `"token_ids"`},
		{"/v1/chat/completions/render", `{"model":"base-model","messages":[{"role":"user","content":"Hi"}]}`, `"token_ids"`},
		{"/tokenize", `{"model":"base-model","prompt":"Hello there"}`, `"tokens"`},
		{"/detokenize", `{"model":"base-model","tokens":[1,2,3]}`, `"prompt"`},
		{"/v1/rerank", `{"model":"base-model","query":"cats","documents":["cats purr","dogs bark"]}`, `"relevance_score"`},
		{"/v1/score", `{"model":"base-model","text_1":"cats","text_2":"cats purr"}`, `"score"`},
		{"/pooling", `{"model":"base-model","input":"pool me"}`, `"pooling"`},
		{"/v1/completions", `{"model":"lora-b","prompt":"adapter","max_tokens":4}`, `"text"`},
	} {
		code, _, b := f.post(t, c.path, "application/json", []byte(c.body))
		if code != 200 || !strings.Contains(string(b), c.want) {
			t.Fatalf("%s: %d %s", c.path, code, b)
		}
	}
	for _, path := range []string{"/v1/audio/transcriptions", "/v1/audio/translations"} {
		var form bytes.Buffer
		mw := multipart.NewWriter(&form)
		_ = mw.WriteField("model", "base-model")
		fw, _ := mw.CreateFormFile("file", "clip.wav")
		_, _ = fw.Write(bytes.Repeat([]byte("RIFFaudio"), 200))
		_ = mw.Close()
		code, _, b := f.post(t, path, mw.FormDataContentType(), form.Bytes())
		var out struct{ Text string }
		if code != 200 || json.Unmarshal(b, &out) != nil || out.Text == "" {
			t.Fatalf("%s: %d %s", path, code, b)
		}
	}

	models, err := oc.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range models.Data {
		ids = append(ids, m.ID)
		if m.ID == "lora-a" && !strings.Contains(m.RawJSON(), `"parent":"base-model"`) {
			t.Fatalf("lora-a is listed without its parent: %s", m.RawJSON())
		}
	}
	if !slices.Contains(ids, "lora-a") || !slices.Contains(ids, "lora-b") || !slices.Contains(ids, "base-model") {
		t.Fatalf("models %v", ids)
	}
}

// TestLoRAAdapterRouting (R21): with an adapter served by one of two workers, every request
// for it lands there (the other serves only the base model); with lora_load_on_demand, an
// adapter no worker has is loaded on one through vLLM's runtime API before its request, and
// served there from then on.
func TestLoRAAdapterRouting(t *testing.T) {
	// The [gateway] table is already open in fastHeartbeats: its keys go there.
	toml := strings.Replace(servingConfig, "heartbeat_miss_limit = 3\n", "heartbeat_miss_limit = 3\nlora_load_on_demand = true\n", 1) + `
[[gateway.lora_adapters]]
name = "lora-z"
path = "/adapters/lora-z"
base_model = "base-model"
`
	f := startFleetWithKey(t, servingKey, toml,
		[]string{"with-a", "--model", "base-model", "--lora", "lora-a", "--allow-runtime-lora"},
		[]string{"plain", "--model", "base-model", "--allow-runtime-lora"})
	for i := range 12 {
		code, worker, b := f.post(t, "/v1/completions", "application/json",
			[]byte(fmt.Sprintf(`{"model":"lora-a","prompt":"request %d","max_tokens":2}`, i)))
		if code != 200 || worker != "with-a" {
			t.Fatalf("lora-a request %d: %d on %q %s", i, code, worker, b)
		}
	}
	var first string
	for i := range 6 {
		code, worker, b := f.post(t, "/v1/chat/completions", "application/json",
			[]byte(fmt.Sprintf(`{"model":"lora-z","messages":[{"role":"user","content":"z %d"}],"max_tokens":2}`, i)))
		if code != 200 {
			t.Fatalf("lora-z request %d: %d %s", i, code, b)
		}
		if first == "" {
			first = worker
		} else if worker != first {
			t.Fatalf("lora-z went to %q after %q: a second load", worker, first)
		}
	}
	eng := f.engines[first]
	req, _ := http.NewRequest("GET", "http://"+eng.HTTPAddr+"/v1/models", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"lora-z"`) {
		t.Fatalf("the engine %s does not list the loaded adapter: %s", first, b)
	}
}

// TestLoRAOnScrapedVLLMEngines (R21) is the issue's own set-up: engines that do not heartbeat,
// fronted as static workers scraped with vLLM's metric names. Their adapters come from their
// GET /v1/models (entries with a parent) and vllm:lora_requests_info; an adapter's requests go
// only to the engine that serves it; /v1/models lists the adapters with their parent and
// max_model_len; an engine that answers 404 for an endpoint it lacks is skipped for it (not
// failed), and every request of that endpoint still answers 200.
func TestLoRAOnScrapedVLLMEngines(t *testing.T) {
	a, b := freeAddr(t), freeAddr(t)
	proctest.StartEngine(t, tlengineBin, "--id", "a", "--model", "base-model", "--http-listen", a,
		"--lora", "lora-a", "--endpoints", "completions,chat,responses,messages")
	proctest.StartEngine(t, tlengineBin, "--id", "b", "--model", "base-model", "--http-listen", b, "--lora", "lora-b")
	toml := fmt.Sprintf(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_miss_limit = 3

[[auth.keys]]
key = %q
scopes = ["inference", "admin", "debug"]

[[gateway.static_workers]]
id = "a"
model = "base-model"
http_address = %q
metrics = "vllm"
scrape_interval = "100ms"

[[gateway.static_workers]]
id = "b"
model = "base-model"
http_address = %q
metrics = "vllm"
scrape_interval = "100ms"
`, servingKey, a, b)
	f := &fleet{gw: startTLGW(t, toml), key: servingKey}
	f.base = "http://" + f.gw.HTTPAddr
	f.waitWorkers(t, "a", "b")

	type model struct {
		ID          string  `json:"id"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	var models []model
	eventually(t, "both engines' adapters are listed", 10*time.Second, func() bool {
		req, _ := http.NewRequest("GET", f.base+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+servingKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list struct {
			Data []model `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			t.Fatal(err)
		}
		models = list.Data
		return len(models) == 3
	})
	slices.SortFunc(models, func(x, y model) int { return strings.Compare(x.ID, y.ID) })
	for i, want := range []struct {
		id, parent string
	}{{"base-model", ""}, {"lora-a", "base-model"}, {"lora-b", "base-model"}} {
		m := models[i]
		if m.ID != want.id || (m.Parent == nil) != (want.parent == "") || (m.Parent != nil && *m.Parent != want.parent) || m.MaxModelLen == 0 {
			t.Fatalf("/v1/models entry %d: %+v, want %s with parent %q and a max_model_len", i, m, want.id, want.parent)
		}
	}

	for i := range 8 {
		for _, c := range []struct{ model, worker string }{{"lora-a", "a"}, {"lora-b", "b"}} {
			code, worker, body := f.post(t, "/v1/chat/completions", "application/json",
				[]byte(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"turn %d"}],"max_tokens":2}`, c.model, i)))
			if code != 200 || worker != c.worker {
				t.Fatalf("%s request %d: %d on %q (want %s) %s", c.model, i, code, worker, c.worker, body)
			}
		}
	}
	// An adapter no engine serves is the same 404 as an unknown model.
	if code, _, body := f.post(t, "/v1/completions", "application/json", []byte(`{"model":"lora-c","prompt":"x","max_tokens":1}`)); code != 404 || !strings.Contains(string(body), "model_not_found") {
		t.Fatalf("an adapter nobody serves: %d %s", code, body)
	}
	// a lacks /v1/embeddings: its 404 sends the request on to b and marks a for the endpoint.
	for i := range 6 {
		code, worker, body := f.post(t, "/v1/embeddings", "application/json", []byte(fmt.Sprintf(`{"model":"base-model","input":"text %d"}`, i)))
		if code != 200 || worker != "b" {
			t.Fatalf("embeddings %d: %d on %q %s", i, code, worker, body)
		}
	}
	// a was tried once (its 404 marks it for router.UnsupportedFor), never again.
	if n := strings.Count(f.gw.Logs(), "the engine does not serve this endpoint"); n != 1 {
		t.Fatalf("a's missing endpoint was met %d times, want once:\n%s", n, f.gw.Logs())
	}
	for _, w := range f.workers(t) {
		if w.FailureLoad != 0 || w.EjectedUntil != nil {
			t.Fatalf("a missing endpoint counted as a failure: %+v", w)
		}
	}
}
