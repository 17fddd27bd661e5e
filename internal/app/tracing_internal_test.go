package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/otlptest"
	"github.com/tlgw/tlgw/internal/tracing"
)

// TestTracing (R24): a gateway with [tracing] gives its request actors the provider's tracer;
// a span made with it while the gateway runs reaches the collector (a loopback OTLP
// receiver) by Shutdown, under service.name tlgw and the client's trace, with the configured
// headers; the app's registry counts it; nothing is left running (goleak in TestMain).
func TestTracing(t *testing.T) {
	rcv := otlptest.Start(t)
	cfg, err := config.Parse([]byte(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"

[tracing]
otlp_endpoint = "`+rcv.Addr()+`"
insecure = true
sample_ratio = 1
headers_env = { authorization = "TLGW_TEST_OTLP_AUTH" }
`), func(v string) string {
		if v == "TLGW_TEST_OTLP_AUTH" {
			return "Bearer test-token"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := Start(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	shut := false
	defer func() {
		if !shut {
			_ = a.Shutdown(context.Background())
		}
	}()
	tr := a.reqDeps.Tracer
	if tr == nil {
		t.Fatal("the request actors have no tracer")
	}
	// A request through the gateway while it traces (a model nobody serves: its actor runs
	// and ends at once).
	req, err := http.NewRequest("POST", "http://"+a.HTTPAddr+"/v1/completions", strings.NewReader(`{"model":"nobody","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	client.CloseIdleConnections()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d", resp.StatusCode)
	}

	ctx := tracing.Extract(context.Background(), http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
	_, span := tr.Start(ctx, "probe")
	span.End()

	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	shut = true
	var probe *otlptest.Span
	for _, s := range rcv.Spans() {
		if s.Name == "probe" {
			probe = s
		}
	}
	if probe == nil {
		t.Fatalf("no probe span among %q", otlptest.Names(rcv.Spans()))
	}
	// The request's own span: in the client's trace, under its span, saying how it ended.
	var reqSpan *otlptest.Span
	for _, s := range rcv.Spans() {
		if s.Name == "tlgw.request" {
			reqSpan = s
		}
	}
	if reqSpan == nil {
		t.Fatalf("no tlgw.request span among %q", otlptest.Names(rcv.Spans()))
	}
	if reqSpan.TraceIDHex() != "4bf92f3577b34da6a3ce929d0e0e4736" || reqSpan.ParentSpanIDHex() != "00f067aa0ba902b7" {
		t.Errorf("tlgw.request in trace %s under %s", reqSpan.TraceIDHex(), reqSpan.ParentSpanIDHex())
	}
	if got, _ := reqSpan.Attr("tlgw.outcome"); got != "model_not_found" {
		t.Errorf("tlgw.request outcome %q", got)
	}
	if probe.TraceIDHex() != "0af7651916cd43dd8448eb211c80319c" || probe.ParentSpanIDHex() != "b7ad6b7169203331" {
		t.Errorf("probe trace %s parent %s", probe.TraceIDHex(), probe.ParentSpanIDHex())
	}
	if got := probe.ResourceAttr("service.name"); got != "tlgw" {
		t.Errorf("service.name %q", got)
	}
	if got := rcv.Headers().Get("authorization"); len(got) != 1 || got[0] != "Bearer test-token" {
		t.Errorf("authorization %q", got)
	}
	n, err := testutil.GatherAndCount(a.Registry, "tlgw_trace_spans_exported_total", "tlgw_trace_spans_dropped_total")
	if err != nil || n != 3 {
		t.Fatalf("%d trace series in the app's registry (%v)", n, err)
	}
	if got := gathered(t, a, "tlgw_trace_spans_exported_total"); got != float64(len(rcv.Spans())) {
		t.Errorf("exported %v, the receiver holds %d", got, len(rcv.Spans()))
	}
}

// gathered is the value of the app registry's one counter named name.
func gathered(t *testing.T, a *App, name string) float64 {
	t.Helper()
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// TestTracingOff: without [tracing] the request actors have no tracer and the registry no
// trace series.
func TestTracingOff(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	a, err := Start(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	if a.reqDeps.Tracer != nil || a.tracing != nil {
		t.Fatal("tracing is on without [tracing]")
	}
	if n, err := testutil.GatherAndCount(a.Registry, "tlgw_trace_spans_exported_total"); err != nil || n != 0 {
		t.Fatalf("%d trace series (%v)", n, err)
	}
}

// TestTracingFailedStart: a start that fails after tracing began (its HTTP port taken) shuts
// tracing down with the rest — nothing is left running (goleak in TestMain); a tracing
// configuration the provider refuses stops the start naming tracing.
func TestTracingFailedStart(t *testing.T) {
	rcv := otlptest.Start(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = taken.Addr().String(), "127.0.0.1:0"
	cfg.Tracing = config.Tracing{OTLPEndpoint: rcv.Addr(), Insecure: true, SampleRatio: 1}
	if a, err := Start(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err == nil {
		_ = a.Shutdown(context.Background())
		t.Fatal("Start bound a taken port")
	}

	cfg.Gateway.HTTPListen = "127.0.0.1:0"
	cfg.Tracing.SampleRatio = 2 // built in code: Parse would refuse it
	a, err := Start(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil {
		_ = a.Shutdown(context.Background())
		t.Fatal("Start took sample ratio 2")
	}
	if !strings.HasPrefix(err.Error(), "tracing: ") {
		t.Errorf("error %q does not name tracing", err)
	}
}
