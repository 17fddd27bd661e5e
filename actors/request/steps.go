package request

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

func prefixHash(key []byte) uint64 { return xxhash.Sum64(key) }

// Results of the I/O goroutines. gen ties a result to the attempt that asked for it.
type (
	attemptResult struct {
		gen  int
		resp *http.Response
		err  error
		// noRoute: the engine's 404/405 is its server saying it has no such endpoint (R21).
		noRoute bool
		// loadFailed: the on-demand load of the pick's LoRA adapter failed (err says how).
		loadFailed bool
	}
	bufferedResult struct {
		gen    int
		status int
		header http.Header
		body   []byte // its bytes are held in the actor's cascadeHold
		err    error
	}
	relayResult struct {
		gen      int
		code     int
		finished bool  // the engine's answer reached its end
		ended    bool  // the client has its terminal outcome (a whole answer, 502, or an error event)
		shed     bool  // the answer found no room in the buffer budget (503 overloaded, R20)
		usage    int64 // usage.total_tokens of the answer (−1: none seen)
		events   int64 // SSE events relayed
		// responseID is a Responses API answer's id (R21; "" when not asked for or not found).
		responseID string
	}
	tokenized struct {
		gen int
		ids []uint32
		err error
	}
	prefilled struct {
		gen int
		res PrefillResult
		err error
	}
	releasedKV struct{ gen int }
)

// IgnoreDeadLetterLogging: a result can outlive its (finished) actor; that is not news.
func (attemptResult) IgnoreDeadLetterLogging()  {}
func (bufferedResult) IgnoreDeadLetterLogging() {}
func (relayResult) IgnoreDeadLetterLogging()    {}
func (tokenized) IgnoreDeadLetterLogging()      {}
func (prefilled) IgnoreDeadLetterLogging()      {}
func (releasedKV) IgnoreDeadLetterLogging()     {}

// resultGen is the gen of an I/O result (ok false: msg is not one).
func resultGen(msg any) (int, bool) {
	switch m := msg.(type) {
	case attemptResult:
		return m.gen, true
	case firstEvent:
		return m.gen, true
	case bufferedResult:
		return m.gen, true
	case relayResult:
		return m.gen, true
	case tokenized:
		return m.gen, true
	case prefilled:
		return m.gen, true
	case releasedKV:
		return m.gen, true
	case remotePrefilled:
		return m.gen, true
	}
	return 0, false
}

// discard drops a result the machine has moved past, closing the engine's body it carries.
func discard(msg any) {
	switch m := msg.(type) {
	case attemptResult:
		if m.resp != nil {
			m.resp.Body.Close()
		}
	case firstEvent:
		if m.err == nil {
			m.resp.Body.Close()
		}
		if m.buf != nil {
			bufPool.Put(m.buf)
		}
	}
}

// runIO starts fn on a goroutine under a context derived from the client's; its result comes
// back as a message. One I/O goroutine runs at a time.
func (r *requestActor) runIO(c actor.Context, fn func(ctx context.Context, gen int) any) {
	r.gen++
	gen := r.gen
	if r.cancelCause == nil {
		r.ioCtx, r.cancelCause = context.WithCancelCause(r.x.Ctx)
	}
	ctx := r.ioCtx
	done := make(chan struct{})
	r.ioDone = done
	self, root := c.Self(), c.ActorSystem().Root
	step := func() {
		defer close(done)
		root.Send(self, fn(ctx, gen))
	}
	if r.d.Go != nil {
		r.d.Go(step)
		return
	}
	go step()
}

// endIO cancels the attempt's context (after its answer was relayed or abandoned).
func (r *requestActor) endIO() {
	if r.cancelCause != nil {
		r.cancelCause(nil)
		r.cancelCause, r.ioCtx = nil, nil
	}
}

// nonFinalStep reports whether the current pick serves a cascade step that is not the last
// (a route without a cascade has one step).
func (r *requestActor) nonFinalStep() bool { return nonFinal(r.picked) }

func nonFinal(p *router.Picked) bool { return p.Step < p.Steps-1 }

