// Package request is the request actor: one short-lived actor per inference request, driving
// an explicit state machine (state.go) — route → attempt → relay → done, with failover before
// the first byte and never after it (R6), the cascade step (R7) and the disaggregated
// sub-states tokenize → prefill → decode → release (R8). Network I/O runs on goroutines that
// report back as messages, so the actor never blocks; every path releases what it holds
// (in-flight counts, KV handles), including a crash of the actor itself.
package request

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/accesslog"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"go.opentelemetry.io/otel/trace"
)

// Exchange is the client side of one request: what the HTTP adapter parsed, and the writer the
// actor answers on. The adapter's handler blocks on Done until the actor has answered.
type Exchange struct {
	W     http.ResponseWriter
	Ctx   context.Context // the client's: cancelled when the client leaves
	Path  string          // /v1/completions or /v1/chat/completions, sent upstream as is
	Kind  oai.Kind
	ID    string // the request id (SPEC B2)
	Debug bool   // the key has the debug scope: X-TL-Route and X-TL-Cascade-Step
	// Traced: Ctx carries the client's valid W3C trace context (internal/tracing.Extract, R24),
	// which the request's spans continue, or which goes to the engines unchanged with tracing
	// off. (Next to Debug, in its padding: the exchange stays in its size class.)
	Traced bool
	Body   []byte
	Req    oai.Request
	Start  time.Time
	// ParseTime is how long the adapter took from the whole body read to handing the request
	// over (parsing and admission headers): tlgw_stage_seconds{stage="parse"} (R17.3).
	ParseTime time.Duration
	// Admission inputs (R10): the class from the key or X-TL-Class, the session from
	// X-Session-ID or the body's user — scoped to the caller's API key when keys are configured,
	// so another key's client cannot join or end this one's session (see the HTTP adapter's
	// sessionKey) — and whether this is the session's last turn (X-TL-Session-Final: true,
	// R15.1).
	Class        string
	SessionID    string
	SessionFinal bool
	// APIKey is the index of the configured API key the request came with (-1: none); the
	// admission queue shares a class's queue among keys by it (R20). The request's size for
	// admission is Req.Cost: every prompt of a batch, and what it may generate.
	APIKey int
	// SLOTTFTMs is the request's TTFT objective in milliseconds (X-TL-SLO-TTFT-Ms, R18.4; 0 =
	// none), carried on its picks.
	SLOTTFTMs int64
	// Rendered is the whole rendered prompt when the adapter parsed it with the body
	// (oai.ParseRendered, one pass); nil: the actor renders it itself when it needs it.
	Rendered []byte
	// R21. Method is the engine call's method ("" = POST; GET and DELETE for a stored
	// response). ContentType is the body's as the client sent it, relayed for a multipart form
	// ("" = application/json). Response names the stored response the request must reach (GET,
	// DELETE, or the body's previous_response_id): the router pins it to the worker that
	// stored it. Owner is the API key's index (-1: none): a stored response belongs to its key.
	// Errors answers in the API's own error shape (nil: Deps.Errors, OpenAI's).
	Method      string
	ContentType string
	Response    string
	Owner       int
	Errors      ErrorWriter
	// TokenIDs are the prompt's token ids as an engine of its pool computes them (R22:
	// gateway.tokenizer = "engine"; nil: not rendered, the pick uses the approximate index).
	// Never changed once the exchange is handed over; the router reads it on each pick.
	TokenIDs []uint32

	done   chan struct{}
	tokens int64 // set before done is closed
}

// Tokens is what the answer cost for the key's token limit (R13.5): usage.total_tokens when the
// engine reported it, else (a stream without usage) prompt bytes/4 + events relayed, and the
// prompt estimate alone when nothing was relayed. Read it after Done.
func (x *Exchange) Tokens() int64 { return x.tokens }

// NewExchange prepares an exchange.
func NewExchange(ctx context.Context, w http.ResponseWriter, path string, kind oai.Kind, id string,
	debug bool, body []byte, req oai.Request, start time.Time) *Exchange {
	return &Exchange{W: w, Ctx: ctx, Path: path, Kind: kind, ID: id, Debug: debug, Body: body, Req: req,
		Start: start, Owner: -1, done: make(chan struct{})}
}

// promptBytes is what the prompt estimate of the answer's cost counts (4 bytes a token): the
// body, but for an audio form, whose bytes are audio, not text (R21: it costs what its answer
// reports).
func (x *Exchange) promptBytes() int {
	if x.Kind.Multipart() {
		return 0
	}
	return len(x.Body)
}

