package app_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestAccessLog (R24): a gateway with [access_log] writes one line per finished inference
// request to its file — a JSON answer with the client's X-Request-ID and traceparent, a stream
// with a generated id and a malformed traceparent, a request that failed over until no worker
// was left, one for a route with no worker (503) and one for an unknown model (404) — each
// field as the request ended, the key by name, and nothing of the keys' secrets, the prompt or
// the engines' addresses. The lines are all there once Shutdown returns.
func TestAccessLog(t *testing.T) {
	const usage = `"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}`
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],"+usage+"}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}],`+usage+`}`)
	}))
	defer engine.Close()
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer flaky.Close()

	logPath := filepath.Join(t.TempDir(), "access.log")
	cfg, err := config.Parse(fmt.Appendf(nil, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"

[[gateway.routes]]
model = "smol"
backends = [{ model = "smol-v3" }]

[[gateway.routes]]
model = "ghost"
backends = [{ model = "ghost-v1" }]

[[auth.keys]]
key = "sk-ops-secret"
name = "ops"
scopes = ["inference"]

[[auth.keys]]
key = "sk-app-secret"
scopes = ["inference"]

[access_log]
path = %q
`, logPath), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	shut := false
	defer func() {
		if !shut {
			_ = a.Shutdown(t.Context())
		}
	}()
	for _, w := range []struct{ id, model, url string }{{"w1", "smol-v3", engine.URL}, {"w-flaky", "flaky", flaky.URL}} {
		hb := gwtest.Worker(w.id, w.model, 0)
		hb.HTTPAddress = strings.TrimPrefix(w.url, "http://")
		if _, err := a.Gateway.Heartbeat(hb); err != nil {
			t.Fatal(err)
		}
	}
	gwtest.Eventually(t, "both workers routable", func() bool { n, _ := a.Gateway.Routable(); return n == 2 })

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	const prompt = "the prompt is private"
	send := func(key, path, body string, header map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("POST", "http://"+a.HTTPAddr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Request-ID")
	}
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	start := time.Now()
	type sent struct {
		status int
		id     string
	}
	var got [5]sent
	got[0].status, got[0].id = send("sk-ops-secret", "/v1/chat/completions",
		`{"model":"smol","messages":[{"role":"user","content":"`+prompt+`"}]}`,
		map[string]string{"X-Request-ID": `client "id" 1`, "traceparent": "00-" + trace + "-00f067aa0ba902b7-01"})
	got[1].status, got[1].id = send("sk-app-secret", "/v1/completions", `{"model":"smol","prompt":"`+prompt+`","stream":true}`,
		map[string]string{"traceparent": "00-" + strings.ToUpper(trace) + "-00f067aa0ba902b7-01"})
	got[2].status, got[2].id = send("sk-ops-secret", "/v1/completions", `{"model":"flaky","prompt":"x"}`, nil)
	got[3].status, got[3].id = send("sk-ops-secret", "/v1/completions", `{"model":"ghost","prompt":"x"}`, nil)
	got[4].status, got[4].id = send("sk-app-secret", "/v1/completions", `{"model":"nobody-serves-this","prompt":"x"}`, nil)
	end := time.Now()
	if got[0].id != `client "id" 1` {
		t.Fatalf("the gateway answered X-Request-ID %q", got[0].id)
	}
	for i, want := range []int{200, 200, 503, 503, 404} {
		if got[i].status != want {
			t.Fatalf("request %d: status %d, want %d", i, got[i].status, want)
		}
	}

	if err := a.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	shut = true
	raw, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"sk-ops-secret", "sk-app-secret", prompt, strings.TrimPrefix(engine.URL, "http://"),
		strings.TrimPrefix(flaky.URL, "http://"), "127.0.0.1"} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the access log holds %q", secret)
		}
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	if len(lines) != len(got) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(got), raw)
	}
	byID := map[string]map[string]any{}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %v: %s", err, l)
		}
		ts, err := time.Parse(time.RFC3339, m["time"].(string))
		if err != nil || !strings.HasSuffix(m["time"].(string), "Z") || len(m["time"].(string)) != len("2006-01-02T15:04:05.000Z") {
			t.Errorf("time %q is not RFC 3339 UTC with milliseconds", m["time"])
		}
		if ts.Before(start.Truncate(time.Millisecond)) || ts.After(end) {
			t.Errorf("time %v is not between %v and %v", ts, start, end)
		}
		d, ok := m["duration_ms"].(float64)
		if !ok || d <= 0 || d > float64(end.Sub(start).Milliseconds()+1) {
			t.Errorf("duration_ms %v, the requests took %v", m["duration_ms"], end.Sub(start))
		}
		if ttft, ok := m["ttft_ms"].(float64); ok && (ttft <= 0 || ttft > d) {
			t.Errorf("ttft_ms %v with duration_ms %v", ttft, d)
		}
		delete(m, "time")
		delete(m, "duration_ms")
		if _, ok := m["ttft_ms"]; ok {
			m["ttft_ms"] = "present"
		}
		byID[m["request_id"].(string)] = m
	}
	want := []map[string]any{
		{"request_id": got[0].id, "trace_id": trace, "key": "ops", "route": "smol", "model": "smol-v3", "endpoint": "chat",
			"worker": "w1", "status": 200.0, "attempts": 1.0, "ttft_ms": "present", "prompt_tokens": 5.0, "completion_tokens": 3.0,
			"stream": false, "outcome": "ok"},
		{"request_id": got[1].id, "trace_id": "", "key": "key-1", "route": "smol", "model": "smol-v3", "endpoint": "completions",
			"worker": "w1", "status": 200.0, "attempts": 1.0, "ttft_ms": "present", "prompt_tokens": 5.0, "completion_tokens": 3.0,
			"stream": true, "outcome": "ok"},
		{"request_id": got[2].id, "trace_id": "", "key": "ops", "route": "flaky", "model": "flaky", "endpoint": "completions",
			"worker": "w-flaky", "status": 503.0, "attempts": 1.0, "stream": false, "outcome": "failover_exhausted"},
		{"request_id": got[3].id, "trace_id": "", "key": "ops", "route": "ghost", "model": "ghost-v1", "endpoint": "completions",
			"worker": "", "status": 503.0, "attempts": 0.0, "stream": false, "outcome": "no_capacity"},
		{"request_id": got[4].id, "trace_id": "", "key": "key-1", "route": "unknown", "model": "unknown", "endpoint": "completions",
			"worker": "", "status": 404.0, "attempts": 0.0, "stream": false, "outcome": "model_not_found"},
	}
	for i, w := range want {
		if diff := cmp.Diff(w, byID[got[i].id], cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("request %d's line (-want +got):\n%s", i, diff)
		}
	}
	if fi, err := os.Stat(logPath); err != nil || fi.Mode().Perm()&^0o640 != 0 {
		t.Errorf("the log file: %v, %v (want mode 0640 at most)", fi.Mode(), err)
	}
}