// stepRouting handles the router's answer.
func (r *requestActor) stepRouting(c actor.Context, msg any) {
	switch m := msg.(type) {
	case *router.Queued:
		if m.Tag == r.pickTag {
			r.stopPickTimer() // the queue owns the wait now (max_wait)
			r.queued = true
			r.tr.queued(time.Now())
		}
	case pickTimeout:
		if m.tag != r.pickTag {
			return
		}
		r.pickRetries++
		if r.pickRetries > 3 {
			r.fail(c, fmt.Errorf("the router did not answer %d picks: %w", r.pickRetries, errs.ErrInternal))
			return
		}
		r.logger().Warn("the router did not answer a pick in time; asking again", "timeout", r.pickTimeout())
		r.pick(c)
	case *router.Picked:
		r.onPicked(c, m)
	}
}

// onPicked takes the router's answer to the current pick.
func (r *requestActor) onPicked(c actor.Context, p *router.Picked) {
	if p.Tag != r.pickTag {
		r.giveBack(c, p) // a late answer to a pick the actor already asked again
		return
	}
	r.stopPickTimer()
	now := time.Now()
	if r.queued {
		r.d.Metrics.stage(stageQueue, now.Sub(r.pickSent))
	} else {
		r.d.Metrics.stage(stagePick, now.Sub(r.pickSent))
	}
	r.tr.picked(r.pickSent, now, p)
	if p.Route != "" {
		if p.Route != r.route {
			r.leaveRoute()
		}
		r.route, r.served = p.Route, p.ServedModel
		if !r.inRoute {
			r.inRoute = true
			r.d.Metrics.routeInFlight(r.route, 1)
		}
	}
	if p.Err != nil {
		if nonFinal(p) && errors.Is(p.Err, errs.ErrNoCapacity) {
			r.escalate(c, p.Step) // nobody serves this step: the next one may
			return
		}
		err := p.Err
		if r.attempts > 0 && errors.Is(err, errs.ErrNoCapacity) {
			// The last failure names an engine (its address, its id): it is in the log of
			// the failover, never in the client's message (R13.4).
			err = fmt.Errorf("%d workers tried, none answered: %w", r.attempts, errs.ErrNoCapacity)
			r.acc.failedAs(OutcomeFailoverExhausted)
		}
		r.fail(c, err)
		return
	}
	r.picked = p
	r.acc.attempt(p.WorkerID)
	r.acquire(p)
	r.warmup(c, p)
	r.armRequestTimeout(c)
	r.decodeOnly = false
	r.pdAt = time.Now()
	switch {
	case p.Prefill != nil && p.PDProtocol == config.PDVLLM:
		r.become(RemotePrefill)
		r.remotePrefill(c)
		return
	case p.Prefill != nil && p.PDProtocol == config.PDSGLang:
		r.become(Attempting) // both calls at once (attemptSGLang)
		r.startAttempt(c)
		return
	case p.Prefill != nil:
		r.become(Tokenizing)
		r.tokenize(c)
		return
	}
	r.become(Attempting)
	r.startAttempt(c)
}

// observeRollout counts the attempt just ended in its route's rollout window (R25), when the
// route has a rollout and count holds: failed, and its time to first byte (0: none).
func (r *requestActor) observeRollout(count, failed bool, ttft time.Duration) {
	if p := r.picked; count && p != nil && p.Rollout != nil {
		p.Rollout.Observe(p.ServedModel, failed, ttft)
	}
}

// leaveRoute ends the request's count in its route's requests in flight, if it has one.
func (r *requestActor) leaveRoute() {
	if r.inRoute {
		r.inRoute = false
		r.d.Metrics.routeInFlight(r.route, -1)
	}
}

// escalate moves a cascade to the step after `from`.
func (r *requestActor) escalate(c actor.Context, from int) {
	r.d.Metrics.cascade.WithLabelValues(r.route, "escalated").Inc()
	r.cascadeStep = from + 1
	r.exclude, r.attempts, r.lastErr, r.picked = nil, 0, nil, nil
	r.acc.firstByte(0) // the step's answer is not relayed
	r.become(Routing)
	r.pick(c)
}

