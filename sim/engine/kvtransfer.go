package engine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/sim/faults"
	"github.com/tlgw/tlgw/sim/kv"
)

// kvFormat is the KV block layout this engine pushes and accepts (WorkerStatus.kv_format):
// blocks of prompt tokens, each with the payload kvPayload computes. Block sizes need not
// agree: the receiver imports tokens, not blocks.
const kvFormat = 1

// kvHandle is pushed KV held for a request that will name it in X-TL-KV-Handle: the imported
// sequence (not running) and what the prefill worker sampled, so decoding can resume.
type kvHandle struct {
	id           string
	seq          *kv.Seq
	model        string
	first        uint32
	firstLogprob float32
	draws        uint64
	lease        clock.Timer
	// regenerate: the KV came for an engine protocol (R22, pd.go), which sends no first
	// token: the run samples every token itself, from its own seed.
	regenerate bool
}

// handles is the table of held KV handles. Whoever deletes a handle from the map owns its
// sequence from then on (a request consuming it, Release, the lease, or Close), so each handle's
// KV is freed exactly once.
type handles struct {
	mu sync.Mutex
	m  map[string]*kvHandle
}

func (h *handles) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}

func newHandleID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// hold registers an imported sequence under a new handle with a lease of cfg.KVLease.
func (e *Engine) hold(seq *kv.Seq, first *kvv1.KvBlock) *kvHandle {
	h := &kvHandle{id: newHandleID(), seq: seq, model: first.GetModel(), first: first.GetFirstToken(),
		firstLogprob: first.GetFirstLogprob(), draws: first.GetRngDrawsConsumed()}
	e.handles.mu.Lock()
	defer e.handles.mu.Unlock()
	e.handles.m[h.id] = h
	h.lease = e.cfg.Clock.AfterFunc(e.cfg.KVLease, func() { e.expire(h) })
	return h
}

// unhold removes h from the table if it is still there and reports whether the caller now owns
// its sequence.
func (e *Engine) unhold(h *kvHandle) bool {
	e.handles.mu.Lock()
	defer e.handles.mu.Unlock()
	if e.handles.m[h.id] != h {
		return false
	}
	delete(e.handles.m, h.id)
	h.lease.Stop()
	return true
}

// expire is h's lease running out: the KV nobody consumed or released is freed.
func (e *Engine) expire(h *kvHandle) {
	if !e.unhold(h) {
		return
	}
	e.sched.freeHeld(h.seq)
	e.met.expirations.Inc()
	e.log.Info("KV handle lease expired", "handle", h.id, "tokens", h.seq.Len())
}

// releaseHandle frees the handle named id; false when no such handle is held.
func (e *Engine) releaseHandle(id string) bool {
	e.handles.mu.Lock()
	h := e.handles.m[id]
	e.handles.mu.Unlock()
	if h == nil || !e.unhold(h) {
		return false
	}
	e.sched.freeHeld(h.seq)
	return true
}

// takeHandle consumes the handle named id for a request whose tokenized prompt is prompt. A
// handle whose tokens differ stays held (the gateway releases it, or its lease ends).
func (e *Engine) takeHandle(id string, prompt []uint32) (*kvHandle, error) {
	e.handles.mu.Lock()
	defer e.handles.mu.Unlock()
	h := e.handles.m[id]
	if h == nil {
		return nil, &apiError{status: 404, typ: "invalid_request_error", code: "kv_handle_not_found",
			msg: fmt.Sprintf("no KV handle %q is held on this engine (unknown, released, expired or already used)", id)}
	}
	if h.model != e.cfg.Model || !slices.Equal(h.seq.Tokens(), prompt) {
		return nil, &apiError{status: 400, typ: "invalid_request_error", code: "kv_handle_mismatch",
			msg: fmt.Sprintf("KV handle %q holds %d tokens of model %q that are not this request's prompt (%d tokens of %q)",
				id, h.seq.Len(), h.model, len(prompt), e.cfg.Model)}
	}
	delete(e.handles.m, id)
	h.lease.Stop()
	return h, nil
}

// dropHandles frees every held handle (the engine is closing).
func (e *Engine) dropHandles() {
	e.handles.mu.Lock()
	held := make([]*kvHandle, 0, len(e.handles.m))
	for id, h := range e.handles.m {
		h.lease.Stop()
		delete(e.handles.m, id)
		held = append(held, h)
	}
	e.handles.mu.Unlock()
	for _, h := range held {
		e.sched.freeHeld(h.seq)
	}
}

