package request

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// maxUpstreamJSON bounds a non-streamed engine answer the gateway buffers (it buffers so that
// a body cut mid-way becomes a clean 502 instead of a truncated 200).
const maxUpstreamJSON = 64 << 20

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// clientAskedLogprobs reports whether the client's body asks for logprobs (a non-null,
// non-false "logprobs"). The key is matched exactly, as the engines match it: a case variant
// such as "LogProbs" is another field, and must not keep a cascade step from forcing
// logprobs on (R13.4).
func (r *requestActor) clientAskedLogprobs() bool {
	raw, ok := oai.Field(r.x.Body, "logprobs")
	v := string(raw)
	return ok && v != "null" && v != "false"
}

// upstreamBody is the body an attempt sends: the served model id, logprobs forced on for a
// non-final cascade step (R7), the fixed seed of a disaggregated request (R8). Every other byte
// is the client's.
func (r *requestActor) upstreamBody() ([]byte, error) {
	p := r.picked
	key := p.ServedModel
	nonFinal := r.nonFinalStep()
	if nonFinal {
		key += "|lp"
	}
	if r.seedFixed {
		key += "|seed"
	}
	pd := r.pdBodyKey() // the engines' protocols' fields (pd.go)
	key += pd
	if r.upBody != nil && r.upBodyFor == key {
		return r.upBody, nil
	}
	b := r.x.Body
	var err error
	if r.x.Method != "" && r.x.Method != http.MethodPost {
		return nil, nil // GET, DELETE of a stored response: no body
	}
	if r.x.Kind.Multipart() {
		// An audio form is relayed byte for byte; only its model value changes when the
		// served model is another (R21).
		if p.ServedModel != r.x.Req.Model {
			var err error
			if b, err = oai.RewriteMultipartModel(r.x.Kind, r.x.ContentType, b, p.ServedModel); err != nil {
				return nil, err
			}
		}
		r.upBody, r.upBodyFor = b, key
		return b, nil
	}
	if p.ServedModel != r.x.Req.Model && r.x.Req.Model != "" {
		if b, err = oai.RewriteModel(b, p.ServedModel); err != nil {
			return nil, err
		}
	}
	if nonFinal && !r.clientAskedLogprobs() {
		forced := []byte("1") // completions: logprobs is a count
		if r.x.Kind == oai.Chat {
			forced = []byte("true")
		}
		if b, err = oai.SetField(b, "logprobs", forced); err != nil {
			return nil, err
		}
	}
	if r.seedFixed {
		if b, err = oai.SetField(b, "seed", []byte(strconv.FormatUint(r.seed, 10))); err != nil {
			return nil, err
		}
	}
	if pd != "" {
		if b, err = r.pdBody(b); err != nil {
			return nil, err
		}
	}
	r.upBody, r.upBodyFor = b, key
	return b, nil
}

var (
	jsonContentType = []string{"application/json"}
	sseAccept       = []string{"text/event-stream"}
)