// failover gives up on the current worker before the first byte (R6): it is released with the
// verdict on err (R14.2) and excluded, a KV handle pushed for it is released (Releasing), and
// then retry routes again or answers.
func (r *requestActor) failover(c actor.Context, err error) {
	if cause := r.ioCause(); cause != nil {
		err = fmt.Errorf("%w: %v", cause, err)
	}
	worker, id, addr := r.blame(err)
	o := outcome(err, 0)
	r.observeRollout(!r.gone, true, 0)
	r.stopFirstByteTimer()
	r.endIO()
	r.releaseVerdict(c, worker, router.Release{Outcome: o, Unreachable: refused(err), Addr: addr})
	r.releaseAll(c.Send)
	r.tr.failedOver(o, refused(err), err)
	r.logger().Info("attempt failed before the first byte", "worker", id, "outcome", o.String(), "err", err)
	r.d.Metrics.failovers.WithLabelValues(r.route).Inc()
	r.pdFailover(worker)
	r.lastErr = err
	r.attempts++
	r.exclude = append(r.exclude, id)
	r.release(c, r.retry)
}

// retry is a failover's second half: the next cascade step, the answer (max_attempts workers
// tried, or the retry budget spent), or the next worker.
func (r *requestActor) retry(c actor.Context) {
	if r.gone {
		r.finish(c, statusClientGone) // the client left while the handle was released
		return
	}
	if r.nonFinalStep() && r.attempts >= r.d.MaxAttempts {
		r.escalate(c, r.picked.Step)
		return
	}
	if r.attempts >= r.d.MaxAttempts {
		r.acc.failedAs(OutcomeFailoverExhausted)
		r.fail(c, fmt.Errorf("%d workers tried, none answered: %w", r.attempts, errs.ErrNoCapacity))
		return
	}
	if !r.retryAllowed(r.lastErr) {
		// R14.3: the failovers running at once are at the retry budget; this failure is
		// answered instead of retried.
		r.logger().Info("retry budget spent; not failing over", "limit", r.d.RetryBudget.Limit())
		r.d.Metrics.budgetSpent(r.route)
		r.acc.failedAs(OutcomeRetryBudget)
		r.fail(c, fmt.Errorf("the worker failed and the retry budget is spent: %w", errs.ErrNoCapacity))
		return
	}
	r.picked = nil
	r.become(Routing)
	r.pick(c)
}

