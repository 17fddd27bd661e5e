package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// snapshotKV answers every Subscribe with an empty snapshot and holds the stream open.
type snapshotKV struct {
	kvv1.UnimplementedKvEventsServer
}

func (snapshotKV) Subscribe(_ *kvv1.SubscribeRequest, st grpc.ServerStreamingServer[kvv1.KvEvent]) error {
	if err := st.Send(&kvv1.KvEvent{Seq: 1, Kind: kvv1.KvEvent_CLEARED}); err != nil {
		return err
	}
	<-st.Context().Done()
	return nil
}

// TestEvictionEmptiesTheEngineTables (R20, bounds): under precise_prefix, a worker that
// reports kv_events has a subscription and an engine connection; once it stops heartbeating
// and is evicted, both go (the subscription first, then the connection under it): the
// subscriber's and the connections' tables are empty.
func TestEvictionEmptiesTheEngineTables(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	kvv1.RegisterKvEventsServer(gs, snapshotKV{})
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.RoutePolicy = config.PolicyPrecisePrefix
	cfg.Gateway.HeartbeatInterval, cfg.Gateway.HeartbeatMissLimit = 50*time.Millisecond, 2
	a, err := Start(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
	}()
	conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	beat := func() {
		if _, err := controlv1.NewWorkerRegistryClient(conn).Heartbeat(context.Background(), &controlv1.WorkerStatus{
			WorkerId: "w1", Model: "smol", HttpAddress: "127.0.0.1:9", GrpcAddress: lis.Addr().String(), KvEvents: true,
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Heartbeating (its deadline is 100 ms) until its subscription is up.
	gwtest.Eventually(t, "subscribed over one connection", func() bool {
		beat()
		return a.kvs.Len() == 1 && a.engines.Len() == 1
	})
	gwtest.Eventually(t, "evicted: no subscription, no connection", func() bool { return a.kvs.Len() == 0 && a.engines.Len() == 0 })
}
