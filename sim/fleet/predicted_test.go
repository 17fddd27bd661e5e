package fleet

import (
	"testing"
	"time"
)

// TestPredictedLatencyOnHeterogeneousFleet is docs/simulate.md's predicted_latency scenario
// at CI size: shared-prefix on a heterogeneous fleet (half, default and double speed and KV)
// at full load with a 200 ms TTFT objective. What the model shows, and this asserts: on this
// seed predicted_latency meets the objective for more requests than every other policy (on
// seed 2 it is 0.001 behind precise_prefix; docs/simulate.md has larger runs), far more than
// the policies blind to the cache or to the engines' speed, while keeping nearly
// prefix_aware's hit rate; and every request completes.
func TestPredictedLatencyOnHeterogeneousFleet(t *testing.T) {
	const workers, requests = 30, 4000
	pols := []string{"round_robin", "least_outstanding", "affinity", "prefix_aware", "precise_prefix", "predicted_latency"}
	rep, err := Run(Options{Trace: TraceSharedPrefix, Workers: workers, Requests: requests, Load: 1, Seed: 1,
		Heterogeneous: true, SLOTTFT: 200 * time.Millisecond, Policies: pols})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", markdownOf(t, rep))
	pl := rep.Results[len(pols)-1]
	if pl.Completed != pl.Requests {
		t.Fatalf("predicted_latency completed %d of %d", pl.Completed, pl.Requests)
	}
	for _, r := range rep.Results[:len(pols)-1] {
		if pl.SLOAttainment <= r.SLOAttainment {
			t.Errorf("predicted_latency met the objective for %.4f, %s for %.4f", pl.SLOAttainment, r.Policy, r.SLOAttainment)
		}
	}
	if pa := rep.Results[3]; pl.HitRate < pa.HitRate-0.03 {
		t.Errorf("predicted_latency hit rate %.4f, prefix_aware's %.4f: more than 3 points apart", pl.HitRate, pa.HitRate)
	}
}
