package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/faults"
	"github.com/tlgw/tlgw/sim/sampler"
)

func start(t *testing.T, cfg Config) *Engine {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID = "e1"
	}
	if cfg.Model == "" {
		cfg.Model = "smol"
	}
	e, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func post(t *testing.T, e *Engine, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+e.HTTPAddr+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

type completion struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Logprobs *struct {
			TokenLogprobs []float64 `json:"token_logprobs"`
			Content       []struct {
				Logprob float64 `json:"logprob"`
			} `json:"content"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

// streamText reads an SSE body and returns the concatenated text and whether [DONE] came.
func streamText(t *testing.T, body []byte, chat bool) (string, bool) {
	t.Helper()
	var text strings.Builder
	done := false
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		for _, ch := range c.Choices {
			if chat {
				text.WriteString(ch.Delta.Content)
			} else {
				text.WriteString(ch.Text)
			}
		}
	}
	return text.String(), done
}

func TestCompletionsDeterministicStreamedOrNot(t *testing.T) {
	e := start(t, Config{})
	body := `{"model":"smol","prompt":"The quick brown fox","max_tokens":12,"seed":42,"logprobs":0}`
	resp, b := post(t, e, "/v1/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.Object != "text_completion" || len(c.Choices) != 1 || c.Usage == nil || c.Usage.CompletionTokens == 0 ||
		c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens || c.Choices[0].Logprobs == nil {
		t.Fatalf("response %s", b)
	}
	for _, lp := range c.Choices[0].Logprobs.TokenLogprobs {
		if lp > 0 {
			t.Fatalf("logprob %v > 0", lp)
		}
	}
	_, again := post(t, e, "/v1/completions", body)
	var c2 completion
	_ = json.Unmarshal(again, &c2)
	if c2.Choices[0].Text != c.Choices[0].Text {
		t.Fatalf("same seed, different text: %q vs %q", c.Choices[0].Text, c2.Choices[0].Text)
	}
	_, sb := post(t, e, "/v1/completions", strings.Replace(body, `"seed":42`, `"seed":42,"stream":true`, 1))
	text, done := streamText(t, sb, false)
	if text != c.Choices[0].Text || !done {
		t.Fatalf("streamed %q (done %v), JSON %q", text, done, c.Choices[0].Text)
	}
	_, other := post(t, e, "/v1/completions", strings.Replace(body, `"seed":42`, `"seed":43`, 1))
	var c3 completion
	_ = json.Unmarshal(other, &c3)
	if c3.Choices[0].Text == c.Choices[0].Text {
		t.Fatalf("seeds 42 and 43 gave the same text %q", c.Choices[0].Text)
	}
}

func TestChatJSONAndSSE(t *testing.T) {
	e := start(t, Config{})
	body := `{"model":"smol","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":8,"seed":1,"logprobs":true}`
	resp, b := post(t, e, "/v1/chat/completions", body)
	var c completion
	if err := json.Unmarshal(b, &c); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if c.Object != "chat.completion" || c.Choices[0].Message.Role != "assistant" || c.Choices[0].Message.Content == "" ||
		c.Choices[0].Logprobs == nil || len(c.Choices[0].Logprobs.Content) != c.Usage.CompletionTokens {
		t.Fatalf("chat response %s", b)
	}
	_, sb := post(t, e, "/v1/chat/completions", strings.Replace(body, `"seed":1`, `"seed":1,"stream":true,"stream_options":{"include_usage":true}`, 1))
	text, done := streamText(t, sb, true)
	if text != c.Choices[0].Message.Content || !done || !strings.Contains(string(sb), `"usage"`) {
		t.Fatalf("stream %q done %v, JSON %q\n%s", text, done, c.Choices[0].Message.Content, sb)
	}
}

func TestTokenize(t *testing.T) {
	e := start(t, Config{})
	resp, b := post(t, e, "/v1/tokenize", `{"model":"smol","prompt":"hello world"}`)
	var out struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 || out.Count == 0 || out.Count != len(out.Tokens) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// The completion's usage counts the same prompt tokens.
	_, cb := post(t, e, "/v1/completions", `{"model":"smol","prompt":"hello world","max_tokens":1}`)
	var c completion
	_ = json.Unmarshal(cb, &c)
	if c.Usage.PromptTokens != out.Count {
		t.Fatalf("usage %d prompt tokens, tokenize %d", c.Usage.PromptTokens, out.Count)
	}
}

func errCodeOf(t *testing.T, b []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type string
			Code          json.RawMessage // a string, or vLLM's HTTP status number
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error: %s", b)
	}
	return strings.Trim(string(e.Error.Code), `"`)
}

func TestBadInput(t *testing.T) {
	e := start(t, Config{})
	for _, c := range []struct {
		name, path, body string
		hdr              []string
		status           int
		code             string
	}{
		{"malformed JSON", "/v1/completions", `{"model":`, nil, 400, "invalid_request"},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, nil, 404, "404"},
		{"max_tokens 0", "/v1/completions", `{"model":"smol","prompt":"x","max_tokens":0}`, nil, 400, "invalid_request"},
		{"max_tokens negative", "/v1/chat/completions", `{"model":"smol","messages":[{"role":"user","content":"x"}],"max_tokens":-3}`, nil, 400, "invalid_request"},
		{"no prompt", "/v1/completions", `{"model":"smol"}`, nil, 400, "invalid_request"},
		{"empty messages", "/v1/chat/completions", `{"model":"smol","messages":[]}`, nil, 400, "invalid_request"},
		{"bad temperature", "/v1/completions", `{"model":"smol","prompt":"x","temperature":7}`, nil, 400, "invalid_request"},
		{"unknown KV handle", "/v1/completions", `{"model":"smol","prompt":"x"}`, []string{"X-TL-KV-Handle", "h-404"}, 404, "kv_handle_not_found"},
	} {
		resp, b := post(t, e, c.path, c.body, c.hdr...)
		if resp.StatusCode != c.status || errCodeOf(t, b) != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, resp.StatusCode, b, c.status, c.code)
		}
	}
	if st := e.Status(); st.Running != 0 || st.QueueDepth != 0 || st.KVFreeBlocks != st.KVTotalBlocks {
		t.Fatalf("bad requests left state behind: %+v", st)
	}
}

