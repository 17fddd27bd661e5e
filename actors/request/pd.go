package request

// The engines' own disaggregation protocols (SPEC R22, ENGINES.md §2 and §3), beside our own
// (disagg.go): a disaggregated route's pd_protocol names which one its picks use.
//
//   - vllm: RemotePrefill sends call 1 to the prefill worker (the client's body with
//     kv_transfer_params {"do_remote_decode": true}, max_tokens 1, not streamed) and takes the
//     kv_transfer_params object of its answer verbatim; Attempting sends the client's body
//     with those params to the decode worker. A decode that fails before its first byte is
//     tried once more on another decode worker with the same params (a DecodeOnly pick: the
//     prefill worker still holds the KV until its own timeout), then the prefill is redone
//     on a fresh pick. There is no release call.
//   - sglang: Attempting sends the same body, with bootstrap_host, bootstrap_port and a new
//     bootstrap_room, to both workers at once; the client gets the decode's answer and the
//     prefill's is drained and dropped. Either failing before the decode's first byte
//     abandons both, and the failover's next attempt draws a new room.
//
// Both keep R6: everything before the decode's first byte fails over; nothing after it does.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// Bounds of what the prefill worker answers.
const (
	// maxPrefillAnswer bounds a vLLM prefill answer (one token; logprobs at most) and the
	// SGLang prefill answer drained and dropped.
	maxPrefillAnswer = 4 << 20
	// maxKVParams bounds the kv_transfer_params object taken from a prefill answer, which
	// the gateway holds and sends on (a block id list of a long prompt fits many times over).
	maxKVParams = 256 << 10
)

// remotePrefilled is call 1's answer (RemotePrefill): kv_transfer_params on a 200, else the
// engine's status and body (at most maxPrefillAnswer bytes), or the failure.
type remotePrefilled struct {
	gen    int
	status int
	header http.Header
	body   []byte
	params []byte
	err    error
}

// IgnoreDeadLetterLogging: a result can outlive its (finished) actor.
func (remotePrefilled) IgnoreDeadLetterLogging() {}

// prefillLegError is the failure of an SGLang pair's prefill call before the decode's first
// byte: the prefill worker is blamed for the attempt (blame).
type prefillLegError struct{ err error }

func (e prefillLegError) Error() string { return "the prefill worker's call: " + e.err.Error() }
func (e prefillLegError) Unwrap() error { return e.err }

// vllmPrefillBody is call 1's body: the attempt's body (the served model) with
// kv_transfer_params {"do_remote_decode": true}, max_tokens 1 (chat: max_completion_tokens 1
// too), stream false, and no stream_options.
func vllmPrefillBody(b []byte, k oai.Kind) ([]byte, error) {
	var err error
	for _, f := range []struct{ key, value string }{
		{"kv_transfer_params", `{"do_remote_decode":true}`}, {"max_tokens", "1"}, {"stream", "false"},
	} {
		if b, err = oai.SetField(b, f.key, []byte(f.value)); err != nil {
			return nil, err
		}
	}
	if k == oai.Chat {
		if b, err = oai.SetField(b, "max_completion_tokens", []byte("1")); err != nil {
			return nil, err
		}
	}
	return oai.DeleteField(b, "stream_options")
}

// remotePrefill sends call 1 to the prefill worker (RemotePrefill), bounded by
// control_timeout like our own Prefill.
func (r *requestActor) remotePrefill(c actor.Context) {
	r.kvParams, r.decodeRetried = nil, false // a new prefill: the old params are gone
	body, err := r.upstreamBody()
	if err == nil {
		body, err = vllmPrefillBody(body, r.x.Kind)
	}
	if err != nil {
		r.fail(c, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest))
		return
	}
	url, id, tr := "http://"+r.picked.Prefill.HTTPAddress+r.x.Path, r.x.ID, r.d.Transport
	clk, timeout := r.clock(), r.controlTimeout()
	th := r.tr.startPrefill(r.picked)
	r.runIO(c, func(ctx context.Context, gen int) any {
		ctx, cancel := withClockTimeout(ctx, clk, timeout, errControlTimeout)
		defer cancel()
		res := vllmPrefillCall(ctx, tr, url, id, body, th)
		res.gen, res.err = gen, controlErr(ctx, res.err)
		return res
	})
}

// vllmPrefillCall is call 1's round trip and the reading of its answer.
func vllmPrefillCall(ctx context.Context, tr Upstream, url, id string, body []byte, th traceHeader) remotePrefilled {
	h := http.Header{"Content-Type": jsonContentType, "X-Request-Id": {id}}
	th.set(h)
	req, err := upstreamRequest(ctx, "", url, body, h)
	if err != nil {
		return remotePrefilled{err: err}
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return remotePrefilled{err: err}
	}
	defer resp.Body.Close()
	raw, err := readBounded(resp.Body, resp.ContentLength, maxPrefillAnswer, nil)
	if errors.Is(err, errAnswerTooLarge) {
		return remotePrefilled{err: fmt.Errorf("the prefill answer is over %d bytes", maxPrefillAnswer)}
	}
	if err != nil {
		return remotePrefilled{err: fmt.Errorf("the prefill answer: %w", err)}
	}
	if resp.StatusCode != http.StatusOK {
		return remotePrefilled{status: resp.StatusCode, header: resp.Header, body: raw}
	}
	params, err := kvTransferParams(raw)
	if err != nil {
		return remotePrefilled{err: err}
	}
	return remotePrefilled{status: resp.StatusCode, params: params}
}

