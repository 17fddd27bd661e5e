package scrape

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/oai"
)

// Target is one static worker to scrape.
type Target struct {
	ID, Model, HTTPAddress, Role string
	Kind                         Kind
	// MetricsURL is the page to read; "" means http://<HTTPAddress>/metrics.
	MetricsURL string
	// Interval is the time between scrapes (default 2 s).
	Interval time.Duration
	// KVTotalBlocks is the KV total used when the engine does not report one.
	KVTotalBlocks int64
	// Endpoints are the serving endpoints the worker is configured to answer (0 = not said);
	// the scraper passes them on untouched.
	Endpoints oai.EndpointSet
	// KVEventsEndpoint is the engine's vLLM-format KV-event endpoint (R22), passed through to
	// its WorkerInfo.
	KVEventsEndpoint string
	// BootstrapPort is the engine's SGLang bootstrap port (R22), passed through to its
	// WorkerInfo.
	BootstrapPort int
	// Draining: the target is on its way out (R23: an engine pool's record vanished); passed
	// through to its WorkerInfo, so no new request goes there while its own finish.
	Draining bool
	// Series is the worker label of the target's scrape metrics; "" = its ID. An engine pool's
	// targets share their pool's name (R23: an IP is never a label), and their series stay
	// when one of them stops (Forget drops them with the pool).
	Series string
}

// series is the worker label of t's metrics.
func (t Target) series() string {
	if t.Series != "" {
		return t.Series
	}
	return t.ID
}

// DefaultInterval is a target's scrape interval when it names none.
const DefaultInterval = 2 * time.Second

// MaxBodyBytes bounds a metrics page; a longer one fails with reason too_large.
const MaxBodyBytes = 4 << 20

// maxTimeout caps the per-scrape timeout, which is otherwise 80% of the interval.
const maxTimeout = 10 * time.Second

// ModelsInterval is how often a scraper reads the engine's GET /v1/models (R21: its LoRA
// adapters and context length): at its first good scrape, then at the first good scrape at
// least ModelsInterval after the last read, on the injected clock. Adapters change only when
// an operator loads or unloads one, so 30 s bounds how stale the list gets while an engine
// scraped every 2 s answers one /v1/models for 15 metrics pages; a time rather than a count of
// scrapes keeps that staleness whatever the scrape interval (one of 30 s or more reads it on
// every scrape). A read that fails keeps the last good list and waits for the next one.
const ModelsInterval = 30 * time.Second

// modelsURL is the engine's model list, beside its serving endpoints.
func (t Target) modelsURL() string { return "http://" + t.HTTPAddress + "/v1/models" }

// withDefaults fills in the interval and the metrics URL.
func (t Target) withDefaults() Target {
	if t.Interval <= 0 {
		t.Interval = DefaultInterval
	}
	if t.MetricsURL == "" {
		t.MetricsURL = "http://" + t.HTTPAddress + "/metrics"
	}
	return t
}

// timeout is how long one scrape may take: 80% of the interval, at most 10 s.
func (t Target) timeout() time.Duration {
	return min(t.Interval*8/10, maxTimeout)
}

// Sink receives every scrape's outcome. Calls for one target come from its scraper goroutine,
// one at a time and in order. A sink may block briefly (an actor request) but must not call
// Set or Close.
type Sink interface {
	// Scraped reports a good scrape: the worker is alive with this load.
	Scraped(t Target, st Status)
	// Failed reports a failed scrape with its reason (the Reason* constants) and a clear error.
	Failed(t Target, reason string, err error)
}

// Manager runs one scraper per target.
//
// A scraper scrapes at once, then every Interval on the injected clock; each scrape has a
// timeout of 80% of the interval (at most 10 s), also on that clock. After a good scrape that
// finds the engine's /v1/models due (ModelsInterval), the scraper reads it, under the same
// timeout, dialer and redirect rule, before it reports; what it read (or the last good read)
// goes into every report until the next read. Only the metrics page decides a scrape's
// outcome. Set and Close never wait
// for a scrape: a removed scraper's request is cancelled and its result dropped. A report
// already being handed to the sink when Set removes or replaces its target may still arrive
// after Set returns; nothing after it does.
type Manager struct {
	sink      Sink
	clk       clock.Clock
	met       *metrics
	transport *http.Transport
	client    *http.Client

	mu sync.Mutex
	// scrapers: one per target of the current set (the static workers' table), each with one
	// goroutine, one timer and its series (forgotten at stop): bounded by the table. The
	// transport keeps at most one idle connection per target's host, closed after 90 s idle.
	scrapers map[string]*scraper // by target id
	closed   bool
	wg       sync.WaitGroup
}