// attempt sends the request to the picked engine (Attempting).
func (r *requestActor) attempt(c actor.Context) {
	th := r.tr.startAttempt(r.picked, r.attemptAt) // the call's traceparent: its parent is the attempt
	if p := r.picked; p.Prefill != nil && p.PDProtocol == config.PDSGLang {
		r.attemptSGLang(c, th)
		return
	}
	body, err := r.upstreamBody()
	if err != nil {
		r.fail(c, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest))
		return
	}
	url := "http://" + r.picked.HTTPAddress + r.x.Path
	stream, id, handle, tr := r.x.Req.Stream, r.x.ID, r.kvHandle, r.d.Transport
	method, contentType := r.x.Method, jsonContentType
	if r.x.ContentType != "" && r.x.Kind.Multipart() {
		contentType = []string{r.x.ContentType}
	}
	// An engine's own 404/405 may say it has no such endpoint (R21): read when the request is
	// not pinned to a stored response (whose holder's 404 is the client's answer).
	probeNoRoute := r.x.Response == "" && r.x.Kind.Valid()
	load, addr := r.picked.LoadLoRA, r.picked.HTTPAddress
	// A stream's first event is read by the same I/O step as its headers (nothing reaches the
	// client before it, R14.1), so a stream costs the actor one result, not two.
	firstEventToo := r.x.Req.Stream && !r.nonFinalStep()
	r.runIO(c, func(ctx context.Context, gen int) any {
		// Canonical keys set directly; the constant values are shared (the transport only
		// reads a request's headers).
		h := make(http.Header, 5)
		th.set(h)
		if body != nil {
			h["Content-Type"] = contentType
		}
		if stream {
			h["Accept"] = sseAccept
		}
		h["X-Request-Id"] = []string{id}
		if handle != "" {
			h["X-Tl-Kv-Handle"] = []string{handle}
		}
		if load != nil {
			// R21 lora_load_on_demand: the adapter is loaded on the engine before the request
			// that needs it is sent.
			if err := loadLoRA(ctx, tr, "http://"+addr, load, id, th); err != nil {
				return attemptResult{gen: gen, err: err, loadFailed: true}
			}
		}
		req, err := upstreamRequest(ctx, method, url, body, h)
		if err != nil {
			return attemptResult{gen: gen, err: err}
		}
		resp, err := tr.RoundTrip(req)
		if err == nil && firstEventToo && resp.StatusCode == http.StatusOK && isSSE(resp) {
			return readFirstEvent(gen, resp)
		}
		if err == nil && probeNoRoute && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed) {
			return attemptResult{gen: gen, resp: resp, noRoute: engineHasNoRoute(resp)}
		}
		return attemptResult{gen: gen, resp: resp, err: err}
	})
}

// readAll reads a whole answer (a non-final cascade step) into bytes of hold, which the actor
// gives back once it has judged (and maybe written) the answer.
func readAll(gen int, resp *http.Response, hold *bufHold) bufferedResult {
	defer resp.Body.Close()
	body, err := readBounded(resp.Body, resp.ContentLength, maxUpstreamJSON, hold)
	return bufferedResult{gen: gen, status: resp.StatusCode, header: resp.Header, body: body, err: err}
}

// jsonHint is the most an engine's Content-Length sizes a buffer before its bytes arrive
// (R14.4): 100 stalled answers that claim 64 MiB hold 100 × 64 KiB, not 6.4 GiB.
const jsonHint = 64 << 10

// errAnswerTooLarge: a non-streamed answer went over maxUpstreamJSON.
var errAnswerTooLarge = fmt.Errorf("an answer larger than %d bytes", maxUpstreamJSON)

