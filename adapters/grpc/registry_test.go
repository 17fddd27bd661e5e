package grpcapi_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/gwtest"
)

type rig struct {
	*gwtest.Harness
	client controlv1.WorkerRegistryClient
	conn   *grpc.ClientConn
}

func newRig(t *testing.T) *rig {
	t.Helper()
	return newRigWith(t, grpcapi.Options{}, nil)
}

// newRigWith serves the registry with o (and server options srv) on loopback; dial are the
// client's dial options (default: insecure).
func newRigWith(t *testing.T, o grpcapi.Options, srv []grpc.ServerOption, dial ...grpc.DialOption) *rig {
	t.Helper()
	return newRigGW(t, gwtest.New(t), o, srv, dial...)
}

func newRigGW(t *testing.T, h *gwtest.Harness, o grpcapi.Options, srv []grpc.ServerOption, dial ...grpc.DialOption) *rig {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := grpcapi.NewListener(h.GW, o, srv...)
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Serve(lis) }()
	t.Cleanup(func() { l.Stop(context.Background()); <-done })
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(lis.Addr().String(), dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rig{Harness: h, client: controlv1.NewWorkerRegistryClient(conn), conn: conn}
}

func (r *rig) beat(t *testing.T, st *controlv1.WorkerStatus) *controlv1.HeartbeatAck {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := r.client.Heartbeat(ctx, st)
	if err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	return ack
}

func status1(id string) *controlv1.WorkerStatus {
	return &controlv1.WorkerStatus{
		WorkerId: id, HttpAddress: "127.0.0.1:8001", GrpcAddress: "127.0.0.1:9001", KvAddress: "127.0.0.1:7001",
		Role: controlv1.Role_ROLE_UNIFIED, Model: "smol", QueueDepth: 1, Running: 2,
		KvFreeBlocks: 100, KvTotalBlocks: 1024,
	}
}

// TestRegistryOverGRPC: a real gRPC heartbeat on loopback makes a worker routable; a drain sets
// drain in the ack and removes it from routing; a worker reporting draining is not routable.
func TestRegistryOverGRPC(t *testing.T) {
	r := newRig(t)
	ack := r.beat(t, status1("w1"))
	if ack.GetDrain() || ack.GetEpoch() != 1 || ack.GetHeartbeatIntervalMs() != 2000 {
		t.Fatalf("ack = %v", ack)
	}
	r.Eventually("w1 routable", func() bool { v, ok := r.View("w1"); return ok && v.Routable })
	v, _ := r.View("w1")
	if v.Info.KVAddress != "127.0.0.1:7001" || v.Info.QueueDepth != 1 || v.Info.Running != 2 || v.Info.KVFreeBlocks != 100 {
		t.Fatalf("view = %+v", v.Info)
	}
	if got := r.MustPick("smol"); got != "w1" {
		t.Fatalf("picked %s", got)
	}

	// Drain through the admin path: the next ack says drain and w1 leaves routing.
	if _, err := r.GW.Drain("smol", true); err != nil {
		t.Fatal(err)
	}
	if ack := r.beat(t, status1("w1")); !ack.GetDrain() {
		t.Fatal("ack after drain lacks drain: true")
	}
	r.Eventually("w1 unroutable", func() bool { v, _ := r.View("w1"); return !v.Routable })
	if _, err := r.GW.Drain("smol", false); err != nil {
		t.Fatal(err)
	}

	// An engine that reports draining is listed but not routable.
	st := status1("w2")
	st.Model = "big"
	st.Draining = true
	r.beat(t, st)
	r.Eventually("w2 listed", func() bool { _, ok := r.View("w2"); return ok })
	if v, _ := r.View("w2"); v.Routable || !v.Info.Draining {
		t.Fatalf("draining worker: %+v", v)
	}

	// Health and reflection are served on the same listener.
	hc := healthpb.NewHealthClient(r.conn)
	hr, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "tl.control.v1.WorkerRegistry"})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hr, err)
	}
	rc := reflectionpb.NewServerReflectionClient(r.conn)
	stream, err := rc.ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range rr.GetListServicesResponse().GetService() {
		found = found || s.GetName() == "tl.control.v1.WorkerRegistry"
	}
	if !found {
		t.Fatalf("reflection lists %v", rr.GetListServicesResponse().GetService())
	}
	_ = stream.CloseSend()
}

