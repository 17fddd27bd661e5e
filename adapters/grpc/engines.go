package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/engineaddr"
)

// Engines is the gateway's client of the engines' EngineControl and KvTransferService (R8).
// Its connections belong to the worker registrations that advertised their addresses (R20),
// never to an address shared between workers, so one worker's expiry or move never closes
// another's connection:
//
//   - Accept follows each accepted heartbeat (registry.Config.OnAccepted, on the registry's
//     goroutine): a registration's grpc_address and kv_address become the ones dialled for it,
//     and the connection to an address it left is closed at once. Forget (OnEvict) closes an
//     evicted registration's connections.
//   - A call names its registration and address (request.Endpoint) and dials, lazily, only an
//     address that registration advertises now: one connection per address per registration,
//     so at most two per registration. A call for a registration that is gone or an address
//     it left fails as a connection never made (failover), and dials nothing.
//   - Address changes are rate-limited: a registration's addresses are followed through at
//     most MaxMoves changes per MoveWindow (the window opens at its first followed change). A
//     change beyond that is ignored here: nothing dials the new address, calls naming it fail
//     as above, and the KV events subscription stays on the addresses followed (Accept returns
//     them), until a heartbeat after the window, whose addresses are then followed. One warning
//     per window names the worker. A legitimate engine moves a few times an hour (a restart on
//     a new port or pod IP); one that moves every heartbeat is probing where the gateway dials.
//   - At most MaxConns connections are open at once (ConnLimit(max_workers), which the two per
//     registration already keep to); a dial beyond it is refused like the calls above (the
//     request fails over to another worker, a subscription retries after its backoff), and
//     logged once per MoveWindow.
//   - Every connection is made by a dialer whose Control applies the engine address rules to
//     the IP a name resolved to (engineaddr.Rules.Control): a refused dial fails the call as
//     unreachable, with the refusal in its error (ErrRefused), at once and never by a hang.
type Engines struct {
	o      EnginesOptions
	dialer *net.Dialer

	mu sync.Mutex
	// owners: one per live registration that has advertised a gRPC or KV address, from its
	// first such heartbeat (Accept) to its eviction (Forget), so at most [registry] max_workers;
	// each holds at most two connections, open counts them all (≤ MaxConns).
	owners    map[string]*owner // by worker id
	open      int
	capWarned time.Time // when the connection cap was last logged
	closed    bool
}

var _ request.Engines = (*Engines)(nil)

// MaxMoves and MoveWindow rate-limit the address changes Engines follows per registration.
const (
	MaxMoves   = 3
	MoveWindow = time.Minute
)

// ConnLimit is the engine connections the gateway holds at once for max_workers registered
// workers (EnginesOptions.MaxConns): one to each one's gRPC address and one to its KV address.
func ConnLimit(maxWorkers int) int { return 2 * maxWorkers }

// EnginesOptions configure Engines. The zero value dials any address the default rules allow
// (no link-local, no unspecified), with no connection cap.
type EnginesOptions struct {
	// Rules vet each connection's resolved address (config.Config.EngineRules).
	Rules engineaddr.Rules
	// Resolver resolves engine names (nil: the default resolver).
	Resolver *net.Resolver
	// MaxConns caps the open connections (0: no cap); the gateway uses ConnLimit(max_workers).
	MaxConns int
	Clock    clock.Clock  // default: the real clock
	Logger   *slog.Logger // default: slog.Default()
}

// owner is one registration's connections.
type owner struct {
	reg      uint64
	grpc, kv string                 // the addresses followed: the only ones dialled for it
	conns    map[string]*engineConn // by address, lazily dialled: grpc's and kv's (one if equal)
	moves    moves
}

// engineConn is one connection, and what its last dial met.
type engineConn struct {
	cc *grpc.ClientConn
	// refusal is the last dial's error when the address rules refused it, nil after any other
	// dial: gRPC hands a call that could not connect only the error's text, so the call's
	// error is given the refusal back (callErr).
	refusal atomic.Pointer[error]
}

// moves counts a registration's followed address changes in the current window.
type moves struct {
	since  time.Time // the window's first followed change
	n      int       // changes followed in the window
	warned bool      // the window's ignored changes were logged
}

