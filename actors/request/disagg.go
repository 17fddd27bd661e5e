package request

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// samplingWire reads the sampling fields of a client's body for the Prefill call.
type samplingWire struct {
	MaxTokens           *int
	MaxCompletionTokens *int
	Temperature         *float64
	TopP                *float64
	TopK                *int
	Seed                *int64
	Logprobs            json.RawMessage
	Stop                json.RawMessage
}

// saturateU32 is a client's token count as the contract's uint32: a negative one is 0 and one
// past 2³²−1 is 2³²−1 (the engine caps it at what it can do, as it would the JSON number),
// never the count modulo 2³² that a plain conversion gives (2³² + 16 would become 16).
func saturateU32(v int) uint32 { return uint32(min(max(int64(v), 0), math.MaxUint32)) }

// ParseSampling reads every sampling field, with the contract's defaults for the omitted ones
// (R8.3: max_tokens 16, temperature 1.0, top_p 1.0, top_k 0 = off, logprobs false, stop none),
// and whether the client gave a seed.
func ParseSampling(body []byte) (Sampling, bool, error) {
	var w samplingWire
	// Each field is read under its exact name, as the engines' parsers read it (R13.4):
	// "Max_Tokens" is another key, not max_tokens.
	for _, f := range []struct {
		name string
		dst  any
	}{
		{"max_tokens", &w.MaxTokens}, {"max_completion_tokens", &w.MaxCompletionTokens},
		{"temperature", &w.Temperature}, {"top_p", &w.TopP}, {"top_k", &w.TopK}, {"seed", &w.Seed},
		{"logprobs", &w.Logprobs}, {"stop", &w.Stop},
	} {
		if raw, ok := oai.Field(body, f.name); ok {
			if err := json.Unmarshal(raw, f.dst); err != nil {
				return Sampling{}, false, fmt.Errorf("%q: %v", f.name, err)
			}
		}
	}
	s := Sampling{MaxTokens: 16, Temperature: 1, TopP: 1}
	switch {
	case w.MaxCompletionTokens != nil:
		s.MaxTokens = saturateU32(*w.MaxCompletionTokens)
	case w.MaxTokens != nil:
		s.MaxTokens = saturateU32(*w.MaxTokens)
	}
	if w.Temperature != nil {
		s.Temperature = *w.Temperature
	}
	if w.TopP != nil {
		s.TopP = *w.TopP
	}
	if w.TopK != nil && *w.TopK > 0 {
		s.TopK = int32(min(int64(*w.TopK), math.MaxInt32)) // a larger k keeps every token too
	}
	seeded := w.Seed != nil
	if seeded {
		s.Seed = uint64(*w.Seed)
	}
	lp := string(bytes.TrimSpace(w.Logprobs))
	s.Logprobs = lp != "" && lp != "null" && lp != "false"
	if st := bytes.TrimSpace(w.Stop); len(st) > 0 && string(st) != "null" {
		var one string
		if json.Unmarshal(st, &one) == nil {
			if one != "" {
				s.Stop = []string{one}
			}
		} else if err := json.Unmarshal(st, &s.Stop); err != nil {
			return Sampling{}, false, fmt.Errorf(`"stop" must be a string or an array of strings`)
		}
	}
	return s, seeded, nil
}

// drawSeed draws a seed for a client that sent none (R8.2), in int64 range so JSON engines
// read it back.
func drawSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// tokenize asks the prefill worker for the prompt's token ids (Tokenizing).
func (r *requestActor) tokenize(c actor.Context) {
	if !r.seedFixed && r.promptIDs == nil {
		s, seeded, err := ParseSampling(r.x.Body)
		if err != nil {
			r.fail(c, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest))
			return
		}
		if !seeded {
			s.Seed = drawSeed()
		}
		r.sampling, r.seed, r.seedFixed = s, s.Seed, true
	}
	p := r.picked
	body, err := oai.RewriteModel(r.x.Body, p.ServedModel)
	if err != nil {
		r.fail(c, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest))
		return
	}
	url, tr := "http://"+p.Prefill.HTTPAddress+"/v1/tokenize", r.d.Transport
	clk, timeout := r.clock(), r.controlTimeout()
	th := r.tr.startPrefill(p) // tokenize and Prefill are the prefill stage
	r.runIO(c, func(ctx context.Context, gen int) any {
		ctx, cancel := withClockTimeout(ctx, clk, timeout, errControlTimeout)
		defer cancel()
		res := tokenizeCall(ctx, tr, url, body, th)
		res.gen, res.err = gen, controlErr(ctx, res.err)
		return res
	})
}