// Option adjusts a Manager.
type Option func(*net.Dialer)

// WithDialControl vets each scrape connection's resolved address before it is made
// (engineaddr.Rules.Control, R20): a static worker's address is held to the engine address
// rules where its name resolves, as a heartbeated one is. res, when set, resolves the names.
func WithDialControl(control func(network, address string, c syscall.RawConn) error, res *net.Resolver) Option {
	return func(d *net.Dialer) { d.Control, d.Resolver = control, res }
}

// NewManager returns a manager with no targets. reg may be nil (no metrics exported); a nil clk
// is the real clock.
func NewManager(sink Sink, clk clock.Clock, reg prometheus.Registerer, opts ...Option) *Manager {
	if clk == nil {
		clk = clock.Real{}
	}
	if sink == nil {
		sink = discard{}
	}
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	for _, o := range opts {
		o(d)
	}
	tr := &http.Transport{
		// Engines are reached directly: no proxy from the environment.
		Proxy:               nil,
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	return &Manager{
		sink:      sink,
		clk:       clk,
		met:       newMetrics(reg),
		transport: tr,
		client: &http.Client{
			Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
		scrapers: make(map[string]*scraper),
	}
}

type discard struct{}

func (discard) Scraped(Target, Status)       {}
func (discard) Failed(Target, string, error) {}

// Set makes targets the scraped set: scrapers start for new ids, stop for ids no longer listed,
// and restart for ids whose target changed; unchanged ones keep their schedule. With duplicate
// ids the last one wins. Set returns at once; it is a no-op after Close.
func (m *Manager) Set(targets []Target) {
	want := make(map[string]Target, len(targets))
	for _, t := range targets {
		want[t.ID] = t.withDefaults()
	}
	var stop, start []*scraper
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	for id, s := range m.scrapers {
		if t, ok := want[id]; !ok || t != s.t {
			stop = append(stop, s)
			delete(m.scrapers, id)
		}
	}
	for id, t := range want {
		if _, ok := m.scrapers[id]; ok {
			continue
		}
		s := m.newScraper(t)
		m.scrapers[id] = s
		start = append(start, s)
	}
	m.wg.Add(len(start))
	m.mu.Unlock()

	// Old scrapers stop before their replacements start, so a target's reports stay in order.
	for _, s := range stop {
		s.stop()
	}
	for _, s := range start {
		go s.run()
	}
}

// Targets returns the scraped targets by id, with defaults filled in.
func (m *Manager) Targets() []Target {
	m.mu.Lock()
	out := make([]Target, 0, len(m.scrapers))
	for _, s := range m.scrapers {
		out = append(out, s.t)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Close stops every scraper, waits for their goroutines and closes idle connections. It may be
// called more than once.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	all := make([]*scraper, 0, len(m.scrapers))
	for id, s := range m.scrapers {
		all = append(all, s)
		delete(m.scrapers, id)
	}
	m.mu.Unlock()
	for _, s := range all {
		s.stop()
	}
	m.wg.Wait()
	m.transport.CloseIdleConnections()
}

// current reports whether s is the live scraper of its id (called with s.mu held).
func (m *Manager) current(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.scrapers[id]
	return ok
}

// scraper is one target's loop.
type scraper struct {
	m      *Manager
	t      Target
	ctx    context.Context
	cancel context.CancelFunc

	// mu orders stop against metric updates: after stop, s touches no series.
	mu      sync.Mutex
	stopped bool

	// The last good read of /v1/models, and when the next is due (zero: at the first good
	// scrape). Only the scraper's goroutine touches them.
	models     modelsRead
	modelsNext time.Time
}

func (m *Manager) newScraper(t Target) *scraper {
	ctx, cancel := context.WithCancel(context.Background())
	return &scraper{m: m, t: t, ctx: ctx, cancel: cancel}
}

// stop cancels the loop and its scrape in flight, and removes the target's series unless a
// scraper for the same id has taken over. The lock order is s.mu, then m.mu.
func (s *scraper) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.cancel()
	if s.t.Series == "" && !s.m.current(s.t.ID) {
		s.m.met.forget(s.t.ID)
	}
}

// Forget drops the scrape series labelled series (Target.Series) once no target uses it.
func (m *Manager) Forget(series string) {
	m.met.forget(series)
}

func (s *scraper) run() {
	defer s.m.wg.Done()
	wake := make(chan struct{}, 1)
	for s.ctx.Err() == nil {
		s.scrapeOnce()
		tm := s.m.clk.AfterFunc(s.t.Interval, func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
		select {
		case <-wake:
		case <-s.ctx.Done():
			tm.Stop()
		}
	}
}

// scrapeOnce scrapes and reports, unless the scraper was stopped meanwhile.
func (s *scraper) scrapeOnce() {
	begin := s.m.clk.Now()
	st, lr, err := s.fetch()
	took := s.m.clk.Now().Sub(begin)
	var (
		fresh     *modelsRead
		modelsErr error
	)
	if err == nil {
		fresh, modelsErr = s.refreshModels()
	}
	if s.ctx.Err() != nil {
		return
	}
	reason := ""
	if err != nil {
		reason = reasonOf(err)
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.m.met.observe(s.t.series(), took, reason)
	if err == nil {
		s.m.met.infoRead(s.t.series(), lr, fresh, modelsErr)
	}
	s.mu.Unlock()
	if err != nil {
		s.m.sink.Failed(s.t, reason, err)
		return
	}
	st.LoRAAdapters, st.MaxModelLen = s.models.adapters, s.models.maxModelLen
	s.m.sink.Scraped(s.t, st)
}

// refreshModels reads the engine's /v1/models when it is due (ModelsInterval). A good read
// replaces s.models and is returned; a failed one keeps s.models and returns the error.
// Nothing is read for a target without an HTTP address.
func (s *scraper) refreshModels() (*modelsRead, error) {
	now := s.m.clk.Now()
	if s.t.HTTPAddress == "" || now.Before(s.modelsNext) {
		return nil, nil
	}
	s.modelsNext = now.Add(ModelsInterval)
	body, err := s.get(request{url: s.t.modelsURL(), accept: "application/json", what: "list", limit: MaxModelsBytes})
	if err != nil {
		return nil, err
	}
	mr, err := readModels(s.t.Model, body)
	if err != nil {
		return nil, &scrapeError{reason: reasonOf(err), err: fmt.Errorf("GET %s: %w", s.t.modelsURL(), err)}
	}
	s.models = mr
	return &s.models, nil
}

// errTimedOut is the cancel cause when a scrape's timeout fires.
var errTimedOut = errors.New("scrape timeout")

// fetch does one GET of the metrics page and parses it.
func (s *scraper) fetch() (Status, loraRead, error) {
	t := s.t
	if _, ok := dialects[t.Kind]; !ok {
		return Status{}, loraRead{}, failf(ReasonInvalidTarget, "unknown metrics kind %q: want vllm, sglang or tlengine", t.Kind)
	}
	u, err := url.Parse(t.MetricsURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Status{}, loraRead{}, failf(ReasonInvalidTarget, "metrics URL %q is not an http(s) URL with a host", t.MetricsURL)
	}
	// Ask for the classic text format, which expfmt's text parser reads.
	body, err := s.get(request{
		url: u.String(), accept: "text/plain;version=0.0.4;q=1,*/*;q=0.1", what: "page", limit: MaxBodyBytes,
		redirectHint: "; redirects are not followed, set metrics_url to the final address",
	})
	if err != nil {
		return Status{}, loraRead{}, err
	}
	st, lr, err := parse(t.Kind, t.Model, body, t.KVTotalBlocks)
	if err != nil {
		return Status{}, loraRead{}, &scrapeError{reason: reasonOf(err), err: fmt.Errorf("GET %s: %w", t.MetricsURL, err)}
	}
	return st, lr, nil
}

// request is one GET of a scrape.
type request struct {
	url, accept string
	what        string // the body's name in errors: "page", "list"
	limit       int64  // the largest body read
	// redirectHint ends the message of a redirect.
	redirectHint string
}

// get does one GET with the scrape's timeout and reads the body of a 200 answer, of at most
// r.limit bytes; a redirect is an error, never followed.
func (s *scraper) get(r request) ([]byte, error) {
	rawURL, limit := r.url, r.limit
	timeout := s.t.timeout()
	ctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)
	tm := s.m.clk.AfterFunc(timeout, func() { cancel(errTimedOut) })
	defer tm.Stop()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, failf(ReasonInvalidTarget, "URL %q: %v", rawURL, err)
	}
	req.Header.Set("Accept", r.accept)
	req.Header.Set("User-Agent", "tlgw-scrape")
	resp, err := s.m.client.Do(req)
	if err != nil {
		return nil, transportError(ctx, r, timeout, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return nil, failf(ReasonRedirect, "GET %s: %s redirects to %q%s",
			rawURL, resp.Status, resp.Header.Get("Location"), r.redirectHint)
	case resp.StatusCode != http.StatusOK:
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		msg := strings.Join(strings.Fields(string(snippet)), " ")
		if msg != "" {
			msg = ": " + msg
		}
		return nil, failf(ReasonStatus, "GET %s: %s%s", rawURL, resp.Status, msg)
	case resp.ContentLength > limit:
		return nil, failf(ReasonTooLarge, "GET %s: the %s is %d bytes, over the %d-byte limit",
			rawURL, r.what, resp.ContentLength, limit)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, transportError(ctx, r, timeout, err)
	}
	if int64(len(body)) > limit {
		return nil, failf(ReasonTooLarge, "GET %s: the %s is over the %d-byte limit", rawURL, r.what, limit)
	}
	return body, nil
}

// transportError classifies a failed request or body read: the scrape's own timeout, or the
// connection.
func transportError(ctx context.Context, r request, timeout time.Duration, err error) error {
	if errors.Is(context.Cause(ctx), errTimedOut) {
		return failf(ReasonTimeout, "GET %s: no complete %s within %v", r.url, r.what, timeout)
	}
	return failf(ReasonConnect, "GET %s: %v", r.url, unwrapURLError(err))
}

// unwrapURLError drops url.Error's method-and-URL prefix, which the message already carries.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// The sources of tlgw_scrape_info_errors_total: what an engine says of its LoRA adapters and
// context length (R21), which never fails a scrape.
const (
	SourceModels   = "models"             // GET /v1/models
	SourceLoRAInfo = "lora_requests_info" // the page's vllm:lora_requests_info
)

// The reasons of tlgw_scrape_info_errors_total beside a failed read's (ReasonConnect, …,
// ReasonParse): counted once per adapter name dropped.
const (
	ReasonInvalidName  = "invalid_name"   // not 1–256 printable ASCII bytes without spaces, or the model's own name
	ReasonTooManyNames = "too_many_names" // past the first router.MaxLoRAAdapters, in sorted order
)

// metrics are the scrapers' series (issue 6).
type metrics struct {
	duration   *prometheus.HistogramVec
	errors     *prometheus.CounterVec
	infoErrors *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tlgw_scrape_duration_seconds",
			Help:    "Time taken by each scrape of a static worker's metrics page (worker: its id; an engine pool's engines: the pool's name), failed ones included.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"worker"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_scrape_errors_total",
			Help: "Failed scrapes of static workers by reason (connect, timeout, status, redirect, too_large, parse, missing_series, invalid_target).",
		}, []string{"worker", "reason"}),
		infoErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_scrape_info_errors_total",
			Help: "What static workers' engines say of their LoRA adapters and context length and tlgw could not use, which fails no scrape: " +
				"by source (models: GET /v1/models; lora_requests_info) a failed read by reason (connect, timeout, status, redirect, too_large, parse), " +
				"and each adapter name dropped (invalid_name, too_many_names).",
		}, []string{"worker", "source", "reason"}),
	}
	if reg != nil {
		m.duration = register(reg, m.duration)
		m.errors = register(reg, m.errors)
		m.infoErrors = register(reg, m.infoErrors)
	}
	return m
}

