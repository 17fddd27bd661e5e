package scrape

import (
	"fmt"
	"net/http"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestTargetsComeAndGo (R19): the manager keeps a scraper, a timer, a goroutine and series for
// the targets of the current set only. After rounds of distinct targets, some failing, each
// replaced by the next round's and the last by none, it holds no scraper, no timer and no
// series, and its goroutines are back to what they were.
func TestTargetsComeAndGo(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	good := serve(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, vllmPage("m", 1)) })
	bad := serve(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusInternalServerError) })
	sink := make(chanSink, 64)
	reg := prometheus.NewRegistry()
	m := NewManager(sink, fc, reg)
	defer m.Close()
	base := runtime.NumGoroutine()
	const rounds, per = 10, 4
	for round := range rounds {
		var ts []Target
		for i := range per {
			srv := good
			if i%2 == 1 {
				srv = bad
			}
			ts = append(ts, Target{ID: fmt.Sprintf("r%d-w%d", round, i), Model: "m", HTTPAddress: addr(srv), Kind: VLLM})
		}
		m.Set(ts)
		for range ts {
			next(t, sink)
		}
		waitPending(t, fc, per)
		if len(m.scrapers) != per {
			t.Fatalf("round %d: %d scrapers for %d targets", round, len(m.scrapers), per)
		}
	}
	m.Set(nil)
	waitPending(t, fc, 0)
	m.mu.Lock()
	left := len(m.scrapers)
	m.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d scrapers left with no target", left)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if n := len(f.GetMetric()); n != 0 {
			t.Fatalf("%s keeps %d series with no target", f.GetName(), n)
		}
	}
	// The scrapers' goroutines have returned; the transport's idle connections to the
	// engines are closed by CloseIdleConnections (their reader and writer goroutines).
	m.transport.CloseIdleConnections()
	gwtest.Eventually(t, "the scrapers' goroutines gone", func() bool { return runtime.NumGoroutine() <= base })
}
