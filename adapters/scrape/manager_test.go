package scrape

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/engine"
)

// TestMain checks that no test leaves a scraper, a connection or a server goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type event struct {
	t      Target
	st     Status
	reason string
	err    error
}

// chanSink hands every report to a channel.
type chanSink chan event

func (c chanSink) Scraped(t Target, st Status)             { c <- event{t: t, st: st} }
func (c chanSink) Failed(t Target, reason string, e error) { c <- event{t: t, reason: reason, err: e} }

func next(t *testing.T, c chanSink) event {
	t.Helper()
	select {
	case ev := <-c:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no scrape was reported")
		return event{}
	}
}

// none fails if a report is waiting.
func none(t *testing.T, c chanSink) {
	t.Helper()
	select {
	case ev := <-c:
		t.Fatalf("unexpected report: %+v", ev)
	default:
	}
}

// waitPending waits until the fake clock holds n timers: the scrapers are idle between scrapes.
func waitPending(t *testing.T, fc *clock.Fake, n int) {
	t.Helper()
	gwtest.Eventually(t, fmt.Sprintf("%d pending timers", n), func() bool { return fc.Pending() == n })
}

func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// metricsOnly serves h on /metrics and 404 elsewhere (the engine's /v1/models), so a count of
// h's calls is a count of scrapes.
func metricsOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}
}

func addr(srv *httptest.Server) string { return srv.Listener.Addr().String() }

func vllmPage(model string, waiting int64) string {
	return fmt.Sprintf(`# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name=%[1]q} %[2]d.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name=%[1]q} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name=%[1]q} 0.5
`, model, waiting)
}

// histCount is the sample count of worker's scrape-duration histogram; -1 when it has none.
func histCount(t *testing.T, reg *prometheus.Registry, worker string) int64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "tlgw_scrape_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "worker") == worker {
				return int64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// errCount is tlgw_scrape_errors_total{worker,reason}.
func errCount(t *testing.T, reg *prometheus.Registry, worker, reason string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "tlgw_scrape_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "worker") == worker && labelValue(m, "reason") == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestManagerScrapesEveryInterval(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	var hits atomic.Int64
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, vllmPage("m", hits.Add(1)))
	})
	sink := make(chanSink, 16)
	reg := prometheus.NewRegistry()
	m := NewManager(sink, fc, reg)
	defer m.Close()

	m.Set([]Target{{ID: "w1", Model: "m", HTTPAddress: addr(srv), Kind: VLLM, KVTotalBlocks: 100}})
	want := Target{ID: "w1", Model: "m", HTTPAddress: addr(srv), Kind: VLLM, KVTotalBlocks: 100,
		MetricsURL: "http://" + addr(srv) + "/metrics", Interval: 2 * time.Second}
	if got := m.Targets(); len(got) != 1 || got[0] != want {
		t.Fatalf("Targets() = %+v, want [%+v]", got, want)
	}
	for i := int64(1); i <= 3; i++ {
		ev := next(t, sink)
		if ev.err != nil {
			t.Fatalf("scrape %d: %s: %v", i, ev.reason, ev.err)
		}
		if ev.t != want {
			t.Fatalf("scrape %d reported target %+v, want %+v", i, ev.t, want)
		}
		if st := (Status{QueueDepth: i, Running: 1, KVFreeBlocks: 50, KVTotalBlocks: 100}); !cmp.Equal(ev.st, st) {
			t.Fatalf("scrape %d: %s", i, cmp.Diff(st, ev.st))
		}
		if n := histCount(t, reg, "w1"); n != i {
			t.Fatalf("after scrape %d the duration histogram counts %d", i, n)
		}
		// Idle until exactly one interval has passed.
		waitPending(t, fc, 1)
		fc.Advance(2*time.Second - time.Millisecond)
		if fc.Pending() != 1 || hits.Load() != i {
			t.Fatalf("scraped again before the interval: %d hits", hits.Load())
		}
		fc.Advance(time.Millisecond)
	}
	next(t, sink) // the fourth scrape, started by the last Advance
	m.Close()
	if len(m.Targets()) != 0 {
		t.Fatalf("targets after Close: %+v", m.Targets())
	}
	if n := histCount(t, reg, "w1"); n != -1 {
		t.Fatalf("a closed manager still exports w1's durations (%d)", n)
	}
}

