package fleet

import (
	"testing"
	"time"
)

// TestPredictedLatencyOnHeterogeneousFleet is docs/simulate.md's predicted_latency scenario
// at CI size: shared-prefix on a heterogeneous fleet (half, default and double speed and KV)
// at full load with a 200 ms TTFT objective. What the model shows, and this asserts: on this
// seed predicted_latency meets the objective for more requests than every other policy (seed
// 2 at this size: 0.9793 against precise_prefix's 0.9790; docs/simulate.md has larger runs), far more than
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

// TestAdmissionWithObjectives: the same fleet with the admission queue on (R18.4 with
// admission). Under predicted_latency a request no engine is predicted to serve within what is
// left of its objective waits in the gateway (while waiting can help) and is shed once its
// objective has passed: every request is either completed or shed, and the objective is met
// for as many requests as without the queue, within half a point (docs/simulate.md has the
// larger runs). A policy without predictions never waits with no busy threshold: its run is
// the same with the queue on.
func TestAdmissionWithObjectives(t *testing.T) {
	const workers, requests = 30, 4000
	run := func(admission bool) *Report {
		t.Helper()
		rep, err := Run(Options{Trace: TraceSharedPrefix, Workers: workers, Requests: requests, Load: 1.3, Seed: 1,
			Heterogeneous: true, SLOTTFT: 200 * time.Millisecond, Policies: []string{"prefix_aware", "predicted_latency"},
			Admission: admission})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("admission %v\n%s", admission, markdownOf(t, rep))
		return rep
	}
	off, on := run(false), run(true)
	if off.Results[0] != on.Results[0] {
		t.Errorf("prefix_aware differs with the queue on: %+v against %+v", on.Results[0], off.Results[0])
	}
	pl := on.Results[1]
	if pl.Completed+pl.Rejected != pl.Requests {
		t.Errorf("predicted_latency with the queue: %d completed + %d shed of %d", pl.Completed, pl.Rejected, pl.Requests)
	}
	if pl.Held == 0 || on.Results[0].Held != 0 {
		t.Errorf("held: predicted_latency %d (want some), prefix_aware %d (want none)", pl.Held, on.Results[0].Held)
	}
	if pl.SLOAttainment < off.Results[1].SLOAttainment-0.005 {
		t.Errorf("objective met for %.4f with the queue, %.4f without", pl.SLOAttainment, off.Results[1].SLOAttainment)
	}
}
