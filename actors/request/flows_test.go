package request_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/config"
)

// completion writes a completions answer whose tokens carry the given logprobs.
func completion(w http.ResponseWriter, text []string, logprobs []float64) {
	lp := map[string]any{"tokens": text, "token_logprobs": logprobs, "top_logprobs": nil, "text_offset": make([]int, len(text))}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"object":  "text_completion",
		"choices": []map[string]any{{"index": 0, "text": strings.Join(text, ""), "logprobs": lp, "finish_reason": "stop"}},
	})
}

func modelOf(body string) string {
	var m struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal([]byte(body), &m)
	return m.Model
}

// TestFailoverBeforeFirstByte: a refused worker and a 503 worker are each tried once and the
// request completes on the next (golden transcript: failover over 3 workers).
func TestFailoverBeforeFirstByte(t *testing.T) {
	r := newRig(t, rigOpt{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := lis.Addr().String()
	lis.Close()
	busy := r.engine(t, "b-busy", func(w http.ResponseWriter, _ *http.Request, _ string) {
		r.tr.add("engine b-busy: answers 503")
		http.Error(w, "full", http.StatusServiceUnavailable)
	})
	good := r.engine(t, "c-good", func(w http.ResponseWriter, _ *http.Request, body string) {
		r.tr.add("engine c-good: answers 200 (model %s)", modelOf(body))
		completion(w, []string{"Hello"}, []float64{-0.5})
	})
	r.beat("a-refused", "smol", refused, 0) // loads order the attempts: a, b, c
	r.beat("b-busy", "smol", busy.URL, 1)
	r.beat("c-good", "smol", good.URL, 2)
	resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"hi"}`)
	r.tr.add("client: %d %s", resp.StatusCode, strings.TrimSpace(body)[:40])
	if resp.StatusCode != 200 || !strings.Contains(body, "Hello") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, id := range []string{"a-refused", "b-busy", "c-good"} {
		r.InFlight(id, 0)
	}
	r.tr.golden(t, "failover_three_workers")
}

// TestNoSpliceAfterFirstByte: a worker that dies after one token; the client gets that token
// and an SSE error event, no [DONE]; no other worker is called (golden: cut after first byte).
func TestNoSpliceAfterFirstByte(t *testing.T) {
	r := newRig(t, rigOpt{})
	dying := r.engine(t, "a-dying", func(w http.ResponseWriter, _ *http.Request, _ string) {
		r.tr.add("engine a-dying: sends one token, then its connection drops")
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n1a\r\ndata: {\"text\":\"The cat\"}\n\n\r\n")
		buf.Flush()
		conn.Close()
	})
	other := r.engine(t, "b-other", func(w http.ResponseWriter, _ *http.Request, _ string) {
		r.tr.add("engine b-other: called (a splice!)")
		completion(w, []string{"x"}, []float64{-1})
	})
	r.beat("a-dying", "smol", dying.URL, 0)
	r.beat("b-other", "smol", other.URL, 5)
	resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"hi","stream":true}`)
	r.tr.add("client: %d, body:\n%s", resp.StatusCode, body)
	if !strings.HasPrefix(body, "data: {\"text\":\"The cat\"}\n\nevent: error\ndata: ") ||
		!strings.Contains(body, `"code":"stream_interrupted"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("body %q", body)
	}
	r.InFlight("a-dying", 0)
	r.tr.golden(t, "cut_after_first_byte")
}

func cascadeRig(t *testing.T, smallLogprobs []float64) (*rig, *int, *int, *string) {
	small, large := 0, 0
	var smallBody string
	r := newRig(t, rigOpt{
		routes: []config.Route{{Model: "auto", Cascade: []config.CascadeStep{
			{Model: "smol", AcceptIf: "mean_logprob > -1.0"}, {Model: "big"},
		}}},
		keys: []config.Key{{Key: "sk-dbg", Scopes: []string{"inference", "debug"}}, {Key: "sk-plain", Scopes: []string{"inference"}}},
	})
	se := r.engine(t, "smol", func(w http.ResponseWriter, req *http.Request, body string) {
		small++
		smallBody = body
		r.tr.add("engine smol: answers %d tokens, logprobs %v", len(smallLogprobs), smallLogprobs)
		words := make([]string, len(smallLogprobs))
		for i := range words {
			words[i] = fmt.Sprint(" w", i)
		}
		completion(w, words, smallLogprobs)
	})
	le := r.engine(t, "big", func(w http.ResponseWriter, req *http.Request, body string) {
		large++
		r.tr.add("engine big: answers (stream %v)", strings.Contains(body, `"stream":true`))
		if strings.Contains(body, `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"big\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		completion(w, []string{"big answer"}, []float64{-0.2})
	})
	r.beat("smol-1", "smol", se.URL, 0)
	r.beat("big-1", "big", le.URL, 0)
	return r, &small, &large, &smallBody
}

