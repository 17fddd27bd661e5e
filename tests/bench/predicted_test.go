package bench

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// BenchmarkPredictedLatencyPick is predicted_latency's pick as the router makes it (R18.2):
// the request is installed (SetLatencyRequest, the approximate index of BenchmarkPolicyPick,
// an objective of 200 ms), the policy predicts every candidate's TTFT and picks, the
// reservation is recorded. Every member's model has been trained (three kinds of speed), so
// every prediction does the model's arithmetic. "shared" is one system prompt every worker
// holds: every worker is stamped as a holder of the deepest match.
func BenchmarkPredictedLatencyPick(b *testing.B) {
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
			st := newPrefixState(c.n, c.systems)
			p := policy.NewPredictedLatency(0)
			members := make([]policy.Member, c.n)
			r := rand.New(rand.NewPCG(1, 1))
			for i := range members {
				members[i].ID = fmt.Sprintf("worker-%04d", i)
				p.Add(&members[i], int64(i%7), 1)
				slope := []float64{200, 100, 50}[i%3]
				for range 20 {
					x := ttftmodel.Features(int64(r.IntN(16)), r.IntN(4000))
					policy.Observe(&members[i], x, 5+3*x[ttftmodel.Load]+slope*x[ttftmodel.KTokens])
				}
			}
			inflight := make([]*policy.Member, 2*c.n)
			samples := make([]time.Duration, 0, b.N/batch+1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				t0 := time.Now()
				for j := i; j < i+batch; j++ {
					p.SetLatencyRequest(st.idx, st.queries[j%len(st.queries)], 200)
					m, _ := p.Pick(0, nil)
					hold(p, inflight, j, m)
				}
				samples = append(samples, time.Since(t0))
			}
			b.StopTimer()
			reportPercentiles(b, samples)
		})
	}
}
