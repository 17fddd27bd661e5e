package thunderagent

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkCheck is one ask about a lane head with n programs in the ledger (acting, spread
// over 64 workers). same_instant: asked again and again at one instant with nothing changed
// (a held head re-asked on a wake): the settling is not repeated. new_instant: the clock moves
// 1 ms before each ask, so each one settles (greedy resume and forced resume have no paused
// program to look at; pause until safe reads each worker's kept sums). Neither walks the
// programs (issue 34: every ask walked them all several times, 47 µs at 100 programs and
// 1.2 ms at 10,000).
func BenchmarkCheck(b *testing.B) {
	for _, instant := range []string{"same_instant", "new_instant"} {
		for _, n := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprint(instant, "/", n), func(b *testing.B) {
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
				step := time.Duration(0)
				if instant == "new_instant" {
					step = time.Millisecond
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					g.now = g.now.Add(step)
					g.p.Check(head, g.view())
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/program")
			})
		}
	}
}