// Done is closed once the client has its terminal outcome and nothing writes to W any more.
func (x *Exchange) Done() <-chan struct{} { return x.done }

// Upstream is the HTTP round trip to an engine (tokenize, attempts): adapters/http's transport
// in production, a fake in tests, so the machine runs without sockets. Any http.RoundTripper is
// one.
type Upstream interface {
	RoundTrip(*http.Request) (*http.Response, error)
}

// Engines is what the actor needs of the engines' gRPC surfaces (adapters/grpc implements it).
type Engines interface {
	// Prefill's error wraps ErrDecodeTarget when the prefill worker says the decode target
	// failed (it could not push the KV there).
	Prefill(ctx context.Context, at Endpoint, call PrefillCall) (PrefillResult, error)
	Release(ctx context.Context, at Endpoint, handleID string) error
}

// Endpoint is an engine's gRPC or KV address as the registration that advertised it (R20):
// engine connections belong to registrations, so a call names whose address it dials, and a
// registration that is gone or no longer advertises the address is not dialled for it.
type Endpoint struct {
	WorkerID string
	Reg      uint64 // the registration (router.WorkerInfo.Reg)
	Addr     string
}

// ErrDecodeTarget: a Prefill failed because of its decode target (unreachable, the push
// failed, or no room there). The decode worker is blamed for the attempt, not the prefill
// worker, which did its part and holds nothing for the request.
var ErrDecodeTarget = errors.New("the decode target failed")

// Sampling is every sampling field of a Prefill call, defaults filled in (R8.3).
type Sampling struct {
	MaxTokens   uint32
	Temperature float64
	TopP        float64
	TopK        int32
	Seed        uint64
	Logprobs    bool
	Stop        []string
}

// PrefillCall is EngineControl/Prefill's request.
type PrefillCall struct {
	RequestID    string
	Model        string
	PromptIDs    []uint32
	Sampling     Sampling
	DecodeTarget string // the decode worker's KV address
}

// PrefillResult is EngineControl/Prefill's answer.
type PrefillResult struct {
	HandleID             string
	NumBlocks, NumTokens uint32
	FirstToken           uint32
	FirstLogprob         float32
	DrawsConsumed        uint64
}

// ErrorWriter answers errors in the API's shape; adapters/http's single mapping implements it.
type ErrorWriter interface {
	// Error writes err as a complete error response and returns its status.
	Error(w http.ResponseWriter, err error) int
	// SSEError writes the event that ends an interrupted stream (R6).
	SSEError(w http.ResponseWriter, message string)
}

// Deps is what every request actor shares.
type Deps struct {
	Errors      ErrorWriter
	Router      *actor.PID
	Transport   Upstream
	Engines     Engines
	MaxAttempts int
	Metrics     *Metrics
	Logger      *slog.Logger
	// ReleaseTimeout bounds a KV Release call (0: the control calls' timeout, controlTimeout).
	ReleaseTimeout time.Duration
	// PickTimeout is how long the actor waits for the router before asking again (default
	// 1 s). The router answers in microseconds; only a router that panicked on this very pick
	// (and was restarted without it) is silent.
	PickTimeout time.Duration
	// Clock times the pick timeout (default the real clock).
	Clock clock.Clock
	// Admission: a request's first pick passes the router's admission queue (R10).
	Admission bool
	// PrefixHashes: picks carry the prompt's chunk hashes for the prefix index (R10 item 5).
	PrefixHashes bool
	// ObserveTTFT: a streamed attempt's time to first event is reported to the router
	// (router.ObservedTTFT), for route_policy = "predicted_latency"; other policies pay nothing.
	ObserveTTFT bool
	// The R14.1 timeouts (0: the SPEC's default, see faults.go): a stream's response headers
	// and first event, a non-streamed request's total, the gap between a stream's events, and
	// the control calls (tokenize, Prefill, Release; ReleaseTimeout, when set, wins for Release).
	StreamFirstByteTimeout time.Duration
	RequestTimeout         time.Duration
	StreamIdleTimeout      time.Duration
	ControlTimeout         time.Duration
	// RetryBudget caps the failovers running at once (R14.3); nil: no cap.
	RetryBudget *RetryBudget
	// BufferBudget bounds the bytes of non-streamed answers buffered at once (R20
	// gateway.max_buffered_bytes); nil: no bound.
	BufferBudget *BufferBudget
	// Warmups counts the prefix warm-ups running (warmup.go); nil: none are sent (their
	// tickets are released at once).
	Warmups *Warmups
	// Go runs an I/O step on a goroutine (internal/gopool's Pool.Go in production, so the step
	// reuses a goroutine whose stack has grown); nil: a go statement.
	Go func(func())
	// AccessLog receives a record of each finished request (R24); nil: no access log, and
	// the request path pays a nil check where the record would be kept.
	AccessLog *accesslog.Log
	// KeyNames are the configured API keys' names by index (config.Key.Name): the access
	// log's key, by the exchange's Owner. Never a secret.
	KeyNames []string
	// Tracer makes the request's spans (R24: tlgw.request and its stages); nil: tracing off —
	// no span is made, and a client's valid traceparent/tracestate (in Exchange.Ctx, see
	// internal/tracing.Extract) goes to the engines unchanged.
	Tracer trace.Tracer
}

