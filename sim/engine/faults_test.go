package engine

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/faults"
)

// requestsWith is tlengine_requests_total for one endpoint and code.
func requestsWith(t *testing.T, e *Engine, endpoint, code string) float64 {
	t.Helper()
	f := scrapeFamilies(t, e)["tlengine_requests_total"]
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		if have["endpoint"] == endpoint && have["code"] == code {
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// open sends a request and returns once the response headers are in (or the request failed).
func open(ctx context.Context, e *Engine, body string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+e.HTTPAddr+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

const (
	faultBody   = `{"model":"smol","prompt":"hello there","max_tokens":8,"seed":3}`
	faultStream = `{"model":"smol","prompt":"hello there","max_tokens":8,"seed":3,"stream":true}`
)

type answer struct {
	resp *http.Response
	body string
	err  error
}

// TestFaultSlowHeaders (R14.5): slow-headers=D writes nothing of the answer until D has passed
// on the engine's clock, then serves the whole answer; a client that leaves during the wait
// stops it.
func TestFaultSlowHeaders(t *testing.T) {
	const d = 5 * time.Second
	for _, body := range []string{faultBody, faultStream} {
		fc := clock.NewFake(time.Unix(0, 0))
		e := start(t, Config{Clock: fc, Fault: faults.Fault{Kind: faults.SlowHeaders, D: d}})
		got := make(chan answer, 1)
		go func() {
			resp, err := open(context.Background(), e, body)
			if err != nil {
				got <- answer{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			got <- answer{resp: resp, body: string(b), err: err}
		}()
		gwtest.Eventually(t, "the wait before the headers", func() bool { return fc.Pending() == 1 })
		fc.Advance(d - time.Millisecond)
		if fc.Pending() != 1 {
			t.Fatal("the headers' wait ended before D")
		}
		select {
		case a := <-got:
			t.Fatalf("answered before D: %+v", a)
		default:
		}
		fc.Advance(time.Millisecond)
		var a answer
		select {
		case a = <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("no answer after D")
		}
		if a.err != nil || a.resp.StatusCode != 200 {
			t.Fatalf("%+v", a)
		}
		if strings.Contains(body, `"stream":true`) {
			if text, done := streamText(t, []byte(a.body), false); text == "" || !done {
				t.Fatalf("stream after D: %q", a.body)
			}
		} else if !strings.Contains(a.body, `"finish_reason"`) {
			t.Fatalf("answer after D: %q", a.body)
		}
	}
	t.Run("client leaves during the wait", func(t *testing.T) {
		fc := clock.NewFake(time.Unix(0, 0))
		e := start(t, Config{Clock: fc, Fault: faults.Fault{Kind: faults.SlowHeaders, D: time.Hour}})
		ctx, cancel := context.WithCancel(context.Background())
		failed := make(chan error, 1)
		go func() {
			resp, err := open(ctx, e, faultBody)
			if err == nil {
				resp.Body.Close()
			}
			failed <- err
		}()
		gwtest.Eventually(t, "the wait before the headers", func() bool { return fc.Pending() == 1 })
		cancel()
		if err := <-failed; err == nil {
			t.Fatal("answered a client that left")
		}
		gwtest.Eventually(t, "the wait stopped and counted as 499", func() bool {
			return fc.Pending() == 0 && requestsWith(t, e, "completions", "499") == 1
		})
	})
}

// TestFaultStallAfter (R14.5): stall-after=N sends N tokens and then nothing, with the
// connection kept open and the request still running (its KV held) until the client leaves;
// then everything is released. A JSON answer stalls after its headers and part of its body;
// stall-after=0 stalls a stream before its first token.
func TestFaultStallAfter(t *testing.T) {
	for _, c := range []struct {
		n      int
		body   string
		events int
	}{{3, faultStream, 3}, {0, faultStream, 0}, {3, faultBody, 0}} {
		e := start(t, Config{Fault: faults.Fault{Kind: faults.StallAfter, N: c.n}})
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := open(ctx, e, c.body)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			cancel()
			t.Fatalf("stall-after=%d: status %d", c.n, resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		for i := 0; i < c.events; i++ {
			line, err := br.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "data: {") {
				t.Fatalf("stall-after=%d: event %d: %q, %v", c.n, i, line, err)
			}
			if blank, err := br.ReadString('\n'); err != nil || blank != "\n" {
				t.Fatalf("stall-after=%d: event %d does not end: %q, %v", c.n, i, blank, err)
			}
		}
		// The answer is open: a read waits, and the request holds its place and KV.
		rest := make(chan answer, 1)
		go func() {
			b, err := io.ReadAll(br)
			rest <- answer{body: string(b), err: err}
		}()
		if st := e.Status(); st.Running != 1 || st.KVFreeBlocks == st.KVTotalBlocks {
			t.Fatalf("stall-after=%d: a stalled request does not hold its place: %+v", c.n, st)
		}
		select {
		case a := <-rest:
			t.Fatalf("stall-after=%d: the answer ended: %+v", c.n, a)
		default:
		}
		cancel()
		var a answer
		select {
		case a = <-rest:
		case <-time.After(10 * time.Second):
			t.Fatalf("stall-after=%d: the read did not end when the client left", c.n)
		}
		resp.Body.Close()
		if a.err == nil || strings.Contains(a.body, "data: ") || strings.Contains(a.body, "[DONE]") {
			t.Fatalf("stall-after=%d: after the stall the client got %q (%v)", c.n, a.body, a.err)
		}
		if c.body == faultBody && !strings.HasPrefix(a.body, `{"id":"`) {
			t.Fatalf("stall-after=%d: a JSON answer did not start: %q", c.n, a.body)
		}
		gwtest.Eventually(t, "the stalled request released", func() bool {
			st := e.Status()
			return st.Running == 0 && st.KVFreeBlocks == st.KVTotalBlocks && requestsWith(t, e, "completions", "499") == 1
		})
	}
	// A shorter answer than N finishes as usual.
	e := start(t, Config{Fault: faults.Fault{Kind: faults.StallAfter, N: 100}})
	if resp, b := post(t, e, "/v1/completions", faultStream); resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
}

// TestFaultEndlessEvent (R14.5): endless-event answers a stream with its headers and one SSE
// line that never ends (a JSON answer with a body that never ends), for as long as the client
// reads; when it leaves, the engine stops writing and releases the request.
func TestFaultEndlessEvent(t *testing.T) {
	for _, body := range []string{faultStream, faultBody} {
		e := start(t, Config{Fault: faults.Fault{Kind: faults.EndlessEvent}})
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := open(ctx, e, body)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		head := `data: {"id":"`
		if body == faultBody {
			head = `{"id":"`
		}
		const read = 3 << 20
		b, err := io.ReadAll(io.LimitReader(resp.Body, read))
		if err != nil || len(b) != read || !strings.HasPrefix(string(b), head) || strings.ContainsAny(string(b), "\r\n") {
			cancel()
			t.Fatalf("%q: %d bytes (%v), starting %.60q; want %d bytes of one line", body, len(b), err, b, read)
		}
		if st := e.Status(); st.Running != 1 {
			t.Fatalf("the endless answer is not running: %+v", st)
		}
		cancel()
		resp.Body.Close()
		gwtest.Eventually(t, "the endless answer stopped and released", func() bool {
			st := e.Status()
			return st.Running == 0 && st.KVFreeBlocks == st.KVTotalBlocks && requestsWith(t, e, "completions", "499") == 1
		})
	}
}
