package enginepool

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/adapters/scrape"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/gwtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeResolver answers from a table the test sets; each lookup is announced on asked.
type fakeResolver struct {
	mu    sync.Mutex
	ips   []netip.Addr
	err   error
	asked chan string // capacity: more than any test's lookups
}

func (r *fakeResolver) set(err error, ips ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ips, r.err = nil, err
	for _, s := range ips {
		r.ips = append(r.ips, netip.MustParseAddr(s))
	}
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	ips, err := slices.Clone(r.ips), r.err
	r.mu.Unlock()
	r.asked <- network + " " + host
	return ips, err
}

// fakeScraper keeps the last target set.
type fakeScraper struct {
	mu     sync.Mutex
	last   []scrape.Target
	forgot []string
}

func (s *fakeScraper) Set(ts []scrape.Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = slices.Clone(ts)
}

func (s *fakeScraper) Forget(series string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgot = append(s.forgot, series)
}

// view is the target set as "id" or "id draining".
func (s *fakeScraper) view() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, t := range s.last {
		v := t.ID
		if t.Draining {
			v += " draining"
		}
		out = append(out, v)
	}
	return out
}

// fakeFleet lists the workers the test says, and records retirements.
type fakeFleet struct {
	mu      sync.Mutex
	workers map[string]router.WorkerView
	retired []string
}

func (f *fakeFleet) put(id string, draining bool, inFlight int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.workers[id] = router.WorkerView{Info: router.WorkerInfo{ID: id, Draining: draining}, InFlight: inFlight}
}

func (f *fakeFleet) Workers() (*router.WorkerList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &router.WorkerList{}
	for _, w := range f.workers {
		out.Workers = append(out.Workers, w)
	}
	return out, nil
}

func (f *fakeFleet) Retire(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retired = append(f.retired, id)
	delete(f.workers, id)
}

func (f *fakeFleet) takeRetired() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.retired
	f.retired = nil
	slices.Sort(out)
	return out
}

type harness struct {
	t   *testing.T
	ps  *Pools
	res *fakeResolver
	scr *fakeScraper
	fl  *fakeFleet
	clk *clock.Fake
	reg *prometheus.Registry
}

var poolCfg = config.NormalizeEnginePools([]config.EnginePool{{
	Name: "p", Model: "m", DNS: "engines.ns:8000", Metrics: "vllm", KVEventsEndpoint: "tcp://{ip}:5557",
}})[0]

func newHarness(t *testing.T, rules engineaddr.Rules) *harness {
	h := &harness{
		t: t, res: &fakeResolver{asked: make(chan string, 64)}, scr: &fakeScraper{},
		fl: &fakeFleet{workers: map[string]router.WorkerView{}}, clk: clock.NewFake(time.Unix(1e9, 0)),
		reg: prometheus.NewRegistry(),
	}
	h.ps = New(Options{Resolver: h.res, Scraper: h.scr, Fleet: h.fl, Rules: rules, Clock: h.clk, Metrics: NewMetrics(h.reg)})
	return h
}

// added puts pool c in without its loop: the test drives resolve and checkDrains itself.
func (h *harness) added(c config.EnginePool) *pool {
	h.ps.mu.Lock()
	defer h.ps.mu.Unlock()
	p := h.ps.newPool(c)
	h.ps.pools[c.Name] = p
	h.t.Cleanup(p.cancel)
	return p
}

func (h *harness) resolve(p *pool, err error, ips ...string) {
	h.t.Helper()
	h.res.set(err, ips...)
	h.ps.resolve(p)
	if got := <-h.res.asked; got != "ip engines.ns" {
		h.t.Fatalf("asked %q", got)
	}
}

func (h *harness) want(targets ...string) {
	h.t.Helper()
	if diff := cmp.Diff(targets, h.scr.view()); diff != "" {
		h.t.Fatalf("targets (-want +got):\n%s", diff)
	}
}

