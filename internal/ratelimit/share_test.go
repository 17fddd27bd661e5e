package ratelimit

import (
	"slices"
	"testing"
	"time"
)

// fleet is a model of n replicas' limiters on one fake clock, exchanging their usage once a
// second: what each publishes at the end of a second, the others use for the whole next one
// (an exchange interval of 1 s and a delay of up to 1 s).
type fleet struct {
	f        *fakeNow
	ls       []*Limiter
	exchange bool // false: no peers' usage, every replica takes ⌈limit / n⌉ (before the fix)
	// admitted[s] is the requests the whole fleet admitted in second s of the run (bounded by
	// the run's seconds).
	admitted []int64
	refused  int64
}

func newFleet(n int, exchange bool) *fleet {
	f := &fakeNow{t: time.Unix(1_000_000, 0)}
	fl := &fleet{f: f, exchange: exchange}
	for range n {
		fl.ls = append(fl.ls, New(f.now))
	}
	fl.publish() // the replicas' first exchange: nothing published yet
	return fl
}

// publish gives every replica the others' usage as of now.
func (fl *fleet) publish() {
	if !fl.exchange {
		return
	}
	us := make([][]KeyUsage, len(fl.ls))
	for i, l := range fl.ls {
		us[i] = l.Usage()
	}
	for i, l := range fl.ls {
		var others [][]KeyUsage
		for j := range fl.ls {
			if j != i {
				others = append(others, us[j])
			}
		}
		l.SetPeers(NewPeers(others...))
	}
}

// second sends, within one second, each replica i's share of reqs requests of key 0 with
// limit rpm (route(j) names the replica of the second's j-th request), then publishes.
func (fl *fleet) second(rpm int64, reqs int, route func(j int) int) {
	var got int64
	step := time.Second / time.Duration(reqs+1)
	start := fl.f.t
	for j := range reqs {
		fl.f.t = start.Add(time.Duration(j) * step)
		l := fl.ls[route(j)]
		if _, ok := l.Allow(0, l.Share(0, Limits{RPM: rpm}, len(fl.ls))); ok {
			got++
		} else {
			fl.refused++
		}
	}
	fl.admitted = append(fl.admitted, got)
	fl.f.t = start.Add(time.Second)
	fl.publish()
}

// maxWindow is the most the fleet admitted in any 60 whole seconds of the run.
func (fl *fleet) maxWindow() int64 {
	var best, sum int64
	for i, a := range fl.admitted {
		sum += a
		if i >= Slots {
			sum -= fl.admitted[i-Slots]
		}
		best = max(best, sum)
	}
	return best
}

// split70 routes the j-th request of a second of 9 … by a 70/20/10 split over 3 replicas,
// counted over the whole run so the split is exact every 10 requests.
func split70(counter *int) func(int) int {
	return func(int) int {
		k := *counter % 10
		*counter++
		switch {
		case k < 7:
			return 0
		case k < 9:
			return 1
		}
		return 2
	}
}

// TestEvenShareRefusesUnevenTraffic measures the error of ⌈limit / replicas⌉ (before the
// exchange): a key at 90% of rpm 600 (9 requests a second) over 3 replicas split 70/20/10.
// Replica 0 sees 378 a minute against a share of 200: after the first minute it refuses
// 178 of every 540 (33%) while the cluster admits 362 of the 600 it may.
func TestEvenShareRefusesUnevenTraffic(t *testing.T) {
	fl := newFleet(3, false)
	c := 0
	const seconds = 300
	for range seconds {
		fl.second(600, 9, split70(&c))
	}
	total := int64(9 * seconds)
	// 5 minutes: replica 0 admits 200 per window of 60 s, i.e. 200·5 = 1000 of its 1890.
	if fl.refused != 890 {
		t.Fatalf("refused %d of %d, want 890 (replica 0's 1890 capped at 200 a minute)", fl.refused, total)
	}
	if w := fl.maxWindow(); w != 362 {
		t.Fatalf("most admitted in a window %d, want 362 (200 + 108 + 54)", w)
	}
	if fb := fl.ls[0].Fallbacks(); fb == 0 {
		t.Fatal("the even share was not counted as a fallback")
	}
	t.Logf("before: refused %d of %d (%.1f%%), most admitted in a window %d of 600", fl.refused, total, 100*float64(fl.refused)/float64(total), fl.maxWindow())
}

// TestSharedShareAdmitsUnevenTraffic: the same traffic with the exchange refuses nothing, and
// the cluster never admits over the limit.
func TestSharedShareAdmitsUnevenTraffic(t *testing.T) {
	fl := newFleet(3, true)
	c := 0
	const seconds = 300
	for range seconds {
		fl.second(600, 9, split70(&c))
	}
	if fl.refused != 0 {
		t.Fatalf("refused %d of %d, want 0", fl.refused, 9*seconds)
	}
	if w := fl.maxWindow(); w != 540 {
		t.Fatalf("most admitted in a window %d, want 540 (all of the traffic)", w)
	}
	if fb := fl.ls[0].Fallbacks(); fb != 0 {
		t.Fatalf("%d fallbacks with the exchange running", fb)
	}
}