// requestActor is one request's state machine.
//
// Bounds (R19): everything here lives as long as the one request. Its slices grow with its
// own picks only: exclude and watchers by the workers it tried (at most max_attempts per
// cascade step, and the prefill workers of a disaggregated route), held by the tickets it
// holds now (two at most: a worker and a prefill worker), hashes by its prompt (the body
// limit / 64). Its timers (pick, first byte, request) are stopped in finish and stopping, its
// I/O goroutine ends with its context (ioDone), and the workers stop watching it when it
// finishes holding nothing (unwatchWorkers) or get its Terminated.
type requestActor struct {
	d *Deps
	x *Exchange

	state State // its step function is machine[state].step
	// toldFinished: the router has its router.Finished (sent once, by finish or stopping).
	// Next to state, in its padding (the size class, see acc).
	toldFinished bool

	// Routing.
	key         uint64 // the internal id: unique among live requests, whatever X-Request-ID says
	pickTag     uint64 // the current Pick's tag; answers with another tag are stale
	pickTimer   clock.Timer
	pickRetries int
	hashes      []uint64         // the prompt's chunk hashes, when the prefix index is on
	admit       router.AdmitInfo // what every pick says of the request's admission (R10)
	cascadeStep int              // the cascade step asked for (router.LastStep: the last)
	exclude     []string
	attempts    int
	lastErr     error
	picked      *router.Picked
	route       string
	served      string

	// openPicks counts the Picks sent and not answered yet (the router answers each Pick
	// once; a queued pick asked again is answered once, for its last tag, so at most the
	// picks of one routing can stay open). While one is open, its answer may name workers
	// that reserved a ticket for this actor and can only learn of its end by watching it:
	// finish then leaves every watch in place (unwatchWorkers).
	openPicks int

	// What the actor holds and must release on every path (a worker also releases the holds
	// of a requester that stops, so a crash between two lines here leaks nothing).
	held []hold // worker tickets picked for it and not yet released
	// watchers are the workers of every pick it got (each watches it from the pick's Acquire
	// on), dropped from its watchers when it finishes with nothing held on them (finish).
	watchers []*actor.PID
	kvHandle string   // a pushed KV handle on the decode worker, until consumed or released
	kvAt     Endpoint // the decode worker's KV address, where Release goes
	// The engines' own disaggregation protocols (R22, pd.go): kvParams is the vLLM prefill
	// worker's kv_transfer_params object (at most maxKVParams bytes; nil: none yet), passed
	// verbatim to the decode; decodeRetried says a decode with these params already failed
	// once and tried another decode worker; decodeOnly asks the next pick for a decode worker
	// alone; room is the current SGLang attempt's bootstrap_room; pdAt is when the current
	// phase (prefill, decode) began, for tlgw_pd_phase_seconds.
	kvParams      []byte
	decodeRetried bool
	decodeOnly    bool
	room          uint64
	pdAt          time.Time
	// cascadeHold is the buffer budget's bytes of a cascade step's answer (nil: none), from
	// its read until it is judged, or the request ends.
	cascadeHold *bufHold
	// afterRelease is what Releasing does once Release has answered: finish, or route again
	// (a failover).
	afterRelease func(c actor.Context)

	// The client leaving (clientStep): gone once it is seen; stopGone unregisters the
	// context.AfterFunc that reports it.
	gone bool
	// inRoute: the request counts in its route's tlgw_requests_in_flight (from the pick that
	// named the route to its end). Next to gone, in its padding.
	inRoute  bool
	stopGone func() bool

	// The current I/O goroutine: gen tags its results (stale ones are ignored), cancelCause
	// stops it naming why (nil, or a timeout: faults.go), ioDone is closed when it has
	// returned (so a crash never writes concurrently with it).
	gen         int
	cancelCause context.CancelCauseFunc
	ioCtx       context.Context
	ioDone      chan struct{}

	committed bool         // bytes have gone to the client
	upStatus  int          // the relayed answer's HTTP status (R14.2: a relayed 5xx counts as 5xx)
	relayOut  *relayResult // the relay goroutine's result (&relayRes; nil: nothing relayed), readable once ioDone is closed
	relayRes  relayResult
	seed      uint64
	seedFixed bool // the gateway drew the seed (disaggregated, R8.2)
	sampling  Sampling
	promptIDs []uint32
	upBody    []byte
	upBodyFor string
	finished  bool
	code      int
	log       *slog.Logger // made by logger() on first use

	// R14.1 timers and R14.3 budget (faults.go).
	fbTag     uint64      // the current first-byte timer's tag
	fbTimer   clock.Timer // stream_first_byte_timeout of the current attempt
	reqTimer  clock.Timer // request_timeout of a non-streamed request
	timedOut  bool        // request_timeout fired: the request ends 504
	counted   bool        // counted in the budget's in-flight requests
	retrySlot bool        // holds one of the budget's failover slots

	// R17.3 stage clocks (measurements on the wall clock, not timing rules): whether the
	// current pick was queued, when it left, when the current attempt started, when the relay
	// began. queued shares a word with the bools above it.
	queued                       bool
	pickSent, attemptAt, relayAt time.Time

	// acc is what the access log will say of the request (access.go); nil when there is no
	// access log. The actor is allocated per request, with Go's 8-byte header (objects over
	// 512 bytes): up to 888 bytes it is in the 896-byte size class, so this pointer took the
	// place of queued's padding rather than move every request to the 1024-byte class.
	acc *access
	// tr is the request's trace (trace.go): nil when tracing is off and the client sent no
	// trace context. Its 8 bytes are toldFinished's old padding: the actor stays at 888.
	tr *reqTrace
}

