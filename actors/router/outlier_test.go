package router

import (
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/internal/config"
)

var testOutlier = config.Outlier{ConsecutiveFailures: 5, BaseEjection: 30 * time.Second,
	MaxEjection: 100 * time.Second, MaxEjectedPercent: 50}

func outlierRig(t *testing.T, o config.Outlier) (*rig, *Metrics) {
	m := NewMetrics(prometheus.NewRegistry())
	return newRig(t, Config{Outlier: o, Metrics: m}), m
}

// askEject is worker id's report whose failure streak asks for an ejection.
func (r *rig) askEject(id string, reason Outcome) {
	r.deliver(r.workers[r.workerPID(id).Id].pid, r.loadReportOf(r.workers[r.workerPID(id).Id], reason))
}

func (r *rig) row(t *testing.T, id string) WorkerView {
	t.Helper()
	for _, w := range r.st.view.list(0).Workers {
		if w.Info.ID == id {
			return w
		}
	}
	t.Fatalf("worker %s is not listed", id)
	return WorkerView{}
}

// picksOf makes n picks of model, releasing each at once, and counts them per worker.
func (r *rig) picksOf(t *testing.T, model string, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	q := r.newRequester()
	for range n {
		p := r.st.pick(&Pick{Model: model, RequestID: "x", Requester: q.pid}, r)
		if p.Err != nil {
			t.Fatalf("pick: %v", p.Err)
		}
		out[p.WorkerID]++
		q.release(p)
	}
	return out
}

