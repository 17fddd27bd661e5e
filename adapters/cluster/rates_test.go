package cluster

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/ratelimit"
)

// limClock is the limiters' clock: the test moves it; the stores' goroutines read it.
type limClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *limClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *limClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// recorder is a replica's limiter that also keeps the last peers the store handed it.
type recorder struct {
	*ratelimit.Limiter
	mu    sync.Mutex
	peers *ratelimit.Peers
	sets  int // SetPeers calls
}

func (r *recorder) SetPeers(p *ratelimit.Peers) {
	r.mu.Lock()
	r.peers, r.sets = p, r.sets+1
	r.mu.Unlock()
	r.Limiter.SetPeers(p)
}

func (r *recorder) last() (*ratelimit.Peers, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peers, r.sets
}

type rateReplica struct {
	replica
	lim *recorder
}

// startRateReplica is a replica whose limiter (on clk) takes part in the exchange; it
// publishes only when the test asks (publishRatesNow) besides its session's start.
func startRateReplica(t *testing.T, endpoint, id string, clk *limClock) rateReplica {
	t.Helper()
	got := newApplied()
	lim := &recorder{Limiter: ratelimit.New(clk.now)}
	s, err := Start(Config{
		Cluster: config.Cluster{Enabled: true, EtcdEndpoints: []string{endpoint}, Prefix: "/test/", LeaseTTL: 2 * time.Second},
		Self:    Replica{ID: id, HTTPAddress: "127.0.0.1:1", GRPCAddress: "127.0.0.1:2", StartedAt: time.Unix(1700000000, 0).UTC()},
		Apply:   got.applier(), CanaryKey: keyOf(id),
		OpTimeout: 500 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
		Rates: lim, RateInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return rateReplica{replica: replica{Store: s, got: got}, lim: lim}
}

// awaitPeers polls until every replica's limiter holds exactly the others' usage as of now
// (the limiters' clock does not move meanwhile), asking each to publish once first.
func awaitPeers(t *testing.T, rs []rateReplica) {
	t.Helper()
	for _, r := range rs {
		r.publishRatesNow()
	}
	want := make([]*ratelimit.Peers, len(rs))
	for i := range rs {
		var others [][]ratelimit.KeyUsage
		for j, o := range rs {
			if j != i {
				others = append(others, o.lim.Usage())
			}
		}
		want[i] = ratelimit.NewPeers(others...)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		ok := true
		for k, r := range rs {
			p, _ := r.lim.last()
			if p == nil || !maps.Equal(p.Keys, want[k].Keys) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replicas did not exchange their usage within 10 s (%d polls)", i)
		}
		if i%50 == 49 {
			for _, r := range rs {
				r.publishRatesNow() // an ask taken before the last admission published older usage
			}
		}
		wait(t, 2*time.Millisecond)
	}
}

// wait blocks d on a timer (a poll's pause; the condition is re-checked after it).
func wait(t *testing.T, d time.Duration) {
	t.Helper()
	tm := time.NewTimer(d)
	defer tm.Stop()
	<-tm.C
}

// TestRatesUnevenSplitOverEtcd: three in-process replicas with a real etcd, a key of rpm 600
// at 90% (9 requests a second) split 70/20/10, each replica's usage exchanged once a second
// (simulated). Nothing is refused, and the cluster never admits more than the limit in any
// 60 s. (Before the exchange, the same traffic has 33% refused: ratelimit's
// TestEvenShareRefusesUnevenTraffic.) It also reports each request's time in Share + Allow.
func TestRatesUnevenSplitOverEtcd(t *testing.T) {
	etcd := etcdtest.Start(t)
	clk := &limClock{t: time.Unix(1_000_000, 0)}
	var rs []rateReplica
	for _, id := range []string{"a", "b", "c"} {
		rs = append(rs, startRateReplica(t, etcd.Endpoint(), id, clk))
	}
	for _, r := range rs {
		r.got.await(t, 10*time.Second, "three replicas", func(x *applied) bool { return x.replicas == 3 })
	}
	awaitPeers(t, rs)
	const rpm, perSecond, seconds = 600, 9, 180
	lim := ratelimit.Limits{RPM: rpm}
	var admitted []int64 // per simulated second: bounded by seconds
	var refused int64
	var lat []time.Duration // per request: bounded by perSecond × seconds
	c := 0
	for range seconds {
		var got int64
		for range perSecond {
			k := c % 10
			c++
			r := rs[0]
			if k >= 7 {
				r = rs[1]
			}
			if k == 9 {
				r = rs[2]
			}
			start := time.Now()
			_, ok := r.lim.Allow(0, r.lim.Share(0, lim, r.replicaCount()))
			lat = append(lat, time.Since(start))
			if ok {
				got++
			} else {
				refused++
			}
		}
		admitted = append(admitted, got)
		clk.advance(time.Second)
		awaitPeers(t, rs)
	}
	var best, sum int64
	for i, a := range admitted {
		sum += a
		if i >= ratelimit.Slots {
			sum -= admitted[i-ratelimit.Slots]
		}
		best = max(best, sum)
	}
	if refused != 0 {
		t.Fatalf("refused %d of %d, want 0", refused, perSecond*seconds)
	}
	if best > rpm {
		t.Fatalf("the cluster admitted %d in 60 s, over rpm %d", best, rpm)
	}
	for _, r := range rs {
		if fb := r.lim.Fallbacks(); fb != 0 {
			t.Fatalf("%d shares fell back to the even share with etcd up", fb)
		}
	}
	slices.Sort(lat)
	t.Logf("after: refused %d of %d, most admitted in a window %d of %d; Share+Allow p50 %v p99 %v",
		refused, perSecond*seconds, best, rpm, lat[len(lat)/2], lat[len(lat)*99/100])
}

// TestRatesReplicasJoinLeaveAndEtcdAway: a replica that leaves takes its usage with it (its
// lease's keys go), one that joins is counted; with etcd away every replica takes the even
// share ⌈limit / replicas⌉ (counted in Fallbacks, tlgw_ratelimit_exchange_up 0), and the
// exchange resumes when etcd is back.
func TestRatesReplicasJoinLeaveAndEtcdAway(t *testing.T) {
	etcd := etcdtest.Start(t)
	clk := &limClock{t: time.Unix(1_000_000, 0)}
	a := startRateReplica(t, etcd.Endpoint(), "a", clk)
	b := startRateReplica(t, etcd.Endpoint(), "b", clk)
	c := startRateReplica(t, etcd.Endpoint(), "c", clk)
	rs := []rateReplica{a, b, c}
	for _, r := range rs {
		r.got.await(t, 10*time.Second, "three replicas", func(x *applied) bool { return x.replicas == 3 })
	}
	lim := ratelimit.Limits{RPM: 300}
	// c takes 100 requests of key 4: the others see it hold them.
	for range 100 {
		if _, ok := c.lim.Allow(4, c.lim.Share(4, lim, 3)); !ok {
			t.Fatal("c refused a request under its share")
		}
	}
	awaitPeers(t, rs)
	// a's share: an even part of the room left (300 − 100)/3, capped by c's 100.
	if got := a.lim.Share(4, lim, 3).RPM; got != 67 {
		t.Fatalf("a's share with c holding 100: %d, want 67", got)
	}
	// c leaves: its lease and usage go, a and b count 2 replicas and the whole room.
	c.Close()
	for _, r := range rs[:2] {
		r.got.await(t, 10*time.Second, "two replicas", func(x *applied) bool { return x.replicas == 2 })
	}
	awaitPeers(t, rs[:2])
	if got := a.lim.Share(4, lim, 2).RPM; got != 150 {
		t.Fatalf("a's share after c left: %d, want 150", got)
	}
	// d joins: three replicas again, and d's usage is followed.
	d := startRateReplica(t, etcd.Endpoint(), "d", clk)
	rs = []rateReplica{a, b, d}
	for _, r := range rs {
		r.got.await(t, 10*time.Second, "d joined", func(x *applied) bool { return x.replicas == 3 })
	}
	for range 30 {
		if _, ok := d.lim.Allow(4, d.lim.Share(4, lim, 3)); !ok {
			t.Fatal("d refused a request under its share")
		}
	}
	awaitPeers(t, rs)
	// a: demand 0 of 30, room 270 in three: 90.
	if got := a.lim.Share(4, lim, 3).RPM; got != 90 {
		t.Fatalf("a's share with d holding 30: %d, want 90", got)
	}
	// etcd goes away: the even share, counted.
	etcd.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if p, _ := a.lim.last(); p == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a still uses its peers' usage 10 s after etcd went away")
		}
		wait(t, 5*time.Millisecond)
	}
	before := a.lim.Fallbacks()
	if got := a.lim.Share(4, lim, 3).RPM; got != 100 {
		t.Fatalf("a's share with etcd away: %d, want ⌈300/3⌉ = 100", got)
	}
	if a.lim.Fallbacks() != before+1 {
		t.Fatal("the even share was not counted")
	}
	if v := testutil.ToFloat64(a.m.rateExchange); v != 0 {
		t.Fatalf("tlgw_ratelimit_exchange_up %v with etcd away", v)
	}
	etcd.Restart()
	awaitPeers(t, rs)
	if got := a.lim.Share(4, lim, 3).RPM; got != 90 {
		t.Fatalf("a's share once etcd is back: %d, want 90", got)
	}
	if v := testutil.ToFloat64(a.m.rateExchange); v != 1 {
		t.Fatalf("tlgw_ratelimit_exchange_up %v with etcd back", v)
	}
}