// stepAttempting handles the engine's response headers (or failure to get them).
func (r *requestActor) stepAttempting(c actor.Context, msg any) {
	if fe, ok := msg.(firstEvent); ok {
		if l := r.picked.LoadLoRA; l != nil {
			// A stream's first event is read after the load succeeded.
			c.Send(r.d.Router, &router.LoRALoaded{WorkerID: r.picked.WorkerID, Reg: r.picked.WorkerReg, Name: l.Name, OK: true})
		}
		if fe.err == nil && r.tooLate(c, fe) {
			return
		}
		r.stepFirstEvent(c, fe)
		return
	}
	m, ok := msg.(attemptResult)
	if !ok {
		return
	}
	if l := r.picked.LoadLoRA; l != nil && (m.err == nil || m.loadFailed) {
		// The router learns whether the adapter it counted on the worker is there (R21).
		c.Send(r.d.Router, &router.LoRALoaded{WorkerID: r.picked.WorkerID, Reg: r.picked.WorkerReg, Name: l.Name, OK: !m.loadFailed})
	}
	if m.err != nil {
		r.failover(c, m.err)
		return
	}
	if r.tooLate(c, m) {
		return
	}
	if m.noRoute {
		r.elsewhere(c, m.resp, &router.EndpointUnsupported{WorkerID: r.picked.WorkerID, Reg: r.picked.WorkerReg, Endpoint: r.x.Kind},
			"the engine does not serve this endpoint; marked and routed again")
		return
	}
	if m.resp.StatusCode == http.StatusNotFound && r.picked.Adapter != "" && r.x.Method == "" && r.x.Response == "" {
		// An engine's 404 for a request naming an adapter it was believed to serve: it does
		// not have the adapter (restarted without it, or unloaded it), R21.
		r.elsewhere(c, m.resp, &router.LoRAMissing{WorkerID: r.picked.WorkerID, Reg: r.picked.WorkerReg, Name: r.picked.Adapter},
			"the engine does not have the LoRA adapter; marked and routed again")
		return
	}
	if m.resp.StatusCode == http.StatusServiceUnavailable {
		_, _ = io.Copy(io.Discard, io.LimitReader(m.resp.Body, 64<<10))
		m.resp.Body.Close()
		r.failover(c, statusError{what: "worker " + r.picked.WorkerID, status: m.resp.StatusCode})
		return
	}
	r.firstByte()
	if r.nonFinalStep() {
		resp := m.resp
		r.become(CascadeStep)
		r.tr.startCascade(r.picked.Step, r.relayAt)
		// The step's answer is buffered whole to be judged: its bytes are held in the budget
		// until the step is judged, or the request ends (finish, stopping).
		r.releaseBuffer()
		hold := r.d.BufferBudget.hold()
		r.cascadeHold = hold
		r.runIO(c, func(ctx context.Context, gen int) any { return readAll(gen, resp, hold) })
		return
	}
	r.relay(c, m.resp, nil, nil)
}

// elsewhere moves on from a worker whose engine does not serve the request's endpoint, or
// its adapter (R21): the router is told (report), and the request goes to another worker. This
// is no failure of the engine (no verdict, no retry-budget slot, not one of max_attempts): each
// such worker is marked and excluded, so the picks end when no worker of the model is left that
// may serve the request, with a 404 saying so.
func (r *requestActor) elsewhere(c actor.Context, resp *http.Response, report any, why string) {
	p := r.picked
	resp.Body.Close() // unread: the connection closes rather than the actor wait for the rest
	c.Send(r.d.Router, report)
	r.logger().Info(why, "worker", p.WorkerID, "endpoint", r.x.Kind.Endpoint(), "model", p.ServedModel, "status", resp.StatusCode)
	r.stopFirstByteTimer()
	r.endIO()
	r.releaseWorker(c, p.Worker, router.OutcomeNone)
	r.releaseAll(c.Send)
	r.tr.endAttempt(stageElsewhere, nil)
	r.exclude = append(r.exclude, p.WorkerID)
	r.release(c, func(c actor.Context) {
		if r.gone {
			r.finish(c, statusClientGone)
			return
		}
		r.picked = nil
		r.become(Routing)
		r.pick(c)
	})
}

// tooLate fails over from an answer (headers, or a stream's first event) that arrived after
// stream_first_byte_timeout fired: the timer's message was handled first and cancelled the
// attempt's context (request_timeout's are faultStep's), so however whole the answer reads — a
// first event read just as the timer fired — nothing of it reaches the client, and the request
// fails over as for the timeout (R14.1). It reports whether it did.
func (r *requestActor) tooLate(c actor.Context, msg any) bool {
	if r.ioCause() == nil {
		return false
	}
	discard(msg)
	r.failover(c, fmt.Errorf("worker %s: its answer came after the timeout fired", r.picked.WorkerID))
	return true
}

// firstByte records the answer's first byte (R11 time to first byte, R17.3 upstream stage)
// and starts the relay's clock: measurements on the wall clock, not timing rules.
func (r *requestActor) firstByte() {
	r.retried()
	now := time.Now()
	r.d.Metrics.ttfb(r.route, r.x.Kind, now.Sub(r.x.Start))
	r.acc.firstByte(now.Sub(r.x.Start))
	r.d.Metrics.stage(stageUpstream, now.Sub(r.attemptAt))
	r.relayAt = now
}

