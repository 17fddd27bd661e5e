package request

// Engine faults (R14.1 timeouts, R14.3 retry budget). Every timer here runs on the injected
// clock (Deps.Clock): the actor arms it and receives its firing as a message, or (the idle
// timer of a relayed stream and the control calls' deadlines) it cancels the I/O it bounds.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/errs"
)

// The R14.1 defaults (SPEC): a Deps field left at 0 takes these.
const (
	DefaultStreamFirstByteTimeout = 60 * time.Second
	DefaultRequestTimeout         = 10 * time.Minute
	DefaultStreamIdleTimeout      = 60 * time.Second
	DefaultControlTimeout         = 30 * time.Second
)

// The causes an I/O context is cancelled with when a timeout fires.
var (
	errFirstByteTimeout = errors.New("no response headers and first event within gateway.stream_first_byte_timeout")
	errRequestTimeout   = errors.New("no answer within gateway.request_timeout")
	errControlTimeout   = errors.New("no answer within gateway.control_timeout")
	errStreamIdle       = errors.New("no event within gateway.stream_idle_timeout")
	errNoFirstEvent     = errors.New("the stream ended before its first event")
)

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (r *requestActor) firstByteTimeout() time.Duration {
	return orDefault(r.d.StreamFirstByteTimeout, DefaultStreamFirstByteTimeout)
}
func (r *requestActor) requestTimeout() time.Duration {
	return orDefault(r.d.RequestTimeout, DefaultRequestTimeout)
}
func (r *requestActor) idleTimeout() time.Duration {
	return orDefault(r.d.StreamIdleTimeout, DefaultStreamIdleTimeout)
}
func (r *requestActor) controlTimeout() time.Duration {
	return orDefault(r.d.ControlTimeout, DefaultControlTimeout)
}

// RetryBudget caps the failovers running at once (R14.3): at most max(3, percent% of the
// in-flight requests); a failure beyond the budget is answered 503 no_capacity instead of
// retried. Shared by every request actor of a gateway.
//
// A slot counts a request that is being retried (R19, the "active retries" of Envoy's retry
// budget), not one that was retried once:
//   - a failover whose failed attempt sent nothing to an engine (the connection was refused or
//     never made: a DNS failure, a connect timeout) takes no slot: it cost the fleet nothing,
//     and max_attempts bounds it;
//   - a failover whose attempt reached an engine takes one, unless the request holds one
//     already (a second failure of the same retry keeps it);
//   - the slot is given back once a retried attempt gets its first byte (the retry worked:
//     what follows is an ordinary answer), or when the request ends.
type RetryBudget struct {
	percent  float64
	inFlight atomic.Int64
	retries  atomic.Int64
}

// NewRetryBudget returns a budget of percent% of the in-flight requests (never under 3).
func NewRetryBudget(percent float64) *RetryBudget { return &RetryBudget{percent: percent} }

// InFlight is the requests being served; Retries the slots held by failovers.
func (b *RetryBudget) InFlight() int64 { return b.inFlight.Load() }

// Retries is the failovers running now.
func (b *RetryBudget) Retries() int64 { return b.retries.Load() }

// Limit is the number of failovers allowed at once now.
func (b *RetryBudget) Limit() int64 {
	return max(3, int64(b.percent*float64(b.inFlight.Load())/100))
}

func (b *RetryBudget) tryAcquire() bool {
	for {
		cur := b.retries.Load()
		if cur >= b.Limit() {
			return false
		}
		if b.retries.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// failover decides whether a request may retry after a failed attempt, given whether it holds
// a slot (*held, updated) and whether the attempt sent nothing to an engine; see RetryBudget.
func (b *RetryBudget) failover(held *bool, sentNothing bool) bool {
	if *held || sentNothing {
		return true
	}
	if b.tryAcquire() {
		*held = true
		return true
	}
	return false
}

// giveBack returns the request's slot, if it holds one (*held, updated).
func (b *RetryBudget) giveBack(held *bool) {
	if *held {
		b.retries.Add(-1)
		*held = false
	}
}

// sentNothing reports whether a failed attempt's error shows that nothing reached an engine:
// the connection was never made (refused, a DNS failure, a connect timeout: a dial error).
func sentNothing(err error) bool {
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &op) && op.Op == "dial"
}

// refused reports whether a failed attempt's connection was refused: nothing listens on the
// engine's address, so it is provably down (R19), or the address it resolved to breaks the
// engine address rules (R20), so the gateway will not reach it there. A DNS failure or a
// connect timeout proves nothing of the engine.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, engineaddr.ErrRefused)
}

