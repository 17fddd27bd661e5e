package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

var testKeys = []config.Key{
	{Key: "sk-inference", Scopes: []string{"inference"}},
	{Key: "sk-debug", Scopes: []string{"inference", "debug"}},
	{Key: "sk-admin", Scopes: []string{"admin"}},
}

// TestModelRewrittenForBackend: an alias reaches the engine as the served model id, and every
// other byte of the body is exactly as the client sent it.
func TestModelRewrittenForBackend(t *testing.T) {
	s := newStack(t, stackOpt{routes: []config.Route{{
		Model: "smol", Aliases: []string{"small"}, Targets: []string{"unified"},
		Backends: []config.Backend{{Model: "smol-v3", Weight: 1}},
	}}})
	e := jsonEngine(t, "v3")
	s.beat("w1", "smol-v3", e)
	sent := "{ \"prompt\" : \"Once upon\\u0020a time\",\n  \"model\":\"small\",\"max_tokens\": 16.0,\"seed\":42,\"stream\":false, \"logit_bias\":{\"50256\":-100}, \"metadata\":{\"model\":\"keep-me\"}  }"
	resp, body := s.do(t, "POST", "/v1/completions", "", sent)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "hello from v3") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := e.calls()
	if len(got) != 1 {
		t.Fatalf("engine called %d times", len(got))
	}
	want := strings.Replace(sent, `"model":"small"`, `"model":"smol-v3"`, 1)
	if string(got[0]) != want {
		t.Fatalf("engine got\n%s\nwant\n%s", got[0], want)
	}
	// The served id itself passes through untouched.
	s.do(t, "POST", "/v1/completions", "", `{"model":"smol-v3","prompt":"x"}`)
	if got := e.calls(); string(got[1]) != `{"model":"smol-v3","prompt":"x"}` {
		t.Fatalf("served id changed: %s", got[1])
	}
}

// TestRouteHeaderOnlyForDebug: X-TL-Route names the worker only for keys with the debug scope.
func TestRouteHeaderOnlyForDebug(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	s.beat("w1", "smol", jsonEngine(t, "w1"))
	body := `{"model":"smol","prompt":"hi"}`
	resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if v, ok := resp.Header["X-Tl-Route"]; ok {
		t.Fatalf("inference key got X-TL-Route %v", v)
	}
	resp, _ = s.do(t, "POST", "/v1/completions", "sk-debug", body)
	if got := resp.Header.Get("X-TL-Route"); got != "w1" {
		t.Fatalf("debug key: X-TL-Route = %q, want w1", got)
	}
	// Streams too.
	sse := newEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	})
	s.beat("w2", "streamer", sse)
	resp, _ = s.do(t, "POST", "/v1/completions", "sk-inference", `{"model":"streamer","prompt":"hi","stream":true}`)
	if resp.Header.Get("X-TL-Route") != "" {
		t.Fatal("inference key got X-TL-Route on a stream")
	}
	resp, _ = s.do(t, "POST", "/v1/completions", "sk-debug", `{"model":"streamer","prompt":"hi","stream":true}`)
	if resp.Header.Get("X-TL-Route") != "w2" {
		t.Fatal("debug key lacks X-TL-Route on a stream")
	}
}

