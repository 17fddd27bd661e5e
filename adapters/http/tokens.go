package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/enginetok"
	"github.com/tlgw/tlgw/internal/oai"
)

// TokenSource gives a request's prompt token ids as an engine of its pool computes them, or
// nil when its pick needs none or none could be had in time (R22: gateway.tokenizer =
// "engine"). The HTTP handler asks it before handing the request over.
type TokenSource interface {
	TokenIDs(ctx context.Context, kind oai.Kind, model, id string, body, rendered []byte) []uint32
}

// EngineTokens is the TokenSource of gateway.tokenizer = "engine". Per request it asks the
// router whether the request's pool picks on token ids (precise_prefix over engines that
// publish their own KV events) and, if so, on which worker to render; then:
//
//   - the prompt was rendered before for that model (enginetok.Cache exact hit): its ids, no call;
//   - it extends a prompt rendered before (a shared system prompt, the next turn): the shared
//     part's ids at once, no call on the request's path; the whole prompt is rendered in the
//     background (at most maxBackground at once, else skipped) for the next request;
//   - otherwise it renders on the worker (POST of the body, model set to the one the worker
//     serves, to the render endpoint of the request's kind or /tokenize) within
//     tokenizer_timeout; past it, or on any failure, nil: the pick uses the approximate index.
//
// A render's answer is bounded (enginetok.MaxAnswerBytes, MaxTokens) and checked before use.
type EngineTokens struct {
	target    func(*router.RenderTarget) (*router.RenderTargetReply, error)
	transport http.RoundTripper
	tokenize  bool
	timeout   time.Duration
	clock     clock.Clock // times the renders' budget and their latency
	cache     *enginetok.Cache
	bg        chan struct{}  // background render slots: bounds their goroutines
	wg        sync.WaitGroup // background renders, for Close
	outcomes  *prometheus.CounterVec
	latency   prometheus.Histogram
	entries   prometheus.GaugeFunc
}

// maxBackground bounds the background renders (and their goroutines) at once.
const maxBackground = 16

// Token outcomes: a fixed label set.
const (
	tokCache    = "cache"    // exact cache hit
	tokPartial  = "partial"  // the shared part from the cache
	tokRender   = "render"   // rendered on the request's path
	tokFallback = "fallback" // no ids in time: the approximate index
)

// NewEngineTokens builds the engine tokenizer: target is the router's RenderTarget, transport
// the engine-facing one, cfg the gateway's tokenizer settings, clk the gateway's clock (nil:
// the real one); reg (may be nil) receives
// tlgw_tokenizer_requests_total{outcome}, tlgw_tokenizer_render_seconds and
// tlgw_tokenizer_cache_entries.
func NewEngineTokens(target func(*router.RenderTarget) (*router.RenderTargetReply, error),
	transport http.RoundTripper, cfg config.Gateway, clk clock.Clock, reg prometheus.Registerer) *EngineTokens {
	if clk == nil {
		clk = clock.Real{}
	}
	t := &EngineTokens{target: target, transport: transport, clock: clk, tokenize: cfg.TokenizerEndpoint == config.TokenizerTokenize,
		timeout: cfg.TokenizerTimeout, cache: enginetok.NewCache(0, 0), bg: make(chan struct{}, maxBackground),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tlgw_tokenizer_requests_total",
			Help: "Requests whose token ids the engine tokenizer gave, by outcome (cache, partial, render, fallback).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tlgw_tokenizer_render_seconds",
			Help:    "Renders on an engine on the request's path, answered or not.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25},
		}),
	}
	if t.timeout <= 0 {
		t.timeout = 50 * time.Millisecond
	}
	t.entries = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tlgw_tokenizer_cache_entries",
		Help: "Rendered prompts the engine tokenizer's cache holds.",
	}, func() float64 { return float64(t.cache.Stats().Entries) })
	for _, o := range []string{tokCache, tokPartial, tokRender, tokFallback} {
		t.outcomes.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(t.outcomes, t.latency, t.entries)
	}
	return t
}

// TokenIDs implements TokenSource.
func (t *EngineTokens) TokenIDs(ctx context.Context, kind oai.Kind, model, id string, body, rendered []byte) []uint32 {
	if kind != oai.Chat && kind != oai.Completions {
		return nil
	}
	tg, err := t.target(&router.RenderTarget{Model: model, RequestID: id, Endpoint: kind})
	if err != nil || tg.Address == "" {
		return nil
	}
	if rendered == nil {
		rendered = oai.RenderPrompt(kind, body, len(body))
	}
	ids, exact := t.cache.Lookup(tg.ServedModel, rendered)
	if exact {
		t.outcomes.WithLabelValues(tokCache).Inc()
		return ids
	}
	if ids != nil {
		t.outcomes.WithLabelValues(tokPartial).Inc()
		select {
		case t.bg <- struct{}{}:
			t.wg.Add(1)
			go func() { // bounded by t.bg; ends within t.timeout
				defer func() { <-t.bg; t.wg.Done() }()
				bctx, cancel := t.budget(context.Background())
				defer cancel()
				if full, err := t.render(bctx, kind, tg, body); err == nil {
					t.cache.Store(tg.ServedModel, rendered, full)
				}
			}()
		default:
		}
		return ids
	}
	start := t.clock.Now()
	rctx, cancel := t.budget(ctx)
	full, err := t.render(rctx, kind, tg, body)
	cancel()
	t.latency.Observe(t.clock.Now().Sub(start).Seconds())
	if err != nil {
		t.outcomes.WithLabelValues(tokFallback).Inc()
		return nil
	}
	t.outcomes.WithLabelValues(tokRender).Inc()
	t.cache.Store(tg.ServedModel, rendered, full)
	return full
}

// budget is ctx cancelled once tokenizer_timeout has passed on the gateway's clock.
func (t *EngineTokens) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	tm := t.clock.AfterFunc(t.timeout, cancel)
	return c, func() { tm.Stop(); cancel() }
}

// Close waits for the background renders (each ends within the timeout).
func (t *EngineTokens) Close() { t.wg.Wait() }

// CacheStats is the cache's snapshot, for tests and the admin view.
func (t *EngineTokens) CacheStats() enginetok.CacheStats { return t.cache.Stats() }

var errRender = errors.New("render")

// render asks worker tg for body's token ids.
func (t *EngineTokens) render(ctx context.Context, kind oai.Kind, tg *router.RenderTargetReply, body []byte) ([]uint32, error) {
	ep := enginetok.ChatRender
	switch {
	case t.tokenize:
		ep = enginetok.Tokenize
	case kind == oai.Completions:
		ep = enginetok.CompletionsRender
	}
	out, err := oai.RewriteModel(body, tg.ServedModel)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+tg.Address+ep.Path(), bytes.NewReader(out))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, enginetok.MaxAnswerBytes+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %d", errRender, ep.Path(), resp.StatusCode)
	}
	return enginetok.Parse(ep, raw)
}