// budgetStart counts the request in flight; budgetEnd (idempotent) gives back what it holds.
func (r *requestActor) budgetStart() {
	if b := r.d.RetryBudget; b != nil && !r.counted {
		b.inFlight.Add(1)
		r.counted = true
	}
}

func (r *requestActor) budgetEnd() {
	b := r.d.RetryBudget
	if b == nil {
		return
	}
	if r.counted {
		b.inFlight.Add(-1)
		r.counted = false
	}
	b.giveBack(&r.retrySlot)
}

// retryAllowed decides a failover after the attempt that failed with err: the request's slot
// is taken (or kept), or none is needed, or the budget is spent.
func (r *requestActor) retryAllowed(err error) bool {
	b := r.d.RetryBudget
	return b == nil || b.failover(&r.retrySlot, sentNothing(err))
}

// retried gives back the request's slot once a retried attempt got its first byte.
func (r *requestActor) retried() {
	if b := r.d.RetryBudget; b != nil {
		b.giveBack(&r.retrySlot)
	}
}

// Timer messages. The tag ties a firing to the timer that is current.
type (
	firstByteTimeout  struct{ tag uint64 }
	requestTimeoutMsg struct{}
	// firstEvent is the first event of a streamed answer read before the request commits
	// (Attempting): until it has arrived nothing has gone to the client, so a stream that
	// stalls or breaks before it fails over (R14.1, R6).
	firstEvent struct {
		gen    int
		resp   *http.Response
		prefix []byte
		// buf is the recycled array prefix is in (nil: prefix outgrew it): the relay reads the
		// rest of the stream into it.
		buf *[]byte
		err error
	}
)

// IgnoreDeadLetterLogging: a timer may fire after the request ended.
func (firstByteTimeout) IgnoreDeadLetterLogging()  {}
func (requestTimeoutMsg) IgnoreDeadLetterLogging() {}
func (firstEvent) IgnoreDeadLetterLogging()        {}

// startAttempt sends the request to the picked engine, with the first-byte timer of a stream
// armed first (so the timer exists before the engine can see the request).
func (r *requestActor) startAttempt(c actor.Context) {
	r.stopFirstByteTimer()
	if r.x.Req.Stream {
		r.fbTag++
		tag, self, root := r.fbTag, c.Self(), c.ActorSystem().Root
		r.fbTimer = r.clock().AfterFunc(r.firstByteTimeout(), func() { root.Send(self, firstByteTimeout{tag: tag}) })
	}
	r.attemptAt = time.Now()
	r.attempt(c)
}

func (r *requestActor) stopFirstByteTimer() {
	if r.fbTimer != nil {
		r.fbTimer.Stop()
		r.fbTimer = nil
	}
}

// armRequestTimeout starts request_timeout for a non-streamed request, once: it covers
// everything after the first pick's answer (tokenize, prefill, every attempt and failover, the
// KV releases between them, cascade steps, the answer); the wait for that first answer is the
// router's (its admission queue's max_wait). A timer that fired is never armed again.
func (r *requestActor) armRequestTimeout(c actor.Context) {
	if r.x.Req.Stream || r.reqTimer != nil || r.timedOut {
		return
	}
	self, root := c.Self(), c.ActorSystem().Root
	r.reqTimer = r.clock().AfterFunc(r.requestTimeout(), func() { root.Send(self, requestTimeoutMsg{}) })
}

func (r *requestActor) stopRequestTimer() {
	if r.reqTimer != nil {
		r.reqTimer.Stop()
		r.reqTimer = nil
	}
}

func (r *requestActor) stopFaultTimers() {
	r.stopFirstByteTimer()
	r.stopRequestTimer()
}

// cancelIO cancels the running I/O goroutine with cause; its result arrives as usual.
func (r *requestActor) cancelIO(cause error) bool {
	if r.cancelCause == nil {
		return false
	}
	r.cancelCause(cause)
	return true
}

// ioCause is the timeout that cancelled the current I/O, or nil.
func (r *requestActor) ioCause() error {
	if r.ioCtx == nil {
		return nil
	}
	if c := context.Cause(r.ioCtx); errors.Is(c, errFirstByteTimeout) || errors.Is(c, errRequestTimeout) {
		return c
	}
	return nil
}