// TestAccessLogUnopenable: a path that cannot be opened stops Start naming the key, and leaves
// nothing running (goleak in TestMain).
func TestAccessLogUnopenable(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.AccessLog.Path = filepath.Join(t.TempDir(), "missing", "access.log")
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil {
		_ = a.Shutdown(t.Context())
		t.Fatal("Start opened a log in a missing directory")
	}
	if !strings.HasPrefix(err.Error(), "access_log.path: ") {
		t.Errorf("error %q does not name access_log.path", err)
	}
}

// TestAccessLogToStdout: path "-" writes the lines to the standard output the app was given
// (cmd/tlgw gives its own), flushed by Shutdown.
func TestAccessLogToStdout(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.AccessLog.Path = "-"
	var stdout strings.Builder
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Stdout: &stdout})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Post("http://"+a.HTTPAddr+"/v1/completions", "application/json", strings.NewReader(`{"model":"nobody","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	client.CloseIdleConnections()
	if err := a.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(stdout.String()), &line); err != nil {
		t.Fatalf("stdout %q: %v", stdout.String(), err)
	}
	if line["request_id"] != resp.Header.Get("X-Request-ID") || line["status"] != 404.0 || line["key"] != "" ||
		line["outcome"] != "model_not_found" {
		t.Errorf("line %v", line)
	}
}
