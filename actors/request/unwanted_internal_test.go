package request

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
)

// Results that arrive when the machine no longer wants them: a pick's answer after the request
// moved on or ended, request_timeout while a failover releases a KV handle, a stream's first
// event just after stream_first_byte_timeout fired.

// TestPickedAfterTheClientLeftIsReleased: a disaggregated request's decode worker fails, the
// failover picks the same prefill worker P again, and the client leaves before that pick's
// answer is handled. Whatever the order of the answer, the client's leaving and the actor's
// stop, P's in-flight count (and the new decode worker's) goes back to 0: the answer is given
// back, or the workers it names still watch the actor and end its holds when it stops. Real
// router and worker actors count; only the pick's answer is held back until the client left.
func TestPickedAfterTheClientLeftIsReleased(t *testing.T) {
	h := gwtest.New(t, gwtest.WithRoutes(config.NormalizeRoutes([]config.Route{
		{Model: "m-pd", Backends: []config.Backend{{Model: "m", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	})...))
	for i, w := range []struct {
		id   string
		role router.Role
	}{{"p", router.RolePrefill}, {"d1", router.RoleDecode}, {"d2", router.RoleDecode}} {
		info := gwtest.Worker(w.id, "m", 0)
		info.Role = w.role
		port := 1001 + 10*i
		info.HTTPAddress, info.GRPCAddress, info.KVAddress = addr(port), addr(port+1), addr(port+2)
		h.Beat(info)
	}
	sys := h.GW.System
	// The first pick goes to the router as is; the second (the failover's) is held here.
	held := make(chan heldPick, 1)
	var picks atomic.Int32
	proxy := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if p, ok := c.Message().(*router.Pick); ok {
			if picks.Add(1) == 1 {
				c.Forward(h.GW.Router)
				return
			}
			held <- heldPick{p: p, sender: c.Sender()}
		}
	}))
	engines := &fakeEngines{released: make(chan struct{}, 64)}
	d := &Deps{
		Router: proxy, Engines: engines, MaxAttempts: 3, Metrics: NewMetrics(nil), Clock: h.Clock,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Errors: codeErrors{},
		// P tokenizes; the first decode worker tried answers 503.
		Transport: upstreamFunc(func(req *http.Request) (*http.Response, error) {
			if strings.HasSuffix(req.URL.Path, "/v1/tokenize") {
				return reply(200, "application/json", `{"tokens":[1,2,3]}`), nil
			}
			return reply(503, "text/plain", "full"), nil
		}),
	}
	body := `{"model":"m-pd","prompt":"hi"}`
	parsed, err := oai.Parse(oai.Completions, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	x := NewExchange(ctx, httptest.NewRecorder(), "/v1/completions", oai.Completions, "req", false, []byte(body), parsed, time.Now())
	Spawn(sys, d, x)

	var hp heldPick
	select {
	case hp = <-held:
	case <-time.After(waitFor):
		t.Fatal("no failover pick")
	}
	picked, err := h.GW.Pick(hp.p) // the router reserves P and the other decode worker for the actor
	if err != nil || picked.Prefill == nil || picked.Prefill.WorkerID != "p" {
		t.Fatalf("the failover's pick: %+v, %v", picked, err)
	}
	// Each worker has taken its Acquire (and watched the actor if it held nothing for it).
	for _, pid := range []*actor.PID{picked.Worker, picked.Prefill.Worker} {
		if _, err := sys.Root.RequestFuture(pid, &actor.Touch{}, waitFor).Result(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	select {
	case <-x.Done():
	case <-time.After(waitFor):
		t.Fatal("the request never finished")
	}
	sys.Root.Send(hp.sender, picked) // the answer, after the client left
	h.InFlight("p", 0)
	h.InFlight(picked.WorkerID, 0)
	gwtest.Idle(t, h.GW)
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// TestLatePickedIsGivenBackInEveryState: an answer to a pick that was asked again arrives once
// the request is past routing (here attempting, relaying or releasing): its tickets — worker,
// prefill worker, warm-up — go back with no verdict at once, not when the request ends.
func TestLatePickedIsGivenBackInEveryState(t *testing.T) {
	for _, state := range []State{Attempting, Relaying, Releasing} {
		t.Run(state.String(), func(t *testing.T) {
			m := newMRig(t)
			m.silent = true
			m.d.ReleaseTimeout = time.Hour
			hold := make(chan struct{})
			var once sync.Once
			letGo := func() { once.Do(func() { close(hold) }) }
			t.Cleanup(letGo)
			pr, pw := io.Pipe()
			t.Cleanup(func() { pw.CloseWithError(io.ErrClosedPipe) })
			at := make(chan string, 4)
			stall := blockUntilDone(at)
			m.upstream = func(worker string, req *http.Request, body string) (*http.Response, error) {
				switch state {
				case Relaying:
					at <- worker
					r := reply(200, "application/json", "")
					r.Body, r.ContentLength = pr, -1 // headers came, the body stalls
					return r, nil
				case Releasing:
					// Disaggregated: P tokenizes, A's answer is cut, so the KV handle pushed to
					// A was not consumed and is released (held up here).
					if strings.HasSuffix(req.URL.Path, "/v1/tokenize") {
						return reply(200, "application/json", `{"tokens":[1,2,3]}`), nil
					}
					at <- worker
					r := reply(200, "application/json", "")
					r.Body, r.ContentLength = io.NopCloser(io.MultiReader(strings.NewReader(`{"cho`), errReader{io.ErrUnexpectedEOF})), -1
					return r, nil
				}
				return stall(worker, req, body)
			}
			if state == Releasing {
				m.engines.hold = hold
			}
			run := m.start(`{"model":"m","prompt":"hi"}`)
			first := <-m.picks
			m.clk.Advance(time.Second) // the pick timeout: asked again
			var second *router.Pick
			select {
			case second = <-m.picks:
			case <-time.After(waitFor):
				t.Fatal("not asked again after the pick timeout")
			}
			m.mu.Lock()
			sender := m.held[0].sender
			m.mu.Unlock()
			cur := &router.Picked{Tag: second.Tag, Ticket: 9, Worker: m.worker("a"), WorkerID: "a", HTTPAddress: "a.http",
				KVAddress: "a.kv", Steps: 1, Route: "r", ServedModel: "served"}
			if state == Releasing {
				cur.Prefill = &router.PickedWorker{Ticket: 11, Worker: m.worker("p"), WorkerID: "p", HTTPAddress: "p.http"}
			}
			m.sys.Root.Send(sender, cur)
			waitAt(t, at, "a")
			switch state {
			case Relaying:
				gwait(t, "relaying", func() bool { return m.transitions(Attempting, Relaying) == 1 })
			case Releasing:
				select {
				case <-m.engines.released:
				case <-time.After(waitFor):
					t.Fatal("the KV handle was not released")
				}
				if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeSuccess}, "a": {router.OutcomeInterrupted}}) {
					t.Fatalf("releases %v", got)
				}
			}
			late := &router.Picked{Tag: first.Tag, Ticket: 7, Worker: m.worker("late"), WorkerID: "late", HTTPAddress: "late.http",
				Prefill: &router.PickedWorker{Ticket: 8, Worker: m.worker("late-p"), WorkerID: "late-p"}, Steps: 1,
				Warm: &router.Warmup{PickedWorker: router.PickedWorker{Ticket: 10, Worker: m.worker("late-w"), WorkerID: "late-w",
					HTTPAddress: "late-w.http"}, Bytes: 2}}
			m.sys.Root.Send(sender, late)
			got := m.expectReleases(3)
			want := map[string][]router.Outcome{"late": {router.OutcomeNone}, "late-p": {router.OutcomeNone}, "late-w": {router.OutcomeNone}}
			if !equalOutcomes(got, want) {
				t.Fatalf("releases %v, want %v", got, want)
			}
			select {
			case <-run.x.Done():
				t.Fatal("the request ended before the late answer was given back")
			default:
			}
			run.cancel()
			letGo()
			pw.CloseWithError(io.ErrUnexpectedEOF)
			run.wait(t)
			if len(m.bodiesOf("late")) != 0 || len(m.bodiesOf("late-w")) != 0 {
				t.Fatal("the late pick's workers were asked")
			}
		})
	}
}

// TestRequestTimeoutWhileReleasing (R14.1): request_timeout fires while a failover releases the
// KV handle pushed to the decode worker that failed. The client gets its 504 at
// request_timeout on the clock, while the Release is still under way — not after it, and never
// after a new attempt with the timer armed again. The Release still runs to its end.
func TestRequestTimeoutWhileReleasing(t *testing.T) {
	m := newMRig(t)
	m.d.RequestTimeout, m.d.ReleaseTimeout = time.Minute, time.Hour
	m.pool, m.prefill = []string{"d1", "d2"}, "p"
	hold := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(letGo)
	m.engines.hold = hold
	at := make(chan string, 4)
	stall := blockUntilDone(at)
	m.upstream = func(worker string, req *http.Request, body string) (*http.Response, error) {
		switch worker {
		case "p":
			return tokenizer(worker, req, body)
		case "d1":
			return reply(503, "text/plain", "full"), nil
		}
		return stall(worker, req, body)
	}
	run := m.start(`{"model":"m","prompt":"hi"}`)
	select {
	case <-m.engines.released: // d1 answered 503 after the push: the failover releases h1
	case <-time.After(waitFor):
		t.Fatal("the KV handle was not released")
	}
	m.clk.Advance(time.Minute - time.Nanosecond)
	select {
	case <-run.x.Done():
		t.Fatal("answered before request_timeout")
	default:
	}
	m.clk.Advance(time.Nanosecond)
	select {
	case <-run.x.Done():
	case w := <-at:
		t.Fatalf("routed again, to %s, after request_timeout", w)
	case <-time.After(waitFor):
		t.Fatal("request_timeout did not end the request while its KV handle was being released")
	}
	if w := run.w; w.Code != 504 {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	letGo()
	gwait(t, "the Release ended and no timer is left", func() bool { return m.clk.Pending() == 0 })
	if _, rel := m.engines.calls(); !slices.Equal(rel, [][2]string{{"d1.kv", "h1"}}) {
		t.Fatalf("KV releases %v", rel)
	}
	if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"p": {router.OutcomeSuccess}, "d1": {router.Outcome5xx}}) {
		t.Fatalf("releases %v", got)
	}
	m.noMoreReleases()
	if len(m.picks) != 1 || len(m.bodiesOf("d2")) != 0 {
		t.Fatalf("%d picks, d2 asked %d times: a request that timed out was retried", len(m.picks), len(m.bodiesOf("d2")))
	}
	if n := m.code("r", "served", 504); n != 1 {
		t.Fatalf("504s counted %v", n)
	}
}