// kvTransferParams takes the kv_transfer_params object of a prefill answer, verbatim (a copy:
// the answer's bytes are not kept), at most maxKVParams bytes.
func kvTransferParams(answer []byte) ([]byte, error) {
	if !json.Valid(answer) {
		return nil, errors.New("the prefill answer is not JSON")
	}
	raw, ok := oai.Field(answer, "kv_transfer_params")
	if !ok {
		return nil, errors.New("the prefill answer has no kv_transfer_params (is the engine a KV producer?)")
	}
	// Checks as ifs, not a switch's cases: go test -cover counts no case expression, so a
	// mutation tester would leave their mutants unrun (the same in this file below).
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, errors.New("the prefill answer's kv_transfer_params is not an object")
	}
	if len(raw) > maxKVParams {
		return nil, fmt.Errorf("the prefill answer's kv_transfer_params is over %d bytes", maxKVParams)
	}
	return bytes.Clone(raw), nil
}

// stepRemotePrefill takes call 1's answer: its params go to the decode (Attempting); a
// failure, a 5xx or a 429 fails over (the prefill worker blamed); another status is the
// client's answer, as the engine gave it (a 400 for a request no engine would serve).
func (r *requestActor) stepRemotePrefill(c actor.Context, msg any) {
	m, ok := msg.(remotePrefilled)
	if !ok {
		return
	}
	r.endIO()
	p := r.picked
	if m.err != nil {
		r.failover(c, fmt.Errorf("prefill worker %s: %w", p.Prefill.WorkerID, m.err))
		return
	}
	if m.status >= 500 || m.status == http.StatusTooManyRequests {
		r.failover(c, statusError{what: "prefill worker " + p.Prefill.WorkerID, status: m.status})
		return
	}
	if m.status != http.StatusOK {
		r.releaseWorker(c, p.Prefill.Worker, router.OutcomeSuccess) // it answered the request
		r.committed = true
		r.writeHeaders(m.header)
		r.x.W.Header().Set("Content-Length", strconv.Itoa(len(m.body)))
		r.x.W.WriteHeader(m.status)
		_, _ = r.x.W.Write(m.body)
		r.finish(c, m.status)
		return
	}
	r.d.Metrics.pdPhase(config.PDVLLM, pdPhasePrefill, time.Since(r.pdAt))
	r.kvParams, r.upBody = m.params, nil
	r.releaseWorker(c, p.Prefill.Worker, router.OutcomeSuccess) // the prefill worker's part is done
	r.pdAt = time.Now()
	r.become(Attempting)
	r.startAttempt(c)
}

// pdBodyKey names the protocol fields an attempt's body carries now ("" = none), for
// upstreamBody's cache: a vLLM decode's params, an SGLang attempt's room.
func (r *requestActor) pdBodyKey() string {
	p := r.picked
	if r.kvParams != nil && p.PDProtocol == config.PDVLLM {
		return "|kv"
	}
	if p.Prefill != nil && p.PDProtocol == config.PDSGLang {
		return "|room" + strconv.FormatUint(r.room, 10)
	}
	return ""
}