// TestOutlierEjectsUntilItsTimeIsUp: an ejection request takes the worker out of every pick,
// lists it with ejected_until and the reason, counts it by reason and in the ejected state,
// and heartbeats do not bring it back; at ejected_until it is routable again.
func TestOutlierEjectsUntilItsTimeIsUp(t *testing.T) {
	r, m := outlierRig(t, testOutlier)
	for _, id := range []string{"w1", "w2", "w3"} {
		r.join(id, "smol", 0)
	}
	r.askEject("w1", Outcome5xx)
	row := r.row(t, "w1")
	if row.Routable || !row.EjectedUntil.Equal(t0.Add(30*time.Second)) || row.EjectionReason != "5xx" {
		t.Fatalf("after the ejection: %+v", row)
	}
	if got := testutil.ToFloat64(m.ejections.WithLabelValues("5xx")); got != 1 {
		t.Fatalf("tlgw_outlier_ejections_total{reason=5xx} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.workers.WithLabelValues(stateEjected)); got != 1 {
		t.Fatalf("tlgw_workers{state=ejected} = %v, want 1", got)
	}
	r.join("w1", "smol", 0) // a heartbeat: still ejected
	if n := r.picksOf(t, "smol", 20)["w1"]; n != 0 {
		t.Fatalf("an ejected worker got %d of 20 picks", n)
	}
	r.advance(30*time.Second - time.Millisecond)
	if r.row(t, "w1").Routable {
		t.Fatal("routable before its ejection ended")
	}
	r.advance(time.Millisecond)
	row = r.row(t, "w1")
	if !row.Routable || !row.EjectedUntil.IsZero() || row.EjectionReason != "" {
		t.Fatalf("after the ejection ended: %+v", row)
	}
	if n := r.picksOf(t, "smol", 30)["w1"]; n == 0 {
		t.Fatal("a worker back from its ejection gets no pick")
	}
	if got := testutil.ToFloat64(m.workers.WithLabelValues(stateEjected)); got != 0 {
		t.Fatalf("tlgw_workers{state=ejected} = %v after the end, want 0", got)
	}
}

// TestOutlierEjectionDoublesUpToMax: each ejection of a run doubles (30 s, 60 s, then capped at
// max_ejection = 100 s); a worker that serves max_ejection with no ejection starts a new run.
func TestOutlierEjectionDoublesUpToMax(t *testing.T) {
	r, _ := outlierRig(t, testOutlier)
	r.join("w1", "smol", 0)
	r.join("w2", "smol", 0)
	for i, want := range []time.Duration{30 * time.Second, 60 * time.Second, 100 * time.Second, 100 * time.Second} {
		now := r.clk.Now()
		r.askEject("w1", OutcomeTimeout)
		if got := r.row(t, "w1").EjectedUntil.Sub(now); got != want {
			t.Fatalf("ejection %d lasts %v, want %v", i+1, got, want)
		}
		r.advance(want)
		if !r.row(t, "w1").Routable {
			t.Fatalf("ejection %d did not end after %v", i+1, want)
		}
	}
	r.advance(100*time.Second - time.Millisecond)
	now := r.clk.Now()
	r.askEject("w1", OutcomeTimeout)
	if got := r.row(t, "w1").EjectedUntil.Sub(now); got != 100*time.Second {
		t.Fatalf("within max_ejection of the last one: %v, want the run to go on (100s)", got)
	}
	r.advance(100 * time.Second)
	r.advance(100 * time.Second)
	now = r.clk.Now()
	r.askEject("w1", OutcomeTimeout)
	if got := r.row(t, "w1").EjectedUntil.Sub(now); got != 30*time.Second {
		t.Fatalf("after max_ejection in service: %v, want a new run (30s)", got)
	}
}

// TestOutlierNeverEjectsPastTheCaps: with 2 of 2 workers failing only one is ejected; a lone
// worker is never ejected; with max_ejected_percent 100 one worker still stays routable; a
// worker already ejected, a report that is no failure and another model's ejections change
// nothing.
func TestOutlierNeverEjectsPastTheCaps(t *testing.T) {
	r, m := outlierRig(t, testOutlier)
	r.join("a1", "smol", 0)
	r.join("a2", "smol", 0)
	r.join("lone", "big", 0)
	r.askEject("a1", OutcomeRefused)
	r.askEject("a2", OutcomeRefused)
	r.askEject("lone", OutcomeRefused)
	if r.row(t, "a1").Routable || !r.row(t, "a2").Routable || !r.row(t, "lone").Routable {
		t.Fatalf("a1 %+v a2 %+v lone %+v", r.row(t, "a1"), r.row(t, "a2"), r.row(t, "lone"))
	}
	if got := testutil.ToFloat64(m.ejections.WithLabelValues("refused")); got != 1 {
		t.Fatalf("ejections counted %v, want 1", got)
	}
	until := r.row(t, "a1").EjectedUntil
	r.askEject("a1", OutcomeReset) // already ejected: not extended
	if !r.row(t, "a1").EjectedUntil.Equal(until) || r.row(t, "a1").EjectionReason != "refused" {
		t.Fatalf("a second request changed the ejection: %+v", r.row(t, "a1"))
	}
	r.askEject("a2", OutcomeSuccess)
	r.askEject("a2", Outcome(200))
	if !r.row(t, "a2").Routable {
		t.Fatal("a report with no failure ejected the worker")
	}

	r2, _ := outlierRig(t, config.Outlier{ConsecutiveFailures: 1, BaseEjection: time.Second, MaxEjection: time.Second, MaxEjectedPercent: 100})
	r2.join("b1", "smol", 0)
	r2.join("b2", "smol", 0)
	r2.askEject("b1", Outcome5xx)
	r2.askEject("b2", Outcome5xx)
	if r2.row(t, "b1").Routable || !r2.row(t, "b2").Routable {
		t.Fatal("max_ejected_percent = 100 left no worker of the model routable")
	}
	// A drained worker is not routable: the last routable one stays.
	r3, _ := outlierRig(t, config.Outlier{ConsecutiveFailures: 1, BaseEjection: time.Second, MaxEjection: time.Second, MaxEjectedPercent: 100})
	r3.join("c1", "smol", 0)
	r3.join("c2", "smol", 0)
	w := r3.workers[r3.workerPID("c2").Id]
	w.info.AdminDrained = true
	r3.report(w)
	r3.askEject("c1", Outcome5xx)
	if !r3.row(t, "c1").Routable {
		t.Fatal("the model's last routable worker was ejected")
	}
}

// TestOutlierEjectionEndsWithTheRegistration: a worker evicted while ejected and registered
// again starts afresh, and the old ejection's end changes nothing; ejection off (base 0) ejects
// nobody.
func TestOutlierEjectionEndsWithTheRegistration(t *testing.T) {
	r, _ := outlierRig(t, testOutlier)
	r.join("w1", "smol", 0)
	r.join("w2", "smol", 0)
	r.askEject("w1", Outcome5xx)
	r.leave("w1")
	r.join("w1", "smol", 0)
	if !r.row(t, "w1").Routable {
		t.Fatal("a new registration inherited the old ejection")
	}
	r.askEject("w1", Outcome5xx)
	until := r.row(t, "w1").EjectedUntil
	if got := until.Sub(r.clk.Now()); got != 30*time.Second {
		t.Fatalf("the new registration's first ejection lasts %v, want 30s", got)
	}
	r.deliver(nil, ejectionOver{id: "w1", seq: r.st.view.slots["w1"].ej.seq - 1}) // the old one's end
	r.deliver(nil, ejectionOver{id: "nobody", seq: 1})
	if r.row(t, "w1").Routable {
		t.Fatal("a stale ejection end put the worker back")
	}
	r.advance(30 * time.Second)
	if !r.row(t, "w1").Routable {
		t.Fatal("the ejection did not end")
	}

	// Off means off, whatever the other knobs allow.
	for _, o := range []config.Outlier{{}, {ConsecutiveFailures: 1, MaxEjection: time.Minute, MaxEjectedPercent: 100}} {
		off, _ := outlierRig(t, o)
		off.join("w1", "smol", 0)
		off.join("w2", "smol", 0)
		off.askEject("w1", Outcome5xx)
		if !off.row(t, "w1").Routable {
			t.Fatalf("ejection is off (%+v), yet the worker was ejected", o)
		}
	}
}

// TestOutlierEjectedPercentCountsTheEjected: at max_ejected_percent 50 of four workers two may
// be out at once and a third is refused while both are; once one is back, another may go.
func TestOutlierEjectedPercentCountsTheEjected(t *testing.T) {
	r, _ := outlierRig(t, testOutlier)
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		r.join(id, "smol", 0)
	}
	r.askEject("w1", Outcome5xx)
	r.advance(10 * time.Second)
	r.askEject("w2", Outcome5xx)
	if r.row(t, "w1").Routable || r.row(t, "w2").Routable {
		t.Fatal("two of four (50%) may be ejected at once")
	}
	r.askEject("w3", Outcome5xx)
	if !r.row(t, "w3").Routable {
		t.Fatal("a third of four ejected past max_ejected_percent 50")
	}
	r.advance(20 * time.Second) // w1's 30 s are up; w2 has 10 s left
	if !r.row(t, "w1").Routable || r.row(t, "w2").Routable {
		t.Fatalf("w1 %+v w2 %+v", r.row(t, "w1"), r.row(t, "w2"))
	}
	r.askEject("w3", Outcome5xx)
	if r.row(t, "w3").Routable {
		t.Fatal("with one of four out, a second may go")
	}
}

