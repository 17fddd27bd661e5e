// Package grpcapi is tlgw's gRPC surface: the WorkerRegistry service engines heartbeat to
// (SPEC B1), next to gRPC reflection and the standard health service on the same listener.
package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
)

// Registry is what the heartbeat handler needs of the actor tree (*gateway.Gateway has it).
type Registry interface {
	HeartbeatContext(ctx context.Context, info router.WorkerInfo) (*registry.Ack, error)
	HeartbeatInterval() time.Duration
}

// Server implements controlv1.WorkerRegistryServer over the registry actor.
type Server struct {
	controlv1.UnimplementedWorkerRegistryServer
	reg Registry
}

var _ controlv1.WorkerRegistryServer = (*Server)(nil)

// NewServer returns the WorkerRegistry service.
func NewServer(reg Registry) *Server { return &Server{reg: reg} }

// Heartbeat validates one status and hands it to the registry actor. A bad status is
// InvalidArgument and changes nothing.
func (s *Server) Heartbeat(ctx context.Context, st *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	info, err := Validate(st)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ack, err := s.reg.HeartbeatContext(ctx, info)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &controlv1.HeartbeatAck{
		Drain:               ack.Drain,
		Epoch:               ack.Epoch,
		HeartbeatIntervalMs: uint32(s.reg.HeartbeatInterval() / time.Millisecond),
	}, nil
}

// Validate turns a WorkerStatus into the registry's form, rejecting an empty id, model or HTTP
// address, negative counts, more free KV blocks than total, and unknown roles.
// ROLE_UNSPECIFIED is read as unified: an engine that predates roles serves both phases.
func Validate(st *controlv1.WorkerStatus) (router.WorkerInfo, error) {
	var errs []error
	if st.GetWorkerId() == "" {
		errs = append(errs, errors.New("worker_id is empty"))
	} else if len(st.GetWorkerId()) > 256 {
		errs = append(errs, errors.New("worker_id is longer than 256 bytes"))
	}
	if st.GetModel() == "" {
		errs = append(errs, errors.New("model is empty"))
	}
	if st.GetHttpAddress() == "" {
		errs = append(errs, errors.New("http_address is empty"))
	}
	for _, c := range []struct {
		name string
		v    int32
	}{
		{"queue_depth", st.GetQueueDepth()}, {"running", st.GetRunning()},
		{"kv_free_blocks", st.GetKvFreeBlocks()}, {"kv_total_blocks", st.GetKvTotalBlocks()},
	} {
		if c.v < 0 {
			errs = append(errs, fmt.Errorf("%s is negative (%d)", c.name, c.v))
		}
	}
	if st.GetKvTotalBlocks() > 0 && st.GetKvFreeBlocks() > st.GetKvTotalBlocks() {
		errs = append(errs, fmt.Errorf("kv_free_blocks (%d) exceeds kv_total_blocks (%d)", st.GetKvFreeBlocks(), st.GetKvTotalBlocks()))
	}
	var role router.Role
	switch st.GetRole() {
	case controlv1.Role_ROLE_UNSPECIFIED, controlv1.Role_ROLE_UNIFIED:
		role = router.RoleUnified
	case controlv1.Role_ROLE_PREFILL:
		role = router.RolePrefill
	case controlv1.Role_ROLE_DECODE:
		role = router.RoleDecode
	default:
		errs = append(errs, fmt.Errorf("role %d is unknown", st.GetRole()))
	}
	if len(errs) > 0 {
		return router.WorkerInfo{}, fmt.Errorf("invalid heartbeat: %w", errors.Join(errs...))
	}
	return router.WorkerInfo{
		ID: st.GetWorkerId(), Model: st.GetModel(), Role: role,
		HTTPAddress: st.GetHttpAddress(), GRPCAddress: st.GetGrpcAddress(), KVAddress: st.GetKvAddress(),
		KVFormat: st.GetKvFormat(), QueueDepth: int64(st.GetQueueDepth()), Running: int64(st.GetRunning()),
		KVFreeBlocks: int64(st.GetKvFreeBlocks()), KVTotalBlocks: int64(st.GetKvTotalBlocks()),
		Draining: st.GetDraining(),
	}, nil
}

// Listener is the registry's gRPC server: WorkerRegistry, reflection and health.
type Listener struct {
	Server *grpc.Server
	Health *health.Server
}

// NewListener builds the gRPC server with the three services registered and health SERVING.
func NewListener(reg Registry, opts ...grpc.ServerOption) *Listener {
	gs := grpc.NewServer(opts...)
	controlv1.RegisterWorkerRegistryServer(gs, NewServer(reg))
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(controlv1.WorkerRegistry_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return &Listener{Server: gs, Health: hs}
}

// Serve serves on lis until Stop.
func (l *Listener) Serve(lis net.Listener) error { return l.Server.Serve(lis) }

// Stop marks health NOT_SERVING and stops gracefully: in-flight heartbeats finish.
func (l *Listener) Stop() {
	l.Health.Shutdown()
	l.Server.GracefulStop()
}