// TestQueueBehindRunningSet: with max-running 1 and a decode cost on a fake clock, a second
// request queues; status and metrics show the real values; time moves both through.
func TestQueueBehindRunningSet(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{MaxRunning: 1, DecodePerToken: time.Second, KVBlocks: 64, Clock: fc})
	results := make(chan int, 2)
	for i := 0; i < 2; i++ {
		go func(i int) {
			resp, _ := post(t, e, "/v1/completions", fmt.Sprintf(`{"model":"smol","prompt":"request %d","max_tokens":2,"seed":1}`, i))
			results <- resp.StatusCode
		}(i)
	}
	gwtest.Eventually(t, "one running, one queued", func() bool {
		st := e.Status()
		return st.Running == 1 && st.QueueDepth == 1
	})
	if st := e.Status(); st.KVFreeBlocks >= st.KVTotalBlocks {
		t.Fatalf("a running request holds no KV: %+v", st)
	}
	resp, err := http.Get("http://" + e.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"tlengine_queue_depth 1", "tlengine_running 1", "tlengine_kv_blocks_free", "tlengine_kv_handles_held 0", "tlengine_prefix_cache_lookup_tokens_total", "tlengine_prefix_cache_hit_tokens_total"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Advance the clock until both finish.
	for done := 0; done < 2; {
		select {
		case code := <-results:
			if code != 200 {
				t.Fatalf("status %d", code)
			}
			done++
		default:
			fc.Advance(time.Second)
			waitTick()
		}
	}
	if st := e.Status(); st.Running != 0 || st.QueueDepth != 0 || st.KVFreeBlocks != st.KVTotalBlocks {
		t.Fatalf("after both: %+v", st)
	}
}

// waitTick yields the processor for a moment without sleeping: a short timer on a channel.
func waitTick() {
	tm := time.NewTimer(time.Millisecond)
	<-tm.C
}

// fakeRegistry records heartbeats.
type fakeRegistry struct {
	controlv1.UnimplementedWorkerRegistryServer
	mu    sync.Mutex
	beats []*controlv1.WorkerStatus
	drain atomic.Bool
}

