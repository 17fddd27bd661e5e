package request

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
)

// TestPDFailoverDecisions (R22): a vLLM decode's first failure before its first byte keeps the
// params and asks for a decode worker alone; its second redoes the prefill; a prefill's
// failure redoes it too; each is counted by protocol and phase, fixed label values only.
func TestPDFailoverDecisions(t *testing.T) {
	m := NewMetrics(nil)
	pre, dec := actor.NewPID("local", "p"), actor.NewPID("local", "d")
	r := &requestActor{d: &Deps{Metrics: m}, kvParams: []byte(`{"remote_block_ids":[1]}`),
		picked: &router.Picked{Worker: dec, PDProtocol: "vllm", Prefill: &router.PickedWorker{Worker: pre}}}
	r.pdFailover(dec)
	if !r.decodeOnly || !r.decodeRetried || r.kvParams == nil {
		t.Fatalf("after the first decode failure: only %v retried %v params %s", r.decodeOnly, r.decodeRetried, r.kvParams)
	}
	r.decodeOnly = false // the decode-only pick was answered
	r.picked = &router.Picked{Worker: dec, PDProtocol: "vllm"}
	r.pdFailover(dec)
	if r.decodeOnly || r.decodeRetried || r.kvParams != nil {
		t.Fatalf("after the second: only %v retried %v params %s", r.decodeOnly, r.decodeRetried, r.kvParams)
	}
	r.picked = &router.Picked{Worker: dec, PDProtocol: "sglang", Prefill: &router.PickedWorker{Worker: pre}}
	r.pdFailover(pre)
	r.picked = &router.Picked{Worker: dec} // unified: nothing counted
	r.pdFailover(dec)
	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.pdFailures.WithLabelValues("vllm", "decode")), 2, "vllm decode failures"},
		{testutil.ToFloat64(m.pdFailures.WithLabelValues("sglang", "prefill")), 1, "sglang prefill failures"},
		{testutil.ToFloat64(m.pdRetries.WithLabelValues("vllm", "same_params")), 1, "vllm same-params retries"},
		{testutil.ToFloat64(m.pdRetries.WithLabelValues("vllm", "new_prefill")), 1, "vllm new prefills"},
		{testutil.ToFloat64(m.pdRetries.WithLabelValues("sglang", "new_prefill")), 1, "sglang new rooms"},
		{float64(testutil.CollectAndCount(m.pdFailures)), 2, "failure series"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if pdLabel("client-said") != UnknownLabel {
		t.Error("a protocol label outside the configuration's names")
	}
}

// TestKVTransferParams (R22): the kv_transfer_params object of a prefill answer is taken
// verbatim and as a copy, up to maxKVParams bytes; an answer that is not JSON, has none, or has
// one that is no object or is over the bound is refused, saying which.
func TestKVTransferParams(t *testing.T) {
	// object is a kv_transfer_params object of exactly n bytes.
	object := func(n int) string { return `{"pad":"` + strings.Repeat("x", n-len(`{"pad":""}`)) + `"}` }
	atBound, overBound := object(maxKVParams), object(maxKVParams+1)
	for _, c := range []struct {
		answer, want, err string
	}{
		{`{"choices":[],"kv_transfer_params":{"remote_block_ids":[1,2]}}`, `{"remote_block_ids":[1,2]}`, ""},
		{"{\"kv_transfer_params\": \n {\"a\":1} \t}", `{"a":1}`, ""},
		{`{"kv_transfer_params":` + atBound + `}`, atBound, ""},
		{`{"kv_transfer_params":` + overBound + `}`, "", "is over 262144 bytes"},
		{`{"kv_transfer_params":{}`, "", "is not JSON"},
		{`{"choices":[{"kv_transfer_params":{}}]}`, "", "has no kv_transfer_params"},
		{`{"kv_transfer_params":[1,2]}`, "", "is not an object"},
		{`{"kv_transfer_params":"{}"}`, "", "is not an object"},
		{`{"kv_transfer_params":null}`, "", "is not an object"},
		{`{"kv_transfer_params":7}`, "", "is not an object"},
	} {
		answer := []byte(c.answer)
		got, err := kvTransferParams(answer)
		name := c.answer[:min(len(c.answer), 60)]
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || got != nil {
				t.Errorf("%s: %.40s, %v; want an error saying %q", name, got, err, c.err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %.60s, %v; want %.60s", name, got, err, c.want)
			continue
		}
		clear(answer) // the answer's buffer goes back; the params stay
		if string(got) != c.want {
			t.Errorf("%s: the params share the answer's bytes", name)
		}
	}
}

// answerOf is an engine answer of status with body (length: its Content-Length, -1 unknown).
func answerOf(status int, contentType string, body io.Reader, length int64) *http.Response {
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {contentType}},
		Body: io.NopCloser(body), ContentLength: length}
}

