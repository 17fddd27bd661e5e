package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/sampler"
)

// pd is a prefill engine, a decode engine and a unified engine of the same model.
type pd struct {
	p, d, u *Engine
	ctl     enginev1.EngineControlClient // to p
	kv      kvv1.KvTransferServiceClient // to d
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// startPD starts the three engines; decode is the decode engine's config (ID and role are set).
func startPD(t *testing.T, decode Config) *pd {
	t.Helper()
	decode.ID, decode.Role = "d1", RoleDecode
	x := &pd{
		p: start(t, Config{ID: "p1", Role: RolePrefill}),
		d: start(t, decode),
		u: start(t, Config{ID: "u1"}),
	}
	x.ctl = enginev1.NewEngineControlClient(dial(t, x.p.GRPCAddr))
	x.kv = kvv1.NewKvTransferServiceClient(dial(t, x.d.KVAddr))
	return x
}

// tokenize asks e's POST /v1/tokenize for the prompt (or messages) of body, as the gateway does.
func tokenize(t *testing.T, e *Engine, body map[string]any) []uint32 {
	t.Helper()
	in := map[string]any{"model": body["model"]}
	for _, k := range []string{"prompt", "messages"} {
		if v, ok := body[k]; ok {
			in[k] = v
		}
	}
	b, _ := json.Marshal(in)
	resp, out := post(t, e, "/v1/tokenize", string(b))
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(out, &tok); err != nil || resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, out)
	}
	return tok.Tokens
}

// sampling is what the gateway sends for body: every field, OpenAI's defaults for omitted ones.
func sampling(body map[string]any) *enginev1.SamplingParams {
	num := func(k string, def float64) float64 {
		if v, ok := body[k].(float64); ok {
			return v
		}
		if v, ok := body[k].(int); ok {
			return float64(v)
		}
		return def
	}
	sp := &enginev1.SamplingParams{MaxTokens: uint32(num("max_tokens", 16)), Temperature: num("temperature", 1),
		TopP: num("top_p", 1), TopK: int32(num("top_k", 0)), Seed: uint64(num("seed", 0))}
	switch lp := body["logprobs"].(type) {
	case bool:
		sp.Logprobs = lp
	case int:
		sp.Logprobs = true
	}
	switch s := body["stop"].(type) {
	case string:
		sp.Stop = []string{s}
	case []string:
		sp.Stop = s
	}
	return sp
}

func (x *pd) prefillReq(t *testing.T, body map[string]any) *enginev1.PrefillRequest {
	t.Helper()
	return &enginev1.PrefillRequest{RequestId: "req-1", PromptIds: tokenize(t, x.p, body), Sampling: sampling(body),
		DecodeTarget: x.d.KVAddr, Model: "smol"}
}

func (x *pd) prefill(t *testing.T, body map[string]any) *enginev1.PrefillResponse {
	t.Helper()
	resp, err := x.ctl.Prefill(context.Background(), x.prefillReq(t, body))
	if err != nil {
		t.Fatalf("Prefill: %v", err)
	}
	return resp
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// normalize makes two answers comparable: ids and timestamps differ between engines, and the
// first token's logprob crosses the wire as a float32, so every number is compared at float32
// precision. A stream becomes the list of its data events.
func normalize(t *testing.T, body []byte, stream bool) []any {
	t.Helper()
	var round func(v any) any
	round = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			delete(v, "id")
			delete(v, "created")
			for k, e := range v {
				v[k] = round(e)
			}
		case []any:
			for i, e := range v {
				v[i] = round(e)
			}
		case float64:
			return float32(v)
		}
		return v
	}
	parse := func(b []byte) any {
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("bad JSON %q: %v", b, err)
		}
		return round(v)
	}
	if !stream {
		return []any{parse(body)}
	}
	var events []any
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			events = append(events, data)
		default:
			events = append(events, parse([]byte(data)))
		}
	}
	return events
}

// answerText is the completion's text (JSON or streamed).
func answerText(t *testing.T, body []byte, chat, stream bool) string {
	t.Helper()
	if stream {
		text, _ := streamText(t, body, chat)
		return text
	}
	var c completion
	if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("bad answer %s", body)
	}
	if chat {
		return c.Choices[0].Message.Content
	}
	return c.Choices[0].Text
}

