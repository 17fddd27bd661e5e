package request_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

var update = flag.Bool("update", false, "rewrite the golden transcripts in testdata/")

// transcript records a request's flow as readable lines: the actor's transitions, what each
// engine saw and did, calls to the engines' gRPC surfaces, and what the client got.
type transcript struct {
	mu    sync.Mutex
	lines []string
}

func (t *transcript) add(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, fmt.Sprintf(format, args...))
}

func (t *transcript) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n") + "\n"
}

// golden compares the transcript with testdata/<name>.golden (rewritten with -update).
func (t *transcript) golden(tb testing.TB, name string) {
	tb.Helper()
	path := filepath.Join("testdata", name+".golden")
	got := t.String()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			tb.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		tb.Fatalf("transcript %s differs:\n--- want\n%s--- got\n%s", name, want, got)
	}
}

// transitionHandler turns the actor's debug "request transition" records into lines.
type transitionHandler struct{ t *transcript }

func (h transitionHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h transitionHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h transitionHandler) WithGroup(string) slog.Handler            { return h }
func (h transitionHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request transition" {
		return nil
	}
	var from, to string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "from":
			from = a.Value.String()
		case "to":
			to = a.Value.String()
		}
		return true
	})
	h.t.add("actor: %s → %s", from, to)
	return nil
}

// rig is a gateway on a fake clock with request actors behind a real HTTP listener.
type rig struct {
	*gwtest.Harness
	srv     *httptest.Server
	tr      *transcript
	engines *recordingEngines
}

type rigOpt struct {
	routes  []config.Route
	keys    []config.Key
	engines request.Engines
	deps    func(d *request.Deps, h *gwtest.Harness) // adjusts the actors' Deps (timeouts, budget)
}

func newRig(t *testing.T, o rigOpt) *rig {
	t.Helper()
	opts := []gwtest.Option{gwtest.WithRoutes(config.NormalizeRoutes(o.routes)...)}
	if e, ok := o.engines.(*grpcapi.Engines); ok {
		// The connections follow registrations, as the app wires them.
		opts = append(opts, gwtest.WithRegistryHooks(func(i router.WorkerInfo) { e.Accept(i, nil) }, e.Forget))
	}
	h := gwtest.New(t, opts...)
	tr := &transcript{}
	rec := &recordingEngines{next: o.engines, t: tr}
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), Engines: rec, MaxAttempts: 3,
		Metrics: request.NewMetrics(nil), Logger: slog.New(transitionHandler{t: tr}), Errors: httpapi.ErrorWriter{},
	}
	if o.deps != nil {
		o.deps(deps, h)
	}
	api := httpapi.New(httpapi.Options{
		Core: h.GW, Keys: o.keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Serve: func(x *request.Exchange) { request.Spawn(h.GW.System, deps, x) },
	})
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &rig{Harness: h, srv: srv, tr: tr, engines: rec}
}

// post sends a request and records the client's outcome.
func (r *rig) post(t *testing.T, path, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", r.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	out := string(b)
	if err != nil {
		out += fmt.Sprintf("<read error: %v>", err)
	}
	return resp, out
}

// engine is a stand-in engine named name, recording into the transcript.
func (r *rig) engine(t *testing.T, name string, h func(w http.ResponseWriter, req *http.Request, body string)) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		h(w, req, string(b))
	}))
	t.Cleanup(s.Close)
	return s
}

// beat registers a unified worker at addr.
func (r *rig) beat(id, model, addr string, queue int64) {
	w := gwtest.Worker(id, model, queue)
	w.HTTPAddress = strings.TrimPrefix(addr, "http://")
	r.Beat(w)
}

func (r *rig) beatRole(id, model string, role router.Role, httpAddr, grpcAddr, kvAddr string) {
	w := gwtest.Worker(id, model, 0)
	w.Role, w.HTTPAddress, w.GRPCAddress, w.KVAddress = role, httpAddr, grpcAddr, kvAddr
	r.Beat(w)
}

// recordingEngines wraps the engines' gRPC client and records each call.
type recordingEngines struct {
	next      request.Engines
	t         *transcript
	mu        sync.Mutex
	prefills  []request.PrefillCall
	handles   []string
	releases  []string
	prefillAt []request.Endpoint // where each Prefill went
	kvAt      []request.Endpoint // where each Release went
}

func (e *recordingEngines) Prefill(ctx context.Context, at request.Endpoint, c request.PrefillCall) (request.PrefillResult, error) {
	e.mu.Lock()
	e.prefills = append(e.prefills, c)
	e.prefillAt = append(e.prefillAt, at)
	e.mu.Unlock()
	res, err := e.next.Prefill(ctx, at, c)
	if err != nil {
		e.t.add("grpc: Prefill(%d prompt ids) failed", len(c.PromptIDs))
		return res, err
	}
	e.mu.Lock()
	e.handles = append(e.handles, res.HandleID)
	e.mu.Unlock()
	e.t.add("grpc: Prefill(%d prompt ids) → handle of %d tokens, first token", len(c.PromptIDs), res.NumTokens)
	return res, nil
}

func (e *recordingEngines) Release(ctx context.Context, at request.Endpoint, handle string) error {
	e.mu.Lock()
	e.releases = append(e.releases, handle)
	e.kvAt = append(e.kvAt, at)
	e.mu.Unlock()
	e.t.add("grpc: Release(the prefill's handle)")
	return e.next.Release(ctx, at, handle)
}