// TestModelsList: GET /v1/models lists route ids, aliases and worker models; an unknown id is 404.
func TestModelsList(t *testing.T) {
	s := newStack(t, stackOpt{routes: []config.Route{{Model: "smol", Aliases: []string{"small"}, Targets: []string{"unified"}}}})
	s.beat("w1", "big", jsonEngine(t, "w1"))
	resp, b := s.do(t, "GET", "/v1/models", "", "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		if m.Object != "model" {
			t.Fatalf("object = %q", m.Object)
		}
		ids = append(ids, m.ID)
	}
	if list.Object != "list" || !slices.Equal(ids, []string{"big", "small", "smol"}) {
		t.Fatalf("models = %s %v", list.Object, ids)
	}
	resp, b = s.do(t, "GET", "/v1/models/small", "", "")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"small"`) {
		t.Fatalf("GET /v1/models/small: %d %s", resp.StatusCode, b)
	}
	resp, b = s.do(t, "GET", "/v1/models/nope", "", "")
	if resp.StatusCode != 404 || errCode(t, b) != "model_not_found" {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, b)
	}
}

// TestAdminRoutesWorkersDrain: workers with the epoch; routes 428, 412, 400 for a bad cascade,
// 200 with a new ETag; the epoch reaches heartbeat acks; drain 404 and 202.
func TestAdminRoutesWorkersDrain(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys, routes: []config.Route{{Model: "smol", Targets: []string{"unified"}}}})
	e := jsonEngine(t, "w1")
	w1 := gwtest.Worker("w1", "smol", 0)
	w1.HTTPAddress, w1.BlockSize = e.addr(), 16 // R15.1: shown as block_size
	s.Beat(w1)
	s.beat("w2", "smol", e) // block size unknown: 0

	resp, b := s.do(t, "GET", "/admin/v1/workers", "sk-admin", "")
	var workers struct {
		Epoch   uint64 `json:"epoch"`
		Workers []struct {
			ID        string `json:"id"`
			Role      string `json:"role"`
			Model     string `json:"model"`
			Addresses struct {
				HTTP string `json:"http"`
			} `json:"addresses"`
			InFlight      int64  `json:"in_flight"`
			KVTotalBlocks int64  `json:"kv_total_blocks"`
			BlockSize     *int64 `json:"block_size"`
			Routable      bool   `json:"routable"`
			Draining      bool   `json:"draining"`
			LastHeartbeat string `json:"last_heartbeat"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(b, &workers); err != nil || resp.StatusCode != 200 {
		t.Fatalf("workers: %d %v %s", resp.StatusCode, err, b)
	}
	if workers.Epoch != 1 || len(workers.Workers) != 2 || workers.Workers[0].ID != "w1" ||
		!workers.Workers[0].Routable || workers.Workers[0].Role != "unified" ||
		workers.Workers[0].Addresses.HTTP != e.addr() || workers.Workers[0].KVTotalBlocks != 1024 ||
		workers.Workers[0].BlockSize == nil || *workers.Workers[0].BlockSize != 16 ||
		workers.Workers[1].BlockSize == nil || *workers.Workers[1].BlockSize != 0 ||
		workers.Workers[0].LastHeartbeat != "2026-01-01T00:00:00Z" ||
		!strings.Contains(string(b), `"ejected_until":null,"ejection_reason":""`) {
		t.Fatalf("workers = %s", b)
	}
	// Scopes: an inference key may not use the admin API; no key is 401.
	if resp, b := s.do(t, "GET", "/admin/v1/workers", "sk-inference", ""); resp.StatusCode != 403 || errCode(t, b) != "insufficient_scope" {
		t.Fatalf("inference key on admin: %d %s", resp.StatusCode, b)
	}
	if resp, b := s.do(t, "GET", "/admin/v1/workers", "", ""); resp.StatusCode != 401 || errCode(t, b) != "invalid_api_key" {
		t.Fatalf("no key on admin: %d %s", resp.StatusCode, b)
	}

	resp, b = s.do(t, "GET", "/admin/v1/routes", "sk-admin", "")
	etag := resp.Header.Get("ETag")
	if resp.StatusCode != 200 || etag != `"1"` || !strings.Contains(string(b), `"epoch":1`) {
		t.Fatalf("GET routes: %d etag %q %s", resp.StatusCode, etag, b)
	}
	newTable := `{"epoch":99,"routes":[{"model":"smol","aliases":["small"]},{"model":"auto","cascade":[{"model":"smol","accept_if":"mean_logprob > -1.0"},{"model":"big"}]}]}`
	if resp, b := s.do(t, "PUT", "/admin/v1/routes", "sk-admin", newTable); resp.StatusCode != 428 || errCode(t, b) != "if_match_required" {
		t.Fatalf("PUT without If-Match: %d %s", resp.StatusCode, b)
	}
	if resp, b := s.do(t, "PUT", "/admin/v1/routes", "sk-admin", newTable, "If-Match", `"7"`); resp.StatusCode != 412 || errCode(t, b) != "etag_mismatch" {
		t.Fatalf("PUT with a stale ETag: %d %s", resp.StatusCode, b)
	}
	for name, bad := range map[string]string{
		"empty cascade":    `{"routes":[{"model":"auto","cascade":[]}]}`,
		"bad accept_if":    `{"routes":[{"model":"auto","cascade":[{"model":"smol","accept_if":"vibes > 3"},{"model":"big"}]}]}`,
		"negative weight":  `{"routes":[{"model":"smol","backends":[{"model":"a","weight":-1}]}]}`,
		"unknown field":    `{"routes":[{"model":"smol","colour":"red"}]}`,
		"unknown top key":  `{"routes":[],"extra":1}`,
		"malformed JSON":   `{"routes":[`,
		"missing routes":   `{}`,
		"duplicate id":     `{"routes":[{"model":"smol"},{"model":"x","aliases":["smol"]}]}`,
		"trailing garbage": `{"routes":[]} []`,
	} {
		resp, b := s.do(t, "PUT", "/admin/v1/routes", "sk-admin", bad, "If-Match", etag)
		if resp.StatusCode != 400 || errCode(t, b) != "invalid_route" {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, b)
		}
	}
	// Nothing changed: still epoch 1.
	if resp, _ := s.do(t, "GET", "/admin/v1/routes", "sk-admin", ""); resp.Header.Get("ETag") != `"1"` {
		t.Fatal("a rejected PUT changed the table")
	}
	resp, b = s.do(t, "PUT", "/admin/v1/routes", "sk-admin", newTable, "If-Match", etag)
	if resp.StatusCode != 200 || resp.Header.Get("ETag") != `"2"` || !strings.Contains(string(b), `"epoch":2`) || !strings.Contains(string(b), `"auto"`) {
		t.Fatalf("PUT: %d %q %s", resp.StatusCode, resp.Header.Get("ETag"), b)
	}
	// The same ETag again is now stale.
	if resp, _ := s.do(t, "PUT", "/admin/v1/routes", "sk-admin", newTable, "If-Match", etag); resp.StatusCode != 412 {
		t.Fatalf("reused ETag: %d", resp.StatusCode)
	}
	// The new epoch reaches heartbeat acks.
	s.Eventually("ack epoch 2", func() bool {
		ack, err := s.GW.Heartbeat(gwtest.Worker("w1", "smol", 0))
		return err == nil && ack.Epoch == 2
	})

	// Drain: unknown model 404; a served model 202, its workers leave routing and their next
	// ack says drain.
	if resp, b := s.do(t, "POST", "/admin/v1/models/nope:drain", "sk-admin", ""); resp.StatusCode != 404 || errCode(t, b) != "model_not_found" {
		t.Fatalf("drain unknown: %d %s", resp.StatusCode, b)
	}
	if resp, b := s.do(t, "POST", "/admin/v1/models/smol:drain", "sk-admin", ""); resp.StatusCode != 202 {
		t.Fatalf("drain: %d %s", resp.StatusCode, b)
	}
	s.Eventually("w1 and w2 unroutable", func() bool {
		v1, _ := s.View("w1")
		v2, _ := s.View("w2")
		return !v1.Routable && !v2.Routable
	})
	ack := s.Beat(gwtest.Worker("w1", "smol", 0))
	if !ack.Drain {
		t.Fatal("heartbeat ack after drain lacks drain: true")
	}
	if resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", `{"model":"small","prompt":"x"}`); resp.StatusCode != 503 || errCode(t, b) != "no_capacity" {
		t.Fatalf("drained model: %d %s", resp.StatusCode, b)
	}
	// Undrain lifts it.
	if resp, _ := s.do(t, "POST", "/admin/v1/models/smol:undrain", "sk-admin", ""); resp.StatusCode != 202 {
		t.Fatalf("undrain: %d", resp.StatusCode)
	}
	s.Eventually("w1 routable again", func() bool { v, _ := s.View("w1"); return v.Routable })
	if ack := s.Beat(gwtest.Worker("w1", "smol", 0)); ack.Drain {
		t.Fatal("ack still says drain after undrain")
	}
}

