// Package bench holds tlgw's hot-path benchmarks. Run ./tests/bench/pick.sh for the pick
// figures (p50/p99 per pick and allocations at 4, 64 and 1,000 workers, each policy).
package bench

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/actormetrics"
	"github.com/tlgw/tlgw/internal/gopool"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/prefixindex"
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
						hold(p, inflight, j, m)
					}
					samples = append(samples, time.Since(t0))
				}
				b.StopTimer()
				reportPercentiles(b, samples)
			})
		}
	}
}

// asInProduction runs the harness's actors as internal/app runs them: each kind's own mailbox
// metrics, on pooled goroutines (the pool closes when b ends).
func asInProduction(b *testing.B) gwtest.Option {
	am, pool := actormetrics.New(prometheus.NewRegistry()), gopool.New(0)
	b.Cleanup(pool.Close)
	return gwtest.WithActorOptions(func(kind string) []actor.PropsOption {
		return append(am.Options(kind), actor.WithDispatcher(pool))
	})
}

// BenchmarkRouterPickRoundTrip is a pick through the router actor: the request, the router's
// work, the reply (then the Release a requester sends). The actors run as the gateway runs
// them (internal/app): each kind's own mailbox, on pooled goroutines.
func BenchmarkRouterPickRoundTrip(b *testing.B) {
	for _, name := range policy.Names() {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/workers=%d", name, n), func(b *testing.B) {
				h := gwtest.New(b, gwtest.WithPolicy(name), asInProduction(b))
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

// prefixState is a prefix index as a fleet of n workers builds it: system prompts of 2 KiB
// (32 chunks), 64 of them each living on three workers (or one living on every worker), and
// every worker's history of 96 conversations (a system prompt, or an unrelated stem on a worker
// no system prompt lives on, plus a distinct 1 KiB turn) filling its default blocks and
// evicting. The queries are new prompts: a system prompt and a turn never seen.
type prefixState struct {
	idx     *prefixindex.Index
	queries [][]uint64
}

var prefixStates = map[[2]int]*prefixState{} // by workers and system prompts

// benchPrompt is n bytes decided by (a, b): equal for equal seeds, unrelated otherwise.
func benchPrompt(a, b uint64, n int) []byte {
	p := make([]byte, n)
	s := a*0x9e3779b97f4a7c15 ^ b*0xc2b2ae3d27d4eb4f ^ 0x165667b19e3779f9
	for i := 0; i+8 <= n; i += 8 {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		binary.LittleEndian.PutUint64(p[i:], s)
	}
	return p
}

// newPrefixState builds (once) the state of n workers with this many system prompts.
func newPrefixState(n, systems int) *prefixState {
	if st := prefixStates[[2]int{n, systems}]; st != nil {
		return st
	}
	const sysBytes, turnBytes, perWorker = 2048, 1024, 96
	sys := make([][]byte, systems)
	for k := range sys {
		sys[k] = benchPrompt(1, uint64(k), sysBytes)
	}
	// System prompt k lives on workers k·s … k·s+r−1 (mod n); one system prompt lives on all.
	r, s := min(3, n), max(1, n/systems)
	if systems == 1 {
		r = n
	}
	home := make([][]int, n)
	for k := range systems {
		for j := range r {
			w := (k*s + j) % n
			home[w] = append(home[w], k)
		}
	}
	st := &prefixState{idx: prefixindex.New(0)}
	var hs []uint64
	buf := make([]byte, 0, sysBytes+turnBytes)
	for i := range n {
		id := fmt.Sprintf("worker-%04d", i)
		for c := range perWorker {
			buf = buf[:0]
			if len(home[i]) > 0 {
				buf = append(buf, sys[home[i][c%len(home[i])]]...)
			} else {
				buf = append(buf, benchPrompt(2, uint64(i*perWorker+c), sysBytes)...)
			}
			buf = append(buf, benchPrompt(3, uint64(i*perWorker+c), turnBytes)...)
			hs = prefixindex.Hashes(hs, buf)
			st.idx.Record(id, hs)
		}
	}
	st.queries = make([][]uint64, 1024)
	for q := range st.queries {
		p := append(append([]byte(nil), sys[q%systems]...), benchPrompt(4, uint64(q), turnBytes)...)
		st.queries[q] = prefixindex.Hashes(nil, p)
	}
	prefixStates[[2]int{n, systems}] = st
	return st
}

// BenchmarkPrefixAwarePick is prefix_aware's scored pick as the router makes it, over a full
// prefix index: the new prompt's hashes are at hand, the prefix is installed, the policy picks,
// and the reservation is recorded (SetLoad), with the ring of completions of BenchmarkPolicyPick.
//
// The "shared" cases are the widest: one system prompt that every worker holds, so every
// worker ties at the deepest match and the pick compares them by load. The "scan" cases score
// every member by Match instead (SetScores), the O(n) pick the index spares.
func BenchmarkPrefixAwarePick(b *testing.B) {
	type bcase struct {
		kind    string // "", "shared/" or "scan/"
		n       int
		systems int
	}
	var cases []bcase
	for _, n := range sizes {
		cases = append(cases, bcase{"", n, 64})
	}
	for _, n := range sizes[1:] {
		cases = append(cases, bcase{"shared/", n, 1})
	}
	for _, n := range sizes {
		cases = append(cases, bcase{"scan/", n, 64})
	}
	for _, c := range cases {
		n := c.n
		b.Run(fmt.Sprintf("%sworkers=%d", c.kind, n), func(b *testing.B) {
			st := newPrefixState(n, c.systems)
			p := policy.NewPrefixAware(0)
			members := make([]policy.Member, n)
			for i := range members {
				members[i].ID = fmt.Sprintf("worker-%04d", i)
				p.Add(&members[i], int64(i%7), 1)
			}
			var q []uint64
			score := func(id string) int { return st.idx.Match(id, q) } // made once, as a router would
			inflight := make([]*policy.Member, 2*n)
			prefixed := 0
			samples := make([]time.Duration, 0, b.N/batch+1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				t0 := time.Now()
				for j := i; j < i+batch; j++ {
					q = st.queries[j%len(st.queries)]
					if c.kind == "scan/" {
						p.SetScores(score)
					} else {
						p.SetPrefix(st.idx, q)
					}
					m, reason := p.Pick(0, nil)
					if reason == policy.ReasonPrefix {
						prefixed++
					}
					hold(p, inflight, j, m)
				}
				samples = append(samples, time.Since(t0))
			}
			b.StopTimer()
			reportPercentiles(b, samples)
			b.ReportMetric(float64(prefixed)/float64(max(b.N, 1)), "prefix-share")
		})
	}
}

// BenchmarkPrefixRecord is the other half of a prefix_aware (or predicted_latency) pick in the
// router: recording the dispatched prompt's chunks on the picked worker (prefixindex.Record),
// over a full index (newPrefixState: every worker at its 4,096-chunk bound, so each new chunk
// evicts one). The prompts are one of the 64 system prompts (2 KiB, 32 chunks the index has
// seen on three workers) and a turn never seen, 3 KiB and 16 KiB in all, recorded on the
// workers in turn: mostly on a worker that holds none of the prompt, so every chunk is new to
// it (a prefix pick sends a prompt where its prefix is, and then only the rest is new). Reports
// ns per Record and per chunk.
func BenchmarkPrefixRecord(b *testing.B) {
	b.Cleanup(func() { // the states recorded into are not the ones the pick benchmarks expect
		for _, n := range sizes {
			delete(prefixStates, [2]int{n, 64})
		}
	})
	for _, n := range sizes[1:] {
		for _, kib := range []int{3, 16} {
			b.Run(fmt.Sprintf("workers=%d/prompt=%dKiB", n, kib), func(b *testing.B) {
				st := newPrefixState(n, 64)
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("worker-%04d", i)
				}
				qs := make([][]uint64, 1024)
				for q := range qs {
					p := append(benchPrompt(1, uint64(q%64), 2048), benchPrompt(5, uint64(q), kib<<10-2048)...)
					qs[q] = prefixindex.Hashes(nil, p)
				}
				next := 0
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if i%len(qs) == 0 && i > 0 { // the turns were recorded: new ones
						b.StopTimer()
						next++
						for q := range qs {
							p := append(benchPrompt(1, uint64(q%64), 2048), benchPrompt(uint64(6+next), uint64(q), kib<<10-2048)...)
							qs[q] = prefixindex.Hashes(qs[q], p)
						}
						b.StartTimer()
					}
					st.idx.Record(ids[i%n], qs[i%len(qs)])
				}
				b.StopTimer()
				per := float64(b.Elapsed().Nanoseconds()) / float64(max(b.N, 1))
				b.ReportMetric(per, "ns/record")
				b.ReportMetric(per/float64(kib*16), "ns/chunk")
			})
		}
	}
}