// Props returns the props of the actor serving x. Request actors are top-level with a guardian
// that stops (never restarts) them when they panic: a crashed request answers its client and
// releases what it held in its *actor.Stopping handler.
func Props(d *Deps, x *Exchange, opts ...actor.PropsOption) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &requestActor{d: d, x: x, cascadeStep: router.LastStep, key: nextKey.Add(1)}
	}, stopOnPanicOpt).Configure(opts...)
}

// stopOnPanicOpt is the guardian option, made once (Props runs per request).
var stopOnPanicOpt = actor.WithGuardian(stopOnPanic)

// nextKey numbers request actors: the internal key every table of the router is keyed by.
var nextKey atomic.Uint64

// hold is one in-flight count the actor holds on a worker.
type hold struct {
	worker *actor.PID
	ticket uint64
}

var stopOnPanic = actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.StopDirective })

// Receive runs the paths every state shares — the client leaving, results of I/O the machine
// has moved past, the R14.1 timeouts — and then the current state's step function.
func (r *requestActor) Receive(c actor.Context) {
	msg := c.Message()
	switch msg.(type) {
	case *actor.Started:
		r.start(c)
		return
	case *actor.Stopping:
		r.stopping(c)
		return
	case *actor.Stopped, *actor.Restarting:
		return
	}
	if r.clientStep(c, msg) {
		return
	}
	if p, ok := msg.(*router.Picked); ok {
		r.openPicks = max(r.openPicks-1, 0)
		if r.state != Routing {
			// An answer the machine has moved past — a pick asked again after its timeout
			// and answered late, or one the client left before (Done) — holds tickets all
			// the same: they go back at once, whatever the state.
			r.giveBack(c, p)
			return
		}
	}
	if gen, ok := resultGen(msg); r.state == Done || (ok && gen != r.gen) {
		discard(msg) // the actor has moved on: a late result only needs its body closed
		return
	}
	if r.faultStep(c, msg) {
		return
	}
	if step := machine[r.state].step; step != nil {
		step(r, c, msg)
	}
}

// clientStep is the one path of a client that leaves: it runs on clientGone (context.AfterFunc
// on the client's context, registered at start for every request), or on the first message
// handled after the client's context ended, whichever comes first — an I/O result that the
// cancellation itself produced can be queued before clientGone, and must not read as the
// worker's failure. It reports whether msg was clientGone.
func (r *requestActor) clientStep(c actor.Context, msg any) bool {
	_, isGone := msg.(clientGone)
	if !r.gone && r.state != Done && (isGone || r.x.Ctx.Err() != nil) {
		r.gone = true
		r.leave(c)
	}
	return isGone
}

