// Package history keeps the gateway's recent past in memory for the live page (R24,
// GET /admin/v1/history): every Resolution (5 s) a sample of requests/s, errors/s and TTFT
// p50/p99 per route, queue depth, and in-flight requests per route and per worker, over the last
// Points samples (15 minutes). It reads what the gateway already counts — its Prometheus
// registry and its worker list — so nothing on a request's path does any work for it.
//
// Bounds: Points samples per series; at most MaxSeries series (routes and workers seen in the
// window; one more is counted in Dropped, not kept); a series with no sample in the whole window
// is removed. Label values are the metrics' own (routes from the route table, worker ids of
// registered workers), never a client's string.
package history

import (
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
)

const (
	// Resolution is the time between two samples; Points how many a series keeps.
	Resolution = 5 * time.Second
	Points     = 180
	// MaxSeries bounds the series kept at once.
	MaxSeries = 2048
)

// Metric names of the series, as GET /admin/v1/history answers them.
const (
	RequestsPerS = "requests_per_s"
	ErrorsPerS   = "errors_per_s"
	TTFTP50Ms    = "ttft_p50_ms"
	TTFTP99Ms    = "ttft_p99_ms"
	QueueDepth   = "queue_depth"
	InFlight     = "in_flight"
)

// Input is one sample's raw material: the registry's metric families and the workers' in-flight
// counts by id.
type Input struct {
	Families []*dto.MetricFamily
	Workers  map[string]int64
}

// Key names a series: its metric and, for per-route and per-worker series, the route or worker.
type Key struct {
	Metric string `json:"metric"`
	Route  string `json:"route,omitempty"`
	Worker string `json:"worker,omitempty"`
}

type series struct {
	vals [Points]float64 // a ring; NaN where no sample
	seen int             // samples since the series last had a value, for removal
}

// History is the recent past. Safe for concurrent use: Sample is called by one sampler,
// Snapshot by the admin API.
type History struct {
	mu     sync.Mutex
	series map[Key]*series // at most MaxSeries
	head   int             // ring index of the newest sample
	n      int             // samples taken, up to Points
	end    time.Time       // the newest sample's time
	// The previous sample's cumulative counts, for rates: by route, requests and errors, and
	// the TTFT histogram's buckets (upper bound → cumulative count).
	prevReq, prevErr map[string]float64
	prevTTFT         map[string]map[float64]uint64
	primed           bool
	Dropped          uint64 // series refused over MaxSeries
}

// New returns an empty history.
func New() *History {
	return &History{series: make(map[Key]*series)}
}

// Sample takes one sample at now from in.
func (h *History) Sample(now time.Time, in Input) {
	req, errs, ttft, queue, inFlight := read(in.Families)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.head = (h.head + 1) % Points
	h.n = min(h.n+1, Points)
	h.end = now
	for _, s := range h.series {
		s.vals[h.head] = math.NaN()
		s.seen++
	}
	secs := Resolution.Seconds()
	if h.primed {
		for route, c := range req {
			if d := c - h.prevReq[route]; d >= 0 {
				h.set(Key{Metric: RequestsPerS, Route: route}, d/secs)
			}
		}
		for route, c := range errs {
			if d := c - h.prevErr[route]; d >= 0 {
				h.set(Key{Metric: ErrorsPerS, Route: route}, d/secs)
			}
		}
		for route, b := range ttft {
			delta := make(map[float64]uint64, len(b))
			for le, c := range b {
				if p := h.prevTTFT[route][le]; c >= p {
					delta[le] = c - p
				}
			}
			if p50, ok := Quantile(0.5, delta); ok {
				h.set(Key{Metric: TTFTP50Ms, Route: route}, p50*1000)
			}
			if p99, ok := Quantile(0.99, delta); ok {
				h.set(Key{Metric: TTFTP99Ms, Route: route}, p99*1000)
			}
		}
	}
	h.prevReq, h.prevErr, h.prevTTFT, h.primed = req, errs, ttft, true
	h.set(Key{Metric: QueueDepth}, queue)
	for route, n := range inFlight {
		h.set(Key{Metric: InFlight, Route: route}, n)
	}
	for id, n := range in.Workers {
		h.set(Key{Metric: InFlight, Worker: id}, float64(n))
	}
	for k, s := range h.series {
		if s.seen >= Points {
			delete(h.series, k) // nothing in the whole window
		}
	}
}