// kvPayload is a block's simulated KV: 8 bytes per token, xxHash64 of (block index, position in
// the block, token id), so a receiver can check that the payload belongs to the tokens.
func kvPayload(index uint32, tokens []uint32) []byte {
	out := make([]byte, 0, 8*len(tokens))
	var buf [12]byte
	binary.LittleEndian.PutUint32(buf[0:], index)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4:], uint32(i))
		binary.LittleEndian.PutUint32(buf[8:], t)
		out = binary.LittleEndian.AppendUint64(out, xxhash.Sum64(buf[:]))
	}
	return out
}

// kvServer is KvTransferService on the KV listener (decode and unified engines).
type kvServer struct {
	kvv1.UnimplementedKvTransferServiceServer
	e *Engine
}

// faultStatus applies the 503 and stall faults to a gRPC call.
func (e *Engine) faultStatus(ctx context.Context) error {
	switch e.cfg.Fault.Kind {
	case faults.Unavailable:
		return status.Error(codes.Unavailable, "the engine is unavailable (fault 503)")
	case faults.Stall:
		select { // accepted, never answered
		case <-ctx.Done():
		case <-e.stop:
		}
		return status.Error(codes.Unavailable, "the engine stalled (fault stall)")
	}
	return nil
}

// Push receives a prompt's blocks and imports them once the stream has ended cleanly, so a push
// that breaks off or is rejected holds nothing.
func (s kvServer) Push(stream kvv1.KvTransferService_PushServer) (err error) {
	e := s.e
	defer func() { e.met.grpc("Push", err) }()
	if err := e.faultStatus(stream.Context()); err != nil {
		return err
	}
	limit := e.cfg.KVBlocks * e.cfg.BlockSize
	var first *kvv1.KvBlock
	var tokens []uint32
	for n := uint32(0); ; n++ {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := checkBlock(b, n, first, e.cfg.Model); err != nil {
			return err
		}
		if n == 0 {
			first = b
		}
		if len(tokens)+len(b.GetTokenIds()) > limit {
			return status.Errorf(codes.ResourceExhausted, "the pushed prompt exceeds this engine's %d KV tokens", limit)
		}
		tokens = append(tokens, b.GetTokenIds()...)
	}
	if first == nil {
		return status.Error(codes.InvalidArgument, "a push needs at least one block")
	}
	seq, err := e.sched.importSeq(tokens)
	if err != nil {
		if errors.Is(err, kv.ErrNoSpace) {
			return status.Errorf(codes.ResourceExhausted, "no room for %d tokens of KV: %v", len(tokens), err)
		}
		return status.Error(codes.Internal, err.Error())
	}
	resp := &kvv1.KvHandle{NumBlocks: uint32(seq.Blocks()), NumTokens: uint32(seq.Len())}
	h := e.hold(seq, first)
	resp.HandleId = h.id
	if err := stream.SendAndClose(resp); err != nil {
		e.releaseHandle(h.id) // the pusher never learns the id: nobody could use or release it
		return err
	}
	e.log.Debug("KV pushed", "request", first.GetRequestId(), "handle", h.id, "tokens", resp.NumTokens)
	return nil
}

// checkBlock validates the n-th block of a push (first: block 0, nil while n = 0).
func checkBlock(b *kvv1.KvBlock, n uint32, first *kvv1.KvBlock, model string) error {
	switch {
	case b.GetIndex() != n:
		return status.Errorf(codes.InvalidArgument, "block %d arrived at position %d: blocks must come in order from 0", b.GetIndex(), n)
	case len(b.GetTokenIds()) == 0:
		return status.Errorf(codes.InvalidArgument, "block %d has no tokens", n)
	case string(b.GetData()) != string(kvPayload(n, b.GetTokenIds())):
		return status.Errorf(codes.InvalidArgument, "block %d: the KV payload does not match its tokens (kv_format %d)", n, kvFormat)
	}
	if first == nil {
		if b.GetModel() != model {
			return status.Errorf(codes.InvalidArgument, "the first block's model %q is not this engine's %q", b.GetModel(), model)
		}
		return nil
	}
	if b.GetRequestId() != first.GetRequestId() {
		return status.Errorf(codes.InvalidArgument, "block %d belongs to request %q, not %q", n, b.GetRequestId(), first.GetRequestId())
	}
	return nil
}

// Release frees a held handle; an unknown one answers released = false.
func (s kvServer) Release(_ context.Context, h *kvv1.KvHandle) (*kvv1.ReleaseResponse, error) {
	released := s.e.releaseHandle(h.GetHandleId())
	s.e.met.grpc("Release", nil)
	return &kvv1.ReleaseResponse{Released: released}, nil
}
