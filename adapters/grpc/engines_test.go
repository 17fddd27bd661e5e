package grpcapi_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/dnstest"
	"github.com/tlgw/tlgw/internal/engineaddr"
)

// fakeEngine answers Prefill with its handle id, and Release with padding of its size.
type fakeEngine struct {
	enginev1.UnimplementedEngineControlServer
	kvv1.UnimplementedKvTransferServiceServer
	handle  string
	padding int          // bytes of the Release answer (an unknown field the client must still read)
	calls   atomic.Int64 // Prefill calls
}

func (f *fakeEngine) Prefill(context.Context, *enginev1.PrefillRequest) (*enginev1.PrefillResponse, error) {
	f.calls.Add(1)
	r := &enginev1.PrefillResponse{Handle: &kvv1.KvHandle{HandleId: f.handle, NumBlocks: 2, NumTokens: 20}, FirstToken: 7}
	f.pad(r.ProtoReflect())
	return r, nil
}

func (f *fakeEngine) Release(context.Context, *kvv1.KvHandle) (*kvv1.ReleaseResponse, error) {
	r := &kvv1.ReleaseResponse{}
	f.pad(r.ProtoReflect())
	return r, nil
}

// pad adds f.padding bytes to m as an unknown field, which the client reads and keeps.
func (f *fakeEngine) pad(m protoreflect.Message) {
	if f.padding > 0 {
		m.SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 1000, protowire.BytesType), make([]byte, f.padding)))
	}
}

func startFakeEngine(t *testing.T, f *fakeEngine) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	enginev1.RegisterEngineControlServer(s, f)
	kvv1.RegisterKvTransferServiceServer(s, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return lis.Addr().String()
}

// registered is an Engines with worker "p" registered at addr (its gRPC and KV address), and
// the endpoint that names it.
func registered(addr string) (*grpcapi.Engines, request.Endpoint) {
	e := grpcapi.NewEngines(grpcapi.EnginesOptions{})
	e.Accept(router.WorkerInfo{ID: "p", Reg: 1, GRPCAddress: addr, KVAddress: addr}, nil)
	return e, request.Endpoint{WorkerID: "p", Reg: 1, Addr: addr}
}

// TestPrefillHandleChecked (R13, "every byte from an engine is hostile"): a prefill worker's KV
// handle id goes on to the decode worker in a header, so one that is empty, longer than
// MaxField bytes or not visible ASCII fails the Prefill (the prefill worker's failure) and is
// never handed on; a valid one is.
func TestPrefillHandleChecked(t *testing.T) {
	f := &fakeEngine{}
	addr := startFakeEngine(t, f)
	e, p := registered(addr)
	defer e.Close()
	for _, c := range []struct {
		handle string
		ok     bool
	}{
		{"0123456789abcdef0123456789abcdef", true}, // tlengine's
		{"9f1c2d3e-0000-4abc-8def-1234567890ab", true},
		{"!~", true},
		{strings.Repeat("h", grpcapi.MaxField), true},
		{"", false},
		{strings.Repeat("h", grpcapi.MaxField+1), false},
		{"h\r\nX-TL-Route: spoofed", false},
		{"two words", false},
		{"tab\there", false},
		{"del\x7f", false},
		{"caf\u00e9", false},
		{"nul\x00", false},
	} {
		f.handle = c.handle
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := e.Prefill(ctx, p, request.PrefillCall{RequestID: "r1", Model: "smol", PromptIDs: []uint32{1, 2}})
		cancel()
		switch {
		case c.ok && (err != nil || res.HandleID != c.handle || res.NumBlocks != 2 || res.FirstToken != 7):
			t.Errorf("handle %q: %+v, %v; want it accepted", c.handle, res, err)
		case !c.ok && (err == nil || res.HandleID != "" || !strings.Contains(err.Error(), "invalid KV handle id")):
			t.Errorf("handle %q: %+v, %v; want it refused as an invalid KV handle id", c.handle, res, err)
		}
	}
}

