package request

import (
	"github.com/tlgw/tlgw/internal/oai"

	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestMetricsResolvedOnceCountEveryCall: the per-request series, resolved once and reused,
// count every call under their own labels, from many goroutines at once.
func TestMetricsResolvedOnceCountEveryCall(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	const goroutines, each = 8, 250
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				m.done("r", "m", oai.Chat, 200)
				m.transition(Routing, Attempting)
				m.ttfb("r", oai.Chat, time.Millisecond)
				if i%5 == 0 {
					m.done("r", "m", oai.Embeddings, 502)
					m.transition(Attempting, Relaying)
					m.ttfb("other", oai.Chat, time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	n, fifth := float64(goroutines*each), float64(goroutines*each/5)
	for _, c := range []struct {
		got, want float64
		what      string
	}{
		{testutil.ToFloat64(m.requests.WithLabelValues("r", "m", "chat", "200")), n, "200s"},
		{testutil.ToFloat64(m.requests.WithLabelValues("r", "m", "embeddings", "502")), fifth, "502s"},
		{testutil.ToFloat64(m.transitions.WithLabelValues("routing", "attempting")), n, "routing→attempting"},
		{testutil.ToFloat64(m.transitions.WithLabelValues("attempting", "relaying")), fifth, "attempting→relaying"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	for route, want := range map[string]uint64{"r": uint64(n), "other": uint64(fifth)} {
		var d dto.Metric
		if err := m.firstByte.WithLabelValues(route, "chat").(prometheus.Metric).Write(&d); err != nil {
			t.Fatal(err)
		}
		if got := d.GetHistogram().GetSampleCount(); got != want {
			t.Errorf("first byte on %s: %d observations, want %d", route, got, want)
		}
	}
	if got := testutil.CollectAndCount(m.firstByte); got != 2 {
		t.Errorf("%d first-byte series, want 2", got)
	}
	if got := testutil.CollectAndCount(m.requests); got != 2 {
		t.Errorf("%d request series, want 2", got)
	}
}