// register registers c, or returns the collector already registered under its name (a second
// manager on the same registry shares the series).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(fmt.Sprintf("scrape: registering metrics: %v", err))
	}
	return c
}

func (m *metrics) observe(worker string, took time.Duration, reason string) {
	m.duration.WithLabelValues(worker).Observe(took.Seconds())
	if reason != "" {
		m.errors.WithLabelValues(worker, reason).Inc()
	}
}

// infoRead counts what a good scrape could not use of the engine's LoRA and model
// information: the page's LoRA info (lr, on every scrape, as the page is read), and the
// /v1/models read of this scrape, if any: a failure (modelsErr) or the names dropped from a
// new list (mr).
func (m *metrics) infoRead(worker string, lr loraRead, mr *modelsRead, modelsErr error) {
	add := func(source, reason string, n int) {
		if n > 0 {
			m.infoErrors.WithLabelValues(worker, source, reason).Add(float64(n))
		}
	}
	if lr.err != nil {
		add(SourceLoRAInfo, reasonOf(lr.err), 1)
	}
	add(SourceLoRAInfo, ReasonInvalidName, lr.invalid)
	add(SourceLoRAInfo, ReasonTooManyNames, lr.over)
	if modelsErr != nil {
		add(SourceModels, reasonOf(modelsErr), 1)
	}
	if mr != nil {
		add(SourceModels, ReasonInvalidName, mr.invalid)
		add(SourceModels, ReasonTooManyNames, mr.over)
	}
}

// forget removes a worker's series once it is no longer scraped.
func (m *metrics) forget(worker string) {
	m.duration.DeleteLabelValues(worker)
	m.errors.DeletePartialMatch(prometheus.Labels{"worker": worker})
	m.infoErrors.DeletePartialMatch(prometheus.Labels{"worker": worker})
}