// TestRatesCodec: a value round-trips; hostile values are refused; usage over the bound is
// published as partial.
func TestRatesCodec(t *testing.T) {
	us := []ratelimit.KeyUsage{{Key: 0, Usage: ratelimit.Usage{Requests: 5, RequestDemand: 7}},
		{Key: 9, Usage: ratelimit.Usage{Tokens: 1 << 40, TokenDemand: 1 << 41, InFlight: 3, InFlightDemand: 4}}}
	fp, got, partial, err := decodeRates(encodeRates(0xfeedface12345678, us))
	if err != nil || partial || !slices.Equal(got, us) || fp != 0xfeedface12345678 {
		t.Fatalf("round trip: %x %+v %v %v", fp, got, partial, err)
	}
	head := []byte{2, 0, 1, 2, 3, 4, 5, 6, 7, 8}
	with := func(rest ...byte) []byte { return append(slices.Clone(head), rest...) }
	if _, got, partial, err := decodeRates(with(0)); err != nil || partial || len(got) != 0 {
		t.Fatalf("no keys: %v %v %v", got, partial, err)
	}
	for name, v := range map[string][]byte{
		"empty":            {},
		"version 1":        {1, 0, 0},
		"other version":    {3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0},
		"no fingerprint":   {2, 0, 0},
		"unknown flag":     {2, 2, 1, 2, 3, 4, 5, 6, 7, 8, 0},
		"count over bound": with(0x81, 0x40), // 8193
		"short":            with(1, 0, 1),
		"trailing":         with(0, 7),
		"descending":       with(2, 5, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0),
		"duplicate":        with(2, 5, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0),
		"partial with key": append([]byte{2, 1, 1, 2, 3, 4, 5, 6, 7, 8}, 1, 5, 0, 0, 0, 0, 0, 0),
		"too long":         make([]byte, MaxRateBytes+1),
	} {
		if _, _, _, err := decodeRates(v); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	many := make([]ratelimit.KeyUsage, 2000) // 2000 keys of 7 × up to 8 bytes: over 8 KiB
	for i := range many {
		many[i] = ratelimit.KeyUsage{Key: i, Usage: ratelimit.Usage{Requests: 1 << 49, RequestDemand: 1 << 49}}
	}
	if fp, _, partial, err := decodeRates(encodeRates(7, many)); err != nil || !partial || fp != 7 {
		t.Fatalf("usage over the bound: partial %v, fingerprint %d, err %v", partial, fp, err)
	}
}

// The key table's fingerprint follows each key's secret, limits and place, and shows no secret.
func TestRateKeysFingerprint(t *testing.T) {
	a := config.Key{Key: "sk-alpha", RPM: 600}
	b := config.Key{Key: "sk-beta", TPM: 1000}
	base := RateKeysFingerprint([]config.Key{a, b})
	if base != RateKeysFingerprint([]config.Key{a, b}) {
		t.Fatal("not stable")
	}
	c := a
	c.RPM = 601
	for name, ks := range map[string][]config.Key{
		"order":  {b, a},
		"limit":  {c, b},
		"secret": {{Key: "sk-alphb", RPM: 600}, b},
		"fewer":  {a},
		"none":   nil,
	} {
		if RateKeysFingerprint(ks) == base {
			t.Errorf("%s: same fingerprint", name)
		}
	}
}

// A replica whose key table differs, or whose value cannot be read, makes the others take the
// even share (partial) rather than sum usage by another numbering or miss its traffic.
func TestRatesOtherKeysAreEvenShare(t *testing.T) {
	s := &Store{cfg: Config{Self: Replica{ID: "me"}, RateKeys: 11}, rates: map[string]rateEntry{}, maxReplicas: 4,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	us := []ratelimit.KeyUsage{{Key: 1, Usage: ratelimit.Usage{Requests: 3}}}
	s.putRatesLocked(DirRates+"same", encodeRates(11, us))
	s.putRatesLocked(DirRates+"other", encodeRates(12, us))
	s.putRatesLocked(DirRates+"old", []byte{1, 0, 0})
	s.putRatesLocked(DirRates+"me", encodeRates(99, us)) // its own: skipped
	if e := s.rates["same"]; e.partial || !slices.Equal(e.keys, us) {
		t.Fatalf("same keys: %+v", e)
	}
	if e := s.rates["other"]; !e.partial || !e.otherKeys || e.keys != nil {
		t.Fatalf("other keys: %+v", e)
	}
	if e := s.rates["old"]; !e.partial || e.otherKeys {
		t.Fatalf("unreadable: %+v", e)
	}
	if _, ok := s.rates["me"]; ok || len(s.rates) != 3 {
		t.Fatalf("entries %v", slices.Collect(maps.Keys(s.rates)))
	}
	s.putRatesLocked(DirRates+"other", encodeRates(11, us)) // it rolled to the same table
	if e := s.rates["other"]; e.partial || e.otherKeys {
		t.Fatalf("after agreeing: %+v", e)
	}
}

// BenchmarkEtcdCounterRoundTrip is what a shared counter in etcd would add to each request:
// one compare-and-swap increment of a key (a transaction: read, compare, put) against a real
// single-member etcd on loopback. It reports p99_ns; compare ratelimit's BenchmarkAdmit.
func BenchmarkEtcdCounterRoundTrip(b *testing.B) {
	etcd := etcdtest.Start(b)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	lat := make([]time.Duration, 0, min(b.N, 1<<16)) // bounded: the first 64 Ki requests
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("/bench/n"), "!=", "x")).
			Then(clientv3.OpPut("/bench/n", strconv.Itoa(i))).Commit(); err != nil {
			b.Fatal(err)
		}
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(start))
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99_ns")
}
