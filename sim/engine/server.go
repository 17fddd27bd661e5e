package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tlgw/tlgw/sim/faults"
	"github.com/tlgw/tlgw/sim/kv"
	"github.com/tlgw/tlgw/sim/sampler"
)

// maxBody bounds a request body the engine reads.
const maxBody = 8 << 20

var reqSeq atomic.Uint64

func writeAPIError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: 500, typ: "server_error", code: "internal_error", msg: err.Error()}
	}
	var code, param any = ae.status, nil
	if ae.code != "" {
		code = ae.code
	}
	if ae.param != "" {
		param = ae.param
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": ae.msg, "type": ae.typ, "param": param, "code": code}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.status)
	_, _ = w.Write(body)
}

func readBody(r *http.Request) ([]byte, error) {
	return readBodyLimit(r, maxBody)
}

// readBodyLimit reads a body of at most limit bytes; a longer one is 413.
func readBodyLimit(r *http.Request, limit int) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(limit)+1))
	if err != nil {
		return nil, badRequest("reading the body: %v", err)
	}
	if len(body) > limit {
		return nil, &apiError{status: 413, typ: "invalid_request_error", code: "request_too_large", msg: "the request body is too large"}
	}
	return body, nil
}

// badHeaders are what --fault bad-headers adds to every inference answer: headers a gateway
// must not pass to its clients (R14.5).
func badHeaders(h http.Header) {
	h.Set("Set-Cookie", "tlengine_session=spoofed; Path=/")
	h.Set("X-TL-Route", "spoofed")
	h.Set("Location", "http://169.254.169.254/latest/meta-data/")
}

// contentType labels the answer ct, or text/html under the bad-headers fault (R20: an engine's
// label must not reach the client, or a browser would run its answer as a page of the
// gateway's origin).
func (x *run) contentType(ct string) {
	if x.e.cfg.Fault.Kind == faults.BadHeaders {
		ct = "text/html; charset=utf-8"
	}
	x.w.Header().Set("Content-Type", ct)
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1 // non-negative as a JSON int64
}

// errShape writes an error in one API's shape (OpenAI's, or Anthropic's on /v1/messages).
type errShape func(http.ResponseWriter, error)

// front is what every endpoint meets before its own work, as completions and chat do: the
// bad-headers fault's headers, the body read (at most limit bytes), the slow-headers fault's
// wait, the 503 fault. It answers errors itself and counts them; ok false: nothing more to do.
func (e *Engine) front(w http.ResponseWriter, r *http.Request, endpoint string, limit int, errw errShape) (body []byte, ok bool) {
	if e.cfg.Fault.Kind == faults.BadHeaders {
		badHeaders(w.Header())
	}
	body, err := readBodyLimit(r, limit)
	if err == nil && e.cfg.Fault.Kind == faults.SlowHeaders {
		// Accepted and read; nothing of the answer is written for D (on the engine's clock).
		if werr := e.sleep(r.Context(), e.cfg.Fault.D); werr != nil {
			e.met.request(endpoint, context.Canceled)
			return nil, false
		}
	}
	if err == nil && e.cfg.Fault.Kind == faults.Unavailable {
		err = &apiError{status: 503, typ: "service_unavailable", code: "engine_unavailable", msg: "the engine is unavailable (fault 503)"}
	}
	if err != nil {
		e.met.request(endpoint, err)
		errw(w, err)
		return nil, false
	}
	return body, true
}

// stalled holds a request under the stall fault (accepted, never answered) until the client
// leaves or the engine stops, and counts it; false: no stall fault.
func (e *Engine) stalled(r *http.Request, endpoint string) bool {
	if e.cfg.Fault.Kind != faults.Stall {
		return false
	}
	select {
	case <-r.Context().Done():
	case <-e.stop:
	}
	e.met.request(endpoint, context.Canceled)
	return true
}

// fail counts and answers an error found after front.
func (e *Engine) fail(w http.ResponseWriter, endpoint string, err error, errw errShape) {
	e.met.request(endpoint, err)
	errw(w, err)
}

// checkModel accepts the base model and each served adapter; anything else is vLLM's 404.
func (e *Engine) checkModel(model string) error {
	if model == e.cfg.Model || e.loras.served(model) {
		return nil
	}
	return modelNotFound(model)
}

