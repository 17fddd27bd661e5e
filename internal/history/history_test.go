package history

import (
	"cmp"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gateway is a registry with the metrics History reads, under their real names and labels.
type gateway struct {
	reg   *prometheus.Registry
	req   *prometheus.CounterVec
	ttft  *prometheus.HistogramVec
	queue *prometheus.GaugeVec
	in    *prometheus.GaugeVec
}

func newGateway() *gateway {
	g := &gateway{reg: prometheus.NewRegistry(),
		req: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tlgw_requests_total"}, []string{"route", "model", "endpoint", "code"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tlgw_time_to_first_byte_seconds",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"route", "endpoint"}),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tlgw_queue_length"}, []string{"class", "lane"}),
		in:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tlgw_requests_in_flight"}, []string{"route"}),
	}
	g.reg.MustRegister(g.req, g.ttft, g.queue, g.in)
	return g
}

func (g *gateway) input(t *testing.T, workers map[string]int64) Input {
	t.Helper()
	fams, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return Input{Families: fams, Workers: workers}
}

// last is the newest value of key, and whether it has one.
func last(s Snapshot, k Key) (float64, bool) {
	for _, x := range s.Series {
		if x.Key == k && len(x.Values) > 0 && x.Values[len(x.Values)-1] != nil {
			return *x.Values[len(x.Values)-1], true
		}
	}
	return 0, false
}

func TestRatesQuantilesAndGauges(t *testing.T) {
	g, h := newGateway(), New()
	t0 := time.Unix(1_700_000_000, 0)
	g.req.WithLabelValues("chat", "smol", "chat", "200").Add(100) // before the first sample: not a rate
	h.Sample(t0, g.input(t, map[string]int64{"w1": 2}))
	s := h.Snapshot()
	if _, ok := last(s, Key{Metric: RequestsPerS, Route: "chat"}); ok || s.Points != 1 {
		t.Fatalf("a rate from one sample: %+v", s)
	}
	if v, ok := last(s, Key{Metric: InFlight, Worker: "w1"}); !ok || v != 2 {
		t.Fatalf("in flight %v %v", v, ok)
	}
	// 50 requests in the window, 10 of them 503; TTFTs: 90 at 10 ms, 10 at 1 s.
	g.req.WithLabelValues("chat", "smol", "chat", "200").Add(40)
	g.req.WithLabelValues("chat", "smol", "completions", "503").Add(10)
	for range 90 {
		g.ttft.WithLabelValues("chat", "chat").Observe(0.010)
	}
	for range 10 {
		g.ttft.WithLabelValues("chat", "completions").Observe(1.0)
	}
	g.queue.WithLabelValues("default", "normal").Set(3)
	g.queue.WithLabelValues("batch", "cold").Set(4)
	g.in.WithLabelValues("chat").Set(6)
	h.Sample(t0.Add(Resolution), g.input(t, map[string]int64{"w1": 5, "w2": 1}))
	s = h.Snapshot()
	for k, want := range map[Key]float64{
		{Metric: RequestsPerS, Route: "chat"}: 10, // 50 / 5 s
		{Metric: ErrorsPerS, Route: "chat"}:   2,
		{Metric: QueueDepth}:                  7,
		{Metric: InFlight, Worker: "w1"}:      5,
		{Metric: InFlight, Worker: "w2"}:      1,
		{Metric: InFlight, Route: "chat"}:     6,
	} {
		if v, ok := last(s, k); !ok || v != want {
			t.Errorf("%+v = %v (%v), want %v", k, v, ok, want)
		}
	}
	p50, _ := last(s, Key{Metric: TTFTP50Ms, Route: "chat"})
	p99, _ := last(s, Key{Metric: TTFTP99Ms, Route: "chat"})
	if p50 < 8 || p50 > 16.4 || p99 < 512 || p99 > 1024.1 {
		t.Fatalf("ttft p50 %v ms (bucket 8–16), p99 %v ms (bucket 512–1024)", p50, p99)
	}
	if !s.End.Equal(t0.Add(Resolution)) || s.Points != 2 || s.ResolutionS != 5 {
		t.Fatalf("snapshot header %+v", s)
	}
	// No traffic: a rate of 0, no TTFT (nothing observed), w2 absent this sample (null).
	h.Sample(t0.Add(2*Resolution), g.input(t, map[string]int64{"w1": 0}))
	s = h.Snapshot()
	if v, ok := last(s, Key{Metric: RequestsPerS, Route: "chat"}); !ok || v != 0 {
		t.Fatalf("idle rate %v %v", v, ok)
	}
	if _, ok := last(s, Key{Metric: TTFTP50Ms, Route: "chat"}); ok {
		t.Fatal("a TTFT from a window without observations")
	}
	if _, ok := last(s, Key{Metric: InFlight, Worker: "w2"}); ok {
		t.Fatal("a gone worker has a value")
	}
	for _, x := range s.Series {
		if len(x.Values) != 3 {
			t.Fatalf("%+v: %d values, want 3", x.Key, len(x.Values))
		}
	}
	// Sorted by metric, route, worker.
	for i := 1; i < len(s.Series); i++ {
		a, b := s.Series[i-1].Key, s.Series[i].Key
		if cmp.Compare(a.Metric, b.Metric)*4+cmp.Compare(a.Route, b.Route)*2+cmp.Compare(a.Worker, b.Worker) >= 0 {
			t.Fatalf("not sorted: %+v before %+v", a, b)
		}
	}
}