// TestControlAnswersBounded: an engine's answer to Prefill or Release over MaxControlAnswer
// bytes is refused (ResourceExhausted) instead of read whole.
func TestControlAnswersBounded(t *testing.T) {
	f := &fakeEngine{handle: "h1"}
	addr := startFakeEngine(t, f)
	e, p := registered(addr)
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	prefill := func() error {
		_, err := e.Prefill(ctx, p, request.PrefillCall{RequestID: "r1", Model: "smol", PromptIDs: []uint32{1}})
		return err
	}
	release := func() error { return e.Release(ctx, p, "h1") }
	for _, c := range []struct {
		padding int
		want    codes.Code
	}{{grpcapi.MaxControlAnswer - 64, codes.OK}, {grpcapi.MaxControlAnswer + 1, codes.ResourceExhausted}} {
		f.padding = c.padding
		for name, call := range map[string]func() error{"prefill": prefill, "release": release} {
			if err := call(); status.Code(err) != c.want {
				t.Errorf("%s with %d bytes of padding: %v, want %v", name, c.padding, err, c.want)
			}
		}
	}
}

// TestDialTimeRules (R20, issue 35 item 5): every connection Engines makes is checked on the
// IP its name resolved to. A name that a test DNS server resolves to a link-local address is
// refused, so is a loopback engine — by name or by IP — under RefuseLoopback; the refusal is
// at once (never a connect attempt that hangs), a connection never made (a dial *net.OpError)
// that says why (engineaddr.ErrRefused: the request actor counts the engine unreachable), and
// the engine behind the loopback address gets no call. Without RefuseLoopback the same name
// serves.
func TestDialTimeRules(t *testing.T) {
	eng := &fakeEngine{handle: "h1"}
	addr := startFakeEngine(t, eng)
	_, port, _ := net.SplitHostPort(addr)
	dns := dnstest.Start(t)
	dns.Set("metadata.test", netip.MustParseAddr("169.254.0.1"))
	dns.Set("engine.test", netip.MustParseAddr("127.0.0.1"))
	for _, c := range []struct {
		name  string
		rules engineaddr.Rules
		addr  string
		ok    bool
	}{
		{"a name resolving to link-local", engineaddr.Rules{}, "metadata.test:9", false},
		{"a loopback name off loopback", engineaddr.Rules{RefuseLoopback: true}, "engine.test:" + port, false},
		{"a loopback IP off loopback", engineaddr.Rules{RefuseLoopback: true}, addr, false},
		{"a name outside engine_cidrs", engineaddr.Rules{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "engine.test:" + port, false},
		{"a loopback name on loopback", engineaddr.Rules{}, "engine.test:" + port, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := grpcapi.NewEngines(grpcapi.EnginesOptions{Rules: c.rules, Resolver: dns.Resolver()})
			defer e.Close()
			e.Accept(router.WorkerInfo{ID: "p", Reg: 1, GRPCAddress: c.addr, KVAddress: c.addr}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			before, start := eng.calls.Load(), time.Now()
			_, err := e.Prefill(ctx, request.Endpoint{WorkerID: "p", Reg: 1, Addr: c.addr}, request.PrefillCall{RequestID: "r", Model: "smol", PromptIDs: []uint32{1}})
			if c.ok {
				if err != nil || eng.calls.Load() != before+1 {
					t.Fatalf("%v, %d calls", err, eng.calls.Load()-before)
				}
				return
			}
			var op *net.OpError
			if !errors.Is(err, engineaddr.ErrRefused) || !errors.As(err, &op) || op.Op != "dial" {
				t.Fatalf("%v (%T), want a dial error wrapping engineaddr.ErrRefused", err, err)
			}
			if eng.calls.Load() != before || time.Since(start) > 5*time.Second {
				t.Fatalf("the engine got %d calls; the refusal took %v", eng.calls.Load()-before, time.Since(start))
			}
			// Release, on the KV address, is refused alike.
			if err := e.Release(ctx, request.Endpoint{WorkerID: "p", Reg: 1, Addr: c.addr}, "h1"); !errors.Is(err, engineaddr.ErrRefused) {
				t.Fatalf("Release: %v", err)
			}
		})
	}
}