// adapter is the adapter a request's model names, or "" for the base model.
func (e *Engine) adapter(model string) string {
	if model == e.cfg.Model {
		return ""
	}
	return model
}

// serveInference runs one completions or chat request through the scheduler.
func (e *Engine) serveInference(w http.ResponseWriter, r *http.Request, chat bool) {
	endpoint, out := EndpointCompletions, format(completionsFormat{})
	if chat {
		endpoint, out = EndpointChat, chatFormat{}
	}
	body, ok := e.front(w, r, endpoint, maxBody, writeAPIError)
	if !ok {
		return
	}
	req, err := parseRequest(body, chat, e.checkModel)
	var prompt []uint32
	var handle *kvHandle
	var pd *pdRequest
	if err == nil {
		pd, err = e.parsePD(body, req) // R22: vllm's kv_transfer_params, sglang's bootstrap room
	}
	id := fmt.Sprintf("%s-%s-%d", endpoint, e.cfg.ID, reqSeq.Add(1))
	if err == nil {
		prompt = sampler.Tokenize(req.prompt)
		if hid := r.Header.Get("X-TL-KV-Handle"); hid != "" {
			// Disaggregated decode: the pushed KV becomes this request's sequence.
			handle, err = e.takeHandle(hid, prompt)
		} else if pd != nil && pd.decode {
			// The engines' protocols: the KV is fetched from the prefill engine (pd.go).
			handle, err = e.fetchRemote(r.Context(), pd, id, prompt)
		}
	}
	if err != nil {
		e.fail(w, endpoint, err, writeAPIError)
		return
	}
	if e.stalled(r, endpoint) {
		if handle != nil {
			e.sched.freeHeld(handle.seq)
		}
		return
	}
	x := &run{e: e, w: w, r: r, req: req, prompt: prompt, handle: handle, chunks: promptChunks(req, body, prompt),
		id: id, out: out, errw: writeAPIError}
	e.preparePD(x, pd)
	e.generate(endpoint, x)
}

// generate serves a run and counts it: a request without a seed gets a random one, as engines
// draw one; a run the engine's stop cut breaks its connection off.
func (e *Engine) generate(endpoint string, x *run) {
	if !x.req.seeded {
		x.req.params.Seed = randomSeed()
	}
	x.created = time.Now().Unix()
	x.lora = e.adapter(x.req.model)
	err := x.execute()
	if errors.Is(err, errStopping) {
		x.cut() // a dying engine breaks its connections off
	}
	e.met.request(endpoint, err)
}

// run is one request being served.
type run struct {
	e       *Engine
	w       http.ResponseWriter
	r       *http.Request
	req     *request
	prompt  []uint32  // the tokenized prompt
	handle  *kvHandle // resuming from pushed KV (X-TL-KV-Handle), or nil
	chunks  []chunkAt // the gateway's chunk ids of the prompt (R18.3)
	id      string
	created int64
	out     format   // the answer's wire shape
	errw    errShape // how errors are written
	lora    string   // the adapter the request runs on, "" for the base model
	// pd is the request's half of an engine protocol's disaggregation (nil: none), and
	// prefilled runs once its prompt is prefilled (pd.go).
	pd        *pdRequest
	prefilled func(*kv.Seq) error

	promptTokens int
	cached       int
	tokens       []sampler.Token
	finish       string
	streamed     int // tokens written to the client
}

// wait sleeps d on the engine's clock, or returns early when the client leaves.
func (x *run) wait(d time.Duration) error {
	return x.e.sleep(x.r.Context(), d)
}