// The window holds Points samples, oldest first; a series without a value for a whole window
// goes; a counter reset (a restart) gives no negative rate.
func TestWindowAndRemoval(t *testing.T) {
	g, h := newGateway(), New()
	t0 := time.Unix(1_700_000_000, 0)
	c := g.req.WithLabelValues("chat", "smol", "chat", "200")
	for i := range Points + 20 {
		c.Add(float64(5 * i)) // i requests a second in sample i
		in := map[string]int64{}
		if i == 0 {
			in["early"] = 1
		}
		h.Sample(t0.Add(time.Duration(i)*Resolution), g.input(t, in))
	}
	s := h.Snapshot()
	if s.Points != Points {
		t.Fatalf("%d points", s.Points)
	}
	var rps Series
	for _, x := range s.Series {
		if x.Key == (Key{Metric: RequestsPerS, Route: "chat"}) {
			rps = x
		}
		if x.Worker == "early" {
			t.Fatal("a series without a value for a whole window is kept")
		}
	}
	if len(rps.Values) != Points || *rps.Values[0] != 20 || *rps.Values[Points-1] != Points+19 {
		t.Fatalf("window: first %v, last %v", *rps.Values[0], *rps.Values[Points-1])
	}
	g2 := newGateway() // the gateway restarted: its counters start over
	g2.req.WithLabelValues("chat", "smol", "chat", "200").Add(1)
	h.Sample(t0.Add(time.Hour), g2.input(t, nil))
	if v, ok := last(h.Snapshot(), Key{Metric: RequestsPerS, Route: "chat"}); ok && v < 0 {
		t.Fatalf("a negative rate %v after a reset", v)
	}
}

func TestSeriesBound(t *testing.T) {
	g, h := newGateway(), New()
	ws := map[string]int64{}
	for i := range MaxSeries + 10 {
		ws[fmt.Sprint("w", i)] = 1
	}
	h.Sample(time.Unix(0, 0), g.input(t, ws))
	// MaxSeries series, the queue depth among them; the other 11 workers dropped.
	if n := len(h.Snapshot().Series); n != MaxSeries || h.Dropped != 11 {
		t.Fatalf("%d series, %d dropped", n, h.Dropped)
	}
}

func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		q    float64
		cum  map[float64]uint64
		want float64
		ok   bool
	}{
		{0.5, map[float64]uint64{1: 0, 2: 10, inf: 10}, 1.5, true},
		{0.99, map[float64]uint64{1: 10, 2: 10, inf: 20}, 2, true}, // in +Inf: the highest finite bound
		{0.5, map[float64]uint64{1: 0, inf: 0}, 0, false},
		{0.5, nil, 0, false},
		{0.5, map[float64]uint64{1: 4, 2: 4, 4: 8, inf: 8}, 1, true},
		{0.5, map[float64]uint64{1: 10, 2: 30, inf: 30}, 1.25, true}, // rank 15: a quarter into (1, 2]
	} {
		got, ok := Quantile(c.q, c.cum)
		if ok != c.ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Quantile(%v, %v) = %v %v, want %v %v", c.q, c.cum, got, ok, c.want, c.ok)
		}
	}
}

// TestQuietSeries: a rate whose counter did not move is 0, not missing; a series without a value
// is kept for Points−1 samples and dropped at the Points-th.
func TestQuietSeries(t *testing.T) {
	g, h := newGateway(), New()
	t0 := time.Unix(1_700_000_000, 0)
	g.req.WithLabelValues("chat", "smol", "chat", "503").Add(3)
	h.Sample(t0, g.input(t, map[string]int64{"gone": 1}))
	h.Sample(t0.Add(Resolution), g.input(t, nil))
	s := h.Snapshot()
	for _, k := range []Key{{Metric: RequestsPerS, Route: "chat"}, {Metric: ErrorsPerS, Route: "chat"}} {
		if v, ok := last(s, k); !ok || v != 0 {
			t.Fatalf("%+v = %v %v, want 0", k, v, ok)
		}
	}
	for i := 2; i < Points; i++ {
		h.Sample(t0.Add(time.Duration(i)*Resolution), g.input(t, nil))
	}
	has := func() bool {
		for _, x := range h.Snapshot().Series {
			if x.Worker == "gone" {
				return true
			}
		}
		return false
	}
	if !has() {
		t.Fatalf("the series went after %d samples without a value, before a whole window", Points-1)
	}
	h.Sample(t0.Add(time.Duration(Points)*Resolution), g.input(t, nil))
	if has() {
		t.Fatalf("the series is kept after %d samples without a value", Points)
	}
}
