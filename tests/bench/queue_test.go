package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// benchHost is a pool of workers with a busy threshold, as cheap as the queue allows.
type benchHost struct {
	now       time.Time
	loads     map[string]int64
	threshold int64
	workers   []admission.Worker
}

type benchView struct{ h *benchHost }

func (v benchView) Workers() []admission.Worker {
	for i := range v.h.workers {
		w := &v.h.workers[i]
		w.Load = v.h.loads[w.ID]
		w.Full = w.Load >= v.h.threshold
	}
	return v.h.workers
}
func (v benchView) Now() time.Time { return v.h.now }

func (h *benchHost) View(*admission.Entry) admission.View { return benchView{h} }
func (h *benchHost) Dispatch(e *admission.Entry, _ string) (string, bool) {
	for _, w := range e.Route {
		if h.loads[w] < h.threshold {
			h.loads[w]++
			return w, true
		}
	}
	return "", false
}
func (h *benchHost) Reject(*admission.Entry, error) {}
func (h *benchHost) ArmTimer(time.Time)             {}

// BenchmarkQueueEnqueueDispatch: 10,000 requests queued over 1,000 session lanes behind full
// workers; each op enqueues one more and frees one slot, which dispatches the oldest head.
// Target (DEVELOPERS.md): ≤ 5 µs p50 per enqueue + dispatch.
func BenchmarkQueueEnqueueDispatch(b *testing.B) {
	h := &benchHost{now: time.Unix(0, 0), loads: map[string]int64{}, threshold: 4}
	route := make([]string, 8)
	for i := range route {
		route[i] = fmt.Sprintf("w%d", i)
		h.loads[route[i]] = h.threshold // full
		h.workers = append(h.workers, admission.Worker{ID: route[i]})
	}
	q := admission.New(admission.Config{
		Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 1 << 30, MaxWait: time.Hour}},
		DefaultClass: "default", Now: func() time.Time { return h.now },
	})
	const queued, lanes = 10000, 1000
	entry := func(i int) *admission.Entry {
		return &admission.Entry{Req: &admission.Request{ID: fmt.Sprint("r", i), SessionID: fmt.Sprint("s", i%lanes)}, Route: route}
	}
	for i := 0; i < queued; i++ {
		q.Admit(entry(i), h, nil)
	}
	if q.Len() != queued {
		b.Fatalf("queued %d", q.Len())
	}
	pre := make([]*admission.Entry, b.N)
	for i := range pre {
		pre[i] = entry(queued + i)
	}
	samples := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		q.Admit(pre[i], h, nil)
		h.loads[route[i%len(route)]]-- // a request finished: one slot free
		q.WakeCapacity(h)
		samples = append(samples, time.Since(t0))
	}
	b.StopTimer()
	if q.Len() != queued {
		b.Fatalf("queue length drifted to %d", q.Len())
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "p50-ns/op")
	b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds()), "p99-ns/op")
}
