package grpcapi_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tlgw/tlgw/actors/request"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	enginev1 "github.com/tlgw/tlgw/contracts/tl/engine/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
)

// fakeEngine answers Prefill with its handle id, and Release with padding of its size.
type fakeEngine struct {
	enginev1.UnimplementedEngineControlServer
	kvv1.UnimplementedKvTransferServiceServer
	handle  string
	padding int // bytes of the Release answer (an unknown field the client must still read)
}

func (f *fakeEngine) Prefill(context.Context, *enginev1.PrefillRequest) (*enginev1.PrefillResponse, error) {
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

// TestPrefillHandleChecked (R13, "every byte from an engine is hostile"): a prefill worker's KV
// handle id goes on to the decode worker in a header, so one that is empty, longer than
// MaxField bytes or not visible ASCII fails the Prefill (the prefill worker's failure) and is
// never handed on; a valid one is.
func TestPrefillHandleChecked(t *testing.T) {
	f := &fakeEngine{}
	addr := startFakeEngine(t, f)
	e := grpcapi.NewEngines()
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
		res, err := e.Prefill(ctx, addr, request.PrefillCall{RequestID: "r1", Model: "smol", PromptIDs: []uint32{1, 2}})
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
	e := grpcapi.NewEngines()
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	prefill := func() error {
		_, err := e.Prefill(ctx, addr, request.PrefillCall{RequestID: "r1", Model: "smol", PromptIDs: []uint32{1}})
		return err
	}
	release := func() error { return e.Release(ctx, addr, "h1") }
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