// admit makes the run's sequence a running one: the prompt admitted and prefilled, or the KV
// handle's imported sequence adopted (its prefill ran on the prefill worker).
func (x *run) admit() (*kv.Seq, error) {
	e, ctx, prompt := x.e, x.r.Context(), x.prompt
	if x.handle != nil {
		if err := e.sched.adopt(ctx, x.handle.seq); err != nil {
			return nil, err
		}
		x.cached = len(prompt)
		return x.handle.seq, nil
	}
	seq, cached, err := e.sched.admit(ctx, prompt, e.cfg.BlockSize)
	if err != nil {
		if errors.Is(err, errTooLong) {
			err = badRequest("%v (%d tokens)", err, len(prompt))
		}
		if ctx.Err() == nil {
			x.errw(x.w, err)
		}
		return nil, err
	}
	x.cached = cached
	if err := x.wait(time.Duration(len(prompt)-cached) * e.cfg.PrefillPerToken); err != nil {
		e.sched.release(seq)
		return nil, err
	}
	return seq, nil
}

func (x *run) execute() error {
	e, prompt := x.e, x.prompt
	x.promptTokens = len(prompt)
	if x.lora != "" {
		release, err := e.runOn(x.r.Context(), x.lora)
		if err != nil {
			if x.r.Context().Err() == nil {
				x.errw(x.w, err)
			}
			return err
		}
		defer release()
	}
	seq, err := x.admit()
	if err != nil {
		return err
	}
	defer e.sched.release(seq)
	e.tagChunks(seq, x.chunks) // its prompt's KV is computed and cached
	if x.prefilled != nil {
		if err := x.prefilled(seq); err != nil {
			x.errw(x.w, err)
			return err
		}
	}
	var gen tokenSource
	if x.handle != nil && !x.handle.regenerate {
		gen = resume(x.req.model, prompt, x.req.params, x.handle)
	} else {
		gen = sampler.NewGenerator(x.req.model, prompt, x.req.params)
	}
	if x.req.stream {
		if err := x.startStream(); err != nil {
			return err
		}
	}
	if e.cfg.Fault.Kind == faults.EndlessEvent {
		return x.endless()
	}
	for {
		if f := e.cfg.Fault; f.Kind == faults.StallAfter && len(x.tokens) >= f.N {
			return x.stall()
		}
		tok, finish, ok := gen.Next()
		if !ok {
			x.finish = finish
			break
		}
		if err := e.sched.appendToken(seq, tok.ID); err != nil {
			x.finish = "length" // the KV pool is full: stop here, as an engine out of blocks would
			break
		}
		x.tokens = append(x.tokens, tok)
		if x.req.stream {
			if err := x.streamToken(tok); err != nil {
				return err
			}
		}
		if err := x.faultAfterToken(); err != nil {
			return err
		}
		if err := x.wait(e.cfg.DecodePerToken); err != nil {
			return err
		}
	}
	if x.req.stream {
		return x.endStream()
	}
	return x.writeJSON()
}

// errCut marks a response the cut-after fault broke off.
var errCut = errors.New("response cut by fault")

// faultAfterToken applies cut-after and crash-after once a token is produced.
func (x *run) faultAfterToken() error {
	f := x.e.cfg.Fault
	switch f.Kind {
	case faults.CutAfter:
		if len(x.tokens) >= f.N {
			x.cut()
			return errCut
		}
	case faults.CrashAfter:
		if x.e.sent.Add(1) >= int64(f.N) {
			if x.req.stream {
				_ = http.NewResponseController(x.w).Flush()
			}
			x.e.log.Error("crash-after fault: exiting", "tokens", f.N)
			x.e.cfg.Exit(3)
		}
	}
	return nil
}

// cut breaks the connection off mid-answer: a streamed answer after the tokens sent so far,
// a JSON answer after its headers and part of its body.
func (x *run) cut() {
	rc := http.NewResponseController(x.w)
	if !x.req.stream {
		x.partialJSON()
	}
	_ = rc.Flush()
	if conn, _, err := rc.Hijack(); err == nil {
		_ = conn.Close()
	}
}

// partialJSON starts a JSON answer that will not be finished: its headers (a Content-Length it
// will not reach) and the first bytes of its body.
func (x *run) partialJSON() {
	x.contentType("application/json")
	x.w.Header().Set("Content-Length", "4096")
	x.w.WriteHeader(http.StatusOK)
	_, _ = x.w.Write([]byte(`{"id":"` + x.id + `","choices":[`))
}

