package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMemoryPerWorker registers 10,000 workers (a worker actor, the registry entry and
// the router's slot and policy index each) and reports the heap they hold. Target ≤ 16 KiB.
func BenchmarkMemoryPerWorker(b *testing.B) {
	const n = 10000
	for _, pol := range []string{"least_outstanding", "affinity"} {
		b.Run(pol, func(b *testing.B) {
			var perWorker float64
			for i := 0; i < b.N; i++ {
				h := gwtest.New(b, gwtest.WithPolicy(pol))
				before := heapInUse()
				for w := 0; w < n; w++ {
					if _, err := h.GW.Heartbeat(gwtest.Worker(fmt.Sprintf("worker-%05d", w), "smol", 0)); err != nil {
						b.Fatal(err)
					}
				}
				h.Eventually("all routable", func() bool { r, _ := h.GW.Routable(); return r == n })
				perWorker = float64(heapInUse()-before) / n
			}
			b.ReportMetric(perWorker, "B/worker")
		})
	}
}

// BenchmarkHeartbeatIngest sends heartbeats over real gRPC on loopback from 64 engines'
// worth of connections to a running gateway with 10,000 registered workers, and reports the
// process CPU per heartbeat (client and server both count: an upper bound for the gateway)
// and the share of one core that 10,000 workers at T = 2 s (5,000 heartbeats/s) would use.
func BenchmarkHeartbeatIngest(b *testing.B) {
	const workers = 10000
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = a.Shutdown(context.Background()) }()
	const conns = 8
	clients := make([]controlv1.WorkerRegistryClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		clients[i] = controlv1.NewWorkerRegistryClient(conn)
	}
	status := func(w int) *controlv1.WorkerStatus {
		return &controlv1.WorkerStatus{WorkerId: fmt.Sprintf("engine-%05d", w), Model: "smol",
			HttpAddress: "127.0.0.1:9", QueueDepth: int32(w % 4), KvTotalBlocks: 1024, KvFreeBlocks: 512}
	}
	send := func(from, to int) {
		var wg sync.WaitGroup
		per := (to - from + 63) / 64
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := from + g*per; i < from+(g+1)*per && i < to; i++ {
					if _, err := clients[g%conns].Heartbeat(context.Background(), status(i%workers)); err != nil {
						b.Error(err)
						return
					}
				}
			}(g)
		}
		wg.Wait()
	}
	send(0, workers) // register everybody first
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ResetTimer()
	c0 := cpu()
	send(0, b.N)
	used := cpu() - c0
	b.StopTimer()
	per := used / time.Duration(b.N)
	b.ReportMetric(float64(per.Microseconds()), "cpu-µs/heartbeat")
	b.ReportMetric(float64(per)*5000/float64(time.Second)*100, "%core@10k-workers")
}
