package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/request"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/actormetrics"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/otlptest"
)

// BenchmarkRequestActorLifecycle is the cost of the request actor itself: spawn (with the
// mailbox metrics of production), a pick round trip to the router, an answer written, stop.
// The model is unknown, so no engine is involved.
func BenchmarkRequestActorLifecycle(b *testing.B) {
	h := gwtest.New(b)
	am := actormetrics.New(prometheus.NewRegistry())
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), MaxAttempts: 3,
		Metrics: request.NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Errors: httpapi.ErrorWriter{},
	}
	opts := am.Options("request")
	body := []byte(`{"model":"unknown","prompt":"x"}`)
	req, err := oai.Parse(oai.Completions, body)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		x := request.NewExchange(context.Background(), w, "/v1/completions", oai.Completions, "id", false, body, req, time.Now())
		request.Spawn(h.GW.System, deps, x, opts...)
		<-x.Done()
		if w.Code != 404 {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// discardWriter is a ResponseWriter that keeps only the status, so the benchmark below counts
// the gateway's allocations, not a recorder's.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) Flush()                      {}

// The deadlines a real connection takes (http.ResponseController finds these methods).
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }
func (w *discardWriter) SetReadDeadline(time.Time) error  { return nil }

// cannedEngine answers every attempt at once with a fixed answer (the JSON of an 8-token
// completion, or a 64-event stream), without sockets.
type cannedEngine struct{ json, sse []byte }

func (e cannedEngine) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	body, ct := e.json, "application/json"
	if r.Header.Get("Accept") == "text/event-stream" {
		body, ct = e.sse, "text/event-stream"
	}
	var rd io.Reader = bytes.NewReader(body)
	if ct == "text/event-stream" {
		rd = &eventReader{rest: body} // a few events per read, as the pinned benchmark's engines
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {ct}},
		Body: io.NopCloser(rd), ContentLength: int64(len(body)), Request: r}, nil
}

// eventReader hands out an SSE body eventsPerRead events per Read (a 64-event stream took
// about six reads on the pinned set-up).
type eventReader struct{ rest []byte }

const eventsPerRead = 11

func (e *eventReader) Read(p []byte) (int, error) {
	if len(e.rest) == 0 {
		return 0, io.EOF
	}
	end := 0
	for k := 0; k < eventsPerRead && end < len(e.rest); k++ {
		i := bytes.Index(e.rest[end:], []byte("\n\n"))
		if i < 0 {
			end = len(e.rest)
			break
		}
		end += i + 2
	}
	n := copy(p, e.rest[:end])
	e.rest = e.rest[n:]
	return n, nil
}

// BenchmarkRoutedRequest is one routed request through the whole gateway in this process, with
// every feature of the proxy benchmark's configuration on (benchGatewayTOML), from the HTTP
// handler to the answer written, over an engine that answers at once: its allocs/op are the
// gateway's own allocations per routed request (net/http's server and client side excluded),
// its ns/op the gateway's own CPU on one goroutine at a time. json and sse run without an
// access log, json_access_log and sse_access_log with one writing to a file (R24): the
// difference is what the log adds to a request (its writer runs on another goroutine, so its
// CPU shows in ns/op only when the two goroutines contend).
func BenchmarkRoutedRequest(b *testing.B) {
	routedRequests(b, benchGatewayTOML, "")
	routedRequests(b, benchGatewayTOML+"\n[access_log]\npath = \""+filepath.Join(b.TempDir(), "access.log")+"\"\n", "_access_log")
	// R24 tracing at the default 1% to a live collector on loopback: 99 requests in 100 make
	// their request span only (unsampled), one every span of its stages.
	rcv := otlptest.Start(b)
	routedRequests(b, benchGatewayTOML+"\n[tracing]\notlp_endpoint = \""+rcv.Addr()+"\"\ninsecure = true\nsample_ratio = 0.01\n", "_tracing")
}

// routedRequests runs BenchmarkRoutedRequest's requests on a gateway configured by toml, named
// json and sse with suffix.
func routedRequests(b *testing.B, toml, suffix string) {
	cfg, err := config.Parse([]byte(toml), func(string) string { return "" })
	if err != nil {
		b.Fatal(err)
	}
	const usage = `"usage":{"prompt_tokens":100,"completion_tokens":8,"total_tokens":108}`
	var sse bytes.Buffer
	for i := 0; i < 64; i++ {
		fmt.Fprintf(&sse, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"model\":\"smol\",\"choices\":[{\"index\":0,\"text\":\" tok%d\",\"finish_reason\":null}]}\n\n", i)
	}
	sse.WriteString("data: [DONE]\n\n")
	engine := cannedEngine{
		json: []byte(`{"id":"cmpl-1","object":"text_completion","model":"smol","choices":[{"index":0,"text":" a b c d e f g h","finish_reason":"length"}],` + usage + `}`),
		sse:  sse.Bytes(),
	}
	a, err := app.Start(cfg, app.Options{Transport: engine, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = a.Shutdown(context.Background()) }()
	// The workers heartbeat every second until the benchmark ends (their deadline is 6 s).
	beat := func() {
		for i := 0; i < 2; i++ {
			if _, err := a.Gateway.Heartbeat(gwtest.Worker(fmt.Sprint("bench-", i), "smol", 0)); err != nil {
				b.Error(err)
			}
		}
	}
	beat()
	stop := make(chan struct{})
	beating := make(chan struct{})
	defer func() { close(stop); <-beating }()
	go func() {
		defer close(beating)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				beat()
			}
		}
	}()
	gwtest.Eventually(b, "workers routable", func() bool { n, _ := a.Gateway.Routable(); return n == 2 })
	prompt := "Benchmark prompt: " + strings.Repeat("tell me about routing requests across engines. ", 7)
	for _, c := range []struct {
		name, body string
	}{
		{"json" + suffix, `{"model":"bench","prompt":"` + prompt + `","max_tokens":8,"seed":1}`},
		{"sse" + suffix, `{"model":"bench","prompt":"` + prompt + `","max_tokens":64,"seed":1,"stream":true}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(c.body)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				r := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(body))
				r.Header.Set("Authorization", "Bearer sk-bench")
				r.Header.Set("Content-Type", "application/json")
				w := &discardWriter{h: http.Header{}}
				a.HTTP.ServeHTTP(w, r)
				if w.code != 200 {
					b.Fatalf("status %d", w.code)
				}
			}
		})
	}
}