// TestManagerFailures: every bad answer is a bounded failure with a clear reason, counted in
// tlgw_scrape_errors_total.
func TestManagerFailures(t *testing.T) {
	const tenMB = 10 << 20
	filler := strings.Repeat("# filler comment line of a very long metrics page\n", 1024)
	refused := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a := l.Addr().String()
		l.Close()
		return a
	}()
	entered := make(chan struct{}, 1)
	for _, c := range []struct {
		name    string
		handler http.HandlerFunc
		target  func(*Target)
		// drive moves the fake clock once the scrape is under way.
		drive  func(*testing.T, *clock.Fake)
		reason string
		msg    string
	}{
		{
			name: "10 MB page",
			handler: func(w http.ResponseWriter, r *http.Request) {
				for written := 0; written < tenMB; written += len(filler) {
					if _, err := w.Write([]byte(filler)); err != nil {
						return
					}
				}
			},
			reason: ReasonTooLarge, msg: "over the 4194304-byte limit",
		},
		{
			name: "10 MB page announced by Content-Length",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(tenMB))
				for written := 0; written < tenMB; written += len(filler) {
					if _, err := w.Write([]byte(filler)); err != nil {
						return
					}
				}
			},
			reason: ReasonTooLarge, msg: "the page is 10485760 bytes, over the 4194304-byte limit",
		},
		{
			name: "a page that streams forever",
			handler: func(w http.ResponseWriter, r *http.Request) {
				for r.Context().Err() == nil {
					if _, err := w.Write([]byte(filler)); err != nil {
						return
					}
				}
			},
			reason: ReasonTooLarge, msg: "over the 4194304-byte limit",
		},
		{
			name: "a page that never ends",
			handler: func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, "# HELP vllm:num_requests_waiting Number of requests waiting.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_wai")
				w.(http.Flusher).Flush()
				entered <- struct{}{}
				<-r.Context().Done()
			},
			drive: func(t *testing.T, fc *clock.Fake) {
				<-entered
				// The scrape's timeout timer is the only one: 80% of the 2 s interval.
				waitPending(t, fc, 1)
				fc.Advance(1600*time.Millisecond - time.Nanosecond)
				if fc.Pending() != 1 {
					t.Fatal("the timeout fired early")
				}
				fc.Advance(time.Nanosecond)
			},
			reason: ReasonTimeout, msg: "no complete page within 1.6s",
		},
		{
			name: "garbage bytes",
			handler: func(w http.ResponseWriter, r *http.Request) {
				b := make([]byte, 8192)
				for i := range b {
					b[i] = byte(i*7919 + 13)
				}
				w.Write(b)
			},
			reason: ReasonParse, msg: "malformed metrics page: text format parsing error in line",
		},
		{
			name: "redirect loop",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "/metrics", http.StatusFound)
			},
			reason: ReasonRedirect, msg: `302 Found redirects to "/metrics"`,
		},
		{
			name: "500",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "engine is initialising", http.StatusInternalServerError)
			},
			reason: ReasonStatus, msg: "500 Internal Server Error: engine is initialising",
		},
		{
			name:    "connection refused",
			handler: func(w http.ResponseWriter, r *http.Request) {},
			target:  func(tg *Target) { tg.MetricsURL = "http://" + refused + "/metrics" },
			reason:  ReasonConnect, msg: "connection refused",
		},
		{
			name: "missing series",
			handler: func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, "vllm:num_requests_waiting{model_name=\"m\"} 1\n")
			},
			reason: ReasonMissingSeries, msg: "missing series vllm:num_requests_running",
		},
		{
			name:    "unknown kind",
			handler: func(w http.ResponseWriter, r *http.Request) {},
			target:  func(tg *Target) { tg.Kind = "tgi" },
			reason:  ReasonInvalidTarget, msg: `unknown metrics kind "tgi"`,
		},
		{
			name:    "not an http URL",
			handler: func(w http.ResponseWriter, r *http.Request) {},
			target:  func(tg *Target) { tg.MetricsURL = "unix:///run/engine.sock" },
			reason:  ReasonInvalidTarget, msg: "is not an http(s) URL",
		},
		{
			name:    "another scheme with a host",
			handler: func(w http.ResponseWriter, r *http.Request) {},
			target:  func(tg *Target) { tg.MetricsURL = "ftp://" + tg.HTTPAddress + "/metrics" },
			reason:  ReasonInvalidTarget, msg: "is not an http(s) URL",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var hits atomic.Int64
			srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				c.handler(w, r)
			})
			fc := clock.NewFake(gwtest.Epoch0)
			sink := make(chanSink, 4)
			reg := prometheus.NewRegistry()
			m := NewManager(sink, fc, reg)
			defer m.Close()
			tg := Target{ID: "w", Model: "m", HTTPAddress: addr(srv), Kind: VLLM}
			if c.target != nil {
				c.target(&tg)
			}
			m.Set([]Target{tg})
			if c.drive != nil {
				c.drive(t, fc)
			}
			ev := next(t, sink)
			if ev.err == nil {
				t.Fatalf("scrape succeeded: %+v", ev.st)
			}
			if ev.reason != c.reason || !strings.Contains(ev.err.Error(), c.msg) {
				t.Fatalf("reason %q, error %q; want %q containing %q", ev.reason, ev.err, c.reason, c.msg)
			}
			if n := errCount(t, reg, "w", c.reason); n != 1 {
				t.Fatalf("tlgw_scrape_errors_total{reason=%q} = %v, want 1", c.reason, n)
			}
			if c.reason == ReasonRedirect && hits.Load() != 1 {
				t.Fatalf("the redirect was followed: %d requests", hits.Load())
			}
			// The scraper waits for the next interval; nothing else is pending.
			waitPending(t, fc, 1)
			none(t, sink)
		})
	}
}