// brokenReader gives n bytes of '{' and then fails.
type brokenReader struct{ n int }

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, errors.New("connection reset")
	}
	k := min(len(p), b.n)
	for i := range p[:k] {
		p[i] = '{'
	}
	b.n -= k
	return k, nil
}

// TestVLLMPrefillCall (R22, ENGINES.md §2): call 1 is a POST of the body with the request's id;
// a 200 gives its params; another status gives the engine's status, headers and body; an answer
// over maxPrefillAnswer bytes (announced or not), a broken one, or a 200 without usable params
// is a failure, as is the round trip's own.
func TestVLLMPrefillCall(t *testing.T) {
	good := `{"choices":[{"text":"x"}],"kv_transfer_params":{"remote_block_ids":[4]}}`
	// padded is a good answer of exactly n bytes.
	padded := func(n int) string {
		head := `{"kv_transfer_params":{"remote_block_ids":[4]},"pad":"`
		return head + strings.Repeat("x", n-len(head)-2) + `"}`
	}
	for _, c := range []struct {
		name         string
		resp         func() *http.Response
		roundTripErr error
		status       int
		params, body string
		err          string
	}{
		{name: "200", resp: func() *http.Response {
			return answerOf(200, "application/json", strings.NewReader(good), int64(len(good)))
		},
			status: 200, params: `{"remote_block_ids":[4]}`},
		{name: "200 at the bound", resp: func() *http.Response {
			return answerOf(200, "application/json", strings.NewReader(padded(maxPrefillAnswer)), -1)
		}, status: 200, params: `{"remote_block_ids":[4]}`},
		{name: "one past the bound, unannounced", resp: func() *http.Response {
			return answerOf(200, "application/json", strings.NewReader(padded(maxPrefillAnswer+1)), -1)
		}, err: "the prefill answer is over 4194304 bytes"},
		{name: "one past the bound, announced", resp: func() *http.Response {
			return answerOf(200, "application/json", strings.NewReader(padded(maxPrefillAnswer+1)), maxPrefillAnswer+1)
		}, err: "the prefill answer is over 4194304 bytes"},
		{name: "broken", resp: func() *http.Response { return answerOf(200, "application/json", &brokenReader{n: 100}, -1) },
			err: "the prefill answer: connection reset"},
		{name: "no params", resp: func() *http.Response {
			return answerOf(200, "application/json", strings.NewReader(`{"choices":[]}`), -1)
		}, err: "has no kv_transfer_params"},
		{name: "503", resp: func() *http.Response {
			return answerOf(503, "application/json", strings.NewReader(`{"error":"busy"}`), -1)
		}, status: 503, body: `{"error":"busy"}`},
		{name: "round trip", roundTripErr: errors.New("connection refused"), err: "connection refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got *http.Request
			tr := upstreamFunc(func(req *http.Request) (*http.Response, error) {
				got = req
				if c.roundTripErr != nil {
					return nil, c.roundTripErr
				}
				return c.resp(), nil
			})
			res := vllmPrefillCall(context.Background(), tr, "http://p:8000/v1/completions", "req-1", []byte(`{"max_tokens":1}`), traceHeader{})
			if got == nil || got.Method != http.MethodPost || got.URL.String() != "http://p:8000/v1/completions" ||
				got.Header.Get("X-Request-Id") != "req-1" || got.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("the call: %+v", got)
			}
			if c.err != "" {
				if res.err == nil || !strings.Contains(res.err.Error(), c.err) || res.params != nil {
					t.Fatalf("got %+v; want an error saying %q", res, c.err)
				}
				return
			}
			if res.err != nil || res.status != c.status || string(res.params) != c.params || string(res.body) != c.body {
				t.Fatalf("got status %d params %s body %s err %v", res.status, res.params, res.body, res.err)
			}
			if c.status != 200 && res.header.Get("Content-Type") != "application/json" {
				t.Fatalf("the engine's headers: %v", res.header)
			}
		})
	}
}