// compare runs body unified on x.u and disaggregated (Prefill on x.p, then x.d with the handle)
// and requires the same answer. It returns the unified answer's text.
func (x *pd) compare(t *testing.T, body map[string]any) (string, *enginev1.PrefillResponse) {
	t.Helper()
	chat := body["messages"] != nil
	stream, _ := body["stream"].(bool)
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
	}
	uResp, want := post(t, x.u, path, mustJSON(body))
	if uResp.StatusCode != 200 {
		t.Fatalf("unified: %d %s", uResp.StatusCode, want)
	}
	pre := x.prefill(t, body)
	dResp, got := post(t, x.d, path, mustJSON(body), "X-TL-KV-Handle", pre.GetHandle().GetHandleId())
	if dResp.StatusCode != 200 {
		t.Fatalf("decode: %d %s", dResp.StatusCode, got)
	}
	if diff := cmp.Diff(normalize(t, want, stream), normalize(t, got, stream)); diff != "" {
		t.Fatalf("disaggregated answer differs from unified (-unified +disaggregated):\n%s\nunified: %s\ndisaggregated: %s", diff, want, got)
	}
	text := answerText(t, want, chat, stream)
	if g := answerText(t, got, chat, stream); g != text {
		t.Fatalf("text %q, unified %q", g, text)
	}
	for _, e := range []*Engine{x.p, x.d, x.u} {
		if st := e.Status(); st.Running != 0 || st.QueueDepth != 0 || st.KVFreeBlocks != st.KVTotalBlocks {
			t.Fatalf("%s holds state after the request: %+v", e.cfg.ID, st)
		}
	}
	if n := x.d.handles.count(); n != 0 {
		t.Fatalf("decode holds %d handles after the request", n)
	}
	return text, pre
}

var chatMsgs = []map[string]any{{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is the capital of France?"}}

func TestDisaggregatedEqualsUnified(t *testing.T) {
	x := startPD(t, Config{})
	long := strings.Repeat("the quick brown fox jumps over the lazy dog and ", 12)
	for _, c := range []struct {
		name string
		body map[string]any
	}{
		{"completions JSON", map[string]any{"model": "smol", "prompt": "Once upon a time", "max_tokens": 24, "seed": 11, "temperature": 0.7, "logprobs": 1}},
		{"completions stream with stops", map[string]any{"model": "smol", "prompt": "Once upon a time", "max_tokens": 40, "seed": 5, "temperature": 1.3,
			"stop": []string{" the", "."}, "stream": true, "stream_options": map[string]any{"include_usage": true}, "logprobs": 0}},
		{"completions greedy", map[string]any{"model": "smol", "prompt": "hello", "max_tokens": 12, "seed": 1, "temperature": 0}},
		{"completions max_tokens 1", map[string]any{"model": "smol", "prompt": "hello", "max_tokens": 1, "seed": 2, "logprobs": 1}},
		{"completions multi-block prompt", map[string]any{"model": "smol", "prompt": long, "max_tokens": 20, "seed": 3, "top_k": 20, "top_p": 0.8}},
		{"chat JSON", map[string]any{"model": "smol", "messages": chatMsgs, "max_tokens": 30, "seed": 21, "temperature": 0.8,
			"top_p": 0.9, "top_k": 40, "logprobs": true, "stop": "\n"}},
		{"chat stream with stops", map[string]any{"model": "smol", "messages": chatMsgs, "max_tokens": 50, "seed": 8, "temperature": 1.5,
			"stop": []string{",", " and"}, "stream": true, "logprobs": true}},
		{"chat stream defaults", map[string]any{"model": "smol", "messages": chatMsgs, "seed": 99, "stream": true,
			"stream_options": map[string]any{"include_usage": true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			text, pre := x.compare(t, c.body)
			if text == "" {
				t.Fatal("empty answer: the case tests nothing")
			}
			if pre.GetFirstToken() == sampler.EOS || pre.GetRngDrawsConsumed() != sampler.DrawsPerToken {
				t.Fatalf("prefill answered %v", pre)
			}
		})
	}
}

// firstTwo finds a seed whose answer starts with a word of at least 3 bytes followed by another
// token, and returns the seed and both tokens' texts.
func firstTwo(t *testing.T, prompt string) (int, string, string) {
	t.Helper()
	ids := sampler.Tokenize(prompt)
	for seed := 1; seed < 1000; seed++ {
		p := sampler.DefaultParams()
		p.Seed = uint64(seed)
		g := sampler.NewGenerator("smol", ids, p)
		t1, _, ok1 := g.Next()
		t2, _, ok2 := g.Next()
		if ok1 && ok2 && len(t1.Text) >= 3 && t1.Text[0] == ' ' && strings.Trim(t1.Text[1:], "abcdefghijklmnopqrstuvwxyz") == "" && t2.Text != "" {
			return seed, t1.Text, t2.Text
		}
	}
	t.Fatal("no suitable seed")
	return 0, "", ""
}

// TestDisaggregatedStopInFirstToken: a stop string that starts inside the first token cuts it,
// whether the stop string ends inside it or in the next token; one that covers it whole leaves
// nothing (the prefill worker then reports EOS).
func TestDisaggregatedStopInFirstToken(t *testing.T) {
	x := startPD(t, Config{})
	const prompt = "Tell me a story about a dragon"
	seed, t1, t2 := firstTwo(t, prompt)
	for _, c := range []struct {
		name, stop string
		inFirst    bool // the stop string starts inside the first token
	}{
		{"inside the first token", t1[2:], true},
		{"across the first and second", t1[len(t1)-1:] + t2[:1], true},
		{"right after the first token", t2, false},
		{"the whole first token", t1, true},
	} {
		at := strings.Index(t1+t2, c.stop)
		if (at < len(t1)) != c.inFirst {
			t.Fatalf("%s: stop %q found at %d in %q+%q", c.name, c.stop, at, t1, t2)
		}
		want := (t1 + t2)[:min(at, len(t1))]
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%v", c.name, stream), func(t *testing.T) {
				body := map[string]any{"model": "smol", "prompt": prompt, "seed": seed, "stop": c.stop, "stream": stream, "logprobs": 0}
				text, pre := x.compare(t, body)
				if text != want {
					t.Fatalf("unified text %q, want %q (tokens %q %q, stop %q)", text, want, t1, t2, c.stop)
				}
				if (want == "") != (pre.GetFirstToken() == sampler.EOS) {
					t.Fatalf("first token %d for answer %q", pre.GetFirstToken(), text)
				}
			})
		}
	}
}