// TestHeartbeatInvalidArgument: an empty id, negative counts and the like are InvalidArgument
// and register nothing.
func TestHeartbeatInvalidArgument(t *testing.T) {
	r := newRig(t)
	bad := map[string]func(*controlv1.WorkerStatus){
		"empty id":          func(s *controlv1.WorkerStatus) { s.WorkerId = "" },
		"empty model":       func(s *controlv1.WorkerStatus) { s.Model = "" },
		"empty http":        func(s *controlv1.WorkerStatus) { s.HttpAddress = "" },
		"negative queue":    func(s *controlv1.WorkerStatus) { s.QueueDepth = -1 },
		"negative running":  func(s *controlv1.WorkerStatus) { s.Running = -3 },
		"negative free":     func(s *controlv1.WorkerStatus) { s.KvFreeBlocks = -1 },
		"negative total":    func(s *controlv1.WorkerStatus) { s.KvTotalBlocks = -1 },
		"free above total":  func(s *controlv1.WorkerStatus) { s.KvFreeBlocks = 2000 },
		"unknown role enum": func(s *controlv1.WorkerStatus) { s.Role = controlv1.Role(9) },
		"huge block size":   func(s *controlv1.WorkerStatus) { s.BlockSize = grpcapi.MaxBlockSize + 1 },
	}
	for name, mutate := range bad {
		st := status1("bad-" + name)
		mutate(st)
		_, err := r.client.Heartbeat(context.Background(), st)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if ids := r.IDs(); len(ids) != 0 {
		t.Fatalf("invalid heartbeats registered %v", ids)
	}
	// Duplicate id with a different address: the latest wins.
	r.beat(t, status1("w1"))
	st := status1("w1")
	st.HttpAddress = "127.0.0.1:8999"
	r.beat(t, st)
	r.Eventually("latest address wins", func() bool { v, _ := r.View("w1"); return v.Info.HTTPAddress == "127.0.0.1:8999" })
	if ids := r.IDs(); len(ids) != 1 {
		t.Fatalf("duplicate id made %v", ids)
	}
}

// TestHeartbeatBlockSize (R15.1): block_size reaches the router's view of the worker next to
// kv_total_blocks, so capacity = kv_total_blocks × block_size; 0 (unknown) and 1<<20 are
// accepted; a block_size over 1<<20 is InvalidArgument and changes nothing.
func TestHeartbeatBlockSize(t *testing.T) {
	r := newRig(t)
	st := status1("w1")
	st.BlockSize = 16
	r.beat(t, st)
	r.Eventually("w1 listed", func() bool { _, ok := r.View("w1"); return ok })
	v, _ := r.View("w1")
	if v.Info.BlockSize != 16 || v.Info.KVTotalBlocks != 1024 || v.Info.KVCapacityTokens() != 1024*16 {
		t.Fatalf("view = %+v, capacity %d, want block size 16 and capacity %d", v.Info, v.Info.KVCapacityTokens(), 1024*16)
	}

	bad := status1("w1")
	bad.BlockSize = grpcapi.MaxBlockSize + 1
	bad.QueueDepth = 77
	_, err := r.client.Heartbeat(context.Background(), bad)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "block_size (1048577) exceeds 1048576") {
		t.Fatalf("block_size 1<<20 + 1: %v, want InvalidArgument naming block_size", err)
	}
	if v, _ := r.View("w1"); v.Info.BlockSize != 16 || v.Info.QueueDepth != 1 {
		t.Fatalf("a refused heartbeat changed the worker: %+v", v.Info)
	}

	st.BlockSize = grpcapi.MaxBlockSize
	r.beat(t, st)
	r.Eventually("block size 1<<20", func() bool { v, _ := r.View("w1"); return v.Info.BlockSize == grpcapi.MaxBlockSize })
	st.BlockSize = 0
	r.beat(t, st)
	r.Eventually("block size unknown", func() bool { v, _ := r.View("w1"); return v.Info.BlockSize == 0 })
	if v, _ := r.View("w1"); v.Info.KVCapacityTokens() != 0 {
		t.Fatalf("unknown block size: capacity %d, want 0", v.Info.KVCapacityTokens())
	}
}