// TestPDCommittedObservesDecode (R22): a disaggregated request's decode phase is observed
// under its protocol when the decode answer is committed; a unified request observes none.
func TestPDCommittedObservesDecode(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	dec := actor.NewPID("local", "d")
	r := &requestActor{d: &Deps{Metrics: m}, picked: &router.Picked{Worker: dec}}
	r.pdCommitted(nil)                                                // unified: nothing observed, nothing released (no actor context needed)
	r.picked = &router.Picked{Worker: dec, PDProtocol: config.PDVLLM} // its prefill worker is released already
	r.pdCommitted(nil)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		if f.GetName() != "tlgw_pd_phase_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := ""
			for _, l := range s.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + " "
			}
			got = append(got, fmt.Sprintf("%s%d", labels, s.GetHistogram().GetSampleCount()))
		}
	}
	if want := []string{"phase=decode_first_byte protocol=vllm 1"}; !slices.Equal(got, want) {
		t.Fatalf("phase series %q, want %q", got, want)
	}
}

// heldBody gives its bytes, then blocks until ctx is done (an engine's stream still open).
type heldBody struct {
	ctx  context.Context
	rest *strings.Reader
}

func (b *heldBody) Read(p []byte) (int, error) {
	if b.rest.Len() > 0 {
		return b.rest.Read(p)
	}
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

// TestSGLangPair (R22, ENGINES.md §3, R6): an SGLang attempt's two calls, with stand-in
// engines, in a synctest bubble so that "the prefill's goroutine is done" is a plain wait. The
// decode's answer is the attempt's (a stream's first event read ahead) unless the prefill
// fails first, which abandons both; once the decode's first byte is in, the prefill's failure
// no longer touches it.
func TestSGLangPair(t *testing.T) {
	const event = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
	type leg func(req *http.Request) (*http.Response, error)
	sse := func(body string) leg {
		return func(req *http.Request) (*http.Response, error) {
			return answerOf(200, "text/event-stream", &heldBody{ctx: req.Context(), rest: strings.NewReader(body)}, -1), nil
		}
	}
	status := func(code int, contentType string) leg {
		return func(*http.Request) (*http.Response, error) {
			return answerOf(code, contentType, strings.NewReader(`{"choices":[]}`), -1), nil
		}
	}
	decodeDown := errors.New("decode: connection refused")
	for _, c := range []struct {
		name    string
		stream  bool
		decode  leg
		prefill leg // nil: answers 200 at once
		// want is the result: "event", "event error", "answer <status>", "decode error", "prefill error"
		want string
	}{
		{name: "stream", stream: true, decode: sse(event), want: "event"},
		{name: "stream ends before its first event", stream: true, decode: func(*http.Request) (*http.Response, error) {
			return answerOf(200, "text/event-stream", strings.NewReader("data: {"), -1), nil
		}, want: "event error"},
		{name: "stream answered 503", stream: true, decode: status(503, "application/json"), want: "answer 503"},
		{name: "stream answered JSON", stream: true, decode: status(200, "application/json"), want: "answer 200"},
		{name: "JSON", decode: status(200, "application/json"), want: "answer 200"},
		{name: "JSON answered as a stream", decode: sse(event), want: "answer 200"},
		{name: "decode fails", decode: func(*http.Request) (*http.Response, error) { return nil, decodeDown }, want: "decode error"},
		{name: "prefill fails first", stream: true, decode: func(req *http.Request) (*http.Response, error) {
			<-req.Context().Done() // it waits for its room's KV until the pair is abandoned
			return nil, context.Cause(req.Context())
		}, prefill: status(500, "application/json"), want: "prefill error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				prefill := c.prefill
				if prefill == nil {
					prefill = status(200, "application/json")
				}
				var prefillCalls, decodeCalls int // each written by its own leg once, read after synctest.Wait
				sp := sglangPair{tr: upstreamFunc(func(req *http.Request) (*http.Response, error) {
					if req.URL.Host == "p:30000" {
						prefillCalls++
						return prefill(req)
					}
					decodeCalls++
					return c.decode(req)
				}), decodeURL: "http://d:30000/v1/completions", prefillURL: "http://p:30000/v1/completions",
					body: []byte(`{"bootstrap_room":1}`), id: "req-1", stream: c.stream,
					clk: clock.NewFake(time.Unix(0, 0)), prefillTimeout: time.Second}
				res := sp.run(ctx, 7)
				var got string
				switch m := res.(type) {
				case firstEvent:
					got = "event"
					if m.err != nil {
						got = "event error"
					} else if string(m.prefix) != event {
						t.Errorf("the first event read ahead: %q", m.prefix)
					}
					if m.gen != 7 {
						t.Errorf("gen %d", m.gen)
					}
					discard(m)
				case attemptResult:
					var leg prefillLegError
					switch {
					case m.gen != 7:
						t.Errorf("gen %d", m.gen)
					case errors.As(m.err, &leg):
						got = "prefill error"
						var se statusError
						if !errors.As(m.err, &se) || se.status != 500 || m.err.Error() != "the prefill worker's call: prefill worker answered 500" {
							t.Errorf("the prefill's failure: %v", m.err)
						}
					case errors.Is(m.err, decodeDown):
						got = "decode error"
					case m.err == nil:
						got = fmt.Sprint("answer ", m.resp.StatusCode)
						m.resp.Body.Close()
					}
				}
				synctest.Wait() // the prefill's goroutine is done
				if got != c.want || prefillCalls != 1 || decodeCalls != 1 {
					t.Fatalf("got %s (%T %+v), want %s; calls: prefill %d decode %d", got, res, res, c.want, prefillCalls, decodeCalls)
				}
			})
		})
	}
}