// readBounded reads r to its end, holding at most limit bytes (more is errAnswerTooLarge). The
// buffer starts at the announced length only up to jsonHint and then grows with what arrives,
// doubling but never past limit+1, so memory follows the bytes received, not the bytes
// promised. length < 0 means unknown. Every buffer's bytes are taken from hold before it is
// made (nil: no budget): the first before anything is read, so an answer that finds no room
// is errBufferBudget with nothing read; a growth that finds none is errBufferBudget too.
func readBounded(r io.Reader, length int64, limit int, hold *bufHold) ([]byte, error) {
	size := 4 << 10
	if length >= 0 {
		size = int(min(length+1, jsonHint)) // +1: the read that sees EOF needs no new array
	}
	size = max(size, 512)
	if !hold.grow(int64(size)) {
		return nil, errBufferBudget
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			next := min(2*cap(b), limit+1)
			if !hold.grow(int64(next - cap(b))) {
				return b, errBufferBudget
			}
			b = append(make([]byte, 0, next), b...)
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > limit {
			return b, errAnswerTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// forwardHeaders is the allow-list of engine response headers that reach the client (R13.4).
// Everything else an engine sends stays behind: hop-by-hop and framing headers, cookies,
// redirects, and X-TL-* (X-TL-Route is the gateway's own, for debug keys only).
// The Content-Type is the gateway's own (R20): application/json, or text/event-stream for an
// engine's stream, whatever the engine labelled it (an engine's text/html answer to a
// cross-site form POST would run script in the gateway's origin).
var forwardHeaders = [...]string{"Cache-Control", "Retry-After"}

// eventStreamType is the Content-Type of a relayed stream; plainTextType of an audio
// transcript asked for as text.
var (
	eventStreamType = []string{"text/event-stream"}
	plainTextType   = []string{"text/plain; charset=utf-8"}
)

// writeHeaders sets the answer's Content-Type, copies the allowed engine headers and adds the
// debug ones (SPEC B2, R7, R20).
func (r *requestActor) writeHeaders(from http.Header) {
	h := r.x.W.Header()
	switch ct := from.Get("Content-Type"); {
	case strings.HasPrefix(ct, "text/event-stream"):
		h["Content-Type"] = eventStreamType
	case r.x.Kind.Multipart() && strings.HasPrefix(ct, "text/plain"):
		// A transcript asked for as text (response_format text, srt, vtt): plain text, which
		// with nosniff no browser runs (R20).
		h["Content-Type"] = plainTextType
	default:
		h["Content-Type"] = jsonContentType
	}
	for _, k := range forwardHeaders {
		if vs := from.Values(k); len(vs) > 0 {
			h[k] = vs
		}
	}
	if r.x.Debug {
		h["X-Tl-Route"] = []string{r.picked.WorkerID} // canonical keys: no per-request canonicalizing
		if r.picked.Steps > 1 {
			h["X-Tl-Cascade-Step"] = []string{strconv.Itoa(r.picked.Step)}
		}
	}
}

// relayer is the relay goroutine's view (Relaying): values copied from the actor before the
// goroutine starts, and the response writer, which nothing else writes to while it runs.
type relayer struct {
	w   http.ResponseWriter
	ctx context.Context // the relay's: cancelled when the client leaves, or by the actor
	// client is the client's own context (nil: ctx): only its end means nobody is left to tell,
	// whatever else cancelled the relay.
	client context.Context
	resp   *http.Response
	body   io.ReadCloser // resp's body as the relay reads it (a stream's: bounded by idleBody)
	// first is the stream's first event when the attempt read it already, in the recycled
	// array buf (nil: first is elsewhere, or there is none), which the relay owns from here.
	first []byte
	buf   *[]byte
	// log, id and worker report a cut answer; the worker is named in the log, never in the
	// client's messages (R13.4).
	log        *slog.Logger
	id, worker string
	errs       ErrorWriter
	// interrupts counts a stream cut after its first byte, under route (nil: not counted).
	interrupts *prometheus.CounterVec
	route      string
	// out receives the result before the goroutine ends, so a crashed actor can tell (after
	// waiting for the goroutine) whether the client already has its terminal outcome.
	out *relayResult
	// budget bounds the bytes of a JSON answer being buffered (nil: no bound).
	budget *BufferBudget
	// kind is the request's endpoint: what ends its stream (streamEnd). wantID: read the
	// Responses answer's id into the result (R21: a stored response).
	kind   oai.Kind
	wantID bool
	// usage receives the answer's prompt and completion tokens before the goroutine ends
	// (the access log's; nil: not read).
	usage *usageDetail
}

// clientLeft reports whether the client is gone (then nothing more is written to it).
func (rl relayer) clientLeft() bool {
	if rl.client != nil {
		return rl.client.Err() != nil
	}
	return rl.ctx.Err() != nil
}

// run relays and reports the status the client saw and whether the answer reached its end.
func (rl relayer) run(gen int) relayResult {
	defer rl.body.Close()
	var res relayResult
	tc := tokenCounter{usage: -1, detail: rl.usage != nil, prompt: -1, completion: -1}
	if strings.HasPrefix(rl.resp.Header.Get("Content-Type"), "text/event-stream") {
		res = rl.sse(gen, &tc)
	} else {
		res = rl.json(gen, &tc)
	}
	res.usage, res.events = tc.usage, tc.events
	if rl.usage != nil {
		*rl.usage = usageDetail{prompt: tc.prompt, completion: tc.completion}
	}
	*rl.out = res
	return res
}

// json buffers a non-streamed answer, so a body cut mid-way is a 502, never a truncated 200.
// Its bytes are held in the buffer budget until it is written, or has failed; an answer that
// finds no room is 503 overloaded (R20), with no verdict on the worker.
func (rl relayer) json(gen int, tc *tokenCounter) relayResult {
	hold := rl.budget.hold()
	defer hold.release()
	body, err := readBounded(rl.body, rl.resp.ContentLength, maxUpstreamJSON, hold)
	if err != nil {
		if rl.ctx.Err() != nil {
			// The client left, or request_timeout fired: the actor answers 504 (faults.go).
			return relayResult{gen: gen, code: statusClientGone}
		}
		for k := range rl.w.Header() {
			if !gatewayHeader(k) {
				rl.w.Header().Del(k)
			}
		}
		if errors.Is(err, errBufferBudget) {
			code := rl.errs.Error(rl.w, overloaded())
			return relayResult{gen: gen, code: code, ended: true, shed: true}
		}
		message := "the engine broke off its answer"
		if errors.Is(err, errAnswerTooLarge) {
			message = "the engine's answer is larger than 64 MiB"
		}
		rl.log.Warn(message, "request_id", rl.id, "worker", rl.worker, "err", err)
		code := rl.errs.Error(rl.w, fmt.Errorf("%s: %w", message, errs.ErrUpstream))
		return relayResult{gen: gen, code: code, ended: true}
	}
	tc.observe(body)
	tc.events = 0 // a JSON answer is one answer, not events
	var id string
	if rl.wantID && rl.resp.StatusCode == http.StatusOK {
		id = responseID(body)
	}
	rl.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	rl.w.WriteHeader(rl.resp.StatusCode)
	_, _ = rl.w.Write(body)
	return relayResult{gen: gen, code: rl.resp.StatusCode, finished: true, ended: true, responseID: id}
}

// sse forwards the stream as it arrives: each read from the engine is written and flushed at
// once, cut at event boundaries (framing.go), so every event reaches the client when the engine
// sent it. If the engine breaks off, the client keeps the whole events it got and then an SSE
// error event, with no [DONE] (R6).
func (rl relayer) sse(gen int, tc *tokenCounter) relayResult {
	rc := http.NewResponseController(rl.w)
	// The headers leave with the first event (every write below is flushed): one write to the
	// client instead of two. The first event is normally in hand already (stepFirstEvent).
	rl.w.WriteHeader(rl.resp.StatusCode)
	bp := rl.buf
	if bp == nil {
		bp = bufPool.Get().(*[]byte)
	}
	defer bufPool.Put(bp)
	buf := *bp
	framer := newEventFramer()
	defer framer.release()
	var tail doneTail
	var end streamEnd
	var id string
	idTries := 0
	write := func(b []byte) bool {
		if len(b) == 0 {
			return true
		}
		tail.add(b)
		end.observe(rl.kind, b)
		if rl.wantID && id == "" && idTries < 4 {
			// The id is in the stream's first event (response.created): looked for in the
			// first few writes only, never in every event of a long stream.
			idTries++
			id = streamResponseID(b)
		}
		tc.observe(b)
		if _, err := rl.w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// message is the client's and names no engine (R13.4); the detail goes to the log only.
	interrupted := func(message string, detail error) relayResult {
		rl.log.Warn(message, "request_id", rl.id, "worker", rl.worker, "err", detail)
		rl.errs.SSEError(rl.w, message)
		_ = rc.Flush()
		if rl.interrupts != nil {
			rl.interrupts.WithLabelValues(rl.route).Inc()
		}
		return relayResult{gen: gen, code: rl.resp.StatusCode, ended: true}
	}
	if len(rl.first) > 0 {
		// The first event, read by the attempt (in buf's array: written before the next read).
		events, ferr := framer.feed(rl.first)
		if !write(events) {
			return relayResult{gen: gen, code: statusClientGone}
		}
		if ferr != nil {
			return interrupted("the engine sent an event larger than 1 MiB", ferr)
		}
	}
	for {
		n, err := rl.body.Read(buf)
		if n > 0 {
			events, ferr := framer.feed(buf[:n])
			if !write(events) {
				return relayResult{gen: gen, code: statusClientGone}
			}
			if ferr != nil {
				// An event over 1 MiB (R14.4): what was held of it is dropped, the engine's
				// connection is closed, and the client gets the error event.
				return interrupted("the engine sent an event larger than 1 MiB", ferr)
			}
		}
		if err == io.EOF {
			if !write(framer.rest()) {
				return relayResult{gen: gen, code: statusClientGone}
			}
			if rl.resp.StatusCode == http.StatusOK && !tail.done() && !end.seen {
				// A stream that ends without its last event ([DONE]; a Responses or Messages
				// stream's own end event) did not finish, however cleanly the connection
				// closed: the client must not take it for a whole answer.
				return interrupted("the engine ended the stream before its last event", nil)
			}
			return relayResult{gen: gen, code: rl.resp.StatusCode, finished: true, ended: true, responseID: id}
		}
		if err != nil {
			// Committed: a client still there gets the error event whatever cut the stream
			// (R6); a clean end with neither [DONE] nor the error event would pass for whole.
			if rl.clientLeft() {
				return relayResult{gen: gen, code: statusClientGone}
			}
			return interrupted("the engine broke off the stream", err)
		}
	}
}

// tokenCounter reads what a relayed answer cost (R13.5): the last usage.total_tokens seen and
// the SSE events relayed. observe gets whole events (or a whole JSON answer), so a pattern is
// never split between two calls. With detail (the access log is on) it also reads the prompt
// and completion tokens of the usage that total_tokens is in (−1: none seen).
type tokenCounter struct {
	usage  int64
	events int64

	detail             bool
	prompt, completion int64
}

var totalTokensKey = []byte(`"total_tokens":`)

// totalTokensAnchor is the key's rarest byte in an engine's JSON, and where it sits in the key.
const (
	totalTokensAnchor    = 'k'
	totalTokensAnchorOff = 9
)

func (tc *tokenCounter) observe(b []byte) {
	tc.events += int64(bytes.Count(b, []byte("\n\n")))
	i := lastTotalTokens(b)
	if i >= 0 {
		rest := bytes.TrimLeft(b[i+len(totalTokensKey):], " ")
		n := 0
		for n < len(rest) && n < 19 && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if v, err := strconv.ParseInt(string(rest[:n]), 10, 64); err == nil {
			tc.usage = v
		}
		if tc.detail {
			tc.prompt = usageNear(b, i, promptTokensKey, inputTokensKey)
			tc.completion = usageNear(b, i, completionTokensKey, outputTokensKey)
		}
	}
}

// The usage keys beside total_tokens: OpenAI's chat and completions name them prompt_ and
// completion_tokens, its Responses API input_ and output_tokens.
var (
	promptTokensKey     = []byte(`"prompt_tokens":`)
	inputTokensKey      = []byte(`"input_tokens":`)
	completionTokensKey = []byte(`"completion_tokens":`)
	outputTokensKey     = []byte(`"output_tokens":`)
)

// usageWindow is how far from total_tokens its usage object's other keys are looked for:
// the object is a few dozen bytes (a few hundred with its details), and the search stays
// bounded whatever the size of the answer.
const usageWindow = 512

// usageNear is the count under key (else alt) nearest to b[at:], the total_tokens key, within
// usageWindow bytes on either side: the same usage object's, when one event or answer holds
// several. −1 when neither key is there, or its value is not a count.
func usageNear(b []byte, at int, key, alt []byte) int64 {
	lo, hi := max(0, at-usageWindow), min(len(b), at+usageWindow)
	for _, k := range [2][]byte{key, alt} {
		best := -1
		if j := bytes.LastIndex(b[lo:at], k); j >= 0 {
			best = lo + j
		}
		if j := bytes.Index(b[at:hi], k); j >= 0 && (best < 0 || j < at-best) {
			best = at + j
		}
		if best < 0 {
			continue
		}
		rest := bytes.TrimLeft(b[best+len(k):hi], " ")
		var v int64
		n := 0
		for n < len(rest) && n < 18 && rest[n] >= '0' && rest[n] <= '9' {
			v = v*10 + int64(rest[n]-'0')
			n++
		}
		if n == 0 {
			return -1
		}
		return v
	}
	return -1
}

// lastTotalTokens is bytes.LastIndex(b, totalTokensKey). It jumps between the key's 'k's with
// the vectorized IndexByte: bytes.Index would start from the key's '"', which an engine's JSON
// holds every few bytes, and fall back to comparing the key at every position (most reads
// hold no usage at all, and the search ran over each of them).
func lastTotalTokens(b []byte) int {
	last := -1
	for from := totalTokensAnchorOff; from < len(b); {
		k := bytes.IndexByte(b[from:], totalTokensAnchor)
		if k < 0 {
			break
		}
		at := from + k - totalTokensAnchorOff
		if at+len(totalTokensKey) <= len(b) && bytes.Equal(b[at:at+len(totalTokensKey)], totalTokensKey) {
			last = at
		}
		from += k + 1
	}
	return last
}

// cost is what an answer counts against the key's tokens: the usage the engine reported, else
// the prompt estimate (body bytes / 4) plus the events relayed. A request that relayed
// nothing (nil) costs its prompt estimate.
func (res *relayResult) cost(bodyBytes int) int64 {
	prompt := int64(bodyBytes / 4)
	switch {
	case res == nil:
		return prompt
	case res.usage > 0:
		return res.usage
	}
	return prompt + res.events
}

// doneTail keeps the last bytes forwarded, to tell whether a stream's last event was
// "data: [DONE]".
type doneTail struct {
	b [32]byte
	n int
}

func (t *doneTail) add(p []byte) {
	if len(p) >= len(t.b) {
		t.n = copy(t.b[:], p[len(p)-len(t.b):])
		return
	}
	keep := min(t.n, len(t.b)-len(p))
	copy(t.b[:keep], t.b[t.n-keep:t.n])
	t.n = keep + copy(t.b[keep:], p)
}

func (t *doneTail) done() bool {
	return bytes.HasSuffix(bytes.TrimRight(t.b[:t.n], "\r\n"), []byte("data: [DONE]"))
}

// upstreamRequest is a POST of body to url with the headers h, to an engine.
//
// It may be sent twice on the engine's address, never to another: when the engine closes a
// kept-alive connection without a byte of answer to the request just written on it (it died,
// or it closed the idle connection as the request arrived: vLLM's and SGLang's HTTP servers
// close idle connections after 5 s), net/http sends the request again on a new connection.
// The engine did not serve it, so nothing is done twice; a live engine answers the second
// copy, and a dead one's address refuses it, which proves the engine down (R19) and takes no
// retry slot. Without this, each such race was a failover holding a retry slot and an outlier
// failure against a healthy engine. net/http resends only requests it may treat as
// idempotent: a nil "Idempotency-Key" entry says so and puts nothing on the wire.
func upstreamRequest(ctx context.Context, method, url string, body []byte, h http.Header) (*http.Request, error) {
	if method == "" {
		method = http.MethodPost
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(len(body))
	h["Idempotency-Key"] = nil
	req.Header = h
	return req, nil
}

// gatewayHeader reports whether an answer's header k is the gateway's own (set before the
// request reached the actor), which survives when the engine's headers are dropped.
func gatewayHeader(k string) bool { return k == "X-Request-Id" || k == "X-Content-Type-Options" }

// noRouteProbe bounds what is read of an engine's 404/405 to tell its HTTP server's "no such
// path" from an API error (engineHasNoRoute).
const noRouteProbe = 4 << 10

// engineHasNoRoute reads the start of an engine's 404 or 405 and reports whether it is its
// HTTP server saying the path (or method) is not served (R21): any 405, or a 404 whose body is
// no API error (FastAPI's {"detail":"Not Found"}, Go's "404 page not found", nothing). A 404
// that is an API error ("message", "error": an unknown model, a missing stored response) is
// the engine's answer to the request, relayed to the client. The bytes read stay in front of
// the body, so either way the answer is whole.
func engineHasNoRoute(resp *http.Response) bool {
	head, _ := io.ReadAll(io.LimitReader(resp.Body, noRouteProbe))
	resp.Body = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if resp.StatusCode == http.StatusMethodNotAllowed {
		return true
	}
	return !bytes.Contains(head, []byte(`"message"`)) && !bytes.Contains(head, []byte(`"error"`))
}

// readCloser reads from r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (rc readCloser) Close() error { return rc.c.Close() }

// streamEnd sees the event that ends a stream of the Responses API (response.completed,
// response.incomplete or response.failed) or of Anthropic's Messages API (message_stop), which
// send no [DONE] (R21). observe gets whole events (the framer's output), so an event type is
// never split between two calls. The type is read from an event's own "event:" line (at a line's
// start: the same words inside a data line's text are no end) or from a "type" member of its
// data, which cannot occur inside a JSON string (its quotes would be escaped).
type streamEnd struct{ seen bool }

var (
	responsesEnds = [...]string{"response.completed", "response.incomplete", "response.failed"}
	messagesEnds  = [...]string{"message_stop"}
	responsesData = [...][]byte{[]byte(`"type":"response.completed"`), []byte(`"type":"response.incomplete"`), []byte(`"type":"response.failed"`)}
	messagesData  = [...][]byte{[]byte(`"type":"message_stop"`)}
)

func (e *streamEnd) observe(k oai.Kind, b []byte) {
	if e.seen {
		return
	}
	switch k {
	case oai.Responses:
		e.seen = endsWith(b, responsesEnds[:], responsesData[:])
	case oai.Messages:
		e.seen = endsWith(b, messagesEnds[:], messagesData[:])
	}
}

// endsWith reports whether events b hold one of types: an "event:" line naming it, or a data
// member of it.
func endsWith(b []byte, types []string, data [][]byte) bool {
	for _, m := range data {
		if bytes.Contains(b, m) {
			return true
		}
	}
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		v, ok := bytes.CutPrefix(line, []byte("event:"))
		if !ok {
			continue
		}
		v = bytes.TrimSuffix(bytes.TrimPrefix(v, []byte(" ")), []byte("\r"))
		for _, t := range types {
			if string(v) == t {
				return true
			}
		}
	}
	return false
}

// responseID is the "id" of a Responses API answer (a JSON object), "" when it has none that
// can name a stored response.
func responseID(body []byte) string {
	raw, ok := oai.Field(body, "id")
	if !ok {
		return ""
	}
	var id string
	if json.Unmarshal(raw, &id) != nil || !oai.ValidResponseID(id) {
		return ""
	}
	return id
}

// streamResponseID is the response id of a Responses stream's events b (whole events): the
// "response" object's id in the first event that carries one (response.created), "" when b
// has none.
func streamResponseID(b []byte) string {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
		if !ok {
			continue
		}
		var ev struct {
			Response *struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal(bytes.TrimSpace(data), &ev) == nil && ev.Response != nil && oai.ValidResponseID(ev.Response.ID) {
			return ev.Response.ID
		}
	}
	return ""
}

// loadLoRA asks the engine at base to load adapter l (vLLM's POST /v1/load_lora_adapter). An
// engine that has it loaded already says so with a 400 naming it "already" loaded, which is as
// good as a load.
func loadLoRA(ctx context.Context, tr Upstream, base string, l *router.LoRALoad, id string, th traceHeader) error {
	body, _ := json.Marshal(struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}{l.Name, l.Path})
	h := http.Header{"Content-Type": jsonContentType, "X-Request-Id": {id}}
	th.set(h)
	req, err := upstreamRequest(ctx, "", base+"/v1/load_lora_adapter", body, h)
	if err != nil {
		return err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, noRouteProbe))
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusBadRequest && bytes.Contains(head, []byte("already")):
		return nil
	}
	return statusError{what: "loading the LoRA adapter", status: resp.StatusCode}
}