func (f *fakeRegistry) Heartbeat(_ context.Context, st *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	f.mu.Lock()
	f.beats = append(f.beats, st)
	f.mu.Unlock()
	return &controlv1.HeartbeatAck{Drain: f.drain.Load(), Epoch: 1, HeartbeatIntervalMs: 2000}, nil
}

func (f *fakeRegistry) last() *controlv1.WorkerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.beats) == 0 {
		return nil
	}
	return f.beats[len(f.beats)-1]
}

func (f *fakeRegistry) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.beats)
}

func startRegistry(t *testing.T) (*fakeRegistry, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fr := &fakeRegistry{}
	s := grpc.NewServer()
	controlv1.RegisterWorkerRegistryServer(s, fr)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return fr, lis.Addr().String()
}

func TestHeartbeatsCarryRealValues(t *testing.T) {
	fr, addr := startRegistry(t)
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{ID: "hb-1", Role: RoleDecode, Gateways: []string{addr}, KVBlocks: 100, BlockSize: 32, Clock: fc})
	// The loop arms its next tick on the fake clock after each ack.
	armed := func(n int) func() bool { return func() bool { return fr.count() >= n && fc.Pending() == 1 } }
	gwtest.Eventually(t, "first heartbeat", armed(1))
	st := fr.last()
	if st.GetWorkerId() != "hb-1" || st.GetModel() != "smol" || st.GetRole() != controlv1.Role_ROLE_DECODE ||
		st.GetHttpAddress() != e.HTTPAddr || st.GetGrpcAddress() != e.GRPCAddr || st.GetKvAddress() != e.KVAddr ||
		st.GetKvTotalBlocks() != 100 || st.GetKvFreeBlocks() != 100 || st.GetBlockSize() != 32 || st.GetDraining() ||
		!st.GetKvEvents() {
		t.Fatalf("heartbeat %v", st)
	}
	// Every T on the engine's clock; a drain in the ack makes the engine report draining.
	fr.drain.Store(true)
	fc.Advance(2 * time.Second)
	gwtest.Eventually(t, "second heartbeat", armed(2))
	if fr.count() != 2 {
		t.Fatalf("%d heartbeats after one interval, want 2", fr.count())
	}
	fc.Advance(2 * time.Second)
	gwtest.Eventually(t, "draining reported", func() bool { return fr.count() >= 3 && fr.last().GetDraining() })
	// The operator undrains: the next ack has no drain, and the heartbeat after it says so.
	gwtest.Eventually(t, "third heartbeat", armed(3))
	fr.drain.Store(false)
	fc.Advance(2 * time.Second)
	gwtest.Eventually(t, "fourth heartbeat", armed(4))
	fc.Advance(2 * time.Second)
	gwtest.Eventually(t, "draining lifted", func() bool { return fr.count() >= 5 && !fr.last().GetDraining() })
}