// TestSetReplacesTargets: removed scrapers stop (and their series go), changed ones restart at
// once, unchanged ones keep their schedule.
func TestSetReplacesTargets(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	var hitsA, hitsB, hitsC atomic.Int64
	a := serve(t, metricsOnly(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, vllmPage("m", hitsA.Add(1))) }))
	b := serve(t, metricsOnly(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, vllmPage("m", 100+hitsB.Add(1))) }))
	c := serve(t, metricsOnly(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, vllmPage("m", 200+hitsC.Add(1))) }))
	sink := make(chanSink, 16)
	reg := prometheus.NewRegistry()
	m := NewManager(sink, fc, reg)
	defer m.Close()

	ta := Target{ID: "a", Model: "m", HTTPAddress: addr(a), Kind: VLLM, KVTotalBlocks: 10}
	tb := Target{ID: "b", Model: "m", HTTPAddress: addr(b), Kind: VLLM, KVTotalBlocks: 10}
	m.Set([]Target{ta})
	if ev := next(t, sink); ev.t.ID != "a" || ev.st.QueueDepth != 1 {
		t.Fatalf("first report %+v", ev)
	}
	waitPending(t, fc, 1)

	m.Set([]Target{tb})
	if ev := next(t, sink); ev.t.ID != "b" || ev.st.QueueDepth != 101 {
		t.Fatalf("after replacing a by b: %+v", ev)
	}
	waitPending(t, fc, 1) // a's timer is gone, b's is armed
	if n := histCount(t, reg, "a"); n != -1 {
		t.Fatalf("a's series outlive it (%d samples)", n)
	}
	for i := int64(2); i <= 3; i++ {
		fc.Advance(2 * time.Second)
		if ev := next(t, sink); ev.t.ID != "b" || ev.st.QueueDepth != 100+i {
			t.Fatalf("b's scrape %d: %+v", i, ev)
		}
		waitPending(t, fc, 1)
	}
	if hitsA.Load() != 1 {
		t.Fatalf("a was scraped %d times after its removal", hitsA.Load()-1)
	}

	// The same set again: b's scraper is untouched.
	before := m.scrapers["b"]
	m.Set([]Target{tb})
	if m.scrapers["b"] != before {
		t.Fatal("an unchanged target was restarted")
	}

	// b moves to c's address: restarted at once, on the new URL.
	tb2 := tb
	tb2.HTTPAddress = addr(c)
	m.Set([]Target{tb2})
	ev := next(t, sink)
	if ev.t.ID != "b" || ev.t.MetricsURL != "http://"+addr(c)+"/metrics" || ev.st.QueueDepth != 201 {
		t.Fatalf("after moving b: %+v", ev)
	}
	waitPending(t, fc, 1)
	if hitsB.Load() != 3 {
		t.Fatalf("the old b was scraped after its change: %d", hitsB.Load())
	}
	if n := histCount(t, reg, "b"); n != 4 {
		t.Fatalf("b's series were reset by the restart: %d samples, want 4", n)
	}

	// Duplicates: the last one wins.
	m.Set([]Target{ta, tb2, {ID: "a", Model: "m", HTTPAddress: addr(c), Kind: VLLM}})
	if ev := next(t, sink); ev.t.ID != "a" || ev.st.QueueDepth != 202 {
		t.Fatalf("duplicate ids: %+v", ev)
	}
	got := m.Targets()
	if len(got) != 2 || got[0].ID != "a" || got[0].HTTPAddress != addr(c) || got[1] != tb2.withDefaults() {
		t.Fatalf("Targets() = %+v", got)
	}
}

