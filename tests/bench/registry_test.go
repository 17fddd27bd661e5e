package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/policy"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/proctest"
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

// BenchmarkHeartbeatIngest runs `tlgw serve` as its own process (pinned to one core) with 10,000 registered
// workers, sends heartbeats to it over real gRPC on loopback (64 senders, 8 connections), and
// reports the gateway process's CPU per heartbeat (from /proc) and the share of one core that
// 10,000 workers at T = 2 s (5,000 heartbeats/s) would use. Target ≤ 25%.
func BenchmarkHeartbeatIngest(b *testing.B) {
	needTools(b)
	const workers = 10000
	dir := b.TempDir()
	bin, err := proctest.Build(dir, "github.com/tlgw/tlgw/cmd/tlgw")
	if err != nil {
		b.Fatal(err)
	}
	// The gateway runs pinned to its own core (serverCore), as in the proxy benchmark;
	// tests/bench/heartbeat.sh pins this process, the senders, to the other.
	cfgPath := filepath.Join(dir, "tlgw.toml")
	if err := os.WriteFile(cfgPath, []byte("[gateway]\nhttp_listen = \"127.0.0.1:0\"\nregistry_listen = \"127.0.0.1:0\"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	p := proctest.Start(b, "taskset", []string{"-c", serverCore, bin, "serve", "--config", cfgPath})
	const conns = 8
	clients := make([]controlv1.WorkerRegistryClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
	send := func(count int) {
		var wg sync.WaitGroup
		const senders = 64
		per := (count + senders - 1) / senders
		for g := 0; g < senders; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := g * per; i < (g+1)*per && i < count; i++ {
					if _, err := clients[g%conns].Heartbeat(context.Background(), status(i%workers)); err != nil {
						b.Error(err)
						return
					}
				}
			}(g)
		}
		wg.Wait()
	}
	send(workers) // register everybody first
	c0, err := p.CPUTime()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	send(b.N)
	b.StopTimer()
	c1, err := p.CPUTime()
	if err != nil {
		b.Fatal(err)
	}
	per := (c1 - c0) / time.Duration(b.N)
	b.ReportMetric(float64(per.Nanoseconds())/1000, "gateway-cpu-µs/heartbeat")
	b.ReportMetric(float64(per)*5000/float64(time.Second)*100, "%core@10k-workers")

	// The target's own scenario: every worker once per T = 2 s, paced (5,000/s) for 4 s, and
	// the gateway's CPU over that wall time.
	const rate, seconds = workers / 2, 10
	c0, _ = p.CPUTime()
	start := time.Now()
	var wg sync.WaitGroup
	const senders = 50 // each paces rate/senders heartbeats a second
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			tick := time.NewTicker(time.Second * senders / rate)
			defer tick.Stop()
			for i := g; i < rate*seconds; i += senders {
				<-tick.C
				if _, err := clients[g%conns].Heartbeat(context.Background(), status(i%workers)); err != nil {
					b.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	wall := time.Since(start)
	c1, _ = p.CPUTime()
	b.ReportMetric(float64(c1-c0)/float64(wall)*100, "%core-paced@5000/s")
}

// BenchmarkHeartbeatPath is one heartbeat of an already registered worker through the actors
// (registry → worker → router, the ack from the registry's table) among 10,000 workers, without
// gRPC: its allocs/op are the actors' own per heartbeat.
func BenchmarkHeartbeatPath(b *testing.B) {
	const n = 10000
	h := gwtest.New(b)
	infos := make([]router.WorkerInfo, n)
	for w := range infos {
		infos[w] = gwtest.Worker(fmt.Sprintf("worker-%05d", w), "smol", int64(w%4))
		if _, err := h.GW.Heartbeat(infos[w]); err != nil {
			b.Fatal(err)
		}
	}
	h.Eventually("all routable", func() bool { r, _ := h.GW.Routable(); return r == n })
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := h.GW.Heartbeat(infos[i%n]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryPrefixIndexes fills the two prefix indexes to their default bound (4,096 chunk
// ids for each of 1,000 workers, every id distinct: the most memory they can hold per entry)
// and reports what an entry and a worker at the bound cost: the approximate index of
// prefix_aware (what the gateway sent) and the exact one of precise_prefix (what the engines
// report). Each is on top of BenchmarkMemoryPerWorker's figure, for a worker whose cache is full.
// gc-ms is a full collection's wall time with the index live (the process's whole heap is this
// index and the test's own): what each of the gateway's collections pays to mark it.
func BenchmarkMemoryPrefixIndexes(b *testing.B) {
	const n, prompts, chunks = 1000, 64, 64 // 64 prompts of 64 chunks: 4,096 ids a worker
	id := func(w, p, c int) uint64 { return uint64(w*prompts*chunks + p*chunks + c + 1) }
	report := func(b *testing.B, used uint64, entries int) {
		if entries != n*prompts*chunks {
			b.Fatalf("%d entries, want %d", entries, n*prompts*chunks)
		}
		t0 := time.Now()
		runtime.GC()
		b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, "gc-ms")
		b.ReportMetric(float64(used)/float64(entries), "B/entry")
		b.ReportMetric(float64(used)/n, "B/worker")
	}
	hashes := make([]uint64, chunks)
	b.Run("approximate", func(b *testing.B) {
		for range b.N {
			before := heapInUse()
			x := prefixindex.New(0)
			for w := range n {
				worker := fmt.Sprintf("worker-%04d", w)
				for p := range prompts {
					for c := range hashes {
						hashes[c] = id(w, p, c)
					}
					x.Record(worker, hashes)
				}
			}
			report(b, heapInUse()-before, x.Entries())
			runtime.KeepAlive(x)
		}
	})
	b.Run("exact", func(b *testing.B) {
		for range b.N {
			before := heapInUse()
			x := kvindex.New[*policy.Member](0)
			members := make([]policy.Member, n)
			for w := range members {
				for p := range prompts {
					for c := range hashes {
						hashes[c] = id(w, p, c)
					}
					x.Store(&members[w], hashes)
				}
			}
			report(b, heapInUse()-before, x.Entries())
			runtime.KeepAlive(x)
		}
	})
}