// TestOutlierEjectionEndWakesTheQueue: a request held in the admission queue while the only
// routable worker is full goes to the ejected worker the moment its ejection ends.
func TestOutlierEjectionEndWakesTheQueue(t *testing.T) {
	r := newRig(t, Config{Outlier: testOutlier, Admission: admissionCfg(nil, 1)})
	r.join("w1", "smol", 0)
	r.join("w2", "smol", 0)
	r.askEject("w1", Outcome5xx)
	if r.row(t, "w1").Routable {
		t.Fatal("w1 not ejected")
	}
	r.join("w2", "smol", 1) // full at threshold 1
	x := r.newRequester()
	x.pick("x", "smol", "")
	x.queued()
	r.advance(30*time.Second - time.Millisecond)
	x.silent()
	r.advance(time.Millisecond)
	if p := x.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("after w1's ejection ended: %+v, want w1", p)
	}
}

// TestOutlierEjectedPercentIgnoresUnreachableWorkers (R14.2, R19): max_ejected_percent is over
// the model's live workers that are not unreachable. At 40 % of three workers one of which is
// unreachable, the base is two: ejecting one (50 %) is past the cap and refused; once the
// third is reachable again (one of three, 33 %) it is allowed.
func TestOutlierEjectedPercentIgnoresUnreachableWorkers(t *testing.T) {
	o := testOutlier
	o.MaxEjectedPercent = 40
	r, _ := outlierRig(t, o)
	for _, id := range []string{"w1", "w2", "w3"} {
		r.join(id, "smol", 0)
	}
	r.unreachable("w3", true)
	r.askEject("w1", Outcome5xx)
	if row := r.row(t, "w1"); !row.Routable {
		t.Fatalf("w1 ejected past max_ejected_percent 40 (one of two reachable workers): %+v", row)
	}
	r.unreachable("w3", false)
	r.askEject("w1", Outcome5xx)
	if row := r.row(t, "w1"); row.Routable {
		t.Fatalf("w1 not ejected with one of three out (33%% ≤ 40%%): %+v", row)
	}
}