// allow reports whether a change at now is followed, counting it when it is: the first
// MaxMoves changes of a window are, later ones are not until MoveWindow after its first.
//
//	t=0 s A→B followed (the window opens), t=5 s B→C followed, t=9 s C→D followed,
//	t=20 s D→E ignored (D still dialled), t=60 s D→E followed (a new window opens)
func (m *moves) allow(now time.Time) bool {
	if m.n == 0 || now.Sub(m.since) >= MoveWindow {
		m.since, m.n, m.warned = now, 0, false
	}
	if m.n >= MaxMoves {
		return false
	}
	m.n++
	return true
}

// Why a call dialled nothing.
var (
	errNotRegistered = errors.New("the engine's registration is gone")
	errNotFollowed   = errors.New("the engine's registration does not advertise this address now, or its change is not followed yet")
	errTooManyConns  = errors.New("the gateway holds its most engine connections")
	errEnginesClosed = errors.New("the engine client is closed")
)

// noConn is a call's error when it dialled nothing: a dial error, which the request actor
// reads as a connection never made (a failover that takes no retry slot). It names no address.
func noConn(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }

// NewEngines returns a client with no connections.
func NewEngines(o EnginesOptions) *Engines {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Engines{
		o:      o,
		dialer: &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second, Control: o.Rules.Control, Resolver: o.Resolver},
		owners: make(map[string]*owner),
	}
}

// dialTimeout bounds one connection attempt (gRPC retries with its backoff).
const dialTimeout = 10 * time.Second

// Accept follows an accepted heartbeat of registration info.Reg (registry.Config.OnAccepted,
// on the registry's goroutine, in order with Forget) and returns info with the gRPC and KV
// addresses dialled for it: its own, or, while its changes are not followed, the ones
// followed before. then, when set, is handed that info before the connections the
// registration left are closed: a KV events subscription on one of them is moved (or stopped)
// first, and never sees its connection close under it.
func (e *Engines) Accept(info router.WorkerInfo, then func(followed router.WorkerInfo)) router.WorkerInfo {
	e.mu.Lock()
	info, left := e.accept(info)
	e.mu.Unlock()
	if then != nil {
		then(info)
	}
	for _, c := range left {
		_ = c.Close()
	}
	return info
}

// accept is Accept's decision (e.mu held): the info followed, and the connections left, already
// out of the tables, to close.
func (e *Engines) accept(info router.WorkerInfo) (router.WorkerInfo, []*grpc.ClientConn) {
	var left []*grpc.ClientConn
	o := e.owners[info.ID]
	if o != nil && o.reg != info.Reg {
		left = e.drop(info.ID, o, left) // an earlier registration's (the registry evicts it first)
		o = nil
	}
	switch {
	case e.closed:
		return info, left
	case o == nil:
		if info.GRPCAddress != "" || info.KVAddress != "" {
			e.owners[info.ID] = &owner{reg: info.Reg, grpc: info.GRPCAddress, kv: info.KVAddress, conns: make(map[string]*engineConn, 2)}
		}
		return info, left
	case o.grpc == info.GRPCAddress && o.kv == info.KVAddress:
		return info, left // every heartbeat of a worker that stays
	}
	// A move, also to no address: the owner stays until eviction, so dropping an address
	// and advertising a new one is no way round the rate.
	if !o.moves.allow(e.o.Clock.Now()) {
		if !o.moves.warned {
			o.moves.warned = true
			e.o.Logger.Warn("worker changes its engine addresses too often: its new addresses are not dialled until the window ends",
				"worker", info.ID, "max_changes", MaxMoves, "window", MoveWindow, "until", o.moves.since.Add(MoveWindow),
				"grpc", o.grpc, "kv", o.kv, "ignored_grpc", info.GRPCAddress, "ignored_kv", info.KVAddress)
		}
		info.GRPCAddress, info.KVAddress = o.grpc, o.kv
		return info, left
	}
	e.o.Logger.Info("engine connections follow the worker to its new addresses", "worker", info.ID,
		"old_grpc", o.grpc, "old_kv", o.kv, "grpc", info.GRPCAddress, "kv", info.KVAddress)
	o.grpc, o.kv = info.GRPCAddress, info.KVAddress
	for addr, c := range o.conns {
		if addr != o.grpc && addr != o.kv {
			left = e.remove(o, addr, c, left)
		}
	}
	return info, left
}