// TestSharedShareOverLimitWithinBound: a key sending twice its rpm, whose traffic moves from
// replica to replica every 7 s (the worst case for shares that follow traffic), is held within
// the documented bound: limit + what the fleet admits in one exchange interval (here the
// exchange delay is 1 s) + one per replica.
func TestSharedShareOverLimitWithinBound(t *testing.T) {
	const rpm, perSecond, seconds = 600, 20, 600
	fl := newFleet(3, true)
	for s := range seconds {
		hot := (s / 7) % 3
		fl.second(rpm, perSecond, func(j int) int {
			if j%10 < 8 {
				return hot
			}
			return (hot + 1 + j%2) % 3
		})
	}
	var perInterval int64
	for _, a := range fl.admitted {
		perInterval = max(perInterval, a)
	}
	bound := rpm + perInterval + 3
	w := fl.maxWindow()
	if w > bound {
		t.Fatalf("most admitted in a window %d, over the bound %d", w, bound)
	}
	// It still admits nearly the limit: under-admission is what moved in the last second.
	if w < rpm*9/10 {
		t.Fatalf("most admitted in a window %d: under 90%% of %d", w, rpm)
	}
	t.Logf("moving overload: most admitted in a window %d (limit %d, bound %d)", w, rpm, bound)
}

// TestShareFormula: the worked example of the package comment, the cap, the floor and the
// share never being 0.
func TestShareFormula(t *testing.T) {
	for _, c := range []struct {
		name             string
		limit, d, od, oc int64
		n                int
		want             int64
	}{
		{"worked example, replica 0", 600, 378, 162, 162, 3, 398},
		{"worked example, replica 1", 600, 108, 432, 432, 3, 128},
		{"worked example, replica 2", 600, 54, 486, 486, 3, 74},
		{"idle key: the even share", 600, 0, 0, 0, 3, 200},
		{"over the limit: in proportion, with a floor", 600, 900, 300, 100, 3, 20 + 405},
		{"no demand here, the rest elsewhere: the floor", 600, 0, 1200, 500, 3, 20},
		{"the others hold the limit: 1, never 0", 600, 50, 600, 600, 3, 1},
		{"capped by what the others hold", 600, 500, 100, 300, 2, 300},
		{"no limit", 0, 5, 5, 5, 3, 0},
	} {
		if got := share(c.limit, c.d, c.od, c.oc, c.n); got != c.want {
			t.Errorf("%s: share %d, want %d", c.name, got, c.want)
		}
	}
}

// TestUsageCountsDemand: refusals of each limit count as demand; a key with nothing in the
// window and nothing held is not published.
func TestUsageCountsDemand(t *testing.T) {
	f, l := newFake()
	lim := Limits{RPM: 1, TPM: 100, InFlight: 1}
	allow(t, l, 3, lim)
	if _, ok := l.Allow(3, lim); ok {
		t.Fatal("second request allowed over rpm 1")
	}
	if !l.Enter(3, lim) || l.Enter(3, lim) {
		t.Fatal("max_in_flight 1 not enforced")
	}
	_, held, ok := l.Reserve(3, lim, 80)
	if !ok {
		t.Fatal("reservation refused")
	}
	if _, _, ok := l.Reserve(3, lim, 30); ok {
		t.Fatal("reservation over tpm allowed")
	}
	want := []KeyUsage{{Key: 3, Usage: Usage{Requests: 1, RequestDemand: 2, Tokens: 80, TokenDemand: 110, InFlight: 1, InFlightDemand: 2}}}
	if got := l.Usage(); len(got) != 1 || got[0] != want[0] {
		t.Fatalf("usage %+v, want %+v", got, want)
	}
	l.Settle(3, held, 0)
	l.Leave(3)
	f.advance(Window)
	if got := l.Usage(); len(got) != 0 {
		t.Fatalf("usage of an idle key after a window: %+v", got)
	}
}

// BenchmarkAdmit is the limiter's work per request of a limited key in a cluster of 3:
// "even" is the share before the exchange (⌈limit / replicas⌉), "shared" the share that
// follows the replicas' traffic (one atomic load, one map lookup and one pass over the
// key's 60 buckets). Neither calls etcd. Each reports p99_ns, the 99th percentile of one
// Share + Allow.
func BenchmarkAdmit(b *testing.B) {
	for _, c := range []struct {
		name  string
		peers *Peers
	}{
		{"even", nil},
		{"shared", NewPeers([]KeyUsage{{Key: 0, Usage: Usage{Requests: 100, RequestDemand: 100}}},
			[]KeyUsage{{Key: 0, Usage: Usage{Requests: 50, RequestDemand: 50}}})},
	} {
		b.Run(c.name, func(b *testing.B) {
			f, l := newFake()
			l.SetPeers(c.peers)
			lim := Limits{RPM: 1 << 40, TPM: 1 << 40, InFlight: 1 << 20}
			lat := make([]time.Duration, 0, min(b.N, 1<<20)) // bounded: the first 1 Mi requests
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				l.Allow(0, l.Share(0, lim, 3))
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
				if i%1000 == 999 {
					f.advance(time.Second / 10) // the window slides as traffic flows
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99_ns")
		})
	}
}