// TestUnifiedEngineServesBothHalves: a unified engine is a prefill and a decode worker at once,
// also for itself.
func TestUnifiedEngineServesBothHalves(t *testing.T) {
	u := start(t, Config{ID: "u2"})
	ref := start(t, Config{ID: "u3"})
	body := map[string]any{"model": "smol", "prompt": "Once upon a time", "max_tokens": 20, "seed": 4, "temperature": 0.9}
	x := &pd{p: u, d: u, u: ref, ctl: enginev1.NewEngineControlClient(dial(t, u.GRPCAddr))}
	x.compare(t, body)
}

// metric reads one series from e's /metrics (0 when absent).
func metric(t *testing.T, e *Engine, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + e.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

func TestReleaseFreesHandle(t *testing.T) {
	x := startPD(t, Config{KVBlocks: 64})
	body := map[string]any{"model": "smol", "prompt": strings.Repeat("one two three four ", 10), "seed": 1}
	ids := tokenize(t, x.p, body)
	pre := x.prefill(t, body)
	h := pre.GetHandle()
	wantBlocks := (len(ids) + 15) / 16
	if h.GetHandleId() == "" || h.GetNumTokens() != uint32(len(ids)) || h.GetNumBlocks() != uint32(wantBlocks) {
		t.Fatalf("handle %v for %d tokens", h, len(ids))
	}
	if st := x.d.Status(); st.KVFreeBlocks != 64-wantBlocks || st.Running != 0 {
		t.Fatalf("decode after the push: %+v, want %d blocks held", st, wantBlocks)
	}
	if got := metric(t, x.d, "tlengine_kv_handles_held"); got != 1 {
		t.Fatalf("handles held %v, want 1", got)
	}
	// The prefill engine freed its sequence; the prompt stays in its prefix cache.
	if st := x.p.Status(); st.Running != 0 || st.KVFreeBlocks != st.KVTotalBlocks {
		t.Fatalf("prefill engine after Prefill: %+v", st)
	}
	x.prefill(t, body) // the same prompt again: its full blocks are found in the cache
	if hit := metric(t, x.p, "tlengine_prefix_cache_hit_tokens_total"); hit < float64(len(ids)/16*16-1) {
		t.Fatalf("prefix cache hits %v after a repeated prompt of %d tokens", hit, len(ids))
	}

	rel, err := x.kv.Release(context.Background(), &kvv1.KvHandle{HandleId: h.GetHandleId()})
	if err != nil || !rel.GetReleased() {
		t.Fatalf("Release: %v %v", rel, err)
	}
	if got := metric(t, x.d, "tlengine_kv_handles_held"); got != 1 {
		t.Fatalf("handles held %v after releasing one of two", got)
	}
	rel, err = x.kv.Release(context.Background(), &kvv1.KvHandle{HandleId: h.GetHandleId()})
	if err != nil || rel.GetReleased() {
		t.Fatalf("second Release: %v %v, want released=false", rel, err)
	}
	if rel, err := x.kv.Release(context.Background(), &kvv1.KvHandle{HandleId: "nope"}); err != nil || rel.GetReleased() {
		t.Fatalf("unknown Release: %v %v", rel, err)
	}
	resp, b := post(t, x.d, "/v1/completions", mustJSON(body), "X-TL-KV-Handle", h.GetHandleId())
	if resp.StatusCode != 404 || errCodeOf(t, b) != "kv_handle_not_found" {
		t.Fatalf("released handle used: %d %s", resp.StatusCode, b)
	}
	// Release the second one too: everything is back.
	x.d.dropHandles()
	if st := x.d.Status(); st.KVFreeBlocks != st.KVTotalBlocks || metric(t, x.d, "tlengine_kv_handles_held") != 0 {
		t.Fatalf("decode after releases: %+v", st)
	}
}

func TestLeaseExpiry(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	x := startPD(t, Config{KVLease: 30 * time.Second, Clock: fc})
	body := map[string]any{"model": "smol", "prompt": "a prompt nobody decodes", "seed": 1}
	h := x.prefill(t, body).GetHandle()
	fc.Advance(30*time.Second - time.Nanosecond)
	if got := metric(t, x.d, "tlengine_kv_handles_held"); got != 1 {
		t.Fatalf("handle gone before its lease ended: held %v", got)
	}
	fc.Advance(time.Nanosecond)
	if st := x.d.Status(); st.KVFreeBlocks != st.KVTotalBlocks || metric(t, x.d, "tlengine_kv_handles_held") != 0 {
		t.Fatalf("expired handle still holds KV: %+v", st)
	}
	if got := metric(t, x.d, "tlengine_kv_handle_expirations_total"); got != 1 {
		t.Fatalf("expirations %v, want 1", got)
	}
	resp, b := post(t, x.d, "/v1/completions", mustJSON(body), "X-TL-KV-Handle", h.GetHandleId())
	if resp.StatusCode != 404 || errCodeOf(t, b) != "kv_handle_not_found" {
		t.Fatalf("expired handle used: %d %s", resp.StatusCode, b)
	}
	if rel, err := x.kv.Release(context.Background(), h); err != nil || rel.GetReleased() {
		t.Fatalf("Release after expiry: %v %v", rel, err)
	}
	// A consumed handle's lease is over: it never expires later.
	h = x.prefill(t, body).GetHandle()
	if resp, b := post(t, x.d, "/v1/completions", mustJSON(body), "X-TL-KV-Handle", h.GetHandleId()); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	fc.Advance(time.Hour)
	if got := metric(t, x.d, "tlengine_kv_handle_expirations_total"); got != 1 {
		t.Fatalf("expirations %v after a consumed handle, want 1", got)
	}
	if e := start(t, Config{ID: "lease-default"}); e.cfg.KVLease != 60*time.Second {
		t.Fatalf("default lease %v", e.cfg.KVLease)
	}
}

func TestHandleMismatch(t *testing.T) {
	x := startPD(t, Config{})
	body := map[string]any{"model": "smol", "prompt": "the pushed prompt", "seed": 1, "max_tokens": 4}
	h := x.prefill(t, body).GetHandle()
	other := map[string]any{"model": "smol", "prompt": "another prompt", "seed": 1, "max_tokens": 4}
	for _, c := range []struct {
		path, body string
	}{
		{"/v1/completions", mustJSON(other)},
		{"/v1/chat/completions", mustJSON(map[string]any{"model": "smol", "messages": chatMsgs})},
	} {
		resp, b := post(t, x.d, c.path, c.body, "X-TL-KV-Handle", h.GetHandleId())
		if resp.StatusCode != 400 || errCodeOf(t, b) != "kv_handle_mismatch" {
			t.Fatalf("%s: %d %s, want 400 kv_handle_mismatch", c.path, resp.StatusCode, b)
		}
	}
	// A mismatch leaves the handle held; the right request still uses it.
	if got := metric(t, x.d, "tlengine_kv_handles_held"); got != 1 {
		t.Fatalf("handles held %v after mismatches", got)
	}
	if resp, b := post(t, x.d, "/v1/completions", mustJSON(body), "X-TL-KV-Handle", h.GetHandleId()); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if st := x.d.Status(); st.KVFreeBlocks != st.KVTotalBlocks || x.d.handles.count() != 0 {
		t.Fatalf("decode after the request: %+v", st)
	}
}

// TestClientLeavesMidStream: the decode engine frees the handle's sequence as for any request,
// and the gateway's Release then answers released=false.
func TestClientLeavesMidStream(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	x := startPD(t, Config{DecodePerToken: time.Second, Clock: fc})
	body := map[string]any{"model": "smol", "prompt": "stream to nobody", "seed": 1, "max_tokens": 50, "stream": true}
	h := x.prefill(t, body).GetHandle()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+x.d.HTTPAddr+"/v1/completions", strings.NewReader(mustJSON(body)))
	req.Header.Set("X-TL-KV-Handle", h.GetHandleId())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q %v", line, err)
	}
	if st := x.d.Status(); st.Running != 1 || x.d.handles.count() != 0 {
		t.Fatalf("decode while streaming: %+v", st)
	}
	cancel()
	resp.Body.Close()
	gwtest.Eventually(t, "the decode engine frees the sequence", func() bool {
		st := x.d.Status()
		return st.Running == 0 && st.KVFreeBlocks == st.KVTotalBlocks
	})
	if rel, err := x.kv.Release(context.Background(), h); err != nil || rel.GetReleased() {
		t.Fatalf("Release after the client left: %v %v", rel, err)
	}
}