// TestBadInput: each bad request gets a clear OpenAI-shaped error and reaches no engine.
func TestBadInput(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys, maxBody: 1024})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	cases := []struct {
		name, path, key, body string
		hdr                   []string
		status                int
		code                  string
	}{
		{"malformed JSON", "/v1/completions", "sk-inference", `{"model":"smol",`, nil, 400, "invalid_request"},
		{"not an object", "/v1/completions", "sk-inference", `[1,2]`, nil, 400, "invalid_request"},
		{"wrong type", "/v1/chat/completions", "sk-inference", `{"model":5,"messages":[]}`, nil, 400, "invalid_request"},
		{"no model", "/v1/completions", "sk-inference", `{"prompt":"x"}`, nil, 400, "invalid_request"},
		{"oversized", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, "request_too_large"},
		{"bad request id", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"x"}`, []string{"X-Request-ID", strings.Repeat("r", 129)}, 400, "invalid_request"},
		{"tab in id", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"x"}`, []string{"X-Request-ID", "abc\tdef"}, 400, "invalid_request"},
		{"non-ASCII id", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"x"}`, []string{"X-Request-ID", "naïve"}, 400, "invalid_request"},
		{"no key", "/v1/completions", "", `{"model":"smol","prompt":"x"}`, nil, 401, "invalid_api_key"},
		{"unknown key", "/v1/completions", "sk-nope", `{"model":"smol","prompt":"x"}`, nil, 401, "invalid_api_key"},
		{"admin key on /v1", "/v1/completions", "sk-admin", `{"model":"smol","prompt":"x"}`, nil, 403, "insufficient_scope"},
		{"unknown model", "/v1/completions", "sk-inference", `{"model":"gpt-9","prompt":"x"}`, nil, 404, "model_not_found"},
		{"unknown path", "/v1/images/generations", "sk-inference", `{}`, nil, 404, "not_found"},
		{"wrong method", "/v1/completions", "sk-inference", ``, []string{"X-Method", "GET"}, 405, "method_not_allowed"},
	}
	for _, c := range cases {
		method := "POST"
		hdr := c.hdr
		if len(hdr) == 2 && hdr[0] == "X-Method" {
			method, hdr = hdr[1], nil
		}
		resp, b := s.do(t, method, c.path, c.key, c.body, hdr...)
		if resp.StatusCode != c.status || errCode(t, b) != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, resp.StatusCode, b, c.status, c.code)
		}
		if id := resp.Header.Get("X-Request-ID"); id == "" || strings.ContainsAny(id, "\r\n\x01") {
			t.Errorf("%s: response X-Request-ID %q", c.name, id)
		}
	}
	if n := len(e.calls()); n != 0 {
		t.Fatalf("bad requests reached the engine %d times", n)
	}
	s.InFlight("w1", 0)
	// A valid client id is echoed.
	resp, _ := s.do(t, "POST", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"x"}`, "X-Request-ID", "client-id-1")
	if resp.StatusCode != 200 || resp.Header.Get("X-Request-ID") != "client-id-1" {
		t.Fatalf("echo: %d %q", resp.StatusCode, resp.Header.Get("X-Request-ID"))
	}
	if got := e.calls(); len(got) != 1 || !bytes.Equal(got[0], []byte(`{"model":"smol","prompt":"x"}`)) {
		t.Fatalf("engine calls %q", got)
	}
}

