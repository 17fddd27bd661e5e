package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tlgw/tlgw/internal/proctest"
)

// fleet is a tlgw process with tlengine processes heartbeating to it.
type fleet struct {
	gw      *proctest.Proc
	engines map[string]*proctest.Proc
	base    string
	key     string // an admin key, when the config has keys
}

const fastHeartbeats = `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3
`

func startFleet(t *testing.T, toml string, engines ...[]string) *fleet {
	t.Helper()
	return startFleetWithKey(t, "", toml, engines...)
}

func startFleetWithKey(t *testing.T, adminKey, toml string, engines ...[]string) *fleet {
	t.Helper()
	f := &fleet{gw: startTLGW(t, toml), engines: map[string]*proctest.Proc{}, key: adminKey}
	f.base = "http://" + f.gw.HTTPAddr
	var ids []string
	for _, args := range engines {
		id := args[0]
		ids = append(ids, id)
		all := append([]string{"--id", id, "--gateway", f.gw.GRPCAddr}, args[1:]...)
		f.engines[id] = proctest.StartEngine(t, tlengineBin, all...)
	}
	slices.Sort(ids)
	f.waitWorkers(t, ids...)
	return f
}

type workerRow struct {
	ID       string `json:"id"`
	Routable bool   `json:"routable"`
	Draining bool   `json:"draining"`
	Drained  bool   `json:"drained"`
	Running  int    `json:"running"`
	InFlight int    `json:"in_flight"`
	// R14.2: an outlier ejection in force (nil and "" when none).
	EjectedUntil   *time.Time `json:"ejected_until"`
	EjectionReason string     `json:"ejection_reason"`
	// R19: the load the worker's recent failures add (0 when none).
	FailureLoad int64 `json:"failure_load"`
	// R23: the other replicas' requests on it, as they last shared them.
	ReplicasInFlight int `json:"replicas_in_flight"`
}

