package engine

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
)

// startHeartbeats sends WorkerStatus to every gateway now and then every T, each on its own
// goroutine and connection so one unreachable gateway never delays another. The interval
// follows the latest ack's heartbeat_interval_ms; an ack with drain makes the engine report
// draining from then on.
func (e *Engine) startHeartbeats() {
	for _, addr := range e.cfg.Gateways {
		e.wg.Add(1)
		go func(addr string) {
			defer e.wg.Done()
			e.heartbeatLoop(addr)
		}(addr)
	}
}

func (e *Engine) heartbeatLoop(addr string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.log.Error("heartbeat: bad gateway address", "gateway", addr, "err", err)
		return
	}
	defer conn.Close()
	client := controlv1.NewWorkerRegistryClient(conn)
	interval := e.cfg.HeartbeatInterval
	for {
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		ack, err := client.Heartbeat(ctx, e.workerStatus())
		cancel()
		if err != nil {
			e.log.Warn("heartbeat failed", "gateway", addr, "err", err)
		} else {
			if ms := ack.GetHeartbeatIntervalMs(); ms > 0 {
				interval = time.Duration(ms) * time.Millisecond
			}
			if ack.GetDrain() && !e.draining.Swap(true) {
				e.log.Info("gateway asked to drain", "gateway", addr)
			}
		}
		tick := make(chan struct{})
		t := e.cfg.Clock.AfterFunc(interval, func() { close(tick) })
		select {
		case <-tick:
		case <-e.stop:
			t.Stop()
			return
		}
	}
}

var roles = map[Role]controlv1.Role{
	RoleUnified: controlv1.Role_ROLE_UNIFIED,
	RolePrefill: controlv1.Role_ROLE_PREFILL,
	RoleDecode:  controlv1.Role_ROLE_DECODE,
}

func (e *Engine) workerStatus() *controlv1.WorkerStatus {
	st := e.Status()
	return &controlv1.WorkerStatus{
		WorkerId: e.cfg.ID, HttpAddress: e.advertisedHTTP, GrpcAddress: e.GRPCAddr, KvAddress: e.KVAddr,
		Role: roles[e.cfg.Role], Model: e.cfg.Model, KvFormat: kvFormat,
		QueueDepth: int32(st.QueueDepth), Running: int32(st.Running),
		KvFreeBlocks: int32(st.KVFreeBlocks), KvTotalBlocks: int32(st.KVTotalBlocks),
		Draining: st.Draining,
	}
}