// TestSGLangPairCommitted (R22, R6): a prefill call that fails after the decode's first event
// is in hand leaves the decode's stream open: it is the client's now.
func TestSGLangPairCommitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		fail := make(chan struct{}) // closed when the prefill call is to fail
		decodeCtx := make(chan context.Context, 1)
		sp := sglangPair{tr: upstreamFunc(func(req *http.Request) (*http.Response, error) {
			if req.URL.Host == "p:30000" {
				<-fail
				return nil, errors.New("prefill: connection reset")
			}
			decodeCtx <- req.Context()
			return answerOf(200, "text/event-stream", &heldBody{ctx: req.Context(), rest: strings.NewReader("data: {}\n\n")}, -1), nil
		}), decodeURL: "http://d:30000/v1/completions", prefillURL: "http://p:30000/v1/completions",
			body: []byte(`{}`), id: "req-1", stream: true, clk: clock.NewFake(time.Unix(0, 0)), prefillTimeout: time.Second}
		fe, ok := sp.run(ctx, 1).(firstEvent)
		if !ok || fe.err != nil {
			t.Fatalf("the decode's first event: %+v", fe)
		}
		defer discard(fe)
		close(fail)
		synctest.Wait() // the prefill's goroutine has failed and is done
		if err := context.Cause(<-decodeCtx); err != nil {
			t.Fatalf("the prefill's late failure ended the decode's stream: %v", err)
		}
	})
}
