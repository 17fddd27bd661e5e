package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// pdEngines is a prefill, a decode and a unified engine of one model under --pd proto.
type pdEngines struct{ p, d, u *Engine }

func startPDProto(t *testing.T, proto string, cfg Config) *pdEngines {
	t.Helper()
	p, d := cfg, cfg
	p.ID, p.Role, p.PD = "p1", RolePrefill, proto
	d.ID, d.Role, d.PD = "d1", RoleDecode, proto
	x := &pdEngines{p: start(t, p), d: start(t, d), u: start(t, Config{ID: "u1"})}
	if x.p.BootstrapAddr == "" || x.d.BootstrapAddr != "" {
		t.Fatalf("side channels: prefill %q decode %q", x.p.BootstrapAddr, x.d.BootstrapAddr)
	}
	return x
}

func pathOf(body map[string]any) string {
	if body["messages"] != nil {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// with is body plus the fields kv.
func with(body map[string]any, kv ...any) map[string]any {
	out := maps.Clone(body)
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// vllmPrefill is the gateway's call 1: it returns the kv_transfer_params of the answer.
func (x *pdEngines) vllmPrefill(t *testing.T, body map[string]any) json.RawMessage {
	t.Helper()
	b := with(body, "kv_transfer_params", map[string]any{"do_remote_decode": true}, "max_tokens", 1, "stream", false)
	delete(b, "stream_options")
	if b["messages"] != nil {
		b["max_completion_tokens"] = 1
	}
	resp, out := post(t, x.p, pathOf(body), mustJSON(b))
	if resp.StatusCode != 200 {
		t.Fatalf("prefill: %d %s", resp.StatusCode, out)
	}
	var a struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(out, &a); err != nil || len(a.Params) == 0 {
		t.Fatalf("prefill answer without kv_transfer_params: %s", out)
	}
	return a.Params
}

// sameAsUnified requires the decode answer got to equal the unified engine's for body.
func (x *pdEngines) sameAsUnified(t *testing.T, body map[string]any, got []byte) {
	t.Helper()
	stream, _ := body["stream"].(bool)
	resp, want := post(t, x.u, pathOf(body), mustJSON(body))
	if resp.StatusCode != 200 {
		t.Fatalf("unified: %d %s", resp.StatusCode, want)
	}
	if diff := cmp.Diff(normalize(t, want, stream), normalize(t, got, stream)); diff != "" {
		t.Fatalf("disaggregated answer differs from unified (-unified +disaggregated):\n%s", diff)
	}
	if answerText(t, want, body["messages"] != nil, stream) == "" {
		t.Fatal("empty answer: the case tests nothing")
	}
}

// idle requires every engine to hold nothing: no running request, no KV, no handle, no hold.
func (x *pdEngines) idle(t *testing.T) {
	t.Helper()
	for _, e := range []*Engine{x.p, x.d, x.u} {
		if st := e.Status(); st.Running != 0 || st.QueueDepth != 0 || st.KVFreeBlocks != st.KVTotalBlocks || st.KVHandlesHeld != 0 {
			t.Fatalf("%s holds state: %+v", e.cfg.ID, st)
		}
		if n := e.pdt.count(); n != 0 {
			t.Fatalf("%s holds %d prompts for remote decodes", e.cfg.ID, n)
		}
	}
}

var pdCases = []struct {
	name string
	body map[string]any
}{
	{"completions JSON", map[string]any{"model": "smol", "prompt": "Once upon a time", "max_tokens": 24, "seed": 11, "temperature": 0.7, "logprobs": 1}},
	{"completions stream", map[string]any{"model": "smol", "prompt": strings.Repeat("a long prompt over blocks ", 5), "max_tokens": 30, "seed": 5,
		"stop": []string{" the"}, "stream": true, "stream_options": map[string]any{"include_usage": true}}},
	{"chat JSON", map[string]any{"model": "smol", "messages": chatMsgs, "max_tokens": 20, "seed": 21, "logprobs": true}},
	{"chat stream", map[string]any{"model": "smol", "messages": chatMsgs, "max_tokens": 20, "seed": 8, "stream": true}},
}

// TestVLLMProtocolEqualsUnified (R22, ENGINES.md §2): call 1 to the prefill engine answers
// kv_transfer_params naming the KV it holds; call 2 to the decode engine with them answers what
// a unified engine answers for the seed, without a prefill of its own, and nothing stays held.
func TestVLLMProtocolEqualsUnified(t *testing.T) {
	x := startPDProto(t, PDVLLM, Config{})
	for _, c := range pdCases {
		t.Run(c.name, func(t *testing.T) {
			raw := x.vllmPrefill(t, c.body)
			var params vllmParams
			if err := json.Unmarshal(raw, &params); err != nil {
				t.Fatal(err)
			}
			host, port, _ := strings.Cut(x.p.BootstrapAddr, ":")
			if !params.DoRemotePrefill || *params.RemoteEngineID != "p1" || len(params.RemoteBlockIDs) == 0 ||
				*params.RemoteHost != host || fmt.Sprint(*params.RemotePort) != port || *params.TPSize != 1 {
				t.Fatalf("kv_transfer_params %s", raw)
			}
			if x.p.pdt.count() != 1 {
				t.Fatal("the prefill engine holds no KV for the decode")
			}
			var b map[string]any
			_ = json.Unmarshal([]byte(mustJSON(c.body)), &b)
			b["kv_transfer_params"] = json.RawMessage(raw)
			resp, got := post(t, x.d, pathOf(c.body), mustJSON(b))
			if resp.StatusCode != 200 {
				t.Fatalf("decode: %d %s", resp.StatusCode, got)
			}
			x.sameAsUnified(t, c.body, got)
			x.idle(t)
			// The KV went once: the same parameters again find nothing (a 503 a gateway fails
			// over from), and the decode engine frees what it took.
			resp, again := post(t, x.d, pathOf(c.body), mustJSON(b))
			if resp.StatusCode != 503 || errCodeOf(t, again) != "kv_transfer_failed" || !strings.Contains(string(again), "block ids") {
				t.Fatalf("the same params twice: %d %s", resp.StatusCode, again)
			}
			x.idle(t)
		})
	}
}

// TestSGLangProtocolEqualsUnified (R22, ENGINES.md §3): the same body goes to both engines at
// once with one bootstrap room; the decode waits for the room's prefill (whichever arrives
// first) and answers what a unified engine answers.
func TestSGLangProtocolEqualsUnified(t *testing.T) {
	x := startPDProto(t, PDSGLang, Config{})
	host, port, _ := strings.Cut(x.p.BootstrapAddr, ":")
	for i, c := range pdCases {
		for _, decodeFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/decode first %v", c.name, decodeFirst), func(t *testing.T) {
				room := uint64(1<<62) + uint64(2*i) + map[bool]uint64{false: 0, true: 1}[decodeFirst]
				var portNum int
				fmt.Sscan(port, &portNum)
				b := mustJSON(with(c.body, "bootstrap_room", room, "bootstrap_host", host, "bootstrap_port", portNum))
				var wg sync.WaitGroup
				var got []byte
				var code int
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, out := postNoFatal(x.d, pathOf(c.body), b)
					code, got = resp, out
				}()
				if decodeFirst {
					gwtest.Eventually(t, "the decode waits for its room", func() bool {
						x.p.pdt.mu.Lock()
						defer x.p.pdt.mu.Unlock()
						return x.p.pdt.waits[room] != nil
					})
				}
				presp, pout := post(t, x.p, pathOf(c.body), b)
				wg.Wait()
				if presp.StatusCode != 200 || code != 200 {
					t.Fatalf("prefill %d %s, decode %d %s", presp.StatusCode, pout, code, got)
				}
				x.sameAsUnified(t, c.body, got)
				x.idle(t)
			})
		}
	}
}