// TestHealthAndReadiness: /healthz always, /readyz only with a routable worker.
func TestHealthAndReadiness(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	if resp, _ := s.do(t, "GET", "/healthz", "", ""); resp.StatusCode != 200 {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
	if resp, _ := s.do(t, "GET", "/readyz", "", ""); resp.StatusCode != 503 {
		t.Fatalf("readyz with no worker: %d", resp.StatusCode)
	}
	s.beat("w1", "smol", jsonEngine(t, "w1"))
	if resp, _ := s.do(t, "GET", "/readyz", "", ""); resp.StatusCode != 200 {
		t.Fatalf("readyz with a worker: %d", resp.StatusCode)
	}
	s.do(t, "POST", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"x"}`)
	resp, b := s.do(t, "GET", "/metrics", "", "")
	for _, want := range []string{`tlgw_requests_total{code="200",endpoint="completions",model="smol",route="smol"} 1`, `tlgw_routing_decisions_total{policy="least_outstanding",reason="least_load"} 1`, `tlgw_workers{state="routable"} 1`} {
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("metrics lack %q:\n%s", want, b)
		}
	}
	s.api.SetDraining()
	if resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", `{"model":"smol","prompt":"x"}`); resp.StatusCode != 503 || errCode(t, b) != "shutting_down" {
		t.Fatalf("draining: %d %s", resp.StatusCode, b)
	}
}

// TestBodyWithoutLength: a chunked body (no Content-Length) reaches the engine byte for byte
// whatever its size, up to the limit; one byte over the limit is 413 and reaches nobody.
func TestBodyWithoutLength(t *testing.T) {
	const limit = 10000
	s := newStack(t, stackOpt{keys: testKeys, maxBody: limit})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	// The premise: the client knows no length for such a reader, so it sends the body chunked.
	if r, err := http.NewRequest("POST", s.srv.URL, io.MultiReader(strings.NewReader("x"))); err != nil || r.ContentLength != 0 {
		t.Fatalf("a request over a MultiReader carries a length (%v)", err)
	}
	send := func(body string) (*http.Response, []byte) {
		t.Helper()
		// A reader that is not a *strings.Reader hides the length: the client sends it chunked.
		return s.doBody(t, "POST", "/v1/completions", "sk-inference", io.MultiReader(strings.NewReader(body)))
	}
	var want [][]byte
	for _, n := range []int{0, 1, 4095, 4096, 4097, 8193, limit - len(`{"model":"smol","prompt":""}`)} {
		body := `{"model":"smol","prompt":"` + strings.Repeat("p", n) + `"}`
		resp, b := send(body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d bytes: %d %s", len(body), resp.StatusCode, b)
		}
		want = append(want, []byte(body))
	}
	resp, b := send(`{"model":"smol","prompt":"` + strings.Repeat("p", limit) + `"}`)
	if resp.StatusCode != 413 || errCode(t, b) != "request_too_large" {
		t.Fatalf("over the limit: %d %s", resp.StatusCode, b)
	}
	if got := e.calls(); len(got) != len(want) {
		t.Fatalf("the engine got %d bodies, want %d", len(got), len(want))
	} else {
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("body %d: %d bytes reached the engine, want %d", i, len(got[i]), len(want[i]))
			}
		}
	}
}