// hold counts pick j on m in a ring of in-flight picks: each pick adds load to its member, and
// the pick len(inflight) earlier completes.
func hold(p policy.Policy, inflight []*policy.Member, j int, m *policy.Member) {
	p.SetLoad(m, m.Load()+1)
	slot := j % len(inflight)
	if old := inflight[slot]; old != nil {
		p.SetLoad(old, old.Load()-1)
	}
	inflight[slot] = m
}

// BenchmarkPrefixPickRoundTrip is a prefix_aware pick through the router actor with the
// prompt's chunk hashes, over the router's own index filled by 320,000 picks of 3 KiB prompts (a
// 2 KiB system prompt of 64 and a 1 KiB turn never seen: 16 new chunks a pick, 5,120 a worker,
// past its 4,096-chunk bound), each pick a new such prompt: the pick, its record in the index
// and the reply. "back-to-back" sends the next pick as soon as the last is answered; "spaced"
// waits 200 µs between picks, so the router's goroutine is parked when each pick comes (what a
// request at low load meets). Reports the round trip's p50 and p99.
func BenchmarkPrefixPickRoundTrip(b *testing.B) {
	const n, perWorker, gap = 1000, 320, 200 * time.Microsecond
	h := gwtest.New(b, gwtest.WithPolicy("prefix_aware"), gwtest.WithPrefixIndex(0), asInProduction(b))
	for i := range n {
		if _, err := h.GW.Heartbeat(gwtest.Worker(fmt.Sprintf("worker-%04d", i), "smol", 0)); err != nil {
			b.Fatal(err)
		}
	}
	h.Eventually("all registered", func() bool { r, _ := h.GW.Routable(); return r == n })
	prompt := func(k, turn uint64) []uint64 {
		return prefixindex.Hashes(nil, append(benchPrompt(1, k%64, 2048), benchPrompt(8, turn, 1024)...))
	}
	pick := func(hs []uint64) time.Duration {
		t0 := time.Now()
		res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: "r", PrefixHashes: hs})
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		h.GW.Release(res)
		return d
	}
	turn := uint64(0)
	for range n * perWorker { // fill the index as traffic would
		turn++
		pick(prompt(turn, turn))
	}
	for _, mode := range []string{"back-to-back", "spaced"} {
		b.Run(mode, func(b *testing.B) {
			qs := make([][]uint64, b.N)
			for i := range qs {
				turn++
				qs[i] = prompt(turn, turn)
			}
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				if mode == "spaced" {
					for t := time.Now(); time.Since(t) < gap; {
					}
				}
				samples = append(samples, pick(qs[i]))
			}
			b.StopTimer()
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "p50-ns/pick")
			b.ReportMetric(float64(samples[(len(samples)-1)*99/100].Nanoseconds()), "p99-ns/pick")
		})
	}
}