// lateBody is a stream whose first event comes in just as stream_first_byte_timeout fires: its
// first read waits for let, whatever the attempt's context says, and its later reads end with
// that context, as a cancelled connection's do.
type lateBody struct {
	ctx     context.Context
	reading chan struct{} // closed when the first read starts
	let     chan struct{}
	started bool
}

func (b *lateBody) Read(p []byte) (int, error) {
	if !b.started {
		b.started = true
		close(b.reading)
		select {
		case <-b.let:
		case <-time.After(waitFor):
		}
		return copy(p, "data: {\"t\":1}\n\n"), nil
	}
	select {
	case <-b.ctx.Done():
		return 0, context.Cause(b.ctx)
	case <-time.After(waitFor):
		return 0, io.ErrUnexpectedEOF
	}
}

func (b *lateBody) Close() error { return nil }

// TestFirstEventAfterFirstByteTimeout (R14.1, R6): a stream's first event read just after
// stream_first_byte_timeout fired (the timer's message is handled first) is not committed on
// the cancelled attempt: the request fails over as for the timeout, and the client gets the
// next worker's whole stream, not one event and an interruption.
func TestFirstEventAfterFirstByteTimeout(t *testing.T) {
	m := newMRig(t)
	m.pool = []string{"a", "b"}
	body := &lateBody{reading: make(chan struct{}), let: make(chan struct{})}
	var once sync.Once
	let := func() { once.Do(func() { close(body.let) }) }
	t.Cleanup(let)
	ctxs := make(chan context.Context, 1)
	const whole = "data: {\"t\":2}\n\ndata: [DONE]\n\n"
	m.upstream = func(worker string, req *http.Request, _ string) (*http.Response, error) {
		if worker == "a" {
			body.ctx = req.Context()
			ctxs <- req.Context()
			r := reply(200, "text/event-stream", "")
			r.Body = body
			return r, nil
		}
		return reply(200, "text/event-stream", whole), nil
	}
	run := m.start(`{"model":"m","prompt":"hi","stream":true}`)
	var ctx context.Context
	select {
	case ctx = <-ctxs:
	case <-time.After(waitFor):
		t.Fatal("a was never asked")
	}
	select {
	case <-body.reading:
	case <-time.After(waitFor):
		t.Fatal("a's stream was never read")
	}
	m.clk.Advance(DefaultStreamFirstByteTimeout)
	select {
	case <-ctx.Done(): // the actor handled the timer: it cancelled the attempt
	case <-time.After(waitFor):
		t.Fatal("stream_first_byte_timeout did not cancel the attempt")
	}
	let()
	if w := run.wait(t); w.Code != 200 || w.Body.String() != whole {
		t.Fatalf("client got %d %q, want b's whole stream", w.Code, w.Body.String())
	}
	if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"a": {router.OutcomeTimeout}, "b": {router.OutcomeSuccess}}) {
		t.Fatalf("releases %v", got)
	}
	m.noMoreReleases()
}