// stall stops the answer where it is, keeping the connection open until the client leaves
// (stall-after): a streamed answer after the events sent so far, a JSON answer after its
// headers and part of its body. The run keeps its place in the running set and its KV.
func (x *run) stall() error {
	if !x.req.stream {
		x.partialJSON()
	}
	_ = http.NewResponseController(x.w).Flush()
	select {
	case <-x.r.Context().Done():
		return x.r.Context().Err()
	case <-x.e.stop:
		return errStopping
	}
}

// endless writes one SSE line that never ends (endless-event): after the stream's start, a
// "data: " line whose JSON string never closes, with no newline, until the client leaves. A
// non-streamed answer is a JSON body that never ends (no Content-Length). Each write waits
// for the client to read (TCP flow control), so the engine's memory stays one chunk.
func (x *run) endless() error {
	head := `data: {"id":"` + x.id + `","choices":[{"index":0,"text":"`
	if !x.req.stream {
		x.contentType("application/json")
		x.w.WriteHeader(http.StatusOK)
		head = `{"id":"` + x.id + `","choices":[{"index":0,"text":"`
	}
	rc := http.NewResponseController(x.w)
	ctx := x.r.Context()
	chunk, xs := []byte(head), bytes.Repeat([]byte("x"), 32<<10)
	for {
		if _, err := x.w.Write(chunk); err != nil {
			return fmt.Errorf("%w: %v", context.Canceled, err) // the client left
		}
		if err := rc.Flush(); err != nil {
			return fmt.Errorf("%w: %v", context.Canceled, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-x.e.stop:
			return errStopping
		default:
		}
		chunk = xs
	}
}

func (x *run) usage() map[string]int {
	return map[string]int{"prompt_tokens": x.promptTokens, "completion_tokens": len(x.tokens),
		"total_tokens": x.promptTokens + len(x.tokens)}
}

func (x *run) text() string {
	var b bytes.Buffer
	for _, t := range x.tokens {
		b.WriteString(t.Text)
	}
	return b.String()
}

func (x *run) startStream() error {
	h := x.w.Header()
	x.contentType("text/event-stream")
	h.Set("Cache-Control", "no-cache")
	x.w.WriteHeader(http.StatusOK)
	if err := x.out.open(x); err != nil {
		return err
	}
	return http.NewResponseController(x.w).Flush()
}

// event writes one SSE event: "data: " and v's JSON.
func (x *run) event(v any) error {
	return x.namedEvent("", v)
}

// namedEvent writes one SSE event with an "event: " line when name is not empty (the Responses
// and Anthropic streams name theirs), and flushes it.
func (x *run) namedEvent(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+len(name)+16)
	if name != "" {
		buf = append(append(append(buf, "event: "...), name...), '\n')
	}
	buf = append(append(append(buf, "data: "...), b...), "\n\n"...)
	if _, err := x.w.Write(buf); err != nil {
		return err
	}
	return http.NewResponseController(x.w).Flush()
}

// done writes the "data: [DONE]" line OpenAI-style streams end with.
func (x *run) done() error {
	if _, err := x.w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return err
	}
	return http.NewResponseController(x.w).Flush()
}

func (x *run) streamToken(tok sampler.Token) error {
	x.streamed++
	return x.out.token(x, tok)
}

func (x *run) endStream() error {
	return x.out.close(x)
}

func chatLogprob(t sampler.Token) map[string]any {
	return map[string]any{"token": t.Text, "logprob": t.Logprob, "bytes": []byte(t.Text), "top_logprobs": []any{}}
}

// completionLogprobs is the legacy completions logprobs object.
func completionLogprobs(toks []sampler.Token, offset int) map[string]any {
	tokens := make([]string, len(toks))
	lps := make([]float64, len(toks))
	offs := make([]int, len(toks))
	for i, t := range toks {
		tokens[i], lps[i], offs[i] = t.Text, t.Logprob, offset
		offset += len(t.Text)
	}
	return map[string]any{"tokens": tokens, "token_logprobs": lps, "top_logprobs": nil, "text_offset": offs}
}

func (x *run) writeJSON() error {
	b, ct, err := x.out.whole(x)
	if err != nil {
		return err
	}
	x.contentType(ct)
	x.w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	x.w.WriteHeader(http.StatusOK)
	_, err = x.w.Write(b)
	return err
}
