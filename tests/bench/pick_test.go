// Package bench holds tlgw's hot-path benchmarks. Run ./tests/bench/pick.sh for the pick
// figures (p50/p99 per pick and allocations at 4, 64 and 1,000 workers, each policy).
package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/gwtest"
)

var sizes = []int{4, 64, 1000}

// batch picks are timed together so the clock read (~20–40 ns) does not dominate a pick.
const batch = 16

// reportPercentiles adds p50 and p99 per pick, in ns, from per-batch samples.
func reportPercentiles(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	per := func(q float64) float64 {
		return float64(samples[int(q*float64(len(samples)-1))].Nanoseconds()) / batch
	}
	b.ReportMetric(per(0.50), "p50-ns/pick")
	b.ReportMetric(per(0.99), "p99-ns/pick")
}

// BenchmarkPolicyPick is the router's own work for one pick: the policy's choice plus the
// reservation (SetLoad), with requests completing so loads stay in a steady state.
// Capacities come in three classes (512, 768, 1024 blocks: a mixed fleet); the
// "weighted-distinct" case gives every worker its own capacity, weighted's worst case.
func BenchmarkPolicyPick(b *testing.B) {
	for _, variant := range append(policy.Names(), "weighted-distinct") {
		name, capacity := variant, func(i int) int64 { return int64(512 + i%3*256) }
		if variant == "weighted-distinct" {
			name, capacity = "weighted", func(i int) int64 { return int64(1000 + i) }
		}
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/workers=%d", variant, n), func(b *testing.B) {
				p, err := policy.New(name, policy.Options{})
				if err != nil {
					b.Fatal(err)
				}
				members := make([]policy.Member, n)
				for i := range members {
					members[i].ID = fmt.Sprintf("worker-%04d", i)
					p.Add(&members[i], int64(i%7), capacity(i))
				}
				// A ring of in-flight picks: each pick adds load, the pick 2n earlier completes.
				inflight := make([]*policy.Member, 2*n)
				keys := make([]uint64, 1024)
				for i := range keys {
					keys[i] = uint64(i) * 0x9e3779b97f4a7c15
				}
				samples := make([]time.Duration, 0, b.N/batch+1)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i += batch {
					t0 := time.Now()
					for j := i; j < i+batch; j++ {
						m, _ := p.Pick(keys[j%len(keys)], nil)
						p.SetLoad(m, m.Load()+1)
						slot := j % len(inflight)
						if old := inflight[slot]; old != nil {
							p.SetLoad(old, old.Load()-1)
						}
						inflight[slot] = m
					}
					samples = append(samples, time.Since(t0))
				}
				b.StopTimer()
				reportPercentiles(b, samples)
			})
		}
	}
}

// BenchmarkRouterPickRoundTrip is a pick through the router actor: the request, the router's
// work, the reply (then the Release a requester sends).
func BenchmarkRouterPickRoundTrip(b *testing.B) {
	for _, name := range policy.Names() {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/workers=%d", name, n), func(b *testing.B) {
				h := gwtest.New(b, gwtest.WithPolicy(name))
				for i := 0; i < n; i++ {
					_, err := h.GW.Heartbeat(gwtest.Worker(fmt.Sprintf("worker-%04d", i), "smol", int64(i%5)))
					if err != nil {
						b.Fatal(err)
					}
				}
				h.Eventually("all registered", func() bool { r, _ := h.GW.Routable(); return r == n })
				samples := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: "r", PrefixHash: uint64(i) * 0x9e3779b97f4a7c15})
					samples = append(samples, time.Since(t0))
					if err != nil {
						b.Fatal(err)
					}
					h.GW.Release(res)
				}
				b.StopTimer()
				slices.Sort(samples)
				b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "p50-ns/pick")
				b.ReportMetric(float64(samples[(len(samples)-1)*99/100].Nanoseconds()), "p99-ns/pick")
			})
		}
	}
}