// faultStep runs before the state's step: the timeouts' messages, and, once request_timeout
// has fired, the result of the I/O it cancelled. It reports whether it handled msg.
func (r *requestActor) faultStep(c actor.Context, msg any) bool {
	switch m := msg.(type) {
	case firstByteTimeout:
		if m.tag == r.fbTag && r.state == Attempting && !r.committed {
			r.logger().Info("stream_first_byte_timeout", "timeout", r.firstByteTimeout())
			r.d.Metrics.timeout(r.route, "stream_first_byte")
			r.cancelIO(errFirstByteTimeout) // its result fails over
		}
		return true
	case requestTimeoutMsg:
		r.reqTimer = nil
		if r.timedOut || r.gone || (r.state == Releasing && r.committed) {
			// A client that left is answered already, or as its state allows; a committed
			// request releasing its handle has its answer.
			return true
		}
		r.timedOut = true
		r.logger().Info("request_timeout", "timeout", r.requestTimeout(), "state", r.state.String())
		r.d.Metrics.timeout(r.route, "request")
		if r.state == Releasing {
			// A failover releasing the KV handle of the attempt it gave up (the one Releasing
			// that is neither committed, nor the client's leaving, nor a timeout's): the client
			// gets its 504 now, not after the Release, and the request does not route again.
			// The Release runs to its end on its own goroutine, bounded by the release timeout;
			// it writes nothing to the client, and its result finds the actor gone.
			r.kvHandle, r.afterRelease = "", nil
			r.answerTimeout(c)
			return true
		}
		if !r.cancelIO(errRequestTimeout) {
			r.answerTimeout(c) // routing: no I/O to wait for
		}
		return true
	}
	if !r.timedOut || r.gone || r.state == Releasing {
		return false
	}
	// The result of the I/O request_timeout cancelled (Receive has dropped stale ones).
	switch m := msg.(type) {
	case attemptResult, firstEvent, bufferedResult, tokenized, remotePrefilled:
		discard(m)
	case prefilled:
		if m.err == nil {
			r.kvHandle, r.kvAt = m.res.HandleID, kvEndpoint(r.picked)
		}
	case relayResult:
		if m.ended {
			return false // the answer (or its error) went out before the timeout took effect
		}
	default:
		return false
	}
	r.answerTimeout(c)
	return true
}

// answerTimeout ends a request whose request_timeout fired: 504 upstream_timeout, not retried
// (R14.1); the worker it waited on is released with Timeout (R14.2), the KV handle through
// Releasing.
func (r *requestActor) answerTimeout(c actor.Context) {
	r.endIO()
	worker, _, _ := r.blame(nil)
	r.releaseWorker(c, worker, router.OutcomeTimeout)
	r.releaseAll(c.Send)
	h := r.x.W.Header()
	for k := range h {
		if !gatewayHeader(k) {
			h.Del(k) // engine headers copied for an answer that never came
		}
	}
	code := r.d.Errors.Error(r.x.W, fmt.Errorf("the engine did not answer within %v: %w", r.requestTimeout(), errs.ErrUpstreamTimeout))
	r.release(c, r.finishing(code))
}

// isSSE reports whether an engine answer is an event stream.
func isSSE(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
}

// maxFirstEvent bounds what is read ahead before the first event is complete (R14.4's event
// bound): an event larger than this is handed to the relay, which ends it.
const maxFirstEvent = 1 << 20

// readFirstEvent reads resp's body up to the end of its first event. An error (a reset, the
// I/O cancelled by a timeout, or the end of the stream before one whole event) is a failure
// before the first byte.
func readFirstEvent(gen int, resp *http.Response) firstEvent {
	bp := bufPool.Get().(*[]byte)
	buf := (*bp)[:0] // reads go straight to a recycled array, which the relay goes on with
	grown := false
	for {
		if len(buf) == cap(buf) {
			buf, grown = append(buf, 0)[:len(buf)], true // an event past the recycled array
		}
		start := len(buf)
		n, err := resp.Body.Read(buf[start:cap(buf)])
		buf = buf[:start+n]
		// An event end in this read, or split between it and the last one.
		if hasEventEnd(buf[max(0, start-3):]) || len(buf) >= maxFirstEvent {
			if grown {
				bufPool.Put(bp)
				bp = nil
			}
			return firstEvent{gen: gen, resp: resp, prefix: buf, buf: bp}
		}
		if err == io.EOF {
			err = errNoFirstEvent
		}
		if err != nil {
			resp.Body.Close()
			bufPool.Put(bp)
			return firstEvent{gen: gen, resp: resp, err: err}
		}
	}
}

