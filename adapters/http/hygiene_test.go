package httpapi_test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	httpapi "github.com/tlgw/tlgw/adapters/http"
	tlengine "github.com/tlgw/tlgw/sim/engine"
	"github.com/tlgw/tlgw/sim/faults"
)

// TestUnknownModelsAddNoSeries (R13.4): 1,000 requests for random unknown models add no
// series: the request metrics label them "unknown", never with the client's string.
func TestUnknownModelsAddNoSeries(t *testing.T) {
	s := newStack(t, stackOpt{})
	s.beat("w1", "smol", jsonEngine(t, "w1"))
	series := func() int {
		mfs, err := s.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				n++
				for _, l := range m.GetLabel() {
					if strings.HasPrefix(l.GetValue(), "rnd-") {
						t.Fatalf("%s has the client's model as a label: %s=%q", mf.GetName(), l.GetName(), l.GetValue())
					}
				}
			}
		}
		return n
	}
	for i := range 2 { // warm up every series an unknown model touches
		resp, body := s.do(t, "POST", "/v1/completions", "", fmt.Sprintf(`{"model":"rnd-warm-%d","prompt":"x"}`, i))
		if resp.StatusCode != 404 || errCode(t, body) != "model_not_found" {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	before := series()
	for i := range 1000 {
		resp, _ := s.do(t, "POST", "/v1/completions", "", fmt.Sprintf(`{"model":"rnd-%d","prompt":"x"}`, i))
		if resp.StatusCode != 404 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	if after := series(); after != before {
		t.Fatalf("1,000 unknown models: %d series before, %d after", before, after)
	}
	if !strings.Contains(s.metricsText(t), `tlgw_requests_total{code="404",endpoint="completions",model="unknown",route="unknown"} 1002`) {
		t.Fatalf("unknown models are not counted under model=\"unknown\":\n%s", s.metricsText(t))
	}
}

func (s *stack) metricsText(t *testing.T) string {
	t.Helper()
	_, body := s.do(t, "GET", "/metrics", "", "")
	return string(body)
}

// badHeaderEngine answers like an engine that sets headers no client may see.
func badHeaderEngine(t *testing.T) *engine {
	return newEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		h := w.Header()
		h.Set("Set-Cookie", "session=stolen")
		h.Set("Location", "http://169.254.169.254/")
		h.Set("X-TL-Route", "spoofed")
		h.Set("X-TL-Cascade-Step", "9")
		h.Set("X-Engine-Secret", "s3cret")
		h.Set("Retry-After", "7")
		if strings.Contains(string(body), `"stream":true`) {
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		h.Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}`)
	})
}

// TestEngineHeadersAllowList (R13.4): only Content-Type, Cache-Control and Retry-After of an
// engine's headers reach the client; X-TL-Route is the gateway's, for debug keys only.
func TestEngineHeadersAllowList(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	s.beat("w1", "smol", badHeaderEngine(t))
	for _, tc := range []struct {
		key, body, ct, route string
	}{
		{"sk-inference", `{"model":"smol","prompt":"x"}`, "application/json", ""},
		{"sk-inference", `{"model":"smol","prompt":"x","stream":true}`, "text/event-stream", ""},
		{"sk-debug", `{"model":"smol","prompt":"x"}`, "application/json", "w1"},
		{"sk-debug", `{"model":"smol","prompt":"x","stream":true}`, "text/event-stream", "w1"},
	} {
		resp, body := s.do(t, "POST", "/v1/completions", tc.key, tc.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: %d %s", tc.key, tc.body, resp.StatusCode, body)
		}
		h := resp.Header
		for _, k := range []string{"Set-Cookie", "Location", "X-Engine-Secret", "X-Tl-Cascade-Step"} {
			if v := h.Values(k); len(v) > 0 {
				t.Errorf("%s %s: the engine's %s reached the client: %q", tc.key, tc.body, k, v)
			}
		}
		if got := h.Values("X-TL-Route"); strings.Join(got, ",") != tc.route {
			t.Errorf("%s %s: X-TL-Route = %q, want %q", tc.key, tc.body, got, tc.route)
		}
		if h.Get("Content-Type") != tc.ct || h.Get("Retry-After") != "7" {
			t.Errorf("%s %s: allowed headers lost: %v", tc.key, tc.body, h)
		}
	}
}

// TestClientErrorsNameNoEngine (R13.4): neither a failed attempt's error (a refused address)
// nor a broken stream's error event names an engine address or a worker id.
func TestClientErrorsNameNoEngine(t *testing.T) {
	s := newStack(t, stackOpt{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := lis.Addr().String()
	lis.Close()
	s.Beat(gwWorker("w-refused", refused, 0))
	resp, body := s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x"}`)
	if resp.StatusCode != 503 || errCode(t, body) != "no_capacity" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	_, port, _ := net.SplitHostPort(refused)
	for _, leak := range []string{"w-refused", "127.0.0.1", port, "dial"} {
		if strings.Contains(string(body), leak) {
			t.Fatalf("the client's error names %q: %s", leak, body)
		}
	}

	cut := cutEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"1a\r\ndata: {\"text\":\"The cat\"}\n\n\r\n")
	s.beat("w-cut", "big", cut)
	resp, body = s.do(t, "POST", "/v1/completions", "", `{"model":"big","prompt":"x","stream":true}`)
	events := sseEvents(t, body)
	if resp.StatusCode != 200 || len(events) != 2 || !strings.HasPrefix(events[1], "event: error") {
		t.Fatalf("%d %q", resp.StatusCode, events)
	}
	for _, leak := range []string{"w-cut", cut.addr(), "127.0.0.1", "EOF"} {
		if strings.Contains(events[1], leak) {
			t.Fatalf("the error event names %q: %s", leak, events[1])
		}
	}

	half := cutEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"choices\":")
	s.beat("w-half", "half", half)
	resp, body = s.do(t, "POST", "/v1/completions", "", `{"model":"half","prompt":"x"}`)
	if resp.StatusCode != 502 || errCode(t, body) != "upstream_error" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, leak := range []string{"w-half", half.addr(), "127.0.0.1", "EOF"} {
		if strings.Contains(string(body), leak) {
			t.Fatalf("the 502 names %q: %s", leak, body)
		}
	}
}