// TestCascadeAcceptsOrEscalates: a confident small answer is kept (large never called,
// logprobs requested, then stripped for a client that did not ask); an unsure one escalates;
// an empty one is never accepted; a streamed request goes straight to the last step.
func TestCascadeAcceptsOrEscalates(t *testing.T) {
	t.Run("accept", func(t *testing.T) {
		r, small, large, smallBody := cascadeRig(t, []float64{-0.2, -0.4, -0.3})
		resp, body := r.post(t, "/v1/completions", "sk-dbg", `{"model":"auto","prompt":"easy"}`)
		r.tr.add("client: %d, X-TL-Cascade-Step %s, logprobs in body: %v", resp.StatusCode, resp.Header.Get("X-TL-Cascade-Step"), !strings.Contains(body, `"logprobs":null`))
		if resp.StatusCode != 200 || *small != 1 || *large != 0 || !strings.Contains(body, " w0 w1 w2") {
			t.Fatalf("%d small %d large %d %s", resp.StatusCode, *small, *large, body)
		}
		if !strings.Contains(*smallBody, `"logprobs":1`) || modelOf(*smallBody) != "smol" {
			t.Fatalf("the small step was asked %s", *smallBody)
		}
		if !strings.Contains(body, `"logprobs":null`) || resp.Header.Get("X-TL-Cascade-Step") != "0" {
			t.Fatalf("client got logprobs it did not ask for, or no step header: %v %s", resp.Header, body)
		}
		r.tr.golden(t, "cascade_accept")
		// A key without the debug scope sees no step header; a client that asked keeps logprobs.
		resp, body = r.post(t, "/v1/completions", "sk-plain", `{"model":"auto","prompt":"easy","logprobs":2}`)
		if resp.Header.Get("X-TL-Cascade-Step") != "" || !strings.Contains(body, `"token_logprobs"`) {
			t.Fatalf("plain key: %v %s", resp.Header, body)
		}
		r.InFlight("smol-1", 0)
	})
	t.Run("escalate", func(t *testing.T) {
		r, small, large, _ := cascadeRig(t, []float64{-2.5, -1.5, -3})
		resp, body := r.post(t, "/v1/completions", "sk-dbg", `{"model":"auto","prompt":"hard"}`)
		r.tr.add("client: %d, X-TL-Cascade-Step %s", resp.StatusCode, resp.Header.Get("X-TL-Cascade-Step"))
		if resp.StatusCode != 200 || *small != 1 || *large != 1 || !strings.Contains(body, "big answer") || resp.Header.Get("X-TL-Cascade-Step") != "1" {
			t.Fatalf("%d small %d large %d %v %s", resp.StatusCode, *small, *large, resp.Header, body)
		}
		r.InFlight("smol-1", 0)
		r.InFlight("big-1", 0)
		r.tr.golden(t, "cascade_escalate")
	})
	t.Run("empty answer escalates", func(t *testing.T) {
		r, small, large, _ := cascadeRig(t, []float64{})
		resp, body := r.post(t, "/v1/completions", "sk-plain", `{"model":"auto","prompt":"x"}`)
		if resp.StatusCode != 200 || *small != 1 || *large != 1 || !strings.Contains(body, "big answer") {
			t.Fatalf("%d small %d large %d %s", resp.StatusCode, *small, *large, body)
		}
	})
	t.Run("stream goes to the last step", func(t *testing.T) {
		r, small, large, _ := cascadeRig(t, []float64{-0.1})
		resp, body := r.post(t, "/v1/completions", "sk-plain", `{"model":"auto","prompt":"x","stream":true}`)
		if resp.StatusCode != 200 || *small != 0 || *large != 1 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("%d small %d large %d %s", resp.StatusCode, *small, *large, body)
		}
	})
	t.Run("a case variant of logprobs does not stop the forcing", func(t *testing.T) {
		// R13.4: "LogProbs" is another key for the engine, so the step must still ask for
		// logprobs, and the client, which did not ask under the real key, gets none.
		r, small, large, smallBody := cascadeRig(t, []float64{-0.2, -0.4})
		resp, body := r.post(t, "/v1/completions", "sk-plain", `{"model":"auto","prompt":"easy","LogProbs":5}`)
		if resp.StatusCode != 200 || *small != 1 || *large != 0 || !strings.Contains(*smallBody, `"logprobs":1`) {
			t.Fatalf("%d small %d large %d, step asked %s", resp.StatusCode, *small, *large, *smallBody)
		}
		if !strings.Contains(body, `"logprobs":null`) {
			t.Fatalf("client got logprobs it did not ask for: %s", body)
		}
	})
	t.Run("chat forces logprobs true", func(t *testing.T) {
		r, _, _, smallBody := cascadeRig(t, []float64{-0.1})
		r.post(t, "/v1/chat/completions", "sk-plain", `{"model":"auto","messages":[{"role":"user","content":"x"}]}`)
		if !strings.Contains(*smallBody, `"logprobs":true`) {
			t.Fatalf("chat step asked %s", *smallBody)
		}
	})
}
