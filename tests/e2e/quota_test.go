package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/proctest"
)

// TestTokenQuotaKeepsRoomForOtherPools (R20, issue 35: `max_workers` was one global pool, so
// one token could take every slot and another pool's restarting engines were refused): a
// holder of pool-a's token registers as many ids as it can; with tokens[].max_workers = 4 it
// gets 4, and pool-b's engine, started afterwards as a process, registers and serves.
func TestTokenQuotaKeepsRoomForOtherPools(t *testing.T) {
	f := startFleet(t, fastHeartbeats+`
[registry]
max_workers = 8
tokens = [
  { token = "token-a", id_prefix = "a-", max_workers = 4 },
  { token = "token-b", id_prefix = "b-" },
]
`)
	conn, err := grpc.NewClient(f.gw.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := controlv1.NewWorkerRegistryClient(conn)
	took := 0
	for i := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer token-a")
		_, err := c.Heartbeat(ctx, &controlv1.WorkerStatus{WorkerId: fmt.Sprintf("a-%d", i), Model: "smol", HttpAddress: "127.0.0.1:9"})
		cancel()
		switch status.Code(err) {
		case codes.OK:
			took++
		case codes.ResourceExhausted:
		default:
			t.Fatalf("heartbeat a-%d: %v", i, err)
		}
	}
	if took != 4 {
		t.Fatalf("pool-a's token registered %d ids, want its max_workers of 4", took)
	}
	f.engines["b-1"] = proctest.StartEngine(t, tlengineBin, "--id", "b-1", "--gateway", f.gw.GRPCAddr, "--model", "smol", "--token", "token-b")
	eventually(t, "pool-b's engine registered", 10*time.Second, func() bool {
		for _, w := range f.workers(t) {
			if w.ID == "b-1" && w.Routable {
				return true
			}
		}
		return false
	})
}