// TestOutlierEjectionLengthStaysWithinMax: the n-th ejection of a run lasts base × 2^(n−1),
// never more than max_ejection and never less than the one before — also for a max_ejection
// near the longest duration a configuration can give (no doubling overflows), and when base
// and max are equal (every ejection lasts max).
func TestOutlierEjectionLengthStaysWithinMax(t *testing.T) {
	longest := 2562047 * time.Hour // about the longest duration time.ParseDuration accepts
	for _, o := range []config.Outlier{
		{BaseEjection: time.Second, MaxEjection: longest},
		{BaseEjection: longest, MaxEjection: longest},
		{BaseEjection: 30 * time.Second, MaxEjection: 100 * time.Second},
	} {
		v := &workerView{outlier: o}
		prev := time.Duration(0)
		for n := 1; n <= 80; n++ {
			d := v.ejectionFor(n)
			if d < prev || d > o.MaxEjection || (n == 1 && d != o.BaseEjection) {
				t.Fatalf("base %v max %v: ejection %d lasts %v (the one before %v)", o.BaseEjection, o.MaxEjection, n, d, prev)
			}
			prev = d
		}
		if prev != o.MaxEjection {
			t.Fatalf("base %v max %v: the 80th ejection lasts %v, want max", o.BaseEjection, o.MaxEjection, prev)
		}
	}
}

// TestOutlierCapsCountTheWorkersOfOneRole (R14.2, R8): the ejection caps count a model's
// workers that can stand in for each other — those of the same role. A disaggregated model's
// two prefill workers, beside its decode and unified workers, keep one routable whatever their
// failures (a decode worker cannot prefill: ejecting both would take the disaggregated route
// down though "half the model's workers" are still routable); a role's lone worker is never
// ejected.
func TestOutlierCapsCountTheWorkersOfOneRole(t *testing.T) {
	r, _ := outlierRig(t, testOutlier)
	r.joinRole("p1", "smol", RolePrefill, 0)
	r.joinRole("p2", "smol", RolePrefill, 0)
	r.joinRole("d1", "smol", RoleDecode, 0)
	for _, id := range []string{"d2", "u1", "u2", "u3", "u4"} {
		role := RoleUnified
		if id == "d2" {
			role = RoleDecode
		}
		r.joinRole(id, "smol", role, 0)
	}
	r.askEject("p1", OutcomeReset)
	r.askEject("p2", OutcomeReset)
	if r.row(t, "p1").Routable || !r.row(t, "p2").Routable {
		t.Fatalf("p1 %+v\np2 %+v: want p1 ejected and p2, the last prefill worker, routable", r.row(t, "p1"), r.row(t, "p2"))
	}
	r.askEject("d1", Outcome5xx)
	r.askEject("d2", Outcome5xx)
	if r.row(t, "d1").Routable || !r.row(t, "d2").Routable {
		t.Fatalf("d1 %+v\nd2 %+v: want d1 ejected and d2 routable", r.row(t, "d1"), r.row(t, "d2"))
	}
	// The unified workers' cap is theirs: two of four may go.
	for _, id := range []string{"u1", "u2", "u3"} {
		r.askEject(id, Outcome5xx)
	}
	if r.row(t, "u1").Routable || r.row(t, "u2").Routable || !r.row(t, "u3").Routable {
		t.Fatalf("u1 %+v\nu2 %+v\nu3 %+v: want two of the four unified workers ejected", r.row(t, "u1"), r.row(t, "u2"), r.row(t, "u3"))
	}
}

// TestOutlierEjectionLengthDoublesExactly (R14.2): the n-th ejection of a run lasts exactly
// base × 2^(n−1) until that passes max_ejection, then max_ejection — also for a max_ejection
// above half the longest duration, where doubling base once more would overflow.
func TestOutlierEjectionLengthDoublesExactly(t *testing.T) {
	maxDur := big.NewInt(math.MaxInt64)
	for _, o := range []config.Outlier{
		{BaseEjection: time.Second, MaxEjection: time.Duration(math.MaxInt64 / 4 * 3)},
		// 3 s × 2^30 ≈ 0.35 × the longest duration: doubled, it stays under this max.
		{BaseEjection: 3 * time.Second, MaxEjection: time.Duration(math.MaxInt64 / 4 * 3)},
		{BaseEjection: 30 * time.Second, MaxEjection: 100 * time.Second},
	} {
		v := &workerView{outlier: o}
		for n := 1; n <= 70; n++ {
			want := new(big.Int).Lsh(big.NewInt(int64(o.BaseEjection)), uint(n-1))
			if want.Cmp(big.NewInt(int64(o.MaxEjection))) > 0 || want.Cmp(maxDur) > 0 {
				want.SetInt64(int64(o.MaxEjection))
			}
			if got := v.ejectionFor(n); int64(got) != want.Int64() {
				t.Fatalf("base %v max %v: ejection %d lasts %v, want %v", o.BaseEjection, o.MaxEjection, n, got, time.Duration(want.Int64()))
			}
		}
	}
}