// leave ends a request whose client left, as its state allows. Its holds are released with
// no verdict on the workers (R14.2: the client, not the engine, ended the exchange).
func (r *requestActor) leave(c actor.Context) {
	r.logger().Info("the client left", "state", r.state.String())
	switch r.state {
	case Routing:
		// The router sees the actor stop: a queued pick leaves. An answer already on its way
		// is given back if it is handled (Receive), else its workers see the actor stop.
		r.finish(c, statusClientGone)
	case Tokenizing, RemotePrefill, Attempting, CascadeStep:
		r.endIO() // its late result is discarded; nothing it carries is held
		r.releaseAll(c.Send)
		r.release(c, r.finishing(statusClientGone))
	case Prefilling:
		// The Prefill may already have pushed KV to the decode worker: its answer names the
		// handle to release, so the actor waits for it (stepPrefilling).
		r.cancelIO(context.Canceled)
		r.releaseAll(c.Send)
	case Relaying:
		r.cancelIO(context.Canceled) // the relay's result ends the request
	}
	// Releasing: the Release runs to its end (afterRelease sees r.gone).
}

// finishing is the continuation that finishes with code.
func (r *requestActor) finishing(code int) func(actor.Context) {
	return func(c actor.Context) { r.finish(c, code) }
}

// become moves to state to, whose step function handles the messages from now on; a
// transition the table does not allow panics.
func (r *requestActor) become(to State) {
	if !allowed(r.state, to) {
		panic(IllegalTransition{From: r.state, To: to})
	}
	if r.d.Logger.Enabled(context.Background(), slog.LevelDebug) {
		r.logger().Debug("request transition", "from", r.state.String(), "to", to.String())
	}
	r.d.Metrics.transition(r.state, to)
	r.state = to
}

// logger is the request's logger, naming its request id; made on first use, since most
// requests log nothing.
func (r *requestActor) logger() *slog.Logger {
	if r.log == nil {
		r.log = r.d.Logger.With("request_id", r.x.ID)
	}
	return r.log
}

func (r *requestActor) start(c actor.Context) {
	// The labels are the router's names for the request (R13.4): until it has named a route,
	// the model is "unknown", so no client string ever becomes a metric label.
	r.route, r.served = UnknownLabel, UnknownLabel
	if !r.x.Req.Stream && r.x.Kind <= oai.Chat {
		// A cascade route starts at its first step; other routes ignore it. Streams, and the
		// endpoints whose answers carry no logprobs to judge (R21), go to its last.
		r.cascadeStep = 0
	}
	r.state = Routing
	if r.d.Tracer != nil || r.x.Traced {
		r.startTrace()
	}
	if r.d.AccessLog != nil || r.tr.recording() {
		// A sampled request's span says what the access log would (outcome, worker, usage).
		r.acc = &access{usage: usageDetail{prompt: -1, completion: -1}}
	}
	if r.x.ParseTime > 0 {
		r.d.Metrics.stage(stageParse, r.x.ParseTime)
	}
	r.budgetStart()
	self, root := c.Self(), c.ActorSystem().Root
	r.stopGone = context.AfterFunc(r.x.Ctx, func() { root.Send(self, clientGone{}) })
	r.pick(c)
}

// clientGone is the client's context ending: the client left (or its connection broke).
type clientGone struct{}

// IgnoreDeadLetterLogging: the request may have ended already.
func (clientGone) IgnoreDeadLetterLogging() {}

// endWatch unregisters the client watch. (The router learns that an admitted request ended
// from its actor stopping.)
func (r *requestActor) endWatch() {
	if r.stopGone != nil {
		r.stopGone()
		r.stopGone = nil
	}
}