func (h *harness) gauge(state string) float64 {
	return testutil.ToFloat64(h.ps.o.Metrics.members.WithLabelValues("p", state))
}

// TestRecordsAddedRemovedChanged: every record is a target "<pool>/<ip:port>" with the
// pool's settings; a record that vanishes drains, one that comes back before its drain ended
// is active again.
func TestRecordsAddedRemovedChanged(t *testing.T) {
	h := newHarness(t, engineaddr.Rules{})
	p := h.added(poolCfg)
	h.resolve(p, nil, "10.0.0.2", "10.0.0.1", "fd00::7", "::ffff:10.0.0.1")
	h.want("p/10.0.0.1:8000", "p/10.0.0.2:8000", "p/[fd00::7]:8000")
	ts := h.scr.last
	if tt := ts[2]; tt.HTTPAddress != "[fd00::7]:8000" || tt.Model != "m" || tt.Kind != "vllm" || tt.Series != "p" ||
		tt.KVEventsEndpoint != "tcp://[fd00::7]:5557" || tt.BootstrapPort != 8998 || tt.Interval != 2*time.Second || tt.Role != "unified" {
		t.Fatalf("target %+v", tt)
	}
	if ts[0].KVEventsEndpoint != "tcp://10.0.0.1:5557" {
		t.Fatalf("kv endpoint %q", ts[0].KVEventsEndpoint)
	}
	if h.gauge("active") != 3 || h.gauge("draining") != 0 {
		t.Fatalf("gauges %v %v", h.gauge("active"), h.gauge("draining"))
	}

	h.resolve(p, nil, "10.0.0.2", "10.0.0.3")
	h.want("p/10.0.0.1:8000 draining", "p/10.0.0.2:8000", "p/10.0.0.3:8000", "p/[fd00::7]:8000 draining")
	if h.gauge("active") != 2 || h.gauge("draining") != 2 {
		t.Fatalf("gauges %v %v", h.gauge("active"), h.gauge("draining"))
	}
	// The same ids on every resolve: nothing restarts for a record that stays.
	h.resolve(p, nil, "10.0.0.3", "10.0.0.2", "10.0.0.1")
	h.want("p/10.0.0.1:8000", "p/10.0.0.2:8000", "p/10.0.0.3:8000", "p/[fd00::7]:8000 draining")
}

// TestDrainThenRemove: a draining member leaves once the router lists its worker draining
// with nothing in flight (retired), or does not list it at all (just dropped).
func TestDrainThenRemove(t *testing.T) {
	h := newHarness(t, engineaddr.Rules{})
	p := h.added(poolCfg)
	h.resolve(p, nil, "10.0.0.1", "10.0.0.2", "10.0.0.3")
	for _, id := range []string{"p/10.0.0.1:8000", "p/10.0.0.2:8000"} {
		h.fl.put(id, false, 2)
	}
	h.resolve(p, nil, "10.0.0.3")
	// The draining scrape has not landed: the router still sees it routable.
	if !h.ps.checkDrains(p) {
		t.Fatal("no drain pending")
	}
	h.want("p/10.0.0.1:8000 draining", "p/10.0.0.2:8000 draining", "p/10.0.0.3:8000")
	// Draining but requests in flight: it stays, scraped.
	h.fl.put("p/10.0.0.1:8000", true, 1)
	h.ps.checkDrains(p)
	h.want("p/10.0.0.1:8000 draining", "p/10.0.0.2:8000 draining", "p/10.0.0.3:8000")
	if r := h.fl.takeRetired(); r != nil {
		t.Fatalf("retired %v early", r)
	}
	// Its last request ends: retired, no longer scraped.
	h.fl.put("p/10.0.0.1:8000", true, 0)
	if !h.ps.checkDrains(p) {
		t.Fatal("10.0.0.2 drains still")
	}
	h.want("p/10.0.0.2:8000 draining", "p/10.0.0.3:8000")
	if r := h.fl.takeRetired(); !slices.Equal(r, []string{"p/10.0.0.1:8000"}) {
		t.Fatalf("retired %v", r)
	}
	// The other one's engine is gone: evicted by its deadline, it is just dropped.
	h.fl.mu.Lock()
	delete(h.fl.workers, "p/10.0.0.2:8000")
	h.fl.mu.Unlock()
	if h.ps.checkDrains(p) {
		t.Fatal("a drain is still pending")
	}
	h.want("p/10.0.0.3:8000")
	if r := h.fl.takeRetired(); r != nil {
		t.Fatalf("retired %v", r)
	}
	if h.gauge("active") != 1 || h.gauge("draining") != 0 {
		t.Fatalf("gauges %v %v", h.gauge("active"), h.gauge("draining"))
	}
}

