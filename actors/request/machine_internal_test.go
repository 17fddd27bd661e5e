package request

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// The machine rig runs request actors with no socket anywhere: a scripted router actor, worker
// actors that record the Releases they get, an Upstream that answers in memory, and Engines
// that record Prefill and Release calls. Everything it waits for has a deadline.

const waitFor = 5 * time.Second

// released is one Release a worker got.
type released struct {
	worker      string
	ticket      uint64
	outcome     router.Outcome
	unreachable bool
	addr        string // the address the verdict is about ("": not said)
}

// upstreamFunc is an Upstream answering from a function.
type upstreamFunc func(*http.Request) (*http.Response, error)

func (f upstreamFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

var _ Upstream = upstreamFunc(nil)

// fakeEngines records the gRPC calls.
type fakeEngines struct {
	mu       sync.Mutex
	prefills []PrefillCall
	releases [][2]string // {KV address, handle}
	prefill  func(ctx context.Context, call PrefillCall) (PrefillResult, error)
	released chan struct{}
	fail     error // what Release answers
	// hold, when set, keeps each Release from returning until it is closed (or its context
	// ends): a release under way.
	hold chan struct{}
}

func (e *fakeEngines) Prefill(ctx context.Context, _ Endpoint, call PrefillCall) (PrefillResult, error) {
	e.mu.Lock()
	e.prefills = append(e.prefills, call)
	n := len(e.prefills)
	e.mu.Unlock()
	if e.prefill != nil {
		return e.prefill(ctx, call)
	}
	return PrefillResult{HandleID: fmt.Sprintf("h%d", n), NumTokens: uint32(len(call.PromptIDs))}, nil
}

func (e *fakeEngines) Release(ctx context.Context, at Endpoint, handle string) error {
	e.mu.Lock()
	e.releases = append(e.releases, [2]string{at.Addr, handle})
	hold := e.hold
	e.mu.Unlock()
	e.released <- struct{}{}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}
	return e.fail
}

func (e *fakeEngines) calls() ([]PrefillCall, [][2]string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.prefills), slices.Clone(e.releases)
}

// codeErrors answers errors with the status adapters/http gives them (a package this one
// cannot import).
type codeErrors struct{}

func (codeErrors) Error(w http.ResponseWriter, err error) int {
	code := http.StatusBadGateway
	switch {
	case errors.Is(err, errs.ErrNoCapacity):
		code = http.StatusServiceUnavailable
	case errors.Is(err, errs.ErrUpstreamTimeout):
		code = http.StatusGatewayTimeout
	case errors.Is(err, errs.ErrInvalidRequest):
		code = http.StatusBadRequest
	case errors.Is(err, errs.ErrInternal):
		code = http.StatusInternalServerError
	case errors.Is(err, errs.ErrModelNotFound):
		code = http.StatusNotFound
	}
	w.WriteHeader(code)
	_, _ = io.WriteString(w, err.Error())
	return code
}

func (codeErrors) SSEError(w http.ResponseWriter, message string) {
	_, _ = io.WriteString(w, "event: error\ndata: "+message+"\n\n")
}

// mrig is the machine rig.
type mrig struct {
	t        *testing.T
	sys      *actor.ActorSystem
	d        *Deps
	clk      *clock.Fake
	engines  *fakeEngines
	releases chan released
	picks    chan *router.Pick
	workers  map[string]*actor.PID

	mu sync.Mutex
	// pool is the unified (or decode) workers the router picks from, in order, skipping the
	// excluded; prefill, when set, makes every pick disaggregated with this prefill worker.
	pool    []string
	prefill string
	// steps makes the route a cascade of len(steps) steps, step i served by worker steps[i]
	// ("": by nobody).
	steps  []string
	accept *cascade.Accept
	// warm, when set, gives every pick a warm-up of warmBytes (or warmTokens: one cut in
	// tokens) on this worker.
	warm       string
	warmBytes  int
	warmTokens int
	// silent: the router keeps the picks it gets (held) and answers none.
	silent bool
	held   []heldPick
	ticket uint64
	// upstream answers the attempts, by worker id (the URL's host).
	upstream func(worker string, req *http.Request, body string) (*http.Response, error)
	bodies   map[string][]string
}

type heldPick struct {
	p      *router.Pick
	sender *actor.PID
}

func newMRig(t *testing.T) *mrig {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	m := &mrig{t: t, sys: sys, clk: clock.NewFake(time.Unix(1_000_000, 0)),
		engines:  &fakeEngines{released: make(chan struct{}, 64)},
		releases: make(chan released, 256), picks: make(chan *router.Pick, 64),
		workers: map[string]*actor.PID{}, bodies: map[string][]string{}}
	routerPID := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if p, ok := c.Message().(*router.Pick); ok {
			m.picks <- p
			if ans := m.answer(c, p); ans != nil {
				c.Respond(ans)
			}
		}
	}))
	m.d = &Deps{
		Router: routerPID, Engines: m.engines, MaxAttempts: 3, Metrics: NewMetrics(nil), Clock: m.clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Errors: codeErrors{},
		Transport: upstreamFunc(m.roundTrip),
	}
	t.Cleanup(func() { sys.Shutdown() })
	return m
}

// worker is the PID of worker id's actor, which records the Releases it gets.
// regOf is the registration number the fake router names worker id's picks with.
func regOf(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

func (m *mrig) worker(id string) *actor.PID {
	m.mu.Lock()
	defer m.mu.Unlock()
	if pid, ok := m.workers[id]; ok {
		return pid
	}
	pid := m.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if r, ok := c.Message().(*router.Release); ok {
			m.releases <- released{worker: id, ticket: r.Ticket, outcome: r.Outcome, unreachable: r.Unreachable, addr: r.Addr}
		}
	}))
	m.workers[id] = pid
	return pid
}