func (f *fleet) workers(t *testing.T) []workerRow {
	t.Helper()
	req, _ := http.NewRequest("GET", f.base+"/admin/v1/workers", nil)
	if f.key != "" {
		req.Header.Set("Authorization", "Bearer "+f.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Workers []workerRow `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Workers
}

func (f *fleet) ids(t *testing.T) []string {
	var ids []string
	for _, w := range f.workers(t) {
		ids = append(ids, w.ID)
	}
	return ids
}

func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", within, what)
		}
		<-tick.C
	}
}

func (f *fleet) waitWorkers(t *testing.T, ids ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("workers %v registered", ids), 10*time.Second, func() bool {
		return slices.Equal(f.ids(t), ids)
	})
}

func (f *fleet) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(f.base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// TestFleetWithOpenAISDK: tlengine processes register by heartbeat; completions and chat,
// JSON and SSE, go through tlgw with the official OpenAI Go SDK as the client.
func TestFleetWithOpenAISDK(t *testing.T) {
	f := startFleet(t, fastHeartbeats,
		[]string{"smol-1", "--model", "smol"}, []string{"smol-2", "--model", "smol"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := f.client()

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel("smol"),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(12), Seed: openai.Int(7),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(comp.Choices) != 1 || comp.Choices[0].Text == "" || comp.Usage.CompletionTokens == 0 {
		t.Fatalf("completion %+v", comp)
	}

	stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel("smol"),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(12), Seed: openai.Int(7),
	})
	var streamed strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			streamed.WriteString(ch.Text)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if streamed.String() != comp.Choices[0].Text {
		t.Fatalf("streamed %q, JSON %q: the same seed must give the same text", streamed.String(), comp.Choices[0].Text)
	}

	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "smol",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello!")},
		Seed:     openai.Int(3), MaxCompletionTokens: openai.Int(10), Logprobs: openai.Bool(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	if chat.Choices[0].Message.Content == "" || len(chat.Choices[0].Logprobs.Content) == 0 {
		t.Fatalf("chat %+v", chat)
	}
	for _, lp := range chat.Choices[0].Logprobs.Content {
		if lp.Logprob > 0 {
			t.Fatalf("logprob %v > 0", lp.Logprob)
		}
	}
	cs := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "smol",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello!")},
		Seed:     openai.Int(3), MaxCompletionTokens: openai.Int(10),
	})
	acc := openai.ChatCompletionAccumulator{}
	for cs.Next() {
		acc.AddChunk(cs.Current())
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != chat.Choices[0].Message.Content {
		t.Fatalf("chat stream %q, JSON %q", acc.Choices[0].Message.Content, chat.Choices[0].Message.Content)
	}

	// An unknown model is the gateway's 404, seen by the SDK as an API error.
	_, err = c.Completions.New(ctx, openai.CompletionNewParams{
		Model:  openai.CompletionNewParamsModel("nope"),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestKilledEngineIsEvicted: an engine killed with SIGKILL is evicted after k·T and later
// requests succeed on the other.
func TestKilledEngineIsEvicted(t *testing.T) {
	f := startFleet(t, fastHeartbeats,
		[]string{"a", "--model", "smol"}, []string{"b", "--model", "smol"})
	victim := f.engines["a"]
	killed := time.Now()
	if err := victim.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.Exited()
	f.waitWorkers(t, "b")
	if gone := time.Since(killed); gone > 3*time.Second {
		t.Fatalf("evicted only after %v (k·T = 600ms)", gone)
	}
	c := f.client()
	for i := 0; i < 10; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:  openai.CompletionNewParamsModel("smol"),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprint("request ", i))},
		})
		cancel()
		if err != nil {
			t.Fatalf("request %d after the eviction: %v", i, err)
		}
	}
}

// TestDrainThroughAdmin: draining a model through the admin API takes its workers out of
// routing (503 no_capacity) and the engines learn it from their heartbeat acks.
func TestDrainThroughAdmin(t *testing.T) {
	f := startFleet(t, fastHeartbeats, []string{"d1", "--model", "smol"})
	resp, err := http.Post(f.base+"/admin/v1/models/smol:drain", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 {
		t.Fatalf("drain: %d", resp.StatusCode)
	}
	eventually(t, "d1 drained, unroutable and reporting draining", 5*time.Second, func() bool {
		w := f.workers(t)
		return len(w) == 1 && w[0].Drained && !w[0].Routable && w[0].Draining
	})
	r, err := http.Post(f.base+"/v1/completions", "application/json", strings.NewReader(`{"model":"smol","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 503 || !strings.Contains(string(b), "no_capacity") {
		t.Fatalf("drained model: %d %s", r.StatusCode, b)
	}
	// The engine reports draining because the gateway asked; an undrain lifts both.
	resp, err = http.Post(f.base+"/admin/v1/models/smol:undrain", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 {
		t.Fatalf("undrain: %d", resp.StatusCode)
	}
	eventually(t, "d1 undrained, routable and no longer reporting draining", 5*time.Second, func() bool {
		w := f.workers(t)
		return len(w) == 1 && !w[0].Drained && w[0].Routable && !w[0].Draining
	})
}

// TestDemoComesUp: `tlgw demo` starts the gateway and its engines and answers.
func TestDemoComesUp(t *testing.T) {
	p := proctest.Start(t, tlgwBin, []string{"demo", "--http-listen", "127.0.0.1:0"})
	base := "http://" + p.HTTPAddr
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	var ids []string
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	for _, want := range []string{"auto", "big", "smol", "smol-pd"} {
		if !slices.Contains(ids, want) {
			t.Fatalf("models %v lack %s", ids, want)
		}
	}
	c := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, model := range []string{"smol", "big", "auto", "smol-pd"} {
		out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi")},
			MaxCompletionTokens: openai.Int(4),
		})
		if err != nil || out.Choices[0].Message.Content == "" {
			t.Fatalf("demo %s: %v %+v", model, err, out)
		}
	}
	if err := p.Cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
		if p.Err() != nil {
			t.Fatalf("demo exit: %v\n%s", p.Err(), p.Logs())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("demo did not stop on Ctrl-C")
	}
}

// TestNoTruncatedStreamsUnderLoad: 64 concurrent clients stream through tlgw for a while; every
// stream ends with data: [DONE] and carries every token (the standard ReverseProxy is known to
// cut a fraction of POST streams; the gateway must cut none).
func TestNoTruncatedStreamsUnderLoad(t *testing.T) {
	f := startFleet(t, fastHeartbeats,
		[]string{"s1", "--model", "smol", "--max-running", "1024"}, []string{"s2", "--model", "smol", "--max-running", "1024"})
	const clients, perClient, maxTokens = 64, 8, 32
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var mu sync.Mutex
	var streams, truncated, short int
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < perClient; i++ {
				body := fmt.Sprintf(`{"model":"smol","prompt":"client %d request %d","max_tokens":%d,"stream":true}`, c, i, maxTokens)
				resp, err := hc.Post(f.base+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					mu.Lock()
					truncated++
					mu.Unlock()
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				done := err == nil && strings.HasSuffix(string(b), "data: [DONE]\n\n")
				// At least the final finish_reason chunk (EOS may come first, so token events can
				// be fewer than maxTokens, even none).
				events := strings.Count(string(b), "data: {")
				mu.Lock()
				streams++
				if !done {
					truncated++
				} else if events < 1 {
					short++
				}
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	if truncated != 0 || short != 0 || streams != clients*perClient {
		t.Fatalf("%d streams: %d truncated, %d without tokens", streams, truncated, short)
	}
}