// pick asks the router (Routing), with a timeout after which it asks again.
func (r *requestActor) pick(c actor.Context) {
	r.pickTag++
	tag := r.pickTag
	if r.d.PrefixHashes && r.pickTag == 1 {
		// The cached-prefix hashes cover the whole rendered prompt (bounded by the body
		// limit), so a long prompt sent again is seen as cached.
		rendered := r.x.Rendered
		if rendered == nil {
			rendered = oai.RenderPrompt(r.x.Kind, r.x.Body, len(r.x.Body))
		}
		r.hashes = prefixindex.Hashes(make([]uint64, 0, len(rendered)/prefixindex.ChunkBytes), rendered)
	}
	p := &router.Pick{
		Model: r.x.Req.Model, RequestID: r.x.ID, Key: r.key, Requester: c.Self(),
		PrefixHash: prefixHash(r.x.Req.PrefixKey), PrefixHashes: r.hashes, Exclude: r.exclude,
		Step: r.cascadeStep, Tag: tag, SLOTTFTMs: r.x.SLOTTFTMs, Endpoint: r.x.Kind,
		Response: r.x.Response, Owner: r.x.Owner, Continues: r.x.Response != "" && r.x.Method == "",
		TokenIDs: r.x.TokenIDs, DecodeOnly: r.decodeOnly,
	}
	if r.d.Admission && (r.x.Response == "" || p.Continues) { // a stored response's read or delete is no generation
		// Every pick of the request names its admission: the router admits the first it
		// sees and keeps the allowed workers for the others. It is the actor's own field,
		// set once and never changed, so the router may keep it.
		if r.pickTag == 1 {
			// Its size is every prompt of the body and the most it may generate (R20: a batch
			// is not sized by its first prompt, nor a request for many long answers as a
			// short one).
			cost := r.x.Req.Cost
			r.admit = router.AdmitInfo{Class: r.x.Class, SessionID: r.x.SessionID, APIKey: r.x.APIKey,
				PromptTokens: clampInt(cost.PromptTokens), OutputTokens: clampInt(cost.Tokens() - cost.PromptTokens),
				Final: r.x.SessionFinal}
		}
		p.Admit = &r.admit
	}
	// The timeout is armed before the pick leaves, so whoever sees the pick sees its timer.
	self, root := c.Self(), c.ActorSystem().Root
	r.pickTimer = r.clock().AfterFunc(r.pickTimeout(), func() { root.Send(self, pickTimeout{tag: tag}) })
	r.pickSent, r.queued = time.Now(), false
	r.openPicks++
	c.Request(r.d.Router, p)
}

// clampInt is n as an int, at most the largest int.
func clampInt(n int64) int { return int(min(n, math.MaxInt)) }

// pickTimeout is the pick timer firing.
type pickTimeout struct{ tag uint64 }

// IgnoreDeadLetterLogging: the timer may fire after the request ended.
func (pickTimeout) IgnoreDeadLetterLogging() {}

func (r *requestActor) clock() clock.Clock {
	if r.d.Clock != nil {
		return r.d.Clock
	}
	return clock.Real{}
}

func (r *requestActor) pickTimeout() time.Duration {
	if r.d.PickTimeout > 0 {
		return r.d.PickTimeout
	}
	return time.Second
}

// stopPickTimer cancels the pending pick timeout.
func (r *requestActor) stopPickTimer() {
	if r.pickTimer != nil {
		r.pickTimer.Stop()
		r.pickTimer = nil
	}
}

// giveBack releases the tickets of a pick the actor will not use (a late answer): no verdict
// on workers that were never asked.
func (r *requestActor) giveBack(c actor.Context, p *router.Picked) {
	if p.Err != nil {
		return
	}
	r.watchedBy(p)
	c.Send(p.Worker, &router.Release{Ticket: p.Ticket, Outcome: router.OutcomeNone})
	if p.Prefill != nil {
		c.Send(p.Prefill.Worker, &router.Release{Ticket: p.Prefill.Ticket, Outcome: router.OutcomeNone})
	}
	if p.Warm != nil {
		c.Send(p.Warm.Worker, &router.Release{Ticket: p.Warm.Ticket, Outcome: router.OutcomeNone})
	}
}

// acquire takes over the in-flight counts the router's pick holds on the worker(s).
func (r *requestActor) acquire(p *router.Picked) {
	r.watchedBy(p)
	r.held = append(r.held, hold{p.Worker, p.Ticket})
	if p.Prefill != nil {
		r.held = append(r.held, hold{p.Prefill.Worker, p.Prefill.Ticket})
	}
}

// watchedBy notes the workers of pick p: its Acquire makes each watch this actor.
func (r *requestActor) watchedBy(p *router.Picked) {
	for _, w := range [2]*actor.PID{p.Worker, prefillWorker(p)} {
		if w != nil && !slices.ContainsFunc(r.watchers, w.Equal) {
			r.watchers = append(r.watchers, w)
		}
	}
}

func prefillWorker(p *router.Picked) *actor.PID {
	if p.Prefill == nil {
		return nil
	}
	return p.Prefill.Worker
}