// pdBody adds the protocol's fields to an attempt's body b (see pdBodyKey).
func (r *requestActor) pdBody(b []byte) ([]byte, error) {
	p := r.picked
	if p.PDProtocol == config.PDVLLM {
		return oai.SetField(b, "kv_transfer_params", r.kvParams)
	}
	host, _, err := net.SplitHostPort(p.Prefill.HTTPAddress)
	if err != nil {
		return nil, fmt.Errorf("the prefill worker's address: %v", err)
	}
	hq, _ := json.Marshal(host)
	for _, f := range []struct {
		key   string
		value []byte
	}{
		{"bootstrap_host", hq},
		{"bootstrap_port", []byte(strconv.Itoa(p.Prefill.BootstrapPort))},
		{"bootstrap_room", []byte(strconv.FormatUint(r.room, 10))},
	} {
		if b, err = oai.SetField(b, f.key, f.value); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// attemptSGLang is an SGLang pair's attempt: one body, with a room of its own, to both workers.
func (r *requestActor) attemptSGLang(c actor.Context, th traceHeader) {
	r.room = drawSeed() // a random non-negative 63-bit room, new for every attempt
	body, err := r.upstreamBody()
	if err != nil {
		r.fail(c, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest))
		return
	}
	p := r.picked
	pair := sglangPair{tr: r.d.Transport, decodeURL: "http://" + p.HTTPAddress + r.x.Path,
		prefillURL: "http://" + p.Prefill.HTTPAddress + r.x.Path, body: body, id: r.x.ID, stream: r.x.Req.Stream,
		clk: r.clock(), prefillTimeout: r.controlTimeout(), trace: th}
	r.runIO(c, pair.run)
}

// sglangPair is an SGLang attempt's I/O, copied from the actor.
type sglangPair struct {
	tr                    Upstream
	decodeURL, prefillURL string
	body                  []byte
	id                    string
	stream                bool
	clk                   clock.Clock
	prefillTimeout        time.Duration
	trace                 traceHeader // both calls': the attempt's (R24)
}

// run sends both calls and returns the decode's answer (its headers, a stream's first event
// too) as an ordinary attempt does, or the failure of either before it. The prefill call
// runs on a goroutine of its own, bounded by the attempt's context, control_timeout and
// maxPrefillAnswer bytes: it cancels the decode call if it fails before the decode's first
// byte, and is drained and dropped otherwise.
func (sp sglangPair) run(ctx context.Context, gen int) any {
	legs, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	committed := false // the decode's first byte is in hand: the prefill call can no longer fail it
	go func() {
		err := sp.prefill(legs)
		if err == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !committed {
			cancel(prefillLegError{err})
		}
	}()
	res, err := sp.decode(legs, gen)
	mu.Lock()
	defer mu.Unlock()
	var leg prefillLegError
	if errors.As(context.Cause(legs), &leg) {
		discard(res) // the prefill call failed first: both are abandoned
		return attemptResult{gen: gen, err: leg}
	}
	if err != nil {
		return attemptResult{gen: gen, err: err}
	}
	if fe, ok := res.(firstEvent); ok && fe.err != nil {
		return fe
	}
	committed = true
	return res
}

// decode is the pair's decode call: its answer (a stream's first event read, as an ordinary
// attempt reads it) or its failure.
func (sp sglangPair) decode(ctx context.Context, gen int) (any, error) {
	h := http.Header{"Content-Type": jsonContentType, "X-Request-Id": {sp.id}}
	sp.trace.set(h)
	if sp.stream {
		h["Accept"] = sseAccept
	}
	req, err := upstreamRequest(ctx, "", sp.decodeURL, sp.body, h)
	if err != nil {
		return nil, err
	}
	resp, err := sp.tr.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if sp.stream && resp.StatusCode == http.StatusOK && isSSE(resp) {
		return readFirstEvent(gen, resp), nil
	}
	return attemptResult{gen: gen, resp: resp}, nil
}

// prefill is the pair's prefill call: a transport failure or a 5xx is its failure; any other
// answer is read to its end (at most maxPrefillAnswer bytes) and dropped, and a 4xx is left
// to the decode's own answer, which the client gets.
func (sp sglangPair) prefill(ctx context.Context) error {
	ctx, cancel := withClockTimeout(ctx, sp.clk, sp.prefillTimeout, errControlTimeout)
	defer cancel()
	h := http.Header{"Content-Type": jsonContentType, "X-Request-Id": {sp.id}}
	sp.trace.set(h)
	req, err := upstreamRequest(ctx, "", sp.prefillURL, sp.body, h)
	if err != nil {
		return err
	}
	resp, err := sp.tr.RoundTrip(req)
	if err != nil {
		return controlErr(ctx, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxPrefillAnswer))
	if resp.StatusCode >= 500 {
		return statusError{what: "prefill worker", status: resp.StatusCode}
	}
	return nil
}

// pdCommitted runs when a disaggregated request's decode answer is committed (relay): the
// decode phase's time is observed, and an SGLang pair's prefill worker, whose part the
// decode's first byte proves done, is released.
func (r *requestActor) pdCommitted(c actor.Context) {
	p := r.picked
	if p.PDProtocol == "" {
		return
	}
	r.d.Metrics.pdPhase(p.PDProtocol, pdPhaseDecode, time.Since(r.pdAt))
	if p.Prefill != nil && p.PDProtocol == config.PDSGLang {
		r.releaseWorker(c, p.Prefill.Worker, router.OutcomeSuccess)
	}
}

// pdFailover counts a disaggregated request's failure before the decode's first byte, by the
// phase that failed (the blamed worker's), and decides what a vLLM decode's failure retries:
// once another decode worker with the same params (a DecodeOnly pick), then a new prefill.
func (r *requestActor) pdFailover(blamed *actor.PID) {
	p := r.picked
	if p == nil || p.PDProtocol == "" {
		return
	}
	phase := pdPhaseDecode
	if p.Prefill != nil && blamed == p.Prefill.Worker {
		phase = pdPhasePrefill
	}
	r.d.Metrics.pdFailure(p.PDProtocol, phase)
	retry := pdRetryNewPrefill
	if p.PDProtocol == config.PDVLLM && phase == pdPhaseDecode && r.kvParams != nil {
		if r.decodeRetried {
			r.kvParams, r.decodeRetried, r.upBody = nil, false, nil // redo the prefill
		} else {
			r.decodeRetried, r.decodeOnly, retry = true, true, pdRetrySameParams
		}
	}
	r.d.Metrics.pdRetry(p.PDProtocol, retry)
}