// TestSetNeverWaitsForAScrape: removing a target whose scrape hangs returns at once, cancels
// the request and reports nothing for it.
func TestSetNeverWaitsForAScrape(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	entered, left := make(chan struct{}), make(chan struct{})
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		close(left)
	})
	sink := make(chanSink, 4)
	m := NewManager(sink, fc, nil)
	defer m.Close()
	m.Set([]Target{{ID: "hung", Model: "m", HTTPAddress: addr(srv), Kind: SGLang}})
	<-entered
	m.Set(nil)
	<-left
	m.Close()
	none(t, sink)
	if fc.Pending() != 0 {
		t.Fatalf("%d timers left behind", fc.Pending())
	}
}

// TestCloseStopsEverything: Close is idempotent, stops all scrapers and leaves no goroutine;
// Set after Close does nothing.
func TestCloseStopsEverything(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, vllmPage("m", 1))
	}))
	sink := make(chanSink, 16)
	m := NewManager(sink, fc, prometheus.NewRegistry())
	var ts []Target
	for i := range 5 {
		ts = append(ts, Target{ID: fmt.Sprintf("w%d", i), Model: "m", HTTPAddress: addr(srv), Kind: VLLM})
	}
	m.Set(ts)
	for range ts {
		next(t, sink)
	}
	waitPending(t, fc, len(ts))
	m.Close()
	m.Close()
	if fc.Pending() != 0 {
		t.Fatalf("%d timers left behind", fc.Pending())
	}
	m.Set(ts)
	if len(m.Targets()) != 0 {
		t.Fatalf("Set after Close started %d scrapers", len(m.Targets()))
	}
	fc.Advance(time.Minute)
	none(t, sink)
	srv.Close()
	goleak.VerifyNone(t)
}

// TestTwoManagersShareARegistry: a second manager on the same registry reuses the series.
func TestTwoManagersShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m1 := NewManager(nil, nil, reg)
	m2 := NewManager(nil, nil, reg)
	m1.Close()
	m2.Close()
}