// stepFirstEvent commits a stream once its first event has arrived (read by the attempt's own
// I/O step, right after the headers: nothing goes to the client before it, R14.1, so until
// then a stall or a break is a failure before the first byte), or fails over.
func (r *requestActor) stepFirstEvent(c actor.Context, m firstEvent) {
	if m.err != nil {
		r.failover(c, fmt.Errorf("worker %s: %w", r.picked.WorkerID, m.err))
		return
	}
	r.firstByte() // for a stream: its first event
	if r.d.ObserveTTFT {
		// The attempt's own TTFT (its start to its first event), for the picked worker's model.
		c.Send(r.d.Router, &router.ObservedTTFT{WorkerID: r.picked.WorkerID, Reg: r.picked.WorkerReg, Features: r.picked.Features,
			TTFT: r.relayAt.Sub(r.attemptAt)})
	}
	r.relay(c, m.resp, m.prefix, m.buf)
}

// relay commits the request and relays the engine's answer (Relaying). A stream's first
// event may have been read already: first, in the recycled array buf (nil: none).
func (r *requestActor) relay(c actor.Context, resp *http.Response, first []byte, buf *[]byte) {
	p := r.picked
	r.stopFirstByteTimer()
	r.pdCommitted(c)
	body := resp.Body
	if isSSE(resp) {
		r.stopRequestTimer() // a stream's bound is stream_idle_timeout from here
		if _, ok := body.(*idleBody); !ok {
			body = r.newIdleBody(body, body)
		}
	}
	r.committed = true
	r.upStatus = resp.StatusCode
	r.tr.startRelay(r.relayAt)
	r.writeHeaders(resp.Header)
	route, metrics := r.route, r.d.Metrics
	r.relayOut = &r.relayRes
	rl := relayer{w: r.x.W, client: r.x.Ctx, resp: resp, body: body, first: first, buf: buf, log: r.d.Logger, id: r.x.ID, worker: p.WorkerID, errs: r.errs(), out: r.relayOut, budget: r.d.BufferBudget,
		interrupts: metrics.interrupts, route: route, kind: r.x.Kind, usage: r.acc.usageOut(),
		wantID: r.x.Kind == oai.Responses && r.x.Req.Store && (r.x.Method == "" || r.x.Method == http.MethodPost)}
	r.become(Relaying)
	r.runIO(c, func(ctx context.Context, gen int) any { rl.ctx = ctx; return rl.run(gen) })
}

// stepCascade judges a non-final cascade step's answer (R7): kept when the accept rule holds
// on its token logprobs (an answer with no tokens never is), else escalated. A step that
// answered 200 did its part, whichever way it is judged.
func (r *requestActor) stepCascade(c actor.Context, msg any) {
	m, ok := msg.(bufferedResult)
	if !ok {
		return
	}
	r.endIO()
	defer r.releaseBuffer() // judged, and written if kept
	r.releaseWorker(c, r.picked.Worker, outcome(m.err, m.status))
	r.releaseAll(c.Send)
	r.kvHandle = "" // a decode worker that answered in full consumed its handle
	p := r.picked
	if errors.Is(m.err, errBufferBudget) {
		r.tr.endCascade(OutcomeOverloaded, m.err)
		r.fail(c, overloaded()) // R20: no room to buffer the step's answer
		return
	}
	if m.err != nil || m.status != http.StatusOK {
		r.logger().Info("cascade step failed; escalating", "step", p.Step, "status", m.status, "err", m.err)
		r.tr.endCascade(verdictEscalated, m.err)
		r.escalate(c, p.Step)
		return
	}
	lps, err := cascade.LogprobsOf(m.body)
	if err != nil || p.Accept == nil || !p.Accept.Holds(lps) {
		r.tr.endCascade(verdictEscalated, nil)
		r.escalate(c, p.Step)
		return
	}
	r.tr.endCascade(verdictAccepted, nil)
	r.d.Metrics.cascade.WithLabelValues(r.route, "accepted").Inc()
	body := m.body
	if r.acc != nil {
		tc := tokenCounter{usage: -1, detail: true, prompt: -1, completion: -1}
		tc.observe(body)
		r.acc.usage = usageDetail{prompt: tc.prompt, completion: tc.completion}
	}
	if !r.clientAskedLogprobs() {
		if stripped, err := cascade.StripLogprobs(body); err == nil {
			body = stripped
		}
	}
	r.committed = true
	r.writeHeaders(m.header)
	r.x.W.Header().Set("Content-Length", strconv.Itoa(len(body)))
	r.x.W.WriteHeader(m.status)
	_, _ = r.x.W.Write(body)
	r.finish(c, m.status)
}

