package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
)

// Engines is the gateway's client of the engines' EngineControl and KvTransferService (R8),
// with one lazily dialled connection per address, kept for reuse.
type Engines struct {
	mu sync.Mutex
	// conns: one per gRPC or KV address a pick named (only registered workers' addresses reach
	// here). An address goes when its worker is evicted (Forget) or moves away from it
	// (Moved), so the pool is bounded by the addresses live workers advertise, two per worker
	// at most ([registry] max_workers).
	conns map[string]*grpc.ClientConn
}

var _ request.Engines = (*Engines)(nil)

// NewEngines returns an empty client set.
func NewEngines() *Engines { return &Engines{conns: make(map[string]*grpc.ClientConn)} }

func (e *Engines) conn(addr string) (*grpc.ClientConn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("engine address %q: %w", addr, err)
	}
	e.conns[addr] = c
	return c, nil
}

// Forget closes the connections to addrs (an evicted engine's): nothing dials it any more,
// and a later call to the same address dials afresh. Empty addresses are ignored.
func (e *Engines) Forget(addrs ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, addr := range addrs {
		if c := e.conns[addr]; c != nil {
			_ = c.Close()
			delete(e.conns, addr)
		}
	}
}

// Moved closes the connections to the addresses a live engine left (a heartbeat changed its
// grpc_address or kv_address, old to cur): nothing dials them for it any more. An address it
// still uses, in either role, stays.
func (e *Engines) Moved(old, cur router.WorkerInfo) {
	var left []string
	for _, addr := range [...]string{old.GRPCAddress, old.KVAddress} {
		if addr != cur.GRPCAddress && addr != cur.KVAddress {
			left = append(left, addr)
		}
	}
	e.Forget(left...)
}

// Len is the number of open connections.
func (e *Engines) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.conns)
}

// Close closes every connection.
func (e *Engines) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for addr, c := range e.conns {
		_ = c.Close()
		delete(e.conns, addr)
	}
}

// MaxControlAnswer bounds an engine's answer to Prefill or Release on the wire. Both are a few
// numbers and a handle id; gRPC's default would take 4 MiB.
const MaxControlAnswer = 64 << 10

// errInvalidHandle: a Prefill answer whose KV handle id the gateway will not carry.
var errInvalidHandle = errors.New("prefill answer: invalid KV handle id")

// validHandleID checks a KV handle id from a prefill worker before the gateway holds it: the
// id goes to the decode worker in the X-TL-KV-Handle header and back to it in Release, so it
// must be 1 to MaxField bytes of visible ASCII (no space, no control byte). A bad id is the
// prefill worker's failure (a failover that counts against it), not the decode worker's, whose
// request would otherwise be refused for it.
func validHandleID(id string) error {
	if id == "" || len(id) > MaxField {
		return fmt.Errorf("%w: %d bytes (1 to %d allowed)", errInvalidHandle, len(id), MaxField)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: byte %d is %#x (visible ASCII allowed)", errInvalidHandle, i, c)
		}
	}
	return nil
}

// Prefill implements request.Engines: EngineControl/Prefill on the prefill worker.
func (e *Engines) Prefill(ctx context.Context, grpcAddr string, call request.PrefillCall) (request.PrefillResult, error) {
	c, err := e.conn(grpcAddr)
	if err != nil {
		return request.PrefillResult{}, err
	}
	s := call.Sampling
	resp, err := enginev1.NewEngineControlClient(c).Prefill(ctx, &enginev1.PrefillRequest{
		RequestId: call.RequestID, Model: call.Model, PromptIds: call.PromptIDs, DecodeTarget: call.DecodeTarget,
		Sampling: &enginev1.SamplingParams{
			MaxTokens: s.MaxTokens, Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK,
			Seed: s.Seed, Logprobs: s.Logprobs, Stop: s.Stop,
		},
	}, grpc.MaxCallRecvMsgSize(MaxControlAnswer))
	if err != nil {
		if enginev1.IsDecodeTarget(err) {
			return request.PrefillResult{}, fmt.Errorf("%w: %w", request.ErrDecodeTarget, err)
		}
		return request.PrefillResult{}, err
	}
	h := resp.GetHandle()
	if err := validHandleID(h.GetHandleId()); err != nil {
		return request.PrefillResult{}, err
	}
	return request.PrefillResult{
		HandleID: h.GetHandleId(), NumBlocks: h.GetNumBlocks(), NumTokens: h.GetNumTokens(),
		FirstToken: resp.GetFirstToken(), FirstLogprob: resp.GetFirstLogprob(), DrawsConsumed: resp.GetRngDrawsConsumed(),
	}, nil
}

// Release implements request.Engines: KvTransferService/Release on the decode worker.
func (e *Engines) Release(ctx context.Context, kvAddr, handleID string) error {
	c, err := e.conn(kvAddr)
	if err != nil {
		return err
	}
	_, err = kvv1.NewKvTransferServiceClient(c).Release(ctx, &kvv1.KvHandle{HandleId: handleID}, grpc.MaxCallRecvMsgSize(MaxControlAnswer))
	return err
}