func hasEventEnd(b []byte) bool {
	if bytes.Contains(b, []byte("\n\n")) {
		return true
	}
	if bytes.IndexByte(b, '\r') < 0 {
		return false // the other two ends need a "\r": one vectorized pass rules both out
	}
	return bytes.Contains(b, []byte("\r\n\r\n")) || bytes.Contains(b, []byte("\r\r"))
}

// idleBody ends a relayed stream when no event has completed for d (R14.1): the engine's body
// is closed, the relay's read fails with errStreamIdle, and the client gets the R6 error event.
//
// An event only records when it ended (one clock read); the stream's one timer is moved
// lazily: when it fires before d has passed since the last event, it is set again for the
// rest, so a stream of many events pays for a timer once per d, not once per event.
type idleBody struct {
	r      io.Reader
	closer io.Closer
	clk    clock.Clock
	d      time.Duration
	onIdle func() // counts the timeout (metrics); may be nil
	base   time.Time

	last  atomic.Int64 // when the last event ended, as time since base
	mu    sync.Mutex
	timer clock.Timer // nil once closed
	tail  [3]byte     // the last bytes read, to see an event end split between two reads
	ntail int
	idle  atomic.Bool
}

func newIdleBody(r io.Reader, closer io.Closer, clk clock.Clock, d time.Duration, onIdle func()) *idleBody {
	b := &idleBody{r: r, closer: closer, clk: clk, d: d, onIdle: onIdle, base: clk.Now()}
	b.timer = clk.AfterFunc(d, b.check)
	return b
}

// newIdleBody bounds a relayed stream by the actor's stream_idle_timeout.
func (r *requestActor) newIdleBody(rd io.Reader, closer io.Closer) *idleBody {
	route, metrics := r.route, r.d.Metrics
	return newIdleBody(rd, closer, r.clock(), r.idleTimeout(), func() { metrics.timeout(route, "stream_idle") })
}

// event records that an event ended now.
func (b *idleBody) event() { b.last.Store(int64(clock.Since(b.clk, b.base))) }

// check runs when the timer fires: the stream is idle if d has passed since its last event,
// else the timer is set for what is left.
func (b *idleBody) check() {
	b.mu.Lock()
	if b.timer == nil {
		b.mu.Unlock()
		return // closed
	}
	if left := time.Duration(b.last.Load()) + b.d - clock.Since(b.clk, b.base); left > 0 {
		b.timer = b.clk.AfterFunc(left, b.check)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	if b.idle.Swap(true) {
		return
	}
	if b.onIdle != nil {
		b.onIdle()
	}
	go b.closer.Close() // Close may wait for the connection; the timer must not
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.idle.Load() {
		return 0, errStreamIdle
	}
	n, err := b.r.Read(p)
	if n > 0 {
		// An event end inside this read, or split between the last read and this one.
		var joint [6]byte
		k := copy(joint[:], b.tail[:b.ntail])
		k += copy(joint[k:], p[:min(n, 3)])
		if hasEventEnd(p[:n]) || hasEventEnd(joint[:k]) {
			b.event()
		}
		if n >= len(b.tail) {
			b.ntail = copy(b.tail[:], p[n-len(b.tail):n])
		} else {
			keep := min(b.ntail, len(b.tail)-n)
			copy(b.tail[:keep], b.tail[b.ntail-keep:b.ntail])
			b.ntail = keep + copy(b.tail[keep:], p[:n])
		}
	}
	if err != nil && err != io.EOF && b.idle.Load() {
		return n, errStreamIdle
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.mu.Unlock()
	return b.closer.Close()
}

// withClockTimeout is ctx cancelled with cause once d has passed on clk.
func withClockTimeout(ctx context.Context, clk clock.Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := clk.AfterFunc(d, func() { cancel(cause) })
	return ctx, func() { t.Stop(); cancel(nil) }
}

// controlErr names control_timeout when it is what ended a control call.
func controlErr(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), errControlTimeout) {
		return fmt.Errorf("%w: %v", errControlTimeout, err)
	}
	return err
}
