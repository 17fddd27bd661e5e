package thunderagent

import (
	"fmt"
	"testing"
)

// BenchmarkCheck is one ask about a lane head with n programs in the ledger (acting, spread
// over 64 workers): the settling walks every program of the pool, so its cost grows with n.
func BenchmarkCheck(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			caps := make([]int64, 64)
			for i := range caps {
				caps[i] = 1 << 30
			}
			c := cfg()
			c.MaxTrackedRequests = n + 10
			g := newRig(&testing.T{}, c, caps...)
			for i := range n {
				r := g.req(fmt.Sprint("p", i), 100)
				g.run(r, g.ws[i%64].ID, 100)
			}
			head := g.req("p0", 100)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				g.p.Check(head, g.view())
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/program")
		})
	}
}