// TestAgainstTLEngine scrapes a running tlengine as a vLLM engine and by its own names: both
// read the engine's live load, which is what its heartbeat would report.
func TestAgainstTLEngine(t *testing.T) {
	efc := clock.NewFake(gwtest.Epoch0) // the engine's timing model
	e, err := engine.Start(engine.Config{ID: "e1", Model: "smol", KVBlocks: 64, BlockSize: 32, MaxRunning: 1,
		DecodePerToken: time.Second, Clock: efc})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	// One request runs and holds KV, one waits behind it.
	results := make(chan int, 2)
	for i := range 2 {
		go func() {
			body := fmt.Sprintf(`{"model":"smol","prompt":"a prompt long enough to hold a block or two %d","max_tokens":2,"seed":1}`, i)
			resp, err := client.Post("http://"+e.HTTPAddr+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	gwtest.Eventually(t, "one running, one queued", func() bool {
		st := e.Status()
		return st.Running == 1 && st.QueueDepth == 1
	})
	st := e.Status()
	// tlengine always publishes vllm:lora_requests_info (no adapter running, its 4 slots by
	// default) and its /v1/models carries max_model_len: both kinds read them.
	want := Status{QueueDepth: 1, Running: 1, KVFreeBlocks: int64(st.KVFreeBlocks), KVTotalBlocks: 64, BlockSize: 32,
		RunningLoRAs: []string{}, MaxLoRAs: 4, MaxModelLen: 2048}
	if want.KVFreeBlocks >= 64 {
		t.Fatalf("a running request holds no KV: %+v", st)
	}

	fc := clock.NewFake(gwtest.Epoch0)
	sink := make(chanSink, 4)
	m := NewManager(sink, fc, nil)
	defer m.Close()
	// No configured total: both kinds read the engine's own.
	m.Set([]Target{
		{ID: "as-vllm", Model: "smol", HTTPAddress: e.HTTPAddr, Kind: VLLM},
		{ID: "as-tlengine", Model: "smol", HTTPAddress: e.HTTPAddr, Kind: TLEngine},
	})
	for range 2 {
		ev := next(t, sink)
		if ev.err != nil {
			t.Fatalf("%s: %s: %v", ev.t.ID, ev.reason, ev.err)
		}
		if !cmp.Equal(ev.st, want) {
			t.Fatalf("%s scraped: %s", ev.t.ID, cmp.Diff(want, ev.st))
		}
	}

	gwtest.Eventually(t, "both requests finish", func() bool {
		efc.Advance(time.Second)
		return len(results) == 2
	})
	for range 2 {
		if code := <-results; code != 200 {
			t.Fatalf("status %d", code)
		}
	}
	waitPending(t, fc, 2)
	fc.Advance(2 * time.Second)
	for range 2 {
		ev := next(t, sink)
		if idle := (Status{KVFreeBlocks: 64, KVTotalBlocks: 64, BlockSize: 32, RunningLoRAs: []string{}, MaxLoRAs: 4, MaxModelLen: 2048}); ev.err != nil || !cmp.Equal(ev.st, idle) {
			t.Fatalf("%s after the requests: %+v %v, want %+v", ev.t.ID, ev.st, ev.err, idle)
		}
	}
}

// TestPageAtTheLimit: a page of exactly MaxBodyBytes is read, with or without Content-Length;
// one byte more is refused either way.
func TestPageAtTheLimit(t *testing.T) {
	base := vllmPage("m", 3)
	line := "# " + strings.Repeat("x", 1021) + "\n" // 1,024 bytes
	pad := func(n int) string {
		var b strings.Builder
		b.WriteString(base)
		for b.Len()+len(line) <= n {
			b.WriteString(line)
		}
		if rest := n - b.Len(); rest > 0 {
			b.WriteString("#" + strings.Repeat(" ", rest-2) + "\n")
		}
		return b.String()
	}
	for _, size := range []int{MaxBodyBytes, MaxBodyBytes + 1} {
		page := pad(size)
		if len(page) != size {
			t.Fatalf("padded to %d bytes, want %d", len(page), size)
		}
		for _, announced := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d bytes, Content-Length %v", size, announced), func(t *testing.T) {
				srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
					if announced {
						w.Header().Set("Content-Length", strconv.Itoa(len(page)))
					} else {
						w.(http.Flusher).Flush() // chunked: no length announced
					}
					io.WriteString(w, page)
				})
				fc := clock.NewFake(gwtest.Epoch0)
				sink := make(chanSink, 4)
				m := NewManager(sink, fc, prometheus.NewRegistry())
				defer m.Close()
				m.Set([]Target{{ID: "w", Model: "m", HTTPAddress: addr(srv), Kind: VLLM}})
				ev := next(t, sink)
				if size == MaxBodyBytes {
					if ev.err != nil || ev.st.QueueDepth != 3 {
						t.Fatalf("a page at the limit: %+v", ev)
					}
					return
				}
				if ev.reason != ReasonTooLarge {
					t.Fatalf("a page over the limit: reason %q (%v)", ev.reason, ev.err)
				}
			})
		}
	}
}