// unwatchWorkers drops the workers from this actor's watchers once it holds nothing on them
// (finish, after releaseAll): the Terminated each would get at its stop only tells it to end
// holds that the Releases already ended, and cost each worker a message, and a run of its
// mailbox, per request. An Unwatch to itself is handled before the Stop that follows it (system
// messages keep their order). A crashed actor does not get here: its workers are told.
//
// Not while a pick is open (openPicks): its answer may come after the stop, which drops it, and
// name a worker that already watched this actor for an earlier pick (it holds the actor's entry,
// or its new Watch came before this Unwatch). That worker ends the ticket only on the
// Terminated the stop sends it, so every watch stays.
func (r *requestActor) unwatchWorkers(c actor.Context) {
	if len(r.watchers) == 0 || len(r.held) != 0 || r.openPicks > 0 {
		return
	}
	self, ok := c.ActorSystem().ProcessRegistry.Get(c.Self())
	if !ok {
		return
	}
	for _, w := range r.watchers {
		self.SendSystemMessage(c.Self(), &actor.Unwatch{Watcher: w})
	}
	r.watchers = nil
}

// releaseWorker ends the in-flight count held on one worker with the verdict on its part
// (R14.2).
func (r *requestActor) releaseWorker(c actor.Context, pid *actor.PID, o router.Outcome) {
	r.releaseVerdict(c, pid, router.Release{Outcome: o})
}

// releaseVerdict is releaseWorker with the whole verdict (rel without its ticket).
func (r *requestActor) releaseVerdict(c actor.Context, pid *actor.PID, rel router.Release) {
	for i, h := range r.held {
		if h.worker == pid {
			rel.Ticket = h.ticket
			c.Send(pid, &rel)
			r.held = append(r.held[:i], r.held[i+1:]...)
			return
		}
	}
}

// releaseAll ends every count still held, with no verdict: a worker whose part came to
// something is released with it first (releaseWorker).
func (r *requestActor) releaseAll(send func(*actor.PID, any)) {
	for _, h := range r.held {
		send(h.worker, &router.Release{Ticket: h.ticket, Outcome: router.OutcomeNone})
	}
	r.held = nil
}

// blame is the worker whose part failed with err, and the HTTP address it was picked at: the
// prefill worker while tokenizing or prefilling (unless the prefill worker says its push to
// the decode worker failed), or when its call of an SGLang pair failed (prefillLegError), else
// the picked (unified or decode) worker; nil while routing.
func (r *requestActor) blame(err error) (*actor.PID, string, string) {
	p := r.picked
	switch {
	case p == nil:
		return nil, "", ""
	case r.state == Tokenizing || r.state == RemotePrefill || r.state == Prefilling && !errors.Is(err, ErrDecodeTarget),
		r.state == Attempting && p.Prefill != nil && errors.As(err, new(prefillLegError)):
		return p.Prefill.Worker, p.Prefill.WorkerID, p.Prefill.HTTPAddress
	}
	return p.Worker, p.WorkerID, p.HTTPAddress
}

// finish ends the request with its terminal outcome already written (code is its status).
func (r *requestActor) finish(c actor.Context, code int) {
	r.become(Done)
	r.releaseBuffer()
	r.stopPickTimer()
	r.stopFaultTimers()
	r.budgetEnd()
	r.endWatch()
	r.releaseAll(c.Send)
	r.unwatchWorkers(c)
	r.code = code
	r.leaveRoute()
	r.d.Metrics.done(r.route, r.served, r.x.Kind, code)
	if r.d.AccessLog != nil {
		r.logAccess(code)
	}
	r.endTrace(code)
	r.finished = true
	r.x.tokens = r.relayOut.cost(r.x.promptBytes())
	r.tellFinished(c.Send, r.x.tokens, !r.answered(code))
	close(r.x.done)
	c.Stop(c.Self())
}

// releaseBuffer gives back a cascade step's bytes of the buffer budget, if it holds some.
func (r *requestActor) releaseBuffer() {
	r.cascadeHold.release()
	r.cascadeHold = nil
}

// answered reports whether the request ended with a whole successful answer.
func (r *requestActor) answered(code int) bool {
	return r.relayOut != nil && r.relayOut.finished && code >= 200 && code < 300
}

// tellFinished tells the router, once, that an admitted request ended (router.Finished): from
// finish, or from the stop after a crash. A request that never asked for a pick, or runs
// without admission, sends nothing.
func (r *requestActor) tellFinished(send func(*actor.PID, any), tokens int64, aborted bool) {
	if !r.d.Admission || r.pickTag == 0 || r.toldFinished {
		return
	}
	r.toldFinished = true
	send(r.d.Router, &router.Finished{Key: r.key, Tokens: tokens, Aborted: aborted})
}

