package request_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/engine"
)

// pdRoute is a disaggregated route "smol-pd" of served model smol on protocol proto.
func pdRoute(proto string) []config.Route {
	return []config.Route{{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}},
		Targets: []string{config.TargetDisaggregated}, PDProtocol: proto}}
}

// beatPD registers a prefill or decode worker at addr (a prefill with its bootstrap port).
func (r *rig) beatPD(id string, role router.Role, addr string, bootstrapPort int) {
	w := gwtest.Worker(id, "smol", 0)
	w.Role, w.HTTPAddress, w.BootstrapPort = role, strings.TrimPrefix(addr, "http://"), bootstrapPort
	r.Beat(w)
}

// TestPDProtocolsEqualUnified (R22): over vLLM's and SGLang's protocols, with tlengine engines
// in-process, a disaggregated route answers what a unified engine answers for one seed, JSON
// and SSE, completions and chat; nothing stays held, no worker keeps a ticket.
func TestPDProtocolsEqualUnified(t *testing.T) {
	for _, proto := range []string{config.PDVLLM, config.PDSGLang} {
		t.Run(proto, func(t *testing.T) {
			r := newRig(t, rigOpt{routes: pdRoute(proto)})
			u := startEngine(t, engine.Config{ID: "u", Model: "smol"})
			p := startEngine(t, engine.Config{ID: "p", Model: "smol", Role: engine.RolePrefill, PD: proto})
			d := startEngine(t, engine.Config{ID: "d", Model: "smol", Role: engine.RoleDecode, PD: proto})
			_, port, _ := net.SplitHostPort(p.BootstrapAddr)
			bp, _ := strconv.Atoi(port)
			r.beatPD("u", router.RoleUnified, u.HTTPAddr, 0)
			r.beatPD("p", router.RolePrefill, p.HTTPAddr, bp)
			r.beatPD("d", router.RoleDecode, d.HTTPAddr, 0)
			for _, c := range []struct{ path, body string }{
				{"/v1/completions", `{"model":"%s","prompt":"The router sends the prompt to the prefill worker","max_tokens":12,"seed":5,"temperature":0.8}`},
				{"/v1/completions", `{"model":"%s","prompt":"Streams too","max_tokens":9,"seed":6,"stream":true,"stream_options":{"include_usage":true}}`},
				{"/v1/chat/completions", `{"model":"%s","messages":[{"role":"user","content":"Hello there"}],"max_tokens":10,"seed":7}`},
				{"/v1/chat/completions", `{"model":"%s","messages":[{"role":"user","content":"Hello again"}],"max_tokens":10,"seed":8,"stream":true}`},
			} {
				resp, got := r.post(t, c.path, "", fmt.Sprintf(c.body, "smol-pd"))
				if resp.StatusCode != 200 {
					t.Fatalf("%s: %d %s", c.body, resp.StatusCode, got)
				}
				_, want := r.post(t, c.path, "", fmt.Sprintf(c.body, "smol"))
				if g, w := answerText(t, got), answerText(t, want); g == "" || g != w {
					t.Fatalf("%s: disaggregated %q, unified %q", c.body, g, w)
				}
				if strings.Contains(c.body, `"stream":true`) && !strings.HasSuffix(got, "data: [DONE]\n\n") {
					t.Fatalf("%s: the stream did not end with [DONE]: %s", c.body, got)
				}
			}
			for _, id := range []string{"u", "p", "d"} {
				r.InFlight(id, 0)
			}
			for _, e := range []*engine.Engine{p, d} {
				gwtest.Eventually(t, "the engines hold nothing", func() bool {
					st := e.Status()
					return st.KVHandlesHeld == 0 && st.Running == 0 && st.KVFreeBlocks == st.KVTotalBlocks
				})
			}
		})
	}
}

// answerText is the generated text of a completions or chat answer, JSON or SSE.
func answerText(t *testing.T, body string) string {
	t.Helper()
	type choice struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	}
	var b strings.Builder
	one := func(data string) {
		var c struct{ Choices []choice }
		if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 {
			ch := c.Choices[0]
			b.WriteString(ch.Text + ch.Message.Content + ch.Delta.Content)
		}
	}
	if !strings.HasPrefix(body, "data: ") {
		one(body)
		return b.String()
	}
	for _, line := range strings.Split(body, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			one(data)
		}
	}
	return b.String()
}