// TestManagerDialControl (R20): with WithDialControl, a scrape whose address resolves to one
// the engine address rules refuse (here a loopback engine off loopback) fails to connect
// without reaching the engine, at once; the same engine is scraped without the rule.
func TestManagerDialControl(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	var hits atomic.Int64
	srv := serve(t, metricsOnly(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, vllmPage("m", 0))
	}))
	for _, refuse := range []bool{true, false} {
		sink := make(chanSink, 16)
		reg := prometheus.NewRegistry()
		m := NewManager(sink, fc, reg, WithDialControl(engineaddr.Rules{RefuseLoopback: refuse}.Control, nil))
		m.Set([]Target{{ID: "w1", Model: "m", HTTPAddress: "localhost:" + srv.URL[strings.LastIndexByte(srv.URL, ':')+1:], Kind: VLLM}})
		ev := next(t, sink)
		m.Close()
		if refuse && (ev.reason != ReasonConnect || ev.err == nil || !strings.Contains(ev.err.Error(), engineaddr.ErrRefused.Error()) || hits.Load() != 0) {
			t.Fatalf("a loopback engine off loopback: %s %v, %d requests reached it", ev.reason, ev.err, hits.Load())
		}
		if !refuse && (ev.err != nil || hits.Load() != 1) {
			t.Fatalf("without the rule: %s %v, %d requests", ev.reason, ev.err, hits.Load())
		}
	}
}

// infoCount is tlgw_scrape_info_errors_total{worker,source,reason}.
func infoCount(t *testing.T, reg *prometheus.Registry, worker, source, reason string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "tlgw_scrape_info_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "worker") == worker && labelValue(m, "source") == source && labelValue(m, "reason") == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// loraEngine is an httptest engine serving a vLLM metrics page with a lora_requests_info
// sample and a /v1/models answer that a test changes, counting the /v1/models reads.
type loraEngine struct {
	srv     *httptest.Server
	reads   atomic.Int64
	models  atomic.Pointer[string] // the body of GET /v1/models; "" answers 500
	metrics atomic.Bool            // false: GET /metrics answers 500
}

func newLoRAEngine(t *testing.T, models string) *loraEngine {
	t.Helper()
	e := &loraEngine{}
	e.models.Store(&models)
	e.metrics.Store(true)
	e.srv = serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			if !e.metrics.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, vllmPage("m", 0)+loraLine("run-1", "4", 1.7e9))
		case "/v1/models":
			e.reads.Add(1)
			body := *e.models.Load()
			if body == "" {
				http.Error(w, "no models", http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
		default:
			http.NotFound(w, r)
		}
	})
	return e
}

func (e *loraEngine) serveModels(body string) { e.models.Store(&body) }