func TestFaultSwitches(t *testing.T) {
	body := `{"model":"smol","prompt":"hello there","max_tokens":8,"seed":3}`
	t.Run("503", func(t *testing.T) {
		e := start(t, Config{Fault: faults.Fault{Kind: faults.Unavailable}})
		if resp, b := post(t, e, "/v1/completions", body); resp.StatusCode != 503 || errCodeOf(t, b) == "" {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})
	t.Run("bad-headers", func(t *testing.T) {
		e := start(t, Config{Fault: faults.Fault{Kind: faults.BadHeaders}})
		for _, b := range []string{body, strings.Replace(body, `"seed":3`, `"seed":3,"stream":true`, 1)} {
			resp, out := post(t, e, "/v1/completions", b)
			h := resp.Header
			if resp.StatusCode != 200 || h.Get("Set-Cookie") == "" || h.Get("X-TL-Route") != "spoofed" || h.Get("Location") == "" ||
				!strings.HasPrefix(h.Get("Content-Type"), "text/html") {
				t.Fatalf("%d %v %s", resp.StatusCode, h, out)
			}
		}
	})
	t.Run("refuse", func(t *testing.T) {
		fr, addr := startRegistry(t)
		e := start(t, Config{Fault: faults.Fault{Kind: faults.Refuse}, Gateways: []string{addr}})
		gwtest.Eventually(t, "heartbeat", func() bool { return fr.count() >= 1 })
		adv := fr.last().GetHttpAddress()
		if adv == e.HTTPAddr {
			t.Fatal("refuse advertised the real address")
		}
		if c, err := net.Dial("tcp", adv); err == nil {
			c.Close()
			t.Fatalf("something listens on the advertised address %s", adv)
		}
	})
	t.Run("cut-after", func(t *testing.T) {
		e := start(t, Config{Fault: faults.Fault{Kind: faults.CutAfter, N: 2}})
		req, _ := http.NewRequest("POST", "http://"+e.HTTPAddr+"/v1/completions", strings.NewReader(strings.Replace(body, `"seed":3`, `"seed":3,"stream":true`, 1)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || strings.Count(string(b), "data: ") != 2 || strings.Contains(string(b), "[DONE]") {
			t.Fatalf("stream not cut after 2 tokens (err %v): %q", err, b)
		}
		resp, err = http.Post("http://"+e.HTTPAddr+"/v1/completions", "application/json", strings.NewReader(body))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Fatal("a JSON answer was not cut")
		}
		gwtest.Eventually(t, "KV released after cuts", func() bool {
			st := e.Status()
			return st.Running == 0 && st.KVFreeBlocks == st.KVTotalBlocks
		})
	})
	t.Run("crash-after", func(t *testing.T) {
		exited := make(chan int, 1)
		e := start(t, Config{Fault: faults.Fault{Kind: faults.CrashAfter, N: 3}, Exit: func(code int) {
			select {
			case exited <- code:
			default:
			}
		}})
		post(t, e, "/v1/completions", body)
		select {
		case code := <-exited:
			if code == 0 {
				t.Fatal("crash exit code 0")
			}
		default:
			t.Fatal("crash-after did not exit after 3 tokens")
		}
	})
	t.Run("stall", func(t *testing.T) {
		e := start(t, Config{Fault: faults.Fault{Kind: faults.Stall}})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+e.HTTPAddr+"/v1/completions", strings.NewReader(body))
		if _, err := http.DefaultClient.Do(req); err == nil {
			t.Fatal("a stalled engine answered")
		}
	})
	t.Run("no-heartbeat", func(t *testing.T) {
		fr, addr := startRegistry(t)
		e := start(t, Config{ID: "silent", Fault: faults.Fault{Kind: faults.NoHeartbeat}, Gateways: []string{addr}})
		// A healthy engine started after it on the same registry gets its heartbeat through.
		start(t, Config{ID: "healthy", Gateways: []string{addr}})
		gwtest.Eventually(t, "healthy heartbeat", func() bool { return fr.count() >= 1 })
		if resp, _ := post(t, e, "/v1/completions", body); resp.StatusCode != 200 {
			t.Fatal("no-heartbeat engine does not serve")
		}
		fr.mu.Lock()
		defer fr.mu.Unlock()
		for _, b := range fr.beats {
			if b.GetWorkerId() == "silent" {
				t.Fatal("the no-heartbeat engine heartbeat")
			}
		}
	})
	t.Run("draining", func(t *testing.T) {
		fr, addr := startRegistry(t)
		start(t, Config{Fault: faults.Fault{Kind: faults.Draining}, Gateways: []string{addr}})
		gwtest.Eventually(t, "heartbeat", func() bool { return fr.count() >= 1 })
		if !fr.last().GetDraining() {
			t.Fatal("draining fault not reported")
		}
	})
}

// TestBlockSizeBounds: --block-size defaults to 16 (what heartbeats report) and is 1 to
// MaxBlockSize; a size the gateway would refuse in every heartbeat fails at start.
func TestBlockSizeBounds(t *testing.T) {
	c := Config{ID: "b", Model: "smol"}
	if err := c.defaults(); err != nil || c.BlockSize != 16 {
		t.Fatalf("default block size %d (%v), want 16", c.BlockSize, err)
	}
	for _, bs := range []int{-1, MaxBlockSize + 1} {
		c := Config{ID: "b", Model: "smol", BlockSize: bs}
		if err := c.defaults(); err == nil || !strings.Contains(err.Error(), "block-size") {
			t.Errorf("block size %d: err %v, want a --block-size error", bs, err)
		}
	}
	c = Config{ID: "b", Model: "smol", BlockSize: MaxBlockSize}
	if err := c.defaults(); err != nil {
		t.Fatalf("block size %d: %v", MaxBlockSize, err)
	}
}

// TestConfigDefaultsAndBounds: each count must be 1 or more (0 selects its default), each cost
// 0 or more, the KV lease positive (0 selects 60 s); a heartbeat interval of 0 or less is 2 s;
// unset listen addresses are loopback with a free port, set ones are kept.
func TestConfigDefaultsAndBounds(t *testing.T) {
	base := func() Config { return Config{ID: "c", Model: "smol"} }
	for _, c := range []struct {
		name string
		set  func(*Config)
		ok   bool
	}{
		{"kv blocks 1", func(c *Config) { c.KVBlocks = 1 }, true},
		{"kv blocks -1", func(c *Config) { c.KVBlocks = -1 }, false},
		{"block size 1", func(c *Config) { c.BlockSize = 1 }, true},
		{"max running 1", func(c *Config) { c.MaxRunning = 1 }, true},
		{"max running -1", func(c *Config) { c.MaxRunning = -1 }, false},
		{"free prefill and decode", func(c *Config) { c.PrefillPerToken, c.DecodePerToken = 0, 0 }, true},
		{"prefill -1 ns", func(c *Config) { c.PrefillPerToken = -1 }, false},
		{"decode -1 ns", func(c *Config) { c.DecodePerToken = -1 }, false},
		{"kv lease 1 ns", func(c *Config) { c.KVLease = 1 }, true},
		{"kv lease -1 ns", func(c *Config) { c.KVLease = -1 }, false},
		{"resolve interval 1 ns", func(c *Config) { c.ResolveInterval = 1 }, true},
	} {
		cfg := base()
		c.set(&cfg)
		if err := cfg.defaults(); (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", c.name, err, c.ok)
		}
	}

	cfg := base()
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.KVBlocks != 1024 || cfg.MaxRunning != 256 || cfg.KVLease != 60*time.Second || cfg.HeartbeatInterval != 2*time.Second ||
		cfg.HTTPListen != "127.0.0.1:0" || cfg.GRPCListen != "127.0.0.1:0" || cfg.KVListen != "127.0.0.1:0" || cfg.Clock == nil {
		t.Fatalf("defaults %+v", cfg)
	}
	for _, hb := range []time.Duration{0, -time.Second} {
		cfg := base()
		cfg.HeartbeatInterval = hb
		if err := cfg.defaults(); err != nil || cfg.HeartbeatInterval != 2*time.Second {
			t.Errorf("heartbeat interval %v: %v (%v), want 2s", hb, cfg.HeartbeatInterval, err)
		}
	}
	cfg = base()
	cfg.HeartbeatInterval, cfg.KVLease = time.Nanosecond, time.Nanosecond
	cfg.HTTPListen, cfg.GRPCListen, cfg.KVListen = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	if err := cfg.defaults(); err != nil || cfg.HeartbeatInterval != time.Nanosecond || cfg.KVLease != time.Nanosecond ||
		cfg.HTTPListen != "127.0.0.1:1" || cfg.GRPCListen != "127.0.0.1:2" || cfg.KVListen != "127.0.0.1:3" {
		t.Fatalf("set values not kept: %+v (%v)", cfg, err)
	}
}

// TestRequestBounds: every sampling and output field at and just past each end of its range.
func TestRequestBounds(t *testing.T) {
	const tiny = 1e-9
	cases := []struct {
		chat   bool
		fields string // JSON members after the prompt
		ok     bool
	}{
		{false, `"max_tokens":1`, true},
		{false, `"max_tokens":0`, false},
		{false, `"max_completion_tokens":1,"max_tokens":0`, true},
		{false, `"temperature":0`, true},
		{false, `"temperature":2`, true},
		{false, fmt.Sprintf(`"temperature":%g`, -tiny), false},
		{false, fmt.Sprintf(`"temperature":%g`, 2+tiny), false},
		{false, `"top_p":1`, true},
		{false, fmt.Sprintf(`"top_p":%g`, tiny), true},
		{false, `"top_p":0`, false},
		{false, fmt.Sprintf(`"top_p":%g`, 1+tiny), false},
		{false, `"top_k":-1`, true},
		{false, `"top_k":0`, true},
		{false, `"top_k":-2`, false},
		{false, `"n":1`, true},
		{false, `"n":0`, false},
		{false, `"n":2`, false},
		{false, `"logprobs":0`, true},
		{false, `"logprobs":5`, true},
		{false, `"logprobs":-1`, false},
		{false, `"logprobs":6`, false},
		{false, `"stop":["a","b","c","d"]`, true},
		{false, `"stop":["a","b","c","d","e"]`, false},
		{true, `"logprobs":true,"top_logprobs":0`, true},
		{true, `"logprobs":true,"top_logprobs":20`, true},
		{true, `"logprobs":true,"top_logprobs":-1`, false},
		{true, `"logprobs":true,"top_logprobs":21`, false},
	}
	for _, c := range cases {
		body := `{"model":"smol","prompt":"x",` + c.fields + `}`
		if c.chat {
			body = `{"model":"smol","messages":[{"role":"user","content":"x"}],` + c.fields + `}`
		}
		_, err := parseRequest([]byte(body), c.chat, only("smol"))
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", body, err, c.ok)
		}
	}
	// What the accepted values set: top_k 1 is kept, 0 and -1 leave it off; the logprobs count.
	for _, c := range []struct {
		fields       string
		topK, topLog int
	}{{`"top_k":1`, 1, 0}, {`"top_k":0`, 0, 0}, {`"top_k":-1`, 0, 0}, {`"logprobs":5`, 0, 5}} {
		r, err := parseRequest([]byte(`{"model":"smol","prompt":"x",`+c.fields+`}`), false, only("smol"))
		if err != nil {
			t.Fatalf("%s: %v", c.fields, err)
		}
		if r.params.TopK != c.topK || r.topLogprobs != c.topLog {
			t.Errorf("%s: top_k %d, logprobs %d; want %d, %d", c.fields, r.params.TopK, r.topLogprobs, c.topK, c.topLog)
		}
	}
}