// stand is a stand-in engine's record of the bodies it was sent.
type stand struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (s *stand) record(t *testing.T, body string) map[string]any {
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Errorf("an engine got a body that is not JSON: %s", body)
	}
	s.mu.Lock()
	s.bodies = append(s.bodies, m)
	s.mu.Unlock()
	return m
}

func (s *stand) got() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.bodies...)
}

// answer writes a completion of text, as JSON or SSE as the body asked.
func answer(w http.ResponseWriter, body map[string]any, text string) {
	if body["stream"] == true {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q}]}\n\ndata: [DONE]\n\n", text)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"text":%q}],"usage":{"total_tokens":3}}`, text)
}

// dropConn breaks the connection off with nothing sent.
func dropConn(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}

// TestVLLMConnector (R22, ENGINES.md §2): call 1 carries do_remote_decode, max_tokens 1 (chat
// max_completion_tokens 1 too), stream false and no stream_options; its kv_transfer_params go
// verbatim to the decode with the client's own body. A decode that fails before its first byte
// is retried once on another decode worker with the same params; a second failure redoes the
// prefill on a fresh pick; the client gets one whole answer.
func TestVLLMConnector(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream %v", stream), func(t *testing.T) {
			r := newRig(t, rigOpt{routes: pdRoute(config.PDVLLM)})
			var pre, d1, d2, d3 stand
			n := 0
			var mu sync.Mutex
			ps := r.engine(t, "p", func(w http.ResponseWriter, _ *http.Request, body string) {
				pre.record(t, body)
				mu.Lock()
				n++
				k := n
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"choices":[{"text":"x","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p","remote_block_ids":[%d,7],"remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`, k)
			})
			fail := func(s *stand) func(http.ResponseWriter, *http.Request, string) {
				return func(w http.ResponseWriter, _ *http.Request, body string) {
					m := s.record(t, body)
					if m["stream"] == true {
						w.Header().Set("Content-Type", "text/event-stream")
						w.WriteHeader(200) // headers, then nothing: no first event
						return
					}
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			}
			s1 := r.engine(t, "d1", fail(&d1))
			s2 := r.engine(t, "d2", func(w http.ResponseWriter, _ *http.Request, body string) { d2.record(t, body); dropConn(w) })
			s3 := r.engine(t, "d3", func(w http.ResponseWriter, _ *http.Request, body string) { answer(w, d3.record(t, body), "decoded") })
			r.beatPD("p", router.RolePrefill, ps.URL, 0)
			r.beatPD("d1", router.RoleDecode, s1.URL, 0)
			r.beatPD("d2", router.RoleDecode, s2.URL, 0)
			r.beatPD("d3", router.RoleDecode, s3.URL, 0)
			body := fmt.Sprintf(`{"model":"smol-pd","prompt":"hello","max_tokens":20,"stream":%v,"stream_options":{"include_usage":true}}`, stream)
			if !stream {
				body = `{"model":"smol-pd","prompt":"hello","max_tokens":20}`
			}
			resp, got := r.post(t, "/v1/completions", "", body)
			if resp.StatusCode != 200 || answerText(t, got) != "decoded" {
				t.Fatalf("client: %d %s", resp.StatusCode, got)
			}
			pb, b1, b2, b3 := pre.got(), d1.got(), d2.got(), d3.got()
			if len(pb) != 2 || len(b1) != 1 || len(b2) != 1 || len(b3) != 1 {
				t.Fatalf("calls: prefill %d, d1 %d, d2 %d, d3 %d; want 2, 1, 1, 1", len(pb), len(b1), len(b2), len(b3))
			}
			for _, b := range pb {
				kv, _ := b["kv_transfer_params"].(map[string]any)
				_, so := b["stream_options"]
				if kv["do_remote_decode"] != true || len(kv) != 1 || b["max_tokens"] != 1.0 || b["stream"] != false || so || b["model"] != "smol" {
					t.Fatalf("call 1 body %v", b)
				}
			}
			params := func(b map[string]any) string { js, _ := json.Marshal(b["kv_transfer_params"]); return string(js) }
			// d1 and d2 got the first prefill's params; d3 the second's.
			if p1 := params(b1[0]); p1 != params(b2[0]) || !strings.Contains(p1, "[1,7]") || !strings.Contains(params(b3[0]), "[2,7]") {
				t.Fatalf("params: d1 %s, d2 %s, d3 %s", p1, params(b2[0]), params(b3[0]))
			}
			for _, b := range [][]map[string]any{b1, b2, b3} {
				if b[0]["max_tokens"] != 20.0 || (b[0]["stream"] == true) != stream || b[0]["model"] != "smol" {
					t.Fatalf("a decode got %v, want the client's body", b[0])
				}
				if _, ok := b[0]["stream_options"]; ok != stream {
					t.Fatalf("a decode body's stream_options %v, the client's %v", b[0]["stream_options"], stream)
				}
			}
			for _, id := range []string{"p", "d1", "d2", "d3"} {
				r.InFlight(id, 0)
			}
		})
	}
}