// TestManagerReadsModelsOnSchedule (R21): over loopback, a static worker's adapters and
// context length (its /v1/models) and its running adapters (its metrics page) reach the sink
// with its load. /v1/models is read at the first good scrape and then once per ModelsInterval
// on the injected clock, not on every scrape: a list changed between reads shows at the next
// read only. A read that fails (an error status, a body that is no list) keeps the last good
// list, fails no scrape and is counted by reason; the next good read replaces the list.
func TestManagerReadsModelsOnSchedule(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	e := newLoRAEngine(t, vllmModels("m", "4096", "a2", "a1"))
	sink := make(chanSink, 4)
	reg := prometheus.NewRegistry()
	m := NewManager(sink, fc, reg)
	defer m.Close()
	m.Set([]Target{{ID: "w", Model: "m", HTTPAddress: addr(e.srv), Kind: VLLM, KVTotalBlocks: 100}})

	want := Status{KVFreeBlocks: 50, KVTotalBlocks: 100, Running: 1,
		RunningLoRAs: []string{"run-1"}, MaxLoRAs: 4, LoRAAdapters: []string{"a1", "a2"}, MaxModelLen: 4096}
	at := time.Duration(0) // the fake clock's time since the first scrape
	// scrape advances to the next scrape and checks its report and the reads of /v1/models.
	scrape := func(reads int64) {
		t.Helper()
		if at > 0 {
			waitPending(t, fc, 1)
			fc.Advance(2 * time.Second)
		}
		ev := next(t, sink)
		if ev.err != nil {
			t.Fatalf("at %v: the scrape failed: %s %v", at, ev.reason, ev.err)
		}
		if diff := cmp.Diff(want, ev.st); diff != "" {
			t.Fatalf("at %v: -want +got:\n%s", at, diff)
		}
		if got := e.reads.Load(); got != reads {
			t.Fatalf("at %v: /v1/models read %d times, want %d", at, got, reads)
		}
		at += 2 * time.Second
	}

	scrape(1) // the first good scrape reads it
	e.serveModels(vllmModels("m", "8192", "b1"))
	for at < ModelsInterval {
		scrape(1) // 28 s of scrapes read the same list
	}
	want.LoRAAdapters, want.MaxModelLen = []string{"b1"}, 8192
	scrape(2) // 30 s: read again

	e.serveModels("") // 500 from now on
	for at < 2*ModelsInterval {
		scrape(2)
	}
	scrape(3) // 60 s: read, failed, the list of 30 s kept
	if n := infoCount(t, reg, "w", SourceModels, ReasonStatus); n != 1 {
		t.Fatalf("a failed read of /v1/models counted %v times, want 1", n)
	}
	e.serveModels(`<html>not a list</html>`)
	for at < 3*ModelsInterval {
		scrape(3)
	}
	scrape(4) // 90 s: a body that is no list, the list kept
	if n := infoCount(t, reg, "w", SourceModels, ReasonParse); n != 1 {
		t.Fatalf("an unreadable /v1/models counted %v times, want 1", n)
	}
	if n := errCount(t, reg, "w", ReasonStatus) + errCount(t, reg, "w", ReasonParse); n != 0 {
		t.Fatalf("a failed /v1/models counted as a failed scrape (%v)", n)
	}

	e.serveModels(vllmModels("m", "2048", "c1", "bad name", "m"))
	for at < 4*ModelsInterval {
		scrape(4)
	}
	want.LoRAAdapters, want.MaxModelLen = []string{"c1"}, 2048
	scrape(5) // 120 s: a good read again
	if n := infoCount(t, reg, "w", SourceModels, ReasonInvalidName); n != 2 {
		t.Fatalf("the dropped names counted %v times, want 2 (once per read)", n)
	}
	scrape(5)
	if n := infoCount(t, reg, "w", SourceModels, ReasonInvalidName); n != 2 {
		t.Fatalf("the dropped names counted %v times after a scrape without a read, want 2", n)
	}
}