// TestFailureKeepsTheSet: a failed lookup keeps the last good set (counted); one empty
// answer too, the second empties the pool.
func TestFailureKeepsTheSet(t *testing.T) {
	h := newHarness(t, engineaddr.Rules{})
	p := h.added(poolCfg)
	h.resolve(p, nil, "10.0.0.1", "10.0.0.2")
	failures := func() float64 { return testutil.ToFloat64(h.ps.o.Metrics.failures.WithLabelValues("p")) }

	h.resolve(p, &net.DNSError{Err: "server misbehaving", Name: "engines.ns", IsTemporary: true})
	h.want("p/10.0.0.1:8000", "p/10.0.0.2:8000")
	h.resolve(p, context.DeadlineExceeded)
	h.want("p/10.0.0.1:8000", "p/10.0.0.2:8000")
	if failures() != 2 {
		t.Fatalf("failures %v, want 2", failures())
	}
	notFound := &net.DNSError{Err: "no such host", Name: "engines.ns", IsNotFound: true}
	h.resolve(p, notFound)
	h.want("p/10.0.0.1:8000", "p/10.0.0.2:8000")
	if failures() != 3 {
		t.Fatalf("failures %v, want 3", failures())
	}
	// A good answer in between resets the confirmation.
	h.resolve(p, nil, "10.0.0.1", "10.0.0.2")
	h.resolve(p, nil)
	h.want("p/10.0.0.1:8000", "p/10.0.0.2:8000")
	h.resolve(p, notFound)
	h.want("p/10.0.0.1:8000 draining", "p/10.0.0.2:8000 draining")
	if failures() != 4 {
		t.Fatalf("failures %v, want 4", failures())
	}
}