// TestVLLMConnectorChatAndBadPrefill: a chat call 1 also sets max_completion_tokens 1; a
// prefill answer without kv_transfer_params (or with one that is no object) fails over to
// another prefill worker; a prefill's 400 is the client's answer.
func TestVLLMConnectorChatAndBadPrefill(t *testing.T) {
	r := newRig(t, rigOpt{routes: pdRoute(config.PDVLLM)})
	var p1, p2, d stand
	bad := r.engine(t, "p1", func(w http.ResponseWriter, _ *http.Request, body string) {
		p1.record(t, body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"x"}],"kv_transfer_params":[1,2]}`)
	})
	good := r.engine(t, "p2", func(w http.ResponseWriter, _ *http.Request, body string) {
		m := p2.record(t, body)
		if strings.Contains(fmt.Sprint(m["messages"]), "refuse me") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":{"message":"bad request","type":"invalid_request_error","code":400}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"x"}}],"kv_transfer_params":{"remote_block_ids":[3]}}`)
	})
	ds := r.engine(t, "d", func(w http.ResponseWriter, _ *http.Request, body string) {
		d.record(t, body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"chat answer"}}]}`)
	})
	r.beatPD("p1", router.RolePrefill, bad.URL, 0)
	r.beatPD("p2", router.RolePrefill, good.URL, 0)
	r.beatPD("d", router.RoleDecode, ds.URL, 0)
	resp, got := r.post(t, "/v1/chat/completions", "", `{"model":"smol-pd","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9}`)
	if resp.StatusCode != 200 || answerText(t, got) != "chat answer" {
		t.Fatalf("client: %d %s", resp.StatusCode, got)
	}
	if b := p2.got(); len(p1.got()) != 1 || len(b) != 1 || b[0]["max_completion_tokens"] != 1.0 || b[0]["max_tokens"] != 1.0 {
		t.Fatalf("prefill calls p1 %v, p2 %v", p1.got(), b)
	}
	if b := d.got(); len(b) != 1 || b[0]["max_completion_tokens"] != 9.0 || fmt.Sprint(b[0]["kv_transfer_params"]) != "map[remote_block_ids:[3]]" {
		t.Fatalf("decode got %v", b)
	}
	// p1 is excluded for that request only; the next may try it again and fail over again.
	resp, got = r.post(t, "/v1/chat/completions", "", `{"model":"smol-pd","messages":[{"role":"user","content":"refuse me"}]}`)
	if resp.StatusCode != 400 || !strings.Contains(got, "bad request") || len(d.got()) != 1 {
		t.Fatalf("a prefill's 400: %d %s (decode calls %d)", resp.StatusCode, got, len(d.got()))
	}
	for _, id := range []string{"p1", "p2", "d"} {
		r.InFlight(id, 0)
	}
}