// pushBlocks builds a well-formed push of tokens in blocks of 16.
func pushBlocks(tokens []uint32, model string) []*kvv1.KvBlock {
	var out []*kvv1.KvBlock
	for i := 0; i*16 < len(tokens); i++ {
		toks := tokens[i*16 : min((i+1)*16, len(tokens))]
		out = append(out, &kvv1.KvBlock{RequestId: "r", Index: uint32(i), TokenIds: toks, Data: kvPayload(uint32(i), toks)})
	}
	out[0].Model = model
	return out
}

func TestPushValidationAndCuts(t *testing.T) {
	x := startPD(t, Config{KVBlocks: 8})
	tokens := sampler.Tokenize(strings.Repeat("alpha beta gamma delta ", 10)) // 40 tokens, 3 blocks
	push := func(blocks []*kvv1.KvBlock) (*kvv1.KvHandle, error) {
		stream, err := x.kv.Push(context.Background())
		if err != nil {
			return nil, err
		}
		for _, b := range blocks {
			if err := stream.Send(b); err != nil {
				break
			}
		}
		return stream.CloseAndRecv()
	}
	clean := func(what string) {
		t.Helper()
		if st := x.d.Status(); st.KVFreeBlocks != st.KVTotalBlocks || x.d.handles.count() != 0 {
			t.Fatalf("%s: decode holds %+v, %d handles", what, st, x.d.handles.count())
		}
	}
	mutate := func(f func([]*kvv1.KvBlock) []*kvv1.KvBlock) []*kvv1.KvBlock { return f(pushBlocks(tokens, "smol")) }
	for _, c := range []struct {
		name   string
		blocks []*kvv1.KvBlock
		code   codes.Code
	}{
		{"empty stream", nil, codes.InvalidArgument},
		{"wrong model", pushBlocks(tokens, "big"), codes.InvalidArgument},
		{"out of order", mutate(func(b []*kvv1.KvBlock) []*kvv1.KvBlock { b[1], b[2] = b[2], b[1]; return b }), codes.InvalidArgument},
		{"empty block", mutate(func(b []*kvv1.KvBlock) []*kvv1.KvBlock { b[1].TokenIds, b[1].Data = nil, nil; return b }), codes.InvalidArgument},
		{"bad payload", mutate(func(b []*kvv1.KvBlock) []*kvv1.KvBlock { b[2].Data = b[2].Data[1:]; return b }), codes.InvalidArgument},
		{"two requests", mutate(func(b []*kvv1.KvBlock) []*kvv1.KvBlock { b[1].RequestId = "other"; return b }), codes.InvalidArgument},
		{"larger than the pool", pushBlocks(sampler.Tokenize(strings.Repeat("alpha beta ", 80)), "smol"), codes.ResourceExhausted},
	} {
		if _, err := push(c.blocks); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
		clean(c.name)
	}

	// A push cut mid-stream holds nothing.
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := x.kv.Push(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range pushBlocks(tokens, "smol")[:2] {
		if err := stream.Send(b); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	gwtest.Eventually(t, "the cut push ends on the decode engine", func() bool {
		return metric(t, x.d, `tlengine_grpc_requests_total{code="Canceled",method="Push"}`) == 1
	})
	clean("cut push")

	// No room: two pushes of 3 blocks fit in 8, the third does not (ResourceExhausted), and a
	// release makes room again.
	other := func(i int) []uint32 { return sampler.Tokenize(strings.Repeat(fmt.Sprintf("word%d more text ", i), 10)) }
	h1, err1 := push(pushBlocks(other(1), "smol"))
	_, err2 := push(pushBlocks(other(2), "smol"))
	if err1 != nil || err2 != nil {
		t.Fatalf("pushes: %v %v", err1, err2)
	}
	if _, err := push(pushBlocks(other(3), "smol")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("push into a full pool: %v", err)
	}
	if _, err := x.kv.Release(context.Background(), h1); err != nil {
		t.Fatal(err)
	}
	if _, err := push(pushBlocks(other(3), "smol")); err != nil {
		t.Fatalf("push after a release: %v", err)
	}
	x.d.dropHandles()
	clean("after dropping")
}

func TestPrefillFailures(t *testing.T) {
	x := startPD(t, Config{})
	body := map[string]any{"model": "smol", "prompt": strings.Repeat("some prompt words ", 5), "seed": 1}
	clean := func(what string) {
		t.Helper()
		if st := x.p.Status(); st.Running != 0 || st.QueueDepth != 0 || st.KVFreeBlocks != st.KVTotalBlocks {
			t.Fatalf("%s: the prefill engine holds %+v", what, st)
		}
	}
	dead, err := deadAddress()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, target string
		code         codes.Code
	}{
		{"dead decode target", dead, codes.Unavailable},
		{"a prefill engine as decode target", x.p.KVAddr, codes.Unavailable},
		{"not an address", "::not an address::", codes.Unavailable},
	} {
		req := x.prefillReq(t, body)
		req.DecodeTarget = c.target
		if _, err := x.ctl.Prefill(context.Background(), req); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
		clean(c.name)
	}
	// A decode engine without room answers ResourceExhausted, passed on as such.
	small := start(t, Config{ID: "d-small", Role: RoleDecode, KVBlocks: 2})
	req := x.prefillReq(t, map[string]any{"model": "smol", "prompt": strings.Repeat("some prompt words ", 20), "seed": 1})
	req.DecodeTarget = small.KVAddr
	if _, err := x.ctl.Prefill(context.Background(), req); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("decode without room: %v", err)
	}
	clean("decode without room")

	valid := func() *enginev1.PrefillRequest { return x.prefillReq(t, body) }
	for _, c := range []struct {
		name string
		edit func(r *enginev1.PrefillRequest)
	}{
		{"wrong model", func(r *enginev1.PrefillRequest) { r.Model = "big" }},
		{"no model", func(r *enginev1.PrefillRequest) { r.Model = "" }},
		{"empty prompt", func(r *enginev1.PrefillRequest) { r.PromptIds = nil }},
		{"not a token id", func(r *enginev1.PrefillRequest) { r.PromptIds[0] = sampler.VocabSize }},
		{"no decode target", func(r *enginev1.PrefillRequest) { r.DecodeTarget = "" }},
		{"no sampling", func(r *enginev1.PrefillRequest) { r.Sampling = nil }},
		{"max_tokens 0", func(r *enginev1.PrefillRequest) { r.Sampling.MaxTokens = 0 }},
		{"temperature 3", func(r *enginev1.PrefillRequest) { r.Sampling.Temperature = 3 }},
		{"temperature NaN", func(r *enginev1.PrefillRequest) { r.Sampling.Temperature = math.NaN() }},
		{"top_p 0", func(r *enginev1.PrefillRequest) { r.Sampling.TopP = 0 }},
		{"top_p 1.5", func(r *enginev1.PrefillRequest) { r.Sampling.TopP = 1.5 }},
		{"top_k -2", func(r *enginev1.PrefillRequest) { r.Sampling.TopK = -2 }},
		{"five stops", func(r *enginev1.PrefillRequest) { r.Sampling.Stop = []string{"a", "b", "c", "d", "e"} }},
		{"prompt longer than the pool", func(r *enginev1.PrefillRequest) {
			r.PromptIds = make([]uint32, 1024*16+1)
		}},
	} {
		req := valid()
		c.edit(req)
		if _, err := x.ctl.Prefill(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", c.name, err)
		}
	}
	clean("invalid requests")
	if n := x.d.handles.count(); n != 0 {
		t.Fatalf("decode holds %d handles after failed prefills", n)
	}

	// Roles: a decode engine has no EngineControl, a prefill engine no KvTransferService.
	if _, err := enginev1.NewEngineControlClient(dial(t, x.d.GRPCAddr)).Prefill(context.Background(), valid()); status.Code(err) != codes.Unimplemented {
		t.Errorf("Prefill on a decode engine: %v", err)
	}
	if _, err := kvv1.NewKvTransferServiceClient(dial(t, x.p.KVAddr)).Release(context.Background(), &kvv1.KvHandle{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("Release on a prefill engine: %v", err)
	}
}

// TestPrefillPaysItsCost: the prompt's prefill cost passes on the engine's clock before the
// push, like a unified engine's.
func TestPrefillPaysItsCost(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	p := start(t, Config{ID: "p-slow", Role: RolePrefill, PrefillPerToken: time.Millisecond, Clock: fc})
	d := start(t, Config{ID: "d-fast", Role: RoleDecode})
	ctl := enginev1.NewEngineControlClient(dial(t, p.GRPCAddr))
	ids := sampler.Tokenize("a prompt of a few words")
	done := make(chan error, 1)
	go func() {
		_, err := ctl.Prefill(context.Background(), &enginev1.PrefillRequest{PromptIds: ids, Model: "smol", DecodeTarget: d.KVAddr,
			Sampling: &enginev1.SamplingParams{MaxTokens: 16, Temperature: 1, TopP: 1, Seed: 1}})
		done <- err
	}()
	gwtest.Eventually(t, "prefill waits on the clock", func() bool { return fc.Pending() == 1 })
	if st := p.Status(); st.Running != 1 || d.handles.count() != 0 {
		t.Fatalf("during prefill: %+v", st)
	}
	fc.Advance(time.Duration(len(ids))*time.Millisecond - time.Nanosecond)
	select {
	case err := <-done:
		t.Fatalf("prefill finished early: %v", err)
	default:
	}
	fc.Advance(time.Nanosecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d.handles.count() != 1 {
		t.Fatal("no handle pushed")
	}
}

// TestResumeMatchesGenerator: over many seeds, parameters and stop strings (taken from the
// unstopped text, so they hit), the prefill half (one Next) plus the decode half (resume) return
// exactly the tokens of one uninterrupted Generator.
func TestResumeMatchesGenerator(t *testing.T) {
	prompts := []string{"Once upon a time", "hello", "Tell me a story about a dragon", strings.Repeat("many words here ", 9)}
	for i := range 3000 {
		ids := sampler.Tokenize(prompts[i%len(prompts)])
		p := sampler.DefaultParams()
		p.Seed = uint64(i)
		p.MaxTokens = 1 + i%12
		p.Temperature = []float64{1, 0.5, 1.4, 0}[i%4]
		raw := sampler.NewGenerator("smol", ids, p)
		var text string
		for {
			tok, _, ok := raw.Next()
			if !ok {
				break
			}
			text += tok.Text
		}
		if len(text) > 0 {
			// A stop string from a position and length picked by i.
			lo := (i * 7) % len(text)
			hi := min(len(text), lo+1+(i/7)%4)
			p.Stop = []string{text[lo:hi]}
			if i%5 == 0 {
				p.Stop = append(p.Stop, "zz")
			}
		}
		var want []sampler.Token
		g := sampler.NewGenerator("smol", ids, p)
		var wantFinish string
		for {
			tok, finish, ok := g.Next()
			if !ok {
				wantFinish = finish
				break
			}
			want = append(want, tok)
		}
		pre := sampler.NewGenerator("smol", ids, p)
		h := &kvHandle{first: sampler.EOS}
		if tok, _, ok := pre.Next(); ok {
			h.first, h.firstLogprob = tok.ID, float32(tok.Logprob)
		}
		h.draws = pre.Draws()
		src := resume("smol", ids, p, h)
		var got []sampler.Token
		var gotFinish string
		for {
			tok, finish, ok := src.Next()
			if !ok {
				gotFinish = finish
				break
			}
			got = append(got, tok)
		}
		if len(got) > 0 {
			if float32(got[0].Logprob) != float32(want[0].Logprob) {
				t.Fatalf("case %d: first logprob %v, want %v", i, got[0].Logprob, want[0].Logprob)
			}
			got[0].Logprob = want[0].Logprob
		}
		if diff := cmp.Diff(want, got); diff != "" || gotFinish != wantFinish {
			t.Fatalf("case %d (params %+v): finish %q, want %q; tokens (-want +got):\n%s", i, p, gotFinish, wantFinish, diff)
		}
	}
}

// TestPrefillPushesWholeBlocks: a prompt of exactly two blocks is pushed as two blocks (no
// empty third, which a decode engine refuses), one token more as three.
func TestPrefillPushesWholeBlocks(t *testing.T) {
	const bs = 16 // the engines' default --block-size
	x := startPD(t, Config{})
	ids := sampler.Tokenize(strings.Repeat("a prompt of a good many words ", 20))
	for _, n := range []int{2 * bs, 2*bs + 1} {
		if len(ids) < n {
			t.Fatalf("only %d prompt tokens", len(ids))
		}
		resp, err := x.ctl.Prefill(context.Background(), &enginev1.PrefillRequest{RequestId: fmt.Sprint("r", n), PromptIds: ids[:n],
			Model: "smol", DecodeTarget: x.d.KVAddr, Sampling: &enginev1.SamplingParams{MaxTokens: 4, Temperature: 1, TopP: 1, Seed: 1}})
		if err != nil {
			t.Fatalf("%d tokens: %v", n, err)
		}
		if h := resp.GetHandle(); h.GetNumTokens() != uint32(n) || h.GetNumBlocks() != uint32((n+bs-1)/bs) {
			t.Fatalf("%d tokens: handle of %d tokens in %d blocks", n, h.GetNumTokens(), h.GetNumBlocks())
		}
	}
}

// TestPrefillPaysOnlyUncached: a prompt prefilled again costs only what its prefix cache does
// not hold — for 33 tokens in blocks of 16, the last token (1 ms) instead of 33.
func TestPrefillPaysOnlyUncached(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	p := start(t, Config{ID: "p-slow", Role: RolePrefill, PrefillPerToken: time.Millisecond, Clock: fc})
	d := start(t, Config{ID: "d-fast", Role: RoleDecode})
	ctl := enginev1.NewEngineControlClient(dial(t, p.GRPCAddr))
	ids := sampler.Tokenize(strings.Repeat("a prompt of a good many words ", 20))[:33]
	for i, cost := range []time.Duration{33 * time.Millisecond, time.Millisecond} {
		done := make(chan error, 1)
		go func() {
			_, err := ctl.Prefill(context.Background(), &enginev1.PrefillRequest{RequestId: fmt.Sprint("r", i), PromptIds: ids,
				Model: "smol", DecodeTarget: d.KVAddr, Sampling: &enginev1.SamplingParams{MaxTokens: 4, Temperature: 1, TopP: 1, Seed: 1}})
			done <- err
		}()
		gwtest.Eventually(t, "prefill waits on the clock", func() bool { return fc.Pending() == 1 })
		fc.Advance(cost - time.Nanosecond)
		select {
		case err := <-done:
			t.Fatalf("prefill %d finished before %v: %v", i, cost, err)
		default:
		}
		fc.Advance(time.Nanosecond)
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("prefill %d not done at %v", i, cost)
		}
	}
}

// TestPushOfExactlyThePool: a push of exactly the decode engine's KV tokens fits; one token
// more is refused before anything is held.
func TestPushOfExactlyThePool(t *testing.T) {
	x := startPD(t, Config{KVBlocks: 2})
	tokens := sampler.Tokenize(strings.Repeat("alpha beta gamma delta ", 10))
	for _, c := range []struct {
		n    int
		code codes.Code
	}{{32, codes.OK}, {33, codes.ResourceExhausted}} {
		stream, err := x.kv.Push(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range pushBlocks(tokens[:c.n], "smol") {
			if err := stream.Send(b); err != nil {
				break
			}
		}
		h, err := stream.CloseAndRecv()
		if status.Code(err) != c.code {
			t.Fatalf("a push of %d tokens into 32: %v, want %v", c.n, err, c.code)
		}
		// Refused as it arrives, by the bound on what a push may buffer, not by the pool.
		if c.code != codes.OK && !strings.Contains(status.Convert(err).Message(), "exceeds this engine's 32 KV tokens") {
			t.Fatalf("a push of %d tokens into 32: %v, want the push bound's refusal", c.n, err)
		}
		if err == nil {
			if h.GetNumTokens() != 32 {
				t.Fatalf("handle of %d tokens", h.GetNumTokens())
			}
			if _, err := x.kv.Release(context.Background(), h); err != nil {
				t.Fatal(err)
			}
		}
	}
}