// TestManagerReadsModelsAtFirstGoodScrape: /v1/models is not read while the metrics scrape
// fails (the engine is not up), and is read at the first good scrape, however soon; the
// reports carry it from that scrape on.
func TestManagerReadsModelsAtFirstGoodScrape(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	e := newLoRAEngine(t, vllmModels("m", "4096", "a1"))
	e.metrics.Store(false)
	sink := make(chanSink, 4)
	m := NewManager(sink, fc, nil)
	defer m.Close()
	m.Set([]Target{{ID: "w", Model: "m", HTTPAddress: addr(e.srv), Kind: VLLM}})
	if ev := next(t, sink); ev.reason != ReasonStatus || e.reads.Load() != 0 {
		t.Fatalf("a failed scrape: %s %v, %d reads of /v1/models", ev.reason, ev.err, e.reads.Load())
	}
	e.metrics.Store(true)
	waitPending(t, fc, 1)
	fc.Advance(2 * time.Second)
	ev := next(t, sink)
	if ev.err != nil || !slices.Equal(ev.st.LoRAAdapters, []string{"a1"}) || ev.st.MaxModelLen != 4096 || e.reads.Load() != 1 {
		t.Fatalf("the first good scrape: %+v, %d reads of /v1/models", ev, e.reads.Load())
	}
}

// infoSeries is how many tlgw_scrape_info_errors_total series worker has.
func infoSeries(t *testing.T, reg *prometheus.Registry, worker string) int {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if f.GetName() == "tlgw_scrape_info_errors_total" && labelValue(m, "worker") == worker {
				n++
			}
		}
	}
	return n
}

// TestManagerCountsLoRAInfoProblems: what a page's lora_requests_info holds that tlgw cannot
// use never fails the scrape, and is counted on every scrape, as the page is read each time:
// an unreadable family by its reason, each dropped name as invalid_name or too_many_names. A
// worker whose page and list are clean has no such series at all.
func TestManagerCountsLoRAInfoProblems(t *testing.T) {
	fc := clock.NewFake(gwtest.Epoch0)
	var lora atomic.Pointer[string]
	models := vllmModels("m", "1")
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, models)
			return
		}
		fmt.Fprint(w, vllmPage("m", 0)+*lora.Load())
	})
	clean := loraLine("a", "2", 1)
	lora.Store(&clean)
	sink := make(chanSink, 4)
	reg := prometheus.NewRegistry()
	m := NewManager(sink, fc, reg)
	defer m.Close()
	m.Set([]Target{{ID: "w", Model: "m", HTTPAddress: addr(srv), Kind: VLLM}})
	if ev := next(t, sink); ev.err != nil || !slices.Equal(ev.st.RunningLoRAs, []string{"a"}) {
		t.Fatalf("a clean page: %+v", ev)
	}
	if n := infoSeries(t, reg, "w"); n != 0 {
		t.Fatalf("a clean page and list left %d series", n)
	}
	for _, c := range []struct {
		page, reason string
		per          float64 // counted per scrape
	}{
		{loraLine("a", "2", 1) + "vllm:lora_requests_info{max_lora=\"2\" 1\n", ReasonParse, 1},
		{loraLine(strings.Repeat("x,", MaxReadBytes/2), "2", 1), ReasonTooLarge, 1},
		{loraLine("ok,bad name,m,", "2", 1), ReasonInvalidName, 3},
		{loraLine(strings.Join(seq(router.MaxLoRAAdapters+5), ","), "2", 1), ReasonTooManyNames, 5},
	} {
		lora.Store(&c.page)
		for i := 1; i <= 2; i++ {
			waitPending(t, fc, 1)
			fc.Advance(2 * time.Second)
			if ev := next(t, sink); ev.err != nil {
				t.Fatalf("%s: the scrape failed: %s %v", c.reason, ev.reason, ev.err)
			}
			if n := infoCount(t, reg, "w", SourceLoRAInfo, c.reason); n != c.per*float64(i) {
				t.Fatalf("%s after %d scrapes: counted %v, want %v", c.reason, i, n, c.per*float64(i))
			}
		}
	}
}