func (m *mrig) nextTicket() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ticket++
	return m.ticket
}

// answer is the scripted router.
func (m *mrig) answer(c actor.Context, p *router.Pick) *router.Picked {
	m.mu.Lock()
	if m.silent {
		m.held = append(m.held, heldPick{p: p, sender: c.Sender()})
		m.mu.Unlock()
		return nil
	}
	pool, prefill, steps, accept, warm, warmBytes, warmTokens := m.pool, m.prefill, m.steps, m.accept, m.warm, m.warmBytes, m.warmTokens
	m.mu.Unlock()
	ans := &router.Picked{Tag: p.Tag, Route: "r", ServedModel: "served", Steps: 1}
	if len(steps) > 0 {
		step := p.Step
		if step == router.LastStep {
			step = len(steps) - 1
		}
		ans.Step, ans.Steps, pool = step, len(steps), []string{steps[step]}
		if steps[step] == "" {
			pool = nil // nobody serves this step
		}
		if step < len(steps)-1 {
			ans.Accept = accept
		}
	}
	for _, id := range pool {
		if slices.Contains(p.Exclude, id) {
			continue
		}
		ans.Ticket, ans.Worker, ans.WorkerID, ans.WorkerReg = m.nextTicket(), m.worker(id), id, regOf(id)
		ans.HTTPAddress, ans.GRPCAddress, ans.KVAddress = id+".http", id+".grpc", id+".kv"
		if prefill != "" {
			ans.Prefill = &router.PickedWorker{Ticket: m.nextTicket(), Worker: m.worker(prefill), WorkerID: prefill,
				HTTPAddress: prefill + ".http", GRPCAddress: prefill + ".grpc"}
		}
		if warm != "" {
			ans.Warm = &router.Warmup{PickedWorker: router.PickedWorker{Ticket: m.nextTicket(), Worker: m.worker(warm),
				WorkerID: warm, Reg: regOf(warm), HTTPAddress: warm + ".http"}, Bytes: warmBytes, Tokens: warmTokens}
		}
		return ans
	}
	ans.Err = errs.ErrNoCapacity
	return ans
}

func (m *mrig) roundTrip(req *http.Request) (*http.Response, error) {
	var body string
	if req.Body != nil {
		b, _ := io.ReadAll(req.Body)
		body = string(b)
	}
	worker := strings.TrimSuffix(req.URL.Host, ".http")
	m.mu.Lock()
	m.bodies[worker] = append(m.bodies[worker], body)
	up := m.upstream
	m.mu.Unlock()
	if up == nil {
		return nil, fmt.Errorf("no upstream for %s", worker)
	}
	return up(worker, req, body)
}

func (m *mrig) bodiesOf(worker string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.bodies[worker])
}

// run is one request: its exchange, the recorder the client reads, and cancel (the client
// leaving).
type run struct {
	x      *Exchange
	w      *httptest.ResponseRecorder
	cancel context.CancelFunc
}

// start spawns a request actor for a completions body; adjust, when given, changes its
// exchange first.
func (m *mrig) start(body string, adjust ...func(*Exchange)) *run {
	m.t.Helper()
	req, err := oai.Parse(oai.Completions, []byte(body))
	if err != nil {
		m.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.t.Cleanup(cancel)
	w := httptest.NewRecorder()
	x := NewExchange(ctx, w, "/v1/completions", oai.Completions, "req", false, []byte(body), req, time.Now())
	for _, f := range adjust {
		f(x)
	}
	Spawn(m.sys, m.d, x)
	return &run{x: x, w: w, cancel: cancel}
}

// wait waits for the client's terminal outcome.
func (r *run) wait(t *testing.T) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case <-r.x.Done():
	case <-time.After(waitFor):
		t.Fatal("the request never finished")
	}
	return r.w
}

// do runs a request to its end.
func (m *mrig) do(body string) *httptest.ResponseRecorder {
	m.t.Helper()
	return m.start(body).wait(m.t)
}

// expectReleases waits for n Releases and reports them by worker, in arrival order.
func (m *mrig) expectReleases(n int) map[string][]router.Outcome {
	m.t.Helper()
	got := map[string][]router.Outcome{}
	for i := range n {
		select {
		case r := <-m.releases:
			got[r.worker] = append(got[r.worker], r.outcome)
		case <-time.After(waitFor):
			m.t.Fatalf("got %d Releases %v, want %d", i, got, n)
		}
	}
	return got
}

// noMoreReleases checks that nothing more was released, once every worker has handled what it
// was sent (each worker actor answers a Touch only after the messages before it).
func (m *mrig) noMoreReleases() {
	m.t.Helper()
	m.mu.Lock()
	pids := make([]*actor.PID, 0, len(m.workers))
	for _, pid := range m.workers {
		pids = append(pids, pid)
	}
	m.mu.Unlock()
	for _, pid := range pids {
		if _, err := m.sys.Root.RequestFuture(pid, &actor.Touch{}, waitFor).Result(); err != nil {
			m.t.Fatal(err)
		}
	}
	select {
	case r := <-m.releases:
		m.t.Fatalf("an extra Release: %+v", r)
	default:
	}
}

// codes is the requests counted by status code, over every endpoint.
func (m *mrig) code(route, model string, code int) float64 {
	var n float64
	for _, k := range append(oai.Kinds(), 0) {
		n += testutil.ToFloat64(m.d.Metrics.requests.WithLabelValues(route, model, EndpointLabel(k), fmt.Sprint(code)))
	}
	return n
}

// reply is an engine answer.
func reply(status int, contentType, body string) *http.Response {
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {contentType}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}
}

const okJSON = `{"choices":[{"text":"ok"}]}`