// postNoFatal is post for a goroutine other than the test's.
func postNoFatal(e *Engine, path, body string) (int, []byte) {
	resp, err := http.Post("http://"+e.HTTPAddr+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b
}

// TestSGLangRoomTimeout: a decode whose room no prefill registers waits --pd-timeout (on the
// engine's clock) and answers 503 naming the room; a room registered and never decoded is
// freed when --kv-lease passes.
func TestSGLangRoomTimeout(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	x := startPDProto(t, PDSGLang, Config{Clock: fc, PDTimeout: 5 * time.Second, KVLease: 20 * time.Second})
	host, port, _ := strings.Cut(x.p.BootstrapAddr, ":")
	body := fmt.Sprintf(`{"model":"smol","prompt":"nobody prefills this","max_tokens":4,"seed":1,"bootstrap_room":7,"bootstrap_host":%q,"bootstrap_port":%s}`, host, port)
	done := make(chan []byte, 1)
	go func() {
		code, b := postNoFatal(x.d, "/v1/completions", body)
		done <- append([]byte(fmt.Sprint(code, " ")), b...)
	}()
	// Both clocks' timers: the decode's fetch bound and the prefill's wait for the room.
	gwtest.Eventually(t, "the decode waits for its room", func() bool { return fc.Pending() == 2 })
	fc.Advance(5 * time.Second)
	select {
	case got := <-done:
		if !strings.HasPrefix(string(got), "503 ") || !strings.Contains(string(got), "kv_transfer_failed") {
			t.Fatalf("decode without a prefill: %s", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the decode did not end at --pd-timeout")
	}
	// A prefill nobody decodes is held until its lease ends.
	if resp, b := post(t, x.p, "/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("prefill: %d %s", resp.StatusCode, b)
	}
	if x.p.pdt.count() != 1 {
		t.Fatal("the room's KV is not held")
	}
	if resp, b := post(t, x.p, "/v1/completions", body); resp.StatusCode != 400 || !strings.Contains(string(b), "already held") {
		t.Fatalf("the same room twice: %d %s", resp.StatusCode, b)
	}
	fc.Advance(20 * time.Second)
	x.idle(t)
}

// TestVLLMHoldExpires: KV held for a decode that never comes is freed when --kv-lease passes.
func TestVLLMHoldExpires(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	x := startPDProto(t, PDVLLM, Config{Clock: fc, KVLease: 30 * time.Second})
	body := map[string]any{"model": "smol", "prompt": "a prompt nobody decodes", "max_tokens": 3, "seed": 1}
	raw := x.vllmPrefill(t, body)
	fc.Advance(30*time.Second - time.Nanosecond)
	if x.p.pdt.count() != 1 {
		t.Fatal("the hold ended before its lease")
	}
	fc.Advance(time.Nanosecond)
	x.idle(t)
	b := with(body, "kv_transfer_params", json.RawMessage(raw))
	if resp, out := post(t, x.d, "/v1/completions", mustJSON(b)); resp.StatusCode != 503 || errCodeOf(t, out) != "kv_transfer_failed" {
		t.Fatalf("decode after the hold expired: %d %s", resp.StatusCode, out)
	}
}

// TestPDInputsValidated: every engine-side input of the protocols is checked, with a 400 that
// names the field; fields of another protocol are ignored, as engines ignore unknown fields.
func TestPDInputsValidated(t *testing.T) {
	v := startPDProto(t, PDVLLM, Config{})
	s := startPDProto(t, PDSGLang, Config{})
	okParams := `{"do_remote_prefill":true,"remote_engine_id":"p1","remote_block_ids":[0],"remote_host":"127.0.0.1","remote_port":9,"tp_size":1}`
	for _, c := range []struct {
		e          *Engine
		extra, say string
	}{
		{v.p, `"kv_transfer_params":[1]`, "must be an object"},
		{v.p, `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":true}`, "exclusive"},
		{v.p, `"kv_transfer_params":{"do_remote_decode":true},"stream":true`, "cannot be streamed"},
		{v.d, `"kv_transfer_params":{"do_remote_decode":true}`, "on a decode engine"},
		{v.p, `"kv_transfer_params":` + okParams, "on a prefill engine"},
		{v.d, `"kv_transfer_params":` + strings.Replace(okParams, `"p1"`, `""`, 1), "remote_engine_id"},
		{v.d, `"kv_transfer_params":` + strings.Replace(okParams, `[0]`, `[]`, 1), "remote_block_ids"},
		{v.d, `"kv_transfer_params":` + strings.Replace(okParams, `[0]`, "["+strings.Repeat("0,", 1024)+"0]", 1), "remote_block_ids"},
		{v.d, `"kv_transfer_params":` + strings.Replace(okParams, `"tp_size":1`, `"tp_size":2`, 1), "tp_size"},
		{v.d, `"kv_transfer_params":` + strings.Replace(okParams, `"remote_port":9`, `"remote_port":70000`, 1), "remote_port"},
		{v.d, `"kv_transfer_params":` + strings.Replace(okParams, `"127.0.0.1"`, `"http://x/y"`, 1), "remote_host"},
		{v.d, `"kv_transfer_params":` + strings.Replace(okParams, `"remote_block_ids":[0]`, `"remote_block_ids":["a"]`, 1), "kv_transfer_params"},
		{s.p, `"bootstrap_room":-1`, "bootstrap_room"},
		{s.p, `"bootstrap_room":9223372036854775808`, "bootstrap_room"},
		{s.p, `"bootstrap_room":"7"`, "bootstrap_room"},
		{s.d, `"bootstrap_room":7`, "bootstrap_port"},
		{s.d, `"bootstrap_room":7,"bootstrap_port":8998`, "bootstrap_host"},
		{s.d, `"bootstrap_room":7,"bootstrap_port":8998,"bootstrap_host":"a b"`, "bootstrap_host"},
	} {
		body := `{"model":"smol","prompt":"hi","max_tokens":2,` + c.extra + `}`
		resp, out := post(t, c.e, "/v1/completions", body)
		if resp.StatusCode != 400 || !strings.Contains(string(out), c.say) {
			t.Errorf("%s on %s: %d %s, want 400 saying %q", c.extra, c.e.cfg.ID, resp.StatusCode, out, c.say)
		}
	}
	// Another protocol's fields are ignored.
	for _, c := range []struct {
		e     *Engine
		extra string
	}{
		{v.d, `"bootstrap_room":"not even a number"`},
		{s.d, `"kv_transfer_params":"whatever"`},
		{v.u, `"kv_transfer_params":{"do_remote_prefill":true}`},
	} {
		if resp, out := post(t, c.e, "/v1/completions", `{"model":"smol","prompt":"hi","max_tokens":2,`+c.extra+`}`); resp.StatusCode != 200 {
			t.Errorf("%s on %s: %d %s, want it ignored", c.extra, c.e.cfg.ID, resp.StatusCode, out)
		}
	}
	// The side channel checks its own inputs.
	for _, c := range []struct{ body, say string }{
		{`{"target":"nohostport","request_id":"r"}`, "target"},
		{`{"target":"127.0.0.1:1","colour":"red"}`, "unknown field"},
		{`{"target":"127.0.0.1:1","engine_id":"other","block_ids":[0]}`, "not this engine"},
		{`{"target":"127.0.0.1:1","engine_id":"p1","block_ids":[12345]}`, "no KV is held"},
	} {
		resp, err := http.Post("http://"+v.p.BootstrapAddr+"/tlengine/pd/send", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode < 400 || !strings.Contains(string(msg), c.say) {
			t.Errorf("send %s: %d %s, want an error saying %q", c.body, resp.StatusCode, msg, c.say)
		}
	}
	for _, bad := range []Config{{PD: "nixl"}, {PD: PDVLLM, BootstrapPort: 70000}, {PDTimeout: -1}} {
		bad.ID, bad.Model = "x", "smol"
		if e, err := Start(bad); err == nil {
			e.Close()
			t.Errorf("Start(%+v) accepted", bad)
		}
	}
}