// tokenizeCall is POST /v1/tokenize on the prefill worker.
func tokenizeCall(ctx context.Context, tr Upstream, url string, body []byte, th traceHeader) tokenized {
	h := http.Header{"Content-Type": jsonContentType}
	th.set(h)
	req, err := upstreamRequest(ctx, "", url, body, h)
	if err != nil {
		return tokenized{err: err}
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return tokenized{err: err}
	}
	defer resp.Body.Close()
	most := maxTokenIDs(len(body))
	limit := maxTokenizeAnswer(most)
	raw, err := readBounded(resp.Body, resp.ContentLength, limit, nil)
	if errors.Is(err, errAnswerTooLarge) {
		return tokenized{err: fmt.Errorf("tokenize answer: over %d bytes for a %d-byte request", limit, len(body))}
	}
	if err != nil {
		return tokenized{err: fmt.Errorf("tokenize answer: %w", err)}
	}
	if resp.StatusCode != http.StatusOK {
		return tokenized{err: fmt.Errorf("%w: %s", statusError{what: "tokenize", status: resp.StatusCode}, bytes.TrimSpace(raw))}
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return tokenized{err: fmt.Errorf("tokenize answer: %v", err)}
	}
	if len(out.Tokens) > most {
		return tokenized{err: fmt.Errorf("tokenize answer: %d token ids for a %d-byte request (at most %d)", len(out.Tokens), len(body), most)}
	}
	return tokenized{ids: out.Tokens}
}

// maxTokenIDs is the most token ids a prefill worker's tokenize answer may hold for a request
// body of n bytes: a tokenizer makes at most one token of each byte of the text (byte-level
// BPE, or byte fallback), the body's JSON holds more bytes than its text, and templateTokens
// leaves room for what a chat template adds (role markers, a default system prompt). So an
// engine's answer is bounded by the request it answers, and a small request cannot make the
// gateway read and hold megabytes of ids.
func maxTokenIDs(n int) int { return n + templateTokens }

const templateTokens = 4096

// maxTokenizeAnswer bounds the bytes of a tokenize answer of at most ids token ids: each id at
// most 10 digits and a separator, and room for the JSON around them and the answer's other
// fields.
func maxTokenizeAnswer(ids int) int { return 11*ids + 4096 }

func (r *requestActor) stepTokenizing(c actor.Context, msg any) {
	m, ok := msg.(tokenized)
	if !ok {
		return
	}
	p := r.picked
	if m.err != nil {
		r.failover(c, fmt.Errorf("prefill worker %s: %w", p.Prefill.WorkerID, m.err))
		return
	}
	r.promptIDs = m.ids
	r.become(Prefilling)
	call := PrefillCall{RequestID: r.x.ID, Model: p.ServedModel, PromptIDs: m.ids, Sampling: r.sampling,
		DecodeTarget: p.KVAddress}
	at, engines := Endpoint{WorkerID: p.Prefill.WorkerID, Reg: p.Prefill.Reg, Addr: p.Prefill.GRPCAddress}, r.d.Engines
	clk, timeout := r.clock(), r.controlTimeout()
	th := r.tr.startPrefill(p)
	r.runIO(c, func(ctx context.Context, gen int) any {
		ctx, cancel := withClockTimeout(ctx, clk, timeout, errControlTimeout)
		defer cancel()
		res, err := engines.Prefill(th.outgoing(ctx), at, call)
		return prefilled{gen: gen, res: res, err: controlErr(ctx, err)}
	})
}

// stepPrefilling takes the Prefill's answer: the handle pushed to the decode worker, which the
// actor holds from here until the decode stream consumes it or it is released.
func (r *requestActor) stepPrefilling(c actor.Context, msg any) {
	m, ok := msg.(prefilled)
	if !ok {
		return
	}
	p := r.picked
	if m.err == nil {
		r.kvHandle, r.kvAt = m.res.HandleID, kvEndpoint(p)
	}
	if r.gone {
		r.endIO() // the client left while the Prefill ran (leave waited for its answer)
		r.release(c, r.finishing(statusClientGone))
		return
	}
	if m.err != nil {
		r.failover(c, fmt.Errorf("prefill on %s: %w", p.Prefill.WorkerID, m.err))
		return
	}
	r.releaseWorker(c, p.Prefill.Worker, router.OutcomeSuccess) // the prefill worker's part is done
	r.d.Metrics.pdPhase(p.PDProtocol, pdPhasePrefill, time.Since(r.pdAt))
	r.pdAt = time.Now()
	r.become(Attempting)
	r.startAttempt(c)
}

// kvEndpoint is where the KV handle pushed for pick p is released: its decode worker's KV
// address, as that worker's registration advertised it.
func kvEndpoint(p *router.Picked) Endpoint {
	return Endpoint{WorkerID: p.WorkerID, Reg: p.WorkerReg, Addr: p.KVAddress}
}
