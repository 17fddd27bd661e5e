package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/policy"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// fillHeld stores in x what newPrefixState records in the approximate index: each worker
// holds 96 prompts (a system prompt of 2 KiB shared by 3 workers, or by every worker when
// systems = 1, then 1 KiB of its own), up to the index's bound.
func fillHeld(x *policy.HeldIndex, members []policy.Member, systems int) {
	const sysBytes, turnBytes, perWorker = 2048, 1024, 96
	n := len(members)
	sys := make([][]byte, systems)
	for k := range sys {
		sys[k] = benchPrompt(1, uint64(k), sysBytes)
	}
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
	var hs []uint64
	buf := make([]byte, 0, sysBytes+turnBytes)
	for i := range members {
		for c := range perWorker {
			buf = buf[:0]
			if len(home[i]) > 0 {
				buf = append(buf, sys[home[i][c%len(home[i])]]...)
			} else {
				buf = append(buf, benchPrompt(2, uint64(i*perWorker+c), sysBytes)...)
			}
			buf = append(buf, benchPrompt(3, uint64(i*perWorker+c), turnBytes)...)
			hs = prefixindex.Hashes(hs, buf)
			x.Store(&members[i], hs)
		}
	}
}

// BenchmarkPrecisePrefixPick is precise_prefix's pick as the router makes it (R18.2), over a
// full exact index: the prefix is installed (SetHeld), the policy picks, the reservation is
// recorded, with the ring of completions of BenchmarkPolicyPick. "shared" is the widest case:
// one system prompt every worker holds, so every worker is a holder of the deepest match.
func BenchmarkPrecisePrefixPick(b *testing.B) {
	type bcase struct {
		kind    string
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
	for _, c := range cases {
		b.Run(fmt.Sprintf("%sworkers=%d", c.kind, c.n), func(b *testing.B) {
			queries := newPrefixState(c.n, c.systems).queries
			p := policy.NewPrecisePrefix(0)
			x := kvindex.New[*policy.Member](0)
			members := make([]policy.Member, c.n)
			for i := range members {
				members[i].ID = fmt.Sprintf("worker-%04d", i)
				p.Add(&members[i], int64(i%7), 1)
			}
			fillHeld(x, members, c.systems)
			inflight := make([]*policy.Member, 2*c.n)
			prefixed := 0
			samples := make([]time.Duration, 0, b.N/batch+1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				t0 := time.Now()
				for j := i; j < i+batch; j++ {
					p.SetHeld(x, queries[j%len(queries)])
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

// BenchmarkExactIndexChurn is the router's work for an engine's KV events at fleet scale: 1,000
// workers hold 3,968 chunk ids each (near the default bound of 4,096), and each op is one
// worker's REMOVED of its 64 oldest ids and STORED of 64 new ones, as a busy engine evicts and
// caches. "distinct": no two workers hold an id; "shared": every id is held by 4 workers (a
// system prompt on several engines). Reports ns per id applied and the heap the index holds.
func BenchmarkExactIndexChurn(b *testing.B) {
	const n, held, batch = 1000, 3968, 64
	for _, c := range []struct {
		name  string
		share int
	}{{"distinct", 1}, {"shared", 4}} {
		b.Run(c.name, func(b *testing.B) {
			// id k of group g: the share workers g·share … g·share+share-1 hold group g's ids.
			id := func(w int, k uint64) uint64 { return uint64(w/c.share)<<32 | (k + 1) }
			before := heapInUse()
			x := kvindex.New[*policy.Member](0)
			members := make([]policy.Member, n)
			ids := make([]uint64, held)
			for w := range members {
				for k := range ids {
					ids[k] = id(w, uint64(k))
				}
				x.Store(&members[w], ids)
			}
			heap := heapInUse() - before
			oldest, next := make([]uint64, n), make([]uint64, n)
			for w := range next {
				next[w] = held
			}
			ev := make([]uint64, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w := i % n
				for k := range ev {
					ev[k] = id(w, oldest[w]+uint64(k))
				}
				x.Remove(&members[w], ev)
				oldest[w] += batch
				for k := range ev {
					ev[k] = id(w, next[w]+uint64(k))
				}
				x.Store(&members[w], ev)
				next[w] += batch
			}
			b.StopTimer()
			if x.Entries() != n*held {
				b.Fatalf("%d entries, want %d", x.Entries(), n*held)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(b.N, 1))/(2*batch), "ns/id")
			b.ReportMetric(float64(heap)/float64(n*held), "heap-B/entry")
		})
	}
}

// BenchmarkPickBehindKVEvents is how long a pick waits in the router's mailbox behind the KV
// events of a whole fleet: 1,000 precise_prefix workers each hold 3,968 chunk ids, every one
// of them has one message in the mailbox (a subscription has at most one waiting), and a pick
// arrives after them. "whole" messages carry an event of 4,096 ids (2,048 removed, 2,048
// stored), as a snapshot or a burst can; "pieces" carry grpcapi.KVPieceIDs, as the subscriber
// now sends them. Reports the pick's round trip in ms.
func BenchmarkPickBehindKVEvents(b *testing.B) {
	const n, held = 1000, 3968
	for _, c := range []struct {
		name string
		ids  int
	}{{"whole", router.MaxKVEventIDs}, {"pieces", grpcapi.KVPieceIDs}} {
		b.Run(c.name, func(b *testing.B) {
			h := gwtest.New(b, gwtest.WithPolicy("precise_prefix"))
			ids := func(w, from, k int) []uint64 {
				out := make([]uint64, k)
				for i := range out {
					out[i] = uint64(w)<<32 | uint64(from+i+1)
				}
				return out
			}
			for w := range n {
				info := gwtest.Worker(fmt.Sprintf("worker-%04d", w), "smol", 0)
				info.KVEvents = true
				if _, err := h.GW.Heartbeat(info); err != nil {
					b.Fatal(err)
				}
			}
			h.Eventually("all registered", func() bool { r, _ := h.GW.Routable(); return r == n })
			// Each worker's registration, which its subscription's events name (KVEvents.Reg).
			list, err := h.GW.Workers()
			if err != nil {
				b.Fatal(err)
			}
			regs := make(map[string]uint64, n)
			for _, w := range list.Workers {
				regs[w.Info.ID] = w.Info.Reg
			}
			apply := func(ev *router.KVEvents) {
				reply := make(chan bool, 1)
				ev.Reply = reply
				h.GW.KVEvents(ev)
				if !<-reply {
					b.Fatalf("router refused %s's events", ev.WorkerID)
				}
			}
			for w := range n {
				id := fmt.Sprintf("worker-%04d", w)
				apply(&router.KVEvents{WorkerID: id, Reg: regs[id], Stored: ids(w, 0, held)})
			}
			oldest, next := 0, held
			var waits []time.Duration
			b.ResetTimer()
			for range b.N {
				replies := make(chan bool, n)
				for w := range n {
					id := fmt.Sprintf("worker-%04d", w)
					h.GW.KVEvents(&router.KVEvents{WorkerID: id, Reg: regs[id], Reply: replies,
						Removed: ids(w, oldest, c.ids/2), Stored: ids(w, next, c.ids/2)})
				}
				t0 := time.Now()
				res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: "r"})
				waits = append(waits, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				h.GW.Release(res)
				for range n {
					if !<-replies {
						b.Fatal("router refused an event")
					}
				}
				oldest, next = oldest+c.ids/2, next+c.ids/2
			}
			b.StopTimer()
			slices.Sort(waits)
			b.ReportMetric(float64(waits[len(waits)/2].Microseconds())/1000, "p50-pick-ms")
			b.ReportMetric(float64(waits[len(waits)-1].Microseconds())/1000, "max-pick-ms")
		})
	}
}
