package request_test

import (
	"bytes"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgw/tlgw/sim/engine"
	"github.com/tlgw/tlgw/sim/faults"
)

// TestEndlessEventEndsInTheErrorEvent (R14.4): an engine that sends one event and then one SSE
// line that never ends: the client gets the event, then the error event after about 1 MiB of
// the line (none of which it sees), no [DONE]; the gateway closes the engine's connection and
// the worker's in-flight count is back to 0. No other worker is tried after the first byte.
func TestEndlessEventEndsInTheErrorEvent(t *testing.T) {
	r := newRig(t, rigOpt{})
	var sent atomic.Int64
	left := make(chan struct{})
	endless := r.engine(t, "a-endless", func(w http.ResponseWriter, req *http.Request, _ string) {
		defer close(left)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"text\":\"The\"}\n\ndata: "))
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		line := bytes.Repeat([]byte("x"), 16<<10)
		for req.Context().Err() == nil && sent.Load() < 64<<20 {
			if _, err := w.Write(line); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
			sent.Add(int64(len(line)))
		}
	})
	other := r.engine(t, "b-other", func(w http.ResponseWriter, _ *http.Request, _ string) {
		t.Error("a second worker was called after the first byte")
	})
	r.beat("a-endless", "smol", endless.URL, 0)
	r.beat("b-other", "smol", other.URL, 5)
	resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"hi","stream":true}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "data: {\"text\":\"The\"}\n\nevent: error\ndata: ") ||
		!strings.Contains(body, `"code":"stream_interrupted"`) || strings.Contains(body, "[DONE]") || strings.Contains(body, "xx") {
		t.Fatalf("%d %.300q", resp.StatusCode, body)
	}
	select {
	case <-left:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine's connection was not closed")
	}
	if n := sent.Load(); n < 1<<20-64<<10 || n >= 64<<20 {
		t.Fatalf("the engine sent %d bytes of the line before the gateway stopped it", n)
	}
	r.InFlight("a-endless", 0)
}

// TestTlengineEndlessEvent (R14.4, R14.5): the gateway in front of tlengine's endless-event
// fault: a stream ends in the error event, a non-streamed request in 502 once the answer passes
// 64 MiB; the engine sees its client leave and releases the request.
func TestTlengineEndlessEvent(t *testing.T) {
	r := newRig(t, rigOpt{})
	e, err := engine.Start(engine.Config{ID: "endless", Model: "smol", Fault: faults.Fault{Kind: faults.EndlessEvent}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	r.beat("endless", "smol", e.HTTPAddr, 0)
	resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"hi","stream":true}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "event: error\ndata: ") || !strings.Contains(body, `"code":"stream_interrupted"`) {
		t.Fatalf("stream: %d %.300q", resp.StatusCode, body)
	}
	resp, body = r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"hi"}`)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, `"code":"upstream_error"`) || len(body) > 1<<10 {
		t.Fatalf("JSON: %d %.300q", resp.StatusCode, body)
	}
	r.Eventually("the engine released both requests", func() bool { return e.Status().Running == 0 })
	r.InFlight("endless", 0)
}