// only accepts one model, as an engine without adapters does.
func only(model string) modelCheck {
	return func(m string) error {
		if m != model {
			return modelNotFound(m)
		}
		return nil
	}
}

// TestTokenIDPrompt: a completions prompt given as the token ids /tokenize answers is the same
// prompt (the same answer for a seed, the same prompt tokens, its blocks cached under the same
// chain); an id outside the vocabulary is refused.
func TestTokenIDPrompt(t *testing.T) {
	e := start(t, Config{})
	text := strings.Repeat("Token ids are a prompt too. ", 8)
	_, tb := post(t, e, "/tokenize", `{"model":"smol","prompt":"`+text+`"}`)
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(tb, &tok); err != nil || len(tok.Tokens) < 32 {
		t.Fatalf("tokenize: %s", tb)
	}
	ids, _ := json.Marshal(tok.Tokens)
	var byText, byIDs completion
	_, a := post(t, e, "/v1/completions", `{"model":"smol","prompt":"`+text+`","max_tokens":6,"seed":7}`)
	resp, b := post(t, e, "/v1/completions", `{"model":"smol","prompt":`+string(ids)+`,"max_tokens":6,"seed":7}`)
	if resp.StatusCode != 200 || json.Unmarshal(a, &byText) != nil || json.Unmarshal(b, &byIDs) != nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if byIDs.Choices[0].Text != byText.Choices[0].Text || byIDs.Usage.PromptTokens != len(tok.Tokens) {
		t.Fatalf("by ids %q (%d prompt tokens), by text %q (%d ids)", byIDs.Choices[0].Text, byIDs.Usage.PromptTokens,
			byText.Choices[0].Text, len(tok.Tokens))
	}
	if st := e.sched.pool.Stats(); st.HitTokens == 0 {
		t.Fatal("the token-id prompt found none of the text prompt's blocks cached")
	}
	for _, bad := range []string{`[-1]`, `[4294967296]`, fmt.Sprintf(`[%d]`, sampler.VocabSize), `[]`, `[1.5]`} {
		if resp, b := post(t, e, "/v1/completions", `{"model":"smol","prompt":`+bad+`,"max_tokens":1}`); resp.StatusCode != 400 {
			t.Fatalf("prompt %s: %d %s", bad, resp.StatusCode, b)
		}
	}
}
