package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/sim/sampler"
)

// controlServer is EngineControl on the gRPC listener (prefill and unified engines).
type controlServer struct {
	enginev1.UnimplementedEngineControlServer
	e *Engine
}

// Prefill runs a request's prefill: the prompt is admitted like any request (its KV allocated,
// the prefill cost paid on the clock), the first token is sampled, the prompt's KV is pushed to
// decode_target, and the engine's own sequence is freed (its full blocks stay in the prefix
// cache). Whatever fails, the engine holds nothing for the request afterwards.
func (s controlServer) Prefill(ctx context.Context, req *enginev1.PrefillRequest) (resp *enginev1.PrefillResponse, err error) {
	e := s.e
	defer func() { e.met.grpc("Prefill", err) }()
	params, err := e.prefillParams(req)
	if err != nil {
		return nil, err
	}
	if err := e.faultStatus(ctx); err != nil {
		return nil, err
	}
	prompt := req.GetPromptIds()
	seq, cached, err := e.sched.admit(ctx, prompt, e.cfg.BlockSize)
	if err != nil {
		if errors.Is(err, errTooLong) {
			return nil, status.Errorf(codes.InvalidArgument, "%v (%d tokens)", err, len(prompt))
		}
		return nil, grpcError(ctx, err)
	}
	defer e.sched.release(seq)
	if err := e.sleep(ctx, time.Duration(len(prompt)-cached)*e.cfg.PrefillPerToken); err != nil {
		return nil, grpcError(ctx, err)
	}
	gen := sampler.NewGenerator(e.cfg.Model, prompt, params)
	first := &kvv1.KvBlock{Model: e.cfg.Model, FirstToken: sampler.EOS}
	if tok, _, ok := gen.Next(); ok {
		first.FirstToken, first.FirstLogprob = tok.ID, float32(tok.Logprob)
	}
	first.RngDrawsConsumed = gen.Draws()
	handle, err := e.push(ctx, req.GetDecodeTarget(), req.GetRequestId(), prompt, first)
	if err != nil {
		e.log.Warn("prefill: KV push failed", "request", req.GetRequestId(), "decode_target", req.GetDecodeTarget(), "err", err)
		return nil, err
	}
	return &enginev1.PrefillResponse{Handle: handle, FirstToken: first.FirstToken,
		FirstLogprob: first.FirstLogprob, RngDrawsConsumed: first.RngDrawsConsumed}, nil
}

// grpcError turns a failed wait into a status: the caller's own cancellation or deadline, else
// Unavailable (the engine is stopping).
func grpcError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

// prefillParams validates a PrefillRequest with the ranges the HTTP surface accepts and returns
// its sampling parameters.
func (e *Engine) prefillParams(req *enginev1.PrefillRequest) (sampler.Params, error) {
	bad := func(format string, args ...any) (sampler.Params, error) {
		return sampler.Params{}, status.Errorf(codes.InvalidArgument, format, args...)
	}
	sp := req.GetSampling()
	switch {
	case req.GetModel() != e.cfg.Model:
		return bad("model %q: this engine serves %q", req.GetModel(), e.cfg.Model)
	case len(req.GetPromptIds()) == 0:
		return bad("prompt_ids must not be empty")
	case req.GetDecodeTarget() == "":
		return bad("decode_target (the decode worker's KV address) is required")
	case sp == nil:
		return bad("sampling is required (every field, with the defaults for omitted ones)")
	case sp.GetMaxTokens() < 1:
		return bad("sampling.max_tokens must be at least 1, got %d", sp.GetMaxTokens())
	case math.IsNaN(sp.GetTemperature()) || sp.GetTemperature() < 0 || sp.GetTemperature() > 2:
		return bad("sampling.temperature must be between 0 and 2, got %v", sp.GetTemperature())
	case math.IsNaN(sp.GetTopP()) || sp.GetTopP() <= 0 || sp.GetTopP() > 1:
		return bad("sampling.top_p must be in (0, 1], got %v", sp.GetTopP())
	case sp.GetTopK() < -1:
		return bad("sampling.top_k must be ≥ 0 (or -1 for off), got %d", sp.GetTopK())
	case len(sp.GetStop()) > 4:
		return bad("sampling.stop holds at most 4 strings, got %d", len(sp.GetStop()))
	}
	for i, id := range req.GetPromptIds() {
		if id >= sampler.VocabSize {
			return bad("prompt_ids[%d] = %d is not a token id (vocabulary size %d)", i, id, sampler.VocabSize)
		}
	}
	return sampler.Params{
		MaxTokens:   int(min(sp.GetMaxTokens(), math.MaxInt32)),
		Temperature: sp.GetTemperature(),
		TopP:        sp.GetTopP(),
		TopK:        int(max(sp.GetTopK(), 0)),
		Stop:        sp.GetStop(),
		Seed:        sp.GetSeed(),
	}, nil
}

// push streams the prompt's KV to target's KvTransferService, one block per KV block, the first
// carrying first's fields, and returns the handle target answers. A target that cannot be
// reached or fails the push is Unavailable (ResourceExhausted when it has no room), with the
// DECODE_TARGET detail (enginev1.DecodeTargetError: the gateway blames the decode worker); the
// caller's own cancellation or deadline passes through.
func (e *Engine) push(ctx context.Context, target, requestID string, prompt []uint32, first *kvv1.KvBlock) (*kvv1.KvHandle, error) {
	fail := func(err error) (*kvv1.KvHandle, error) {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		code := codes.Unavailable
		if status.Code(err) == codes.ResourceExhausted {
			code = codes.ResourceExhausted
		}
		return nil, enginev1.DecodeTargetError(code, fmt.Sprintf("decode target %s: %s", target, status.Convert(err).Message()))
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream on every early return: the target then holds nothing
	stream, err := kvv1.NewKvTransferServiceClient(conn).Push(ctx)
	if err != nil {
		return fail(err)
	}
	bs := e.cfg.BlockSize
	for i := 0; i*bs < len(prompt); i++ {
		toks := prompt[i*bs : min((i+1)*bs, len(prompt))]
		b := &kvv1.KvBlock{RequestId: requestID, Index: uint32(i), TokenIds: toks, Data: kvPayload(uint32(i), toks)}
		if i == 0 {
			b.Model, b.FirstToken, b.FirstLogprob, b.RngDrawsConsumed = first.Model, first.FirstToken, first.FirstLogprob, first.RngDrawsConsumed
		}
		if err := stream.Send(b); err != nil {
			// A broken stream's status comes from CloseAndRecv; Send reports only io.EOF.
			if _, rerr := stream.CloseAndRecv(); rerr != nil {
				err = rerr
			}
			return fail(err)
		}
	}
	h, err := stream.CloseAndRecv()
	if err != nil {
		return fail(err)
	}
	return h, nil
}

// sleep waits d on the engine's clock; it returns early when ctx ends or the engine stops.
func (e *Engine) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	done := make(chan struct{})
	t := e.cfg.Clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-e.stop:
		t.Stop()
		return errStopping
	}
}

// errStopping: the engine is shutting down mid-request; like a dying process, it cuts the
// connection instead of finishing the answer.
var errStopping = errors.New("engine stopping")