// Forget closes the connections of an evicted registration (registry.Config.OnEvict). Another
// registration's, at the same addresses or not, stay.
func (e *Engines) Forget(info router.WorkerInfo) {
	e.mu.Lock()
	var left []*grpc.ClientConn
	if o := e.owners[info.ID]; o != nil && o.reg == info.Reg {
		left = e.drop(info.ID, o, left)
	}
	e.mu.Unlock()
	for _, c := range left {
		_ = c.Close()
	}
}

// drop forgets o, appending its connections to left (e.mu held).
func (e *Engines) drop(id string, o *owner, left []*grpc.ClientConn) []*grpc.ClientConn {
	for addr, c := range o.conns {
		left = e.remove(o, addr, c, left)
	}
	delete(e.owners, id)
	return left
}

// remove takes o's connection to addr out of the tables, appending it to left (e.mu held); the
// caller closes it once the lock is released.
func (e *Engines) remove(o *owner, addr string, c *engineConn, left []*grpc.ClientConn) []*grpc.ClientConn {
	delete(o.conns, addr)
	e.open--
	return append(left, c.cc)
}

// conn is the connection of registration at.Reg of worker at.WorkerID to at.Addr, dialled on
// first use; an error (noConn) when it is not one to dial.
func (e *Engines) conn(at request.Endpoint) (*engineConn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.owners[at.WorkerID]
	switch {
	case e.closed:
		return nil, noConn(errEnginesClosed)
	case o == nil || o.reg != at.Reg:
		return nil, noConn(errNotRegistered)
	case at.Addr == "" || (at.Addr != o.grpc && at.Addr != o.kv):
		return nil, noConn(errNotFollowed)
	}
	if c := o.conns[at.Addr]; c != nil {
		return c, nil
	}
	if e.o.MaxConns > 0 && e.open >= e.o.MaxConns {
		if now := e.o.Clock.Now(); e.capWarned.IsZero() || now.Sub(e.capWarned) >= MoveWindow {
			e.capWarned = now
			e.o.Logger.Warn("engine connection refused: the gateway holds its most", "max", e.o.MaxConns, "worker", at.WorkerID)
		}
		return nil, noConn(errTooManyConns)
	}
	c := &engineConn{}
	cc, err := grpc.NewClient("passthrough:///"+at.Addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			nc, err := e.dialer.DialContext(ctx, "tcp", addr)
			if errors.Is(err, engineaddr.ErrRefused) {
				c.refusal.Store(&err)
			} else {
				c.refusal.Store(nil)
			}
			return nc, err
		}))
	if err != nil {
		return nil, noConn(err)
	}
	c.cc = cc
	o.conns[at.Addr] = c
	e.open++
	return c, nil
}

// callErr is a call's error on c, with the dial refusal that kept it from connecting: an
// Unavailable call whose last dial the address rules refused is that refusal (a *net.OpError
// wrapping engineaddr.ErrRefused: the engine is unreachable, nothing was sent).
func (c *engineConn) callErr(err error) error {
	if err == nil || status.Code(err) != codes.Unavailable {
		return err
	}
	if r := c.refusal.Load(); r != nil {
		return fmt.Errorf("%w (%v)", *r, err)
	}
	return err
}

// Len is the number of open connections.
func (e *Engines) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.open
}

// Close closes every connection; later calls dial nothing.
func (e *Engines) Close() {
	e.mu.Lock()
	e.closed = true
	var left []*grpc.ClientConn
	for id, o := range e.owners {
		left = e.drop(id, o, left)
	}
	e.mu.Unlock()
	for _, c := range left {
		_ = c.Close()
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
func (e *Engines) Prefill(ctx context.Context, at request.Endpoint, call request.PrefillCall) (request.PrefillResult, error) {
	c, err := e.conn(at)
	if err != nil {
		return request.PrefillResult{}, err
	}
	s := call.Sampling
	resp, err := enginev1.NewEngineControlClient(c.cc).Prefill(ctx, &enginev1.PrefillRequest{
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
		return request.PrefillResult{}, c.callErr(err)
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
func (e *Engines) Release(ctx context.Context, at request.Endpoint, handleID string) error {
	c, err := e.conn(at)
	if err != nil {
		return err
	}
	_, err = kvv1.NewKvTransferServiceClient(c.cc).Release(ctx, &kvv1.KvHandle{HandleId: handleID}, grpc.MaxCallRecvMsgSize(MaxControlAnswer))
	return c.callErr(err)
}