// set records v as key's newest sample.
func (h *History) set(k Key, v float64) {
	s := h.series[k]
	if s == nil {
		if len(h.series) >= MaxSeries {
			h.Dropped++
			return
		}
		s = &series{}
		for i := range s.vals {
			s.vals[i] = math.NaN()
		}
		h.series[k] = s
	}
	s.vals[h.head] = v
	s.seen = 0
}

// Series is one series of a Snapshot: its values oldest first, nil where no sample.
type Series struct {
	Key
	Values []*float64 `json:"values"`
}

// Snapshot is the history as GET /admin/v1/history answers it: Points values per series at
// Resolution, the last at End (fewer while the gateway is younger than the window).
type Snapshot struct {
	ResolutionS float64   `json:"resolution_s"`
	End         time.Time `json:"end"`
	Points      int       `json:"points"`
	Series      []Series  `json:"series"`
	Dropped     uint64    `json:"dropped_series,omitempty"`
}

// Snapshot copies the history, series sorted by metric, route, worker.
func (h *History) Snapshot() Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := Snapshot{ResolutionS: Resolution.Seconds(), End: h.end, Points: h.n, Dropped: h.Dropped,
		Series: make([]Series, 0, len(h.series))}
	for k, s := range h.series {
		vs := make([]*float64, h.n)
		for i := range h.n {
			v := s.vals[(h.head-h.n+1+i+Points)%Points]
			if !math.IsNaN(v) {
				vs[i] = &v
			}
		}
		out.Series = append(out.Series, Series{Key: k, Values: vs})
	}
	slices.SortFunc(out.Series, func(a, b Series) int {
		return strings.Compare(a.Metric+"\x00"+a.Route+"\x00"+a.Worker, b.Metric+"\x00"+b.Route+"\x00"+b.Worker)
	})
	return out
}

// read takes from the registry's families: per route the requests and the 5xx answers
// (tlgw_requests_total), the TTFT histogram's cumulative buckets summed over endpoints
// (tlgw_time_to_first_byte_seconds), and the admission queue's length (tlgw_queue_length).
func read(fams []*dto.MetricFamily) (req, errs map[string]float64, ttft map[string]map[float64]uint64, queue float64,
	inFlight map[string]float64) {
	req, errs, ttft, inFlight = map[string]float64{}, map[string]float64{}, map[string]map[float64]uint64{}, map[string]float64{}
	for _, f := range fams {
		switch f.GetName() {
		case "tlgw_requests_total":
			for _, m := range f.GetMetric() {
				route, code := label(m, "route"), label(m, "code")
				v := m.GetCounter().GetValue()
				req[route] += v
				if strings.HasPrefix(code, "5") {
					errs[route] += v
				}
			}
		case "tlgw_time_to_first_byte_seconds":
			for _, m := range f.GetMetric() {
				route := label(m, "route")
				b := ttft[route]
				if b == nil {
					b = map[float64]uint64{}
					ttft[route] = b
				}
				for _, bk := range m.GetHistogram().GetBucket() {
					b[bk.GetUpperBound()] += bk.GetCumulativeCount()
				}
				b[math.Inf(1)] += m.GetHistogram().GetSampleCount()
			}
		case "tlgw_queue_length":
			for _, m := range f.GetMetric() {
				queue += m.GetGauge().GetValue()
			}
		case "tlgw_requests_in_flight":
			for _, m := range f.GetMetric() {
				inFlight[label(m, "route")] += m.GetGauge().GetValue()
			}
		}
	}
	return req, errs, ttft, queue, inFlight
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Quantile estimates the q-quantile of a histogram's window from its cumulative buckets (upper
// bound → count, +Inf included), interpolating linearly inside the bucket, as Prometheus's
// histogram_quantile does; false when the window holds no observation. An answer in the +Inf
// bucket is the highest finite bound.
func Quantile(q float64, cum map[float64]uint64) (float64, bool) {
	bounds := make([]float64, 0, len(cum))
	for le := range cum {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return 0, false
	}
	total := cum[bounds[len(bounds)-1]]
	if total == 0 {
		return 0, false
	}
	rank := q * float64(total)
	prevLe, prevC := 0.0, uint64(0)
	for _, le := range bounds {
		c := cum[le]
		if float64(c) >= rank {
			if math.IsInf(le, 1) {
				return prevLe, true
			}
			if c == prevC {
				return le, true
			}
			return prevLe + (le-prevLe)*(rank-float64(prevC))/float64(c-prevC), true
		}
		prevLe, prevC = le, c
	}
	return prevLe, true
}
