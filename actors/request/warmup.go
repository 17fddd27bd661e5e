package request

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/oai"
)

// Prefix warm-ups (router.Warmup, actors/router/warm.go). A pick may carry one: a ticket on
// another worker and a length. The request actor builds the warm-up from its own body at once
// (oai.WarmupBody: the leading part of the prompt, one token, not streamed; or, for a length in
// tokens, oai.TokenWarmupBody: a completions request of the pick's first token ids, at most
// as many as the pick carried) and sends it on a goroutine of its own, off the client's path: the client's answer never waits for it, and it
// does not end with the request. The goroutine releases the ticket when the warm-up has ended,
// with no verdict (a warm-up's failure is not held against the engine: client traffic judges
// engines, R14.2). The worker watches the request actor, as for every ticket the router
// reserves for it, so if the request ends first the count ends with it: the warm-up's load is
// counted at most as long as its request's.
//
// The router hears of each warm-up sent (router.WarmupSent) as it starts: its approximate
// prefix index believes the target holds the prefix from then on, as it believes it of a
// request's worker from its pick; a skipped warm-up is never reported, so no later pick goes
// to its target as if the prefix were cached there.
//
// Bounds: at most Warmups.Max run at once (more are skipped: the ticket is released at once),
// each within the request timeout, reading at most maxWarmAnswer bytes of the answer.

// DefaultMaxWarmups is how many warm-ups the gateway runs at once: as many as the router keeps
// pending.
const DefaultMaxWarmups = router.MaxWarmPending

// maxWarmAnswer bounds what a warm-up reads of its answer (one token's worth is a few hundred
// bytes); the rest is not read, and the connection is closed.
const maxWarmAnswer = 64 << 10

// Warmups is the gateway's count of warm-ups running, shared by every request actor.
type Warmups struct {
	Max     int64 // at most this many at once (≤ 0: none run)
	running atomic.Int64
}

// NewWarmups returns a count that lets max warm-ups run at once.
func NewWarmups(max int64) *Warmups { return &Warmups{Max: max} }

func (w *Warmups) take() bool {
	if w == nil {
		return false
	}
	if w.running.Add(1) > w.Max {
		w.running.Add(-1)
		return false
	}
	return true
}

func (w *Warmups) done() { w.running.Add(-1) }

// Running is how many warm-ups are running (0 for nil: none run).
func (w *Warmups) Running() int64 {
	if w == nil {
		return 0
	}
	return w.running.Load()
}

// Warm-up results (tlgw_prefix_warmups_sent_total{result}).
const (
	warmOK = iota
	warmFailed
	warmSkipped
	numWarmResults
)

var warmResultNames = [numWarmResults]string{"ok", "failed", "skipped"}

// warmup sends pick p's warm-up, if it has one.
func (r *requestActor) warmup(c actor.Context, p *router.Picked) {
	w := p.Warm
	if w == nil {
		return
	}
	release := &router.Release{Ticket: w.Ticket, Outcome: router.OutcomeNone}
	var body []byte
	var ok bool
	path := r.x.Path
	if w.Tokens > 0 {
		// Cut in tokens (an engine-keyed pool, R22): the pick's own token ids, which the
		// router cut into the blocks it matched, as a completions prompt whatever the
		// request's kind (a chat's ids already hold its template's render).
		body, ok = oai.TokenWarmupBody(r.x.TokenIDs, w.Tokens, p.ServedModel)
		path = oai.Completions.Path()
	} else {
		body, ok = oai.WarmupBody(r.x.Kind, r.x.Body, w.Bytes, p.ServedModel)
	}
	if !ok || !r.d.Warmups.take() {
		r.d.Metrics.warmups[warmSkipped].Inc()
		c.Send(w.Worker, release)
		return
	}
	// The router's approximate prefix index learns the copy now, and only for a warm-up that
	// is sent: a skipped one leaves its target holding nothing.
	c.Send(r.d.Router, &router.WarmupSent{WorkerID: w.WorkerID, Reg: w.Reg, Hashes: w.Hashes})
	url := "http://" + w.HTTPAddress + path
	tr, timeout, root, m, count := r.d.Transport, r.requestTimeout(), c.ActorSystem().Root, r.d.Metrics, r.d.Warmups
	clk, th := r.clock(), r.tr.header(nil) // the request's own trace context
	run := func() {
		// Bounded by the request timeout on the injected clock, as the request's own I/O is.
		ctx, cancel := context.WithCancel(context.Background())
		timer := clk.AfterFunc(timeout, cancel)
		result := sendWarmup(ctx, tr, url, body, th)
		timer.Stop()
		cancel()
		// Counted before the Release: whoever sees the Release sees the count.
		m.warmups[result].Inc()
		count.done()
		root.Send(w.Worker, release)
	}
	if r.d.Go != nil {
		r.d.Go(run)
		return
	}
	go run()
}

// sendWarmup posts body to url and reads (a bounded part of) the answer.
func sendWarmup(ctx context.Context, tr Upstream, url string, body []byte, th traceHeader) int {
	h := http.Header{"Content-Type": jsonContentType}
	th.set(h)
	req, err := upstreamRequest(ctx, "", url, body, h)
	if err != nil {
		return warmFailed
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return warmFailed
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, maxWarmAnswer))
	if err != nil || resp.StatusCode/100 != 2 {
		return warmFailed
	}
	return warmOK
}
