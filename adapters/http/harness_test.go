package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// stack is a gateway on a fake clock behind a real HTTP listener on loopback.
type stack struct {
	*gwtest.Harness
	srv *httptest.Server
	api *httpapi.Server
	reg *prometheus.Registry
}

type stackOpt struct {
	keys    []config.Key
	routes  []config.Route
	maxBody int64
	engines request.Engines
	// R13.3
	maxInFlight               int
	bodyTimeout, writeTimeout time.Duration
	now                       func() time.Time // the rate limits' clock (R13.5)
	// admission is the HTTP surface's admission settings (the router's queue stays off);
	// served, when set, sees each exchange before its request actor does.
	admission httpapi.Admission
	served    func(*request.Exchange)
	// routerAdmission turns the router's admission queue on (and the request actors' admitted
	// picks with it).
	routerAdmission *router.AdmissionConfig
}

func newStack(t *testing.T, o stackOpt) *stack {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts := []gwtest.Option{gwtest.WithRoutes(o.routes...), gwtest.WithRouterMetrics(reg)}
	if o.routerAdmission != nil {
		opts = append(opts, gwtest.WithAdmission(o.routerAdmission))
	}
	h := gwtest.New(t, opts...)
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), MaxAttempts: 3, Admission: o.routerAdmission != nil,
		Metrics: request.NewMetrics(reg), Logger: quietLogger(), Errors: httpapi.ErrorWriter{},
		Engines: o.engines,
	}
	api := httpapi.New(httpapi.Options{
		Core: h.GW, Keys: o.keys, MaxBodyBytes: o.maxBody,
		Serve: func(x *request.Exchange) {
			if o.served != nil {
				o.served(x)
			}
			request.Spawn(h.GW.System, deps, x)
		},
		Admission:  o.admission,
		Registerer: reg, Gatherer: reg, Logger: quietLogger(),
		MaxInFlight: o.maxInFlight, BodyReadTimeout: o.bodyTimeout, ClientWriteTimeout: o.writeTimeout,
		Now: o.now,
	})
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &stack{Harness: h, srv: srv, api: api, reg: reg}
}

// do sends a request to the gateway and returns the response with its body read.
func (s *stack) do(t *testing.T, method, path, key string, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	return s.doBody(t, method, path, key, strings.NewReader(body), hdr...)
}

// doBody is do with the body as a reader: one that is not a *strings.Reader (or another of
// the kinds whose length the client knows) goes out chunked, without a Content-Length.
func (s *stack) doBody(t *testing.T, method, path, key string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, s.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// errCode extracts error.code from an OpenAI-shaped error body.
func errCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body (%v): %s", err, body)
	}
	return e.Error.Code
}

// engine is a stand-in engine: it records every request body and answers with the handler.
type engine struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newEngine(t *testing.T, h func(w http.ResponseWriter, r *http.Request, body []byte)) *engine {
	t.Helper()
	e := &engine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.bodies = append(e.bodies, body)
		e.mu.Unlock()
		h(w, r, body)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *engine) calls() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][]byte(nil), e.bodies...)
}

// jsonEngine answers a fixed completion naming the engine.
func jsonEngine(t *testing.T, name string) *engine {
	return newEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hello from %s","finish_reason":"stop"}]}`, name)
	})
}

// beat registers a worker served by engine e.
func (s *stack) beat(id, model string, e *engine) {
	w := gwtest.Worker(id, model, 0)
	w.HTTPAddress = e.addr()
	s.Beat(w)
}

// sseEvents reads an SSE body into its events (the lines of each event joined by "\n").
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var events []string
	var cur []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if len(cur) > 0 {
				events = append(events, strings.Join(cur, "\n"))
				cur = nil
			}
			continue
		}
		cur = append(cur, line)
	}
	if len(cur) > 0 {
		events = append(events, strings.Join(cur, "\n"))
	}
	return events
}

func gwWorker(id, addr string, queue int64) router.WorkerInfo {
	w := gwtest.Worker(id, "smol", queue)
	w.HTTPAddress = addr
	return w
}
