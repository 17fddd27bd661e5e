package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/otlptest"
)

// engineTraceparent is one entry of tlengine's GET /tlengine/traceparents.
type engineTraceparent struct {
	Traceparent string `json:"traceparent"`
	Path        string `json:"path"`
	RequestID   string `json:"request_id"`
}

// engineTraceparents is what engine base received, oldest first.
func engineTraceparents(t *testing.T, base string) []engineTraceparent {
	t.Helper()
	resp, err := http.Get(base + "/tlengine/traceparents")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Traceparents []engineTraceparent `json:"traceparents"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Traceparents
}

// spansOf is the spans of trace id, by name.
func spansOf(spans []*otlptest.Span, id string) map[string][]*otlptest.Span {
	out := map[string][]*otlptest.Span{}
	for _, s := range spans {
		if s.TraceIDHex() == id {
			out[s.Name] = append(out[s.Name], s)
		}
	}
	return out
}

// TestTracingOverOTLP (R24): the gateway and its engines export to a real OTLP/gRPC receiver.
// A request with the client's sampled traceparent (the gateway samples 0% of its own) yields
// tlgw.request under the client's span; one that fails over shows two tlgw.attempt spans, and
// each engine received a traceparent whose parent is its own attempt span (and made its span
// under it); an unsampled client trace and a request without one export nothing; the access
// log's line for the request names the same trace.
func TestTracingOverOTLP(t *testing.T) {
	rcv := otlptest.Start(t)
	logPath := filepath.Join(t.TempDir(), "access.log")
	f := startFleetWithKey(t, "sk-ops", fastHeartbeats+`
route_policy = "round_robin"

[[auth.keys]]
key = "sk-ops"
name = "ops"
scopes = ["inference", "admin", "debug"]

[tracing]
otlp_endpoint = "`+rcv.Addr()+`"
insecure = true
sample_ratio = 0

[access_log]
path = "`+logPath+`"
`,
		[]string{"t-bad", "--model", "smol", "--fault", "503", "--otlp-endpoint", rcv.Addr()},
		[]string{"t-ok", "--model", "smol", "--otlp-endpoint", rcv.Addr()})
	hc := &http.Client{Timeout: 10 * time.Second}
	send := func(id, traceparent string) *http.Response {
		req, _ := http.NewRequest("POST", f.base+"/v1/completions",
			strings.NewReader(`{"model":"smol","prompt":"trace me","max_tokens":4}`))
		req.Header.Set("Authorization", "Bearer sk-ops")
		req.Header.Set("X-Request-ID", id)
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-TL-Route") != "t-ok" {
			t.Fatalf("%s: %d from %q", id, resp.StatusCode, resp.Header.Get("X-TL-Route"))
		}
		return resp
	}
	const clientSpan = "00f067aa0ba902b7"
	// Round robin alternates the two engines: within a few requests one goes to t-bad first
	// and fails over to t-ok.
	var traceID, reqID string
	sampled := 0
	for i := 0; i < 6 && traceID == ""; i++ {
		id := fmt.Sprintf("%032x", 0xa11ce0000+i)
		before := metricSum(t, f.base, "tlgw_failovers_total")
		send(fmt.Sprintf("trace-%d", i), "00-"+id+"-"+clientSpan+"-01")
		sampled++
		if metricSum(t, f.base, "tlgw_failovers_total") > before {
			traceID, reqID = id, fmt.Sprintf("trace-%d", i)
		}
	}
	if traceID == "" {
		t.Fatal("no request failed over in 6")
	}
	// Sampling: the client's unsampled flag is followed, and at ratio 0 the gateway starts no
	// sampled trace of its own.
	unsampled := fmt.Sprintf("%032x", 0xb0b)
	send("unsampled", "00-"+unsampled+"-"+clientSpan+"-00")
	send("no-trace", "")

	var byName map[string][]*otlptest.Span
	rcv.WaitFor(t, func(spans []*otlptest.Span) bool {
		byName = spansOf(spans, traceID)
		return len(byName["tlgw.request"]) == 1 && len(byName["tlgw.attempt"]) == 2 && len(byName["tlgw.relay"]) == 1 &&
			len(byName["tlengine.request"]) == 2
	}, 20*time.Second)
	req := byName["tlgw.request"][0]
	if req.ParentSpanIDHex() != clientSpan {
		t.Fatalf("tlgw.request's parent %s, want the client's span %s", req.ParentSpanIDHex(), clientSpan)
	}
	if got, _ := req.Attr("tlgw.request_id"); got != reqID {
		t.Fatalf("tlgw.request's request id %q, want %q", got, reqID)
	}
	if got, _ := req.Attr("tlgw.attempts"); got != "2" {
		t.Fatalf("tlgw.request says %s attempts", got)
	}
	attempts := map[string]*otlptest.Span{} // by worker
	for _, a := range byName["tlgw.attempt"] {
		if a.ParentSpanIDHex() != req.SpanIDHex() {
			t.Fatalf("an attempt's parent is %s, not tlgw.request", a.ParentSpanIDHex())
		}
		w, _ := a.Attr("tlgw.worker")
		attempts[w] = a
	}
	if attempts["t-bad"] == nil || attempts["t-ok"] == nil {
		t.Fatalf("attempt spans on %v, want t-bad and t-ok", attempts)
	}
	if o, _ := attempts["t-bad"].Attr("tlgw.outcome"); o != "failover" {
		t.Fatalf("t-bad's attempt outcome %q", o)
	}
	// Each engine got a traceparent whose parent is its attempt, and made its span under it.
	for w, a := range attempts {
		want := "00-" + traceID + "-" + a.SpanIDHex() + "-01"
		found := false
		for _, tp := range engineTraceparents(t, "http://"+f.engines[w].HTTPAddr) {
			if tp.RequestID == reqID {
				found = true
				if tp.Traceparent != want || tp.Path != "/v1/completions" {
					t.Fatalf("%s received %+v, want traceparent %s", w, tp, want)
				}
			}
		}
		if !found {
			t.Fatalf("%s received no traceparent for %s", w, reqID)
		}
		engineSpan := false
		for _, e := range byName["tlengine.request"] {
			engineSpan = engineSpan || e.ParentSpanIDHex() == a.SpanIDHex()
		}
		if !engineSpan {
			t.Fatalf("no tlengine.request span under %s's attempt", w)
		}
	}
	// The unsampled requests: the engine still got their trace (flagged 00), nobody exported
	// a span of it, and the gateway exported no request span beyond the sampled ones.
	gotUnsampled := false
	for _, tp := range engineTraceparents(t, "http://"+f.engines["t-ok"].HTTPAddr) {
		if tp.RequestID == "unsampled" {
			gotUnsampled = strings.HasPrefix(tp.Traceparent, "00-"+unsampled+"-") && strings.HasSuffix(tp.Traceparent, "-00")
		}
	}
	if !gotUnsampled {
		t.Fatal("the engine did not get the unsampled request's trace, flagged unsampled")
	}
	spans := rcv.WaitFor(t, func(spans []*otlptest.Span) bool {
		n := 0
		for _, s := range spans {
			if s.Name == "tlgw.request" {
				n++
			}
		}
		return n == sampled
	}, 10*time.Second)
	if n := len(spansOf(spans, unsampled)); n != 0 {
		t.Fatalf("%d spans of the unsampled trace exported", n)
	}
	// The access log names the same trace for the request.
	eventually(t, "the access log's line for "+reqID, 5*time.Second, func() bool {
		return accessTraceID(t, logPath, reqID) != ""
	})
	if got := accessTraceID(t, logPath, reqID); got != traceID {
		t.Fatalf("the access log says trace %q for %s, the spans are in %s", got, reqID, traceID)
	}
	if n := metricSum(t, f.base, "tlgw_trace_spans_dropped_total"); n != 0 {
		t.Fatalf("%v spans dropped", n)
	}
}

// accessTraceID is the trace_id of the access log's line for request id ("": no line yet).
func accessTraceID(t *testing.T, path, id string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return ""
		}
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var line struct {
			RequestID string `json:"request_id"`
			TraceID   string `json:"trace_id"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.RequestID == id {
			return line.TraceID
		}
	}
	return ""
}