// TestSGLangConnector (R22, ENGINES.md §3): both workers get the same body with bootstrap_host
// (the prefill's host), bootstrap_port (its configured port) and a bootstrap_room; the client
// gets the decode's answer. A decode failing before its first byte, or the prefill failing
// before it, abandons both and the retry draws a new room.
func TestSGLangConnector(t *testing.T) {
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"smol-pd","prompt":"hello","max_tokens":5,"stream":%v}`, stream)
		// checkPairs requires each pair's two bodies to be equal and to carry the protocol's
		// fields, with a new room every time.
		checkPairs := func(t *testing.T, pairs [][2]map[string]any, ports ...float64) {
			t.Helper()
			rooms := map[any]bool{}
			for i, pr := range pairs {
				pj, _ := json.Marshal(pr[0])
				dj, _ := json.Marshal(pr[1])
				room, _ := pr[0]["bootstrap_room"].(float64)
				if string(pj) != string(dj) || pr[0]["bootstrap_host"] != "127.0.0.1" || room < 0 || rooms[room] ||
					pr[0]["model"] != "smol" || pr[0]["bootstrap_port"] != ports[i] || pr[0]["max_tokens"] != 5.0 {
					t.Fatalf("pair %d: prefill got %s, decode %s", i, pj, dj)
				}
				rooms[room] = true
			}
		}
		t.Run(fmt.Sprintf("decode fails, stream %v", stream), func(t *testing.T) {
			r := newRig(t, rigOpt{routes: pdRoute(config.PDSGLang)})
			var p, d1, d2 stand
			pCalls := make(chan struct{}, 8) // one per prefill call (at most a few)
			sp := r.engine(t, "p", func(w http.ResponseWriter, _ *http.Request, body string) {
				m := p.record(t, body)
				pCalls <- struct{}{}
				answer(w, m, "prefilled")
			})
			sd1 := r.engine(t, "d1", func(w http.ResponseWriter, _ *http.Request, body string) {
				d1.record(t, body)
				<-pCalls           // its pair's prefill call has arrived
				w.WriteHeader(503) // before its first byte
			})
			sd2 := r.engine(t, "d2", func(w http.ResponseWriter, _ *http.Request, body string) {
				m := d2.record(t, body)
				<-pCalls // as an engine, the decode answers once its room's prefill came
				answer(w, m, "decoded")
			})
			r.beatPD("p", router.RolePrefill, sp.URL, 9100)
			r.beatPD("d1", router.RoleDecode, sd1.URL, 0)
			r.beatPD("d2", router.RoleDecode, sd2.URL, 0)
			resp, got := r.post(t, "/v1/completions", "", body)
			if resp.StatusCode != 200 || answerText(t, got) != "decoded" {
				t.Fatalf("client: %d %s", resp.StatusCode, got)
			}
			pb, b1, b2 := p.got(), d1.got(), d2.got()
			if len(b1) != 1 || len(b2) != 1 {
				t.Fatalf("calls: p %d d1 %d d2 %d; want 2 1 1", len(pb), len(b1), len(b2))
			}
			// The prefill's calls may arrive in either order: match them to decodes by room.
			if pb[0]["bootstrap_room"] != b1[0]["bootstrap_room"] {
				pb[0], pb[1] = pb[1], pb[0]
			}
			checkPairs(t, [][2]map[string]any{{pb[0], b1[0]}, {pb[1], b2[0]}}, 9100, 9100)
			for _, id := range []string{"p", "d1", "d2"} {
				r.InFlight(id, 0)
			}
		})
		t.Run(fmt.Sprintf("prefill fails, stream %v", stream), func(t *testing.T) {
			r := newRig(t, rigOpt{routes: pdRoute(config.PDSGLang)})
			var p1, p2, d stand
			dFirst := make(chan struct{})    // closed when d has its first call
			abandoned := make(chan struct{}) // closed when the gateway abandoned it
			stop := make(chan struct{})      // the test's end: every held handler returns
			sp1 := r.engine(t, "p1", func(w http.ResponseWriter, _ *http.Request, body string) {
				p1.record(t, body)
				select { // it fails once the decode has the same call
				case <-dFirst:
				case <-stop:
				}
				w.WriteHeader(500)
			})
			p2Calls := make(chan struct{}, 8) // one per call (at most a few)
			sp2 := r.engine(t, "p2", func(w http.ResponseWriter, _ *http.Request, body string) {
				m := p2.record(t, body)
				p2Calls <- struct{}{}
				answer(w, m, "prefilled")
			})
			sd := r.engine(t, "d", func(w http.ResponseWriter, req *http.Request, body string) {
				m := d.record(t, body)
				if len(d.got()) == 1 {
					close(dFirst)
					select { // waits for its room's KV until the gateway abandons the pair
					case <-req.Context().Done():
						close(abandoned)
					case <-stop:
					}
					return
				}
				select { // as an engine, the decode answers once its room's prefill came
				case <-p2Calls:
				case <-stop:
				}
				answer(w, m, "decoded")
			})
			t.Cleanup(func() { close(stop) }) // runs before the engines' servers close
			r.beatPD("p1", router.RolePrefill, sp1.URL, 0)
			r.beatPD("p2", router.RolePrefill, sp2.URL, 0)
			r.beatPD("d", router.RoleDecode, sd.URL, 0)
			resp, got := r.post(t, "/v1/completions", "", body)
			if resp.StatusCode != 200 || answerText(t, got) != "decoded" {
				t.Fatalf("client: %d %s", resp.StatusCode, got)
			}
			<-abandoned
			pb1, pb2, bd := p1.got(), p2.got(), d.got()
			if len(pb1) != 1 || len(pb2) != 1 || len(bd) != 2 {
				t.Fatalf("calls: p1 %d p2 %d d %d; want 1 1 2", len(pb1), len(pb2), len(bd))
			}
			port := float64(config.DefaultBootstrapPort)
			checkPairs(t, [][2]map[string]any{{pb1[0], bd[0]}, {pb2[0], bd[1]}}, port, port)
			for _, id := range []string{"p1", "p2", "d"} {
				r.InFlight(id, 0)
			}
		})
	}
}

// TestPDNoSpliceAfterFirstByte (R6): a decode that breaks off after its first event is never
// retried, on either protocol: the client keeps what it got and an SSE error event, no [DONE].
func TestPDNoSpliceAfterFirstByte(t *testing.T) {
	for _, proto := range []string{config.PDVLLM, config.PDSGLang} {
		t.Run(proto, func(t *testing.T) {
			r := newRig(t, rigOpt{routes: pdRoute(proto)})
			var pre, d1, d2 stand
			pCalls := make(chan struct{}, 8) // one per prefill call (one expected)
			ps := r.engine(t, "p", func(w http.ResponseWriter, _ *http.Request, body string) {
				m := pre.record(t, body)
				pCalls <- struct{}{}
				if proto == config.PDVLLM {
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprint(w, `{"choices":[{"text":"x"}],"kv_transfer_params":{"remote_block_ids":[1]}}`)
					return
				}
				answer(w, m, "x")
			})
			s1 := r.engine(t, "d1", func(w http.ResponseWriter, _ *http.Request, body string) {
				d1.record(t, body)
				<-pCalls // its prefill came (sglang: at the same time)
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"first\"}]}\n\n")
				http.NewResponseController(w).Flush()
				dropConn(w)
			})
			s2 := r.engine(t, "d2", func(w http.ResponseWriter, _ *http.Request, body string) { answer(w, d2.record(t, body), "spliced") })
			r.beatPD("p", router.RolePrefill, ps.URL, 0)
			r.beatPD("d1", router.RoleDecode, s1.URL, 0)
			r.beatPD("d2", router.RoleDecode, s2.URL, 0)
			resp, got := r.post(t, "/v1/completions", "", `{"model":"smol-pd","prompt":"hello","max_tokens":5,"stream":true}`)
			if resp.StatusCode != 200 || !strings.Contains(got, `"first"`) || !strings.Contains(got, "event: error") ||
				strings.Contains(got, "[DONE]") || strings.Contains(got, "spliced") {
				t.Fatalf("client: %d %s", resp.StatusCode, got)
			}
			if len(d2.got()) != 0 || len(d1.got()) != 1 || len(pre.got()) != 1 {
				t.Fatalf("calls: prefill %d, d1 %d, d2 %d; want 1, 1, 0", len(pre.got()), len(d1.got()), len(d2.got()))
			}
			for _, id := range []string{"p", "d1", "d2"} {
				r.InFlight(id, 0)
			}
		})
	}
}

// TestVLLMPrefillAnswers (R22, R6): call 1's 5xx and 429, and a 200 whose kv_transfer_params
// are unusable (none, no object, over their bound), fail over to the other prefill worker and,
// both failing, are the gateway's own error, the engine's body never relayed; any other status
// is the client's answer, the engine's body as it gave it. No decode is called either way.
func TestVLLMPrefillAnswers(t *testing.T) {
	over := `{"pad":"` + strings.Repeat("x", 256<<10) + `"}`
	for _, c := range []struct {
		status   int
		answer   string
		failover bool
	}{
		{500, `{"error":"engine says 500"}`, true},
		{503, `{"error":"engine says 503"}`, true},
		{429, `{"error":"engine says 429"}`, true},
		{200, `{"choices":[{"text":"x"}]}`, true},
		{200, `{"choices":[{"text":"x"}],"kv_transfer_params":"engine says params"}`, true},
		{200, `{"choices":[{"text":"x"}],"kv_transfer_params":` + over + `}`, true},
		{499, `{"error":"engine says 499"}`, false},
		{404, `{"error":"engine says 404"}`, false},
	} {
		t.Run(fmt.Sprint(c.status, " ", c.answer[:min(len(c.answer), 40)]), func(t *testing.T) {
			r := newRig(t, rigOpt{routes: pdRoute(config.PDVLLM)})
			var p1, p2, d stand
			prefill := func(s *stand) func(http.ResponseWriter, *http.Request, string) {
				return func(w http.ResponseWriter, _ *http.Request, body string) {
					s.record(t, body)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(c.status)
					fmt.Fprint(w, c.answer)
				}
			}
			s1, s2 := r.engine(t, "p1", prefill(&p1)), r.engine(t, "p2", prefill(&p2))
			sd := r.engine(t, "d", func(w http.ResponseWriter, _ *http.Request, body string) { answer(w, d.record(t, body), "decoded") })
			r.beatPD("p1", router.RolePrefill, s1.URL, 0)
			r.beatPD("p2", router.RolePrefill, s2.URL, 0)
			r.beatPD("d", router.RoleDecode, sd.URL, 0)
			resp, got := r.post(t, "/v1/completions", "", `{"model":"smol-pd","prompt":"hello","max_tokens":5}`)
			calls := len(p1.got()) + len(p2.got())
			if c.failover {
				if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(got, "engine says") || calls != 2 {
					t.Fatalf("client: %d %s; prefill calls %d, want 2", resp.StatusCode, got, calls)
				}
			} else if resp.StatusCode != c.status || got != c.answer || calls != 1 {
				t.Fatalf("client: %d %s; prefill calls %d, want the engine's %d from 1", resp.StatusCode, got, calls, c.status)
			}
			if n := len(d.got()); n != 0 {
				t.Fatalf("%d decode calls after the prefill answered %d", n, c.status)
			}
			for _, id := range []string{"p1", "p2", "d"} {
				r.InFlight(id, 0)
			}
		})
	}
}

// TestSGLangReleasesPrefillAtFirstByte (R22): an SGLang pair's prefill worker is released as
// soon as the decode's first event is in (its part is done), while the decode's stream goes on.
func TestSGLangReleasesPrefillAtFirstByte(t *testing.T) {
	r := newRig(t, rigOpt{routes: pdRoute(config.PDSGLang)})
	var p, d stand
	pCalls := make(chan struct{}, 8) // one per prefill call (one expected)
	more := make(chan struct{})      // closed when the decode is to finish its stream
	stop := make(chan struct{})      // the test's end: a held handler returns
	sp := r.engine(t, "p", func(w http.ResponseWriter, _ *http.Request, body string) {
		answer(w, p.record(t, body), "prefilled")
		pCalls <- struct{}{}
	})
	sd := r.engine(t, "d", func(w http.ResponseWriter, _ *http.Request, body string) {
		d.record(t, body)
		select { // as an engine, the decode starts once its room's prefill came
		case <-pCalls:
		case <-stop:
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"first\"}]}\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-more:
		case <-stop:
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\" second\"}]}\n\ndata: [DONE]\n\n")
	})
	t.Cleanup(func() { close(stop) }) // registered after the engines: runs before their servers close
	r.beatPD("p", router.RolePrefill, sp.URL, 0)
	r.beatPD("d", router.RoleDecode, sd.URL, 0)
	client := *r.srv.Client()
	client.Timeout = 10 * time.Second // bounds every read below
	resp, err := client.Post(r.srv.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"smol-pd","prompt":"hello","max_tokens":5,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	first, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(first, `"first"`) {
		t.Fatalf("the first event: %q %v", first, err)
	}
	r.InFlight("p", 0) // released at the decode's first byte
	r.InFlight("d", 1) // the decode still streams
	close(more)
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.Contains(string(rest), `" second"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the rest of the stream: %q %v", rest, err)
	}
	r.InFlight("d", 0)
	if len(p.got()) != 1 || len(d.got()) != 1 {
		t.Fatalf("calls: p %d d %d; want 1 1", len(p.got()), len(d.got()))
	}
}