// TestDuplicateTopLevelKey (R13.4): a body with a repeated top-level key is 400
// invalid_request naming the key, and reaches no engine; a case variant is another key.
func TestDuplicateTopLevelKey(t *testing.T) {
	s := newStack(t, stackOpt{})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	resp, body := s.do(t, "POST", "/v1/completions", "", `{"model":"smol","model":"big","prompt":"x"}`)
	if resp.StatusCode != 400 || errCode(t, body) != "invalid_request" || !strings.Contains(string(body), `\"model\"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x","logprobs":1,"LogProbs":null}`)
	if resp.StatusCode != 200 {
		t.Fatalf("a case variant is another key: %d %s", resp.StatusCode, body)
	}
	if n := len(e.calls()); n != 1 {
		t.Fatalf("the engine got %d requests, want 1", n)
	}
}

// TestBadHeadersFaultThroughGateway (R13.4, R14.5): tlengine's --fault bad-headers sends
// Set-Cookie, X-TL-Route: spoofed and Location; none reaches the client, streamed or not, and a
// debug key sees the gateway's X-TL-Route, not the engine's.
func TestBadHeadersFaultThroughGateway(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	e, err := tlengine.Start(tlengine.Config{ID: "e1", Model: "smol", Fault: faults.Fault{Kind: faults.BadHeaders}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	s.Beat(gwWorker("w1", e.HTTPAddr, 0))
	for _, key := range []string{"sk-inference", "sk-debug"} {
		for _, body := range []string{
			`{"model":"smol","prompt":"hello","max_tokens":4,"seed":1}`,
			`{"model":"smol","prompt":"hello","max_tokens":4,"seed":1,"stream":true}`,
		} {
			resp, out := s.do(t, "POST", "/v1/completions", key, body)
			if resp.StatusCode != 200 {
				t.Fatalf("%s %s: %d %s", key, body, resp.StatusCode, out)
			}
			h := resp.Header
			if h.Get("Set-Cookie") != "" || h.Get("Location") != "" || h.Get("X-TL-Route") == "spoofed" {
				t.Fatalf("%s %s: an engine header reached the client: %v", key, body, h)
			}
			if want := map[string]string{"sk-inference": "", "sk-debug": "w1"}[key]; h.Get("X-TL-Route") != want {
				t.Fatalf("%s: X-TL-Route = %q, want %q", key, h.Get("X-TL-Route"), want)
			}
		}
	}
}

// TestErrorsEchoLittle (R13.4): an error repeats at most errs.EchoMax bytes of what the client
// sent and says how long it was, so an answer does not grow with the request: a 1 MiB model
// id, of bytes that quoting widens, was answered with all of it.
func TestErrorsEchoLittle(t *testing.T) {
	s := newStack(t, stackOpt{admission: httpapi.Admission{Enabled: true, DefaultClass: "default",
		AllowHeader: map[string]bool{"default": true, "other": false}}})
	s.beat("w1", "smol", jsonEngine(t, "w1"))
	huge := strings.Repeat(`\u0001`, 1<<18) // 1.5 MiB of JSON, 256 KiB of control bytes
	for _, c := range []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
		says                     string
	}{
		{"unknown model", "POST", "/v1/completions", `{"model":"` + huge + `","prompt":"x"}`, nil, 404, "(262144 bytes)"},
		{"unknown model, chat", "POST", "/v1/chat/completions", `{"model":"` + huge + `","messages":[{"role":"user","content":"x"}]}`, nil, 404, "(262144 bytes)"},
		{"model lookup", "GET", "/v1/models/" + strings.Repeat("m", 30000), "", nil, 404, "(30000 bytes)"},
		{"session final", "POST", "/v1/completions", `{"model":"smol","prompt":"x"}`, []string{"X-TL-Session-Final", strings.Repeat("y", 60000)}, 400, "(60000 bytes)"},
		{"class", "POST", "/v1/completions", `{"model":"smol","prompt":"x"}`, []string{"X-TL-Class", strings.Repeat("c", 60000)}, 400, "(60000 bytes)"},
	} {
		resp, body := s.do(t, c.method, c.path, "", c.body, c.hdr...)
		if resp.StatusCode != c.status || len(body) > 1024 || !strings.Contains(string(body), c.says) {
			t.Errorf("%s: %d, %d bytes: %.300s", c.name, resp.StatusCode, len(body), body)
		}
	}
}

// TestAnswersCarryTheGatewaysContentType (R20): the client's Content-Type is the gateway's
// choice — application/json, or text/event-stream for a stream — whatever the engine labelled
// its answer, and every answer says X-Content-Type-Options: nosniff. An engine answering
// text/html to a cross-site form POST would otherwise run script in the gateway's origin.
func TestAnswersCarryTheGatewaysContentType(t *testing.T) {
	s := newStack(t, stackOpt{})
	s.beat("w1", "smol", newEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8; x=<script>")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `{"choices":[{"index":0,"text":"<script>alert(1)</script>","finish_reason":"stop"}]}`)
	}))
	for _, tc := range []struct{ method, path, body, ct string }{
		{"POST", "/v1/completions", `{"model":"smol","prompt":"x"}`, "application/json"},
		{"POST", "/v1/completions", `{"model":"smol","prompt":"x","stream":true}`, "text/event-stream"},
		{"GET", "/no/such/path", "", "application/json"},
	} {
		resp, body := s.do(t, tc.method, tc.path, "", tc.body)
		if got := resp.Header.Get("Content-Type"); got != tc.ct {
			t.Errorf("%s %s: Content-Type %q, want %q (%d %s)", tc.method, tc.body, got, tc.ct, resp.StatusCode, body)
		}
		if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s %s: X-Content-Type-Options %q, want nosniff", tc.method, tc.body, got)
		}
	}
}