// TestTracingDisaggregated (R24): a disaggregated request's control calls carry their stage's
// trace context over processes: the prefill engine received tokenize (HTTP header) and the
// EngineControl Prefill call (gRPC metadata) with tlgw.prefill as their parent, and the decode
// engine the completion with the attempt as its parent.
func TestTracingDisaggregated(t *testing.T) {
	rcv := otlptest.Start(t)
	f := startFleet(t, pdConfig+`
[tracing]
otlp_endpoint = "`+rcv.Addr()+`"
insecure = true
sample_ratio = 1
`,
		[]string{"p", "--model", "smol", "--role", "prefill"},
		[]string{"d", "--model", "smol", "--role", "decode"})
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	req, _ := http.NewRequest("POST", f.base+"/v1/completions",
		strings.NewReader(`{"model":"smol","prompt":"split me","max_tokens":4,"seed":3}`))
	req.Header.Set("X-Request-ID", "pd-traced")
	req.Header.Set("traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var byName map[string][]*otlptest.Span
	rcv.WaitFor(t, func(spans []*otlptest.Span) bool {
		byName = spansOf(spans, traceID)
		return len(byName["tlgw.request"]) == 1 && len(byName["tlgw.prefill"]) == 1 && len(byName["tlgw.attempt"]) == 1
	}, 20*time.Second)
	pre, att := byName["tlgw.prefill"][0], byName["tlgw.attempt"][0]
	if w, _ := pre.Attr("tlgw.worker"); w != "p" {
		t.Fatalf("tlgw.prefill on %q", w)
	}
	parentIs := func(s *otlptest.Span) string { return "00-" + traceID + "-" + s.SpanIDHex() + "-01" }
	got := map[string]string{} // path → traceparent, for this request
	for _, e := range []string{"p", "d"} {
		for _, tp := range engineTraceparents(t, "http://"+f.engines[e].HTTPAddr) {
			if strings.HasPrefix(tp.Traceparent, "00-"+traceID+"-") {
				got[e+" "+tp.Path] = tp.Traceparent
			}
		}
	}
	want := map[string]string{
		"p /v1/tokenize":                        parentIs(pre),
		"p /tl.engine.v1.EngineControl/Prefill": parentIs(pre),
		"d /v1/completions":                     parentIs(att),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s received %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}