// stepRelaying ends a committed request: the worker is released with the verdict on its
// answer (R14.2), and a KV handle the decode stream did not consume is released (R8).
func (r *requestActor) stepRelaying(c actor.Context, msg any) {
	m, ok := msg.(relayResult)
	if !ok {
		return
	}
	r.endIO()
	r.d.Metrics.stage(stageRelay, time.Since(r.relayAt))
	r.tr.endRelay(&m)
	// An answer the engine cut, or a 5xx it relayed, is the backend's failure; one the client
	// left, or the buffer budget shed, says nothing of it.
	r.observeRollout(!r.gone && !m.shed, m.ended && !m.finished || r.upStatus >= 500, r.relayAt.Sub(r.attemptAt))
	if m.finished {
		r.kvHandle = "" // consumed by the decode worker
	}
	r.releaseWorker(c, r.picked.Worker, outcome(m.cut(), r.upStatus))
	r.releaseAll(c.Send)
	r.stored(c, m)
	r.release(c, r.finishing(m.code))
}

// stored tells the router of a stored response the engine answered (R21): a Responses answer
// with store on, relayed whole with 200, is now on the picked worker; a DELETE of one that
// succeeded is gone.
func (r *requestActor) stored(c actor.Context, m relayResult) {
	if !m.finished || m.code != http.StatusOK {
		return
	}
	switch {
	case m.responseID != "":
		c.Send(r.d.Router, &router.StoreResponse{ID: m.responseID, WorkerID: r.picked.WorkerID, Reg: r.picked.WorkerReg, Owner: r.x.Owner})
	case r.x.Method == http.MethodDelete && r.x.Response != "":
		c.Send(r.d.Router, &router.ForgetResponse{ID: r.x.Response, Owner: r.x.Owner})
	}
}

// release gives back a KV handle that will not be consumed, through Releasing, and then runs
// then; without a handle, then runs at once. It is the one way a handle is released while the
// actor lives (a crashed actor's stopping makes the same call, kvRelease).
func (r *requestActor) release(c actor.Context, then func(actor.Context)) {
	if r.kvHandle == "" {
		then(c)
		return
	}
	r.afterRelease = then
	r.become(Releasing)
	call := r.kvRelease()
	r.runIO(c, func(_ context.Context, gen int) any {
		call()
		return releasedKV{gen: gen}
	})
}

// kvRelease is the one call that gives the KV handle held now back to the decode worker, at
// its KV address (R8), bounded by the release timeout.
func (r *requestActor) kvRelease() func() {
	h, at, engines, timeout, clk, log := r.kvHandle, r.kvAt, r.d.Engines, r.releaseTimeout(), r.clock(), r.logger()
	traced := r.tr.releaser() // nil: no trace context to send
	return func() {
		ctx, cancel := withClockTimeout(context.Background(), clk, timeout, errControlTimeout)
		defer cancel()
		end := func(error) {}
		if traced != nil {
			ctx, end = traced(ctx, h)
		}
		err := engines.Release(ctx, at, h)
		end(err)
		if err != nil {
			log.Warn("KV release failed; the engine's lease will free it", "handle", h, "err", err)
		}
	}
}

// stepReleasing continues once the handle is released.
func (r *requestActor) stepReleasing(c actor.Context, msg any) {
	if _, ok := msg.(releasedKV); !ok {
		return
	}
	r.endIO()
	r.kvHandle = ""
	then := r.afterRelease
	r.afterRelease = nil
	then(c)
}