// TestBounds: past config.MaxPoolWorkers records, the lowest addresses are kept and the rest
// counted; addresses the engine rules refuse are dropped and counted; draining members beyond
// the bound are retired, oldest first.
func TestBounds(t *testing.T) {
	h := newHarness(t, engineaddr.Rules{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	p := h.added(poolCfg)
	var ips []string
	for i := range config.MaxPoolWorkers + 6 {
		ips = append(ips, fmt.Sprintf("10.1.%d.%d", i/256, i%256))
	}
	ips = append(ips, "169.254.169.254", "0.0.0.0", "192.168.1.1")
	h.resolve(p, nil, ips...)
	if n := len(h.scr.view()); n != config.MaxPoolWorkers {
		t.Fatalf("%d targets, want %d", n, config.MaxPoolWorkers)
	}
	if last := h.scr.last[len(h.scr.last)-1].ID; strings.HasPrefix(last, "p/10.1.4.") {
		t.Fatalf("kept %s, past the lowest %d", last, config.MaxPoolWorkers)
	}
	dropped := func(reason string) float64 {
		return testutil.ToFloat64(h.ps.o.Metrics.drops.WithLabelValues("p", reason))
	}
	if dropped("over_limit") != 6 || dropped("refused") != 3 {
		t.Fatalf("dropped over_limit %v refused %v", dropped("over_limit"), dropped("refused"))
	}
	// A whole new set: the old one drains (1024), within the bound.
	var next []string
	for i := range config.MaxPoolWorkers {
		next = append(next, fmt.Sprintf("10.2.%d.%d", i/256, i%256))
	}
	h.clk.Advance(time.Second)
	h.resolve(p, nil, next...)
	if r := h.fl.takeRetired(); r != nil {
		t.Fatalf("retired %d within the bound", len(r))
	}
	// Another: 2048 would drain; the 1024 oldest are retired at once.
	h.clk.Advance(time.Second)
	h.resolve(p, nil, "10.3.0.1")
	r := h.fl.takeRetired()
	if len(r) != config.MaxPoolWorkers || !strings.HasPrefix(r[0], "p/10.1.") || dropped("drain_overflow") != config.MaxPoolWorkers {
		t.Fatalf("retired %d (first %v), drain_overflow %v", len(r), r[:min(1, len(r))], dropped("drain_overflow"))
	}
	if n := len(h.scr.view()); n != config.MaxPoolWorkers+1 {
		t.Fatalf("%d targets, want %d", n, config.MaxPoolWorkers+1)
	}
}

// TestLoop: Set starts a pool that resolves at once and then every refresh on the clock,
// checks drains every scrape interval while one is pending, and, once dropped from the table,
// drains every worker and ends (its series forgotten).
func TestLoop(t *testing.T) {
	h := newHarness(t, engineaddr.Rules{})
	defer h.ps.Close()
	c := poolCfg
	c.Refresh = config.Duration(10 * time.Second)
	h.res.set(nil, "10.0.0.1", "10.0.0.2")
	h.ps.Set([]config.EnginePool{c})
	<-h.res.asked
	waitTimer := func(want time.Duration) {
		t.Helper()
		gwtest.Eventually(t, fmt.Sprintf("the loop's timer %v from now", want), func() bool {
			d, ok := h.clk.Next()
			return ok && d == want
		})
	}
	waitTimer(10 * time.Second)
	h.want("p/10.0.0.1:8000", "p/10.0.0.2:8000")
	h.fl.put("p/10.0.0.1:8000", true, 1)

	h.res.set(nil, "10.0.0.2")
	h.clk.Advance(10 * time.Second)
	<-h.res.asked
	waitTimer(2 * time.Second) // a drain pending: checked every scrape interval
	h.want("p/10.0.0.1:8000 draining", "p/10.0.0.2:8000")
	h.fl.put("p/10.0.0.1:8000", true, 0)
	h.clk.Advance(2 * time.Second)
	waitTimer(8 * time.Second) // drained: back to the refresh, due at 20 s
	if r := h.fl.takeRetired(); !slices.Equal(r, []string{"p/10.0.0.1:8000"}) {
		t.Fatalf("retired %v", r)
	}
	h.want("p/10.0.0.2:8000")

	// Dropped from the table: its worker drains (one request still in flight, so the drain is
	// pending when the loop first checks it), then the pool ends.
	h.fl.put("p/10.0.0.2:8000", true, 1)
	h.ps.Set(nil)
	h.want("p/10.0.0.2:8000 draining")
	h.fl.put("p/10.0.0.2:8000", true, 0)
	gwtest.Eventually(t, "the dropped pool ends", func() bool {
		h.ps.mu.Lock()
		n := len(h.ps.pools)
		h.ps.mu.Unlock()
		if n > 0 {
			h.clk.Advance(2 * time.Second) // its drain checks, every scrape interval
		}
		return n == 0
	})
	h.want()
	if !slices.Equal(h.scr.forgot, []string{"p"}) {
		t.Fatalf("forgot %v", h.scr.forgot)
	}
	select {
	case q := <-h.res.asked:
		t.Fatalf("a dropped pool resolved %q", q)
	default:
	}
	if err := testutil.CollectAndCompare(h.ps.o.Metrics.members, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
}