// fail answers an error to a client that has received nothing yet and finishes. The access
// log's outcome is the error's, unless the caller named a more precise one (access.failedAs).
func (r *requestActor) fail(c actor.Context, err error) {
	r.acc.failedWith(err)
	r.finish(c, r.errs().Error(r.x.W, err))
}

// errs answers errors in the shape of the request's API.
func (r *requestActor) errs() ErrorWriter {
	if r.x.Errors != nil {
		return r.x.Errors
	}
	return r.d.Errors
}

// statusClientGone is recorded (never sent) when the client left first.
const statusClientGone = 499

// stopping runs on every stop. After a normal finish there is nothing left; after a crash the
// actor answers the client (502, or an SSE error event once committed) and releases what it
// held, once the I/O goroutine it may have running has returned.
func (r *requestActor) stopping(c actor.Context) {
	if r.finished {
		return
	}
	r.d.Metrics.crashes.Inc()
	r.logger().Error("request actor stopped before finishing: answering the client and releasing", "state", r.state.String())
	if r.cancelCause != nil && !r.committed {
		r.cancelCause(nil) // an attempt not yet committed is abandoned; a relay runs to its end
	}
	r.releaseAll(c.Send)
	// A pick still outstanding needs nothing more: the worker it picked watches this actor and
	// releases its ticket when it stops, and the router, told here, cancels an admitted
	// request that still waits or ends its turn for the gate.
	// The relay may still be writing its result: the cost is the prompt's estimate.
	r.tellFinished(c.Send, (*relayResult)(nil).cost(r.x.promptBytes()), true)
	r.stopPickTimer()
	r.stopFaultTimers()
	r.budgetEnd()
	r.endWatch()
	ioDone, x, committed, stream, ew, out := r.ioDone, r.x, r.committed, r.x.Req.Stream, r.errs(), r.relayOut
	kvHandle, releaseKV := r.kvHandle, r.kvRelease()
	route, served, metrics, kind, inRoute := r.route, r.served, r.d.Metrics, r.x.Kind, r.inRoute
	hold := r.cascadeHold
	alog, acc, clk := r.d.AccessLog, r.acc, r.clock()
	var rec accesslog.Record
	if alog != nil {
		rec = r.accessRecord()
	}
	tr, tend := r.tr, r.traceEnd(0, OutcomeCrashed)
	go func() {
		if ioDone != nil {
			<-ioDone
		}
		hold.release() // a cascade step's answer read, its result never handled
		if out != nil && out.finished {
			kvHandle = "" // the decode worker consumed it
		}
		if kvHandle != "" {
			releaseKV()
		}
		code := 502
		switch {
		case out != nil && out.ended:
			code = out.code // the relay finished: the client already has its outcome
		case x.Ctx.Err() != nil:
			code = statusClientGone
		case committed && stream:
			ew.SSEError(x.W, "the gateway failed while relaying the stream")
		case committed:
			// Headers are out; the body is cut short, which the client sees as an error.
		default:
			code = ew.Error(x.W, fmt.Errorf("the gateway failed while serving the request: %w", errs.ErrUpstream))
		}
		if inRoute {
			metrics.routeInFlight(route, -1) // in flight until the relay has returned
		}
		metrics.done(route, served, kind, code)
		if alog != nil {
			// The relay has returned: the usage it read is there.
			rec.PromptTokens, rec.CompletionTokens = acc.usage.prompt, acc.usage.completion
			rec.Time, rec.Duration, rec.Status, rec.Outcome = clk.Now(), time.Since(x.Start), code, OutcomeCrashed
			alog.Record(&rec)
		}
		if acc != nil {
			tend.prompt, tend.completion = acc.usage.prompt, acc.usage.completion
		}
		tend.status = code
		tr.end(tend) // the actor has stopped: its trace is this goroutine's now
		close(x.done)
	}()
}

func (r *requestActor) releaseTimeout() time.Duration {
	if r.d.ReleaseTimeout > 0 {
		return r.d.ReleaseTimeout
	}
	return r.controlTimeout()
}

// Spawn starts the actor serving x on sys.
func Spawn(sys *actor.ActorSystem, d *Deps, x *Exchange, opts ...actor.PropsOption) {
	sys.Root.Spawn(Props(d, x, opts...))
}
