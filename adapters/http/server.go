// Package httpapi is tlgw's HTTP surface (SPEC B2): the OpenAI-compatible inference API with
// its proxy path, the admin API, API-key auth with scopes, /metrics and health. It holds no
// routing state: every decision is a message to the actor tree behind the Core interface.
package httpapi

import (
	"github.com/tlgw/tlgw/internal/ratelimit"

	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/history"
	"github.com/tlgw/tlgw/internal/oai"
)

// Core is what the HTTP surface needs of the actor tree (*gateway.Gateway implements it).
type Core interface {
	Workers() (*router.WorkerList, error)
	Routes() (*router.RouteTable, error)
	PutRoutes(ifMatch uint64, routes []config.Route) (*router.RouteTable, error)
	Models() (*router.ModelList, error)
	Routable() (int, error)
	Drain(model string, drained bool) (*registry.DrainResult, error)
	Queue() (*router.QueueView, error)
	Programs() (*router.ProgramList, error)
	// R25: the route table's rollouts, and an operator's action on one.
	Rollouts() (*router.RolloutsView, error)
	RolloutAction(route, action string, ifMatch *uint64) (*router.RolloutView, error)
}

// StaticWorkers is the table of static (scraped) workers behind
// GET/PUT /admin/v1/static-workers, with the same optimistic concurrency as routes.
type StaticWorkers interface {
	StaticWorkers() (epoch uint64, workers []config.StaticWorker)
	// PutStaticWorkers replaces the table if ifMatch is its epoch (errs.ErrEtagMismatch
	// otherwise); workers are already validated and normalized.
	PutStaticWorkers(ifMatch uint64, workers []config.StaticWorker) (uint64, error)
}

// EnginePools is the engine pool table (R23) behind GET/PUT /admin/v1/engine-pools, with the
// same optimistic concurrency as the static workers.
type EnginePools interface {
	EnginePools() (epoch uint64, pools []config.EnginePool)
	// PutEnginePools replaces the table if ifMatch is its epoch (errs.ErrEtagMismatch
	// otherwise); pools are already validated and normalized.
	PutEnginePools(ifMatch uint64, pools []config.EnginePool) (uint64, error)
}

// Replica is one row of GET /admin/v1/replicas (R16).
type Replica struct {
	ID          string    `json:"id"`
	HTTPAddress string    `json:"http_address"`
	GRPCAddress string    `json:"grpc_address"`
	StartedAt   time.Time `json:"started_at"`
	Self        bool      `json:"self"`
}

// Replicas is what GET /admin/v1/replicas shows: whether the gateway runs as a cluster,
// whether its configuration store answers, and the live replicas (this one always among them).
type Replicas struct {
	Cluster bool      `json:"cluster"`
	StoreUp bool      `json:"config_store_up"`
	List    []Replica `json:"replicas"`
}

// Admission is what the HTTP surface needs to know of the admission classes (R10): the
// default class and, per class, whether its requests may pick another class with X-TL-Class.
type Admission struct {
	Enabled      bool
	DefaultClass string
	AllowHeader  map[string]bool // every configured class, with its allow_header
}

// Options configure the HTTP surface.
type Options struct {
	Core Core
	// Serve hands an inference exchange to a request actor (the composition root spawns it).
	Serve        func(*request.Exchange)
	Keys         []config.Key
	MaxBodyBytes int64 // request body limit (413 above it); default 4 MiB
	Logger       *slog.Logger
	Admission    Admission
	Static       StaticWorkers // nil: the static-workers admin path answers 404
	Pools        EnginePools   // nil: the engine-pools admin path answers 404
	// Replicas lists the gateway's replicas (R16); nil: an empty list.
	Replicas func() Replicas
	// History is the recent past for GET /admin/v1/history (R24); nil: that path answers 404.
	History func() history.Snapshot
	// Registerer receives the HTTP metrics; Gatherer serves /metrics. Either may be nil.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// The HTTP trust boundary (R13.3); zero means no limit.
	MaxInFlight        int           // inference requests at once; above it 503 overloaded
	BodyReadTimeout    time.Duration // a request body must arrive within it (408 request_timeout)
	ClientWriteTimeout time.Duration // a client that takes no write for it is dropped
	// Now is the clock of the per-key rate limits (R13.5); default time.Now.
	Now func() time.Time
	// RenderPrompts: the request actors need each prompt rendered in full (the prefix index
	// is on), so the body's one parse renders it too (Exchange.Rendered).
	RenderPrompts bool
	// Tokens gives chat and completions requests their token ids before they are handed
	// over (R22: gateway.tokenizer = "engine"); nil: none.
	Tokens TokenSource
}

// Server is the gateway's http.Handler.
type Server struct {
	core      Core
	mux       *http.ServeMux
	serve     func(*request.Exchange)
	keys      *keyring
	limiter   *ratelimit.Limiter // per-key rpm/tpm (R13.5)
	replicas  atomic.Int64       // live gateway replicas: each enforces its share of a key's limits (R16)
	maxBody   int64
	log       *slog.Logger
	metrics   *httpMetrics
	metricsH  http.Handler
	draining  atomic.Bool
	admission Admission
	static    StaticWorkers
	pools     EnginePools
	history   func() history.Snapshot // Options.History
	replicaFn func() Replicas

	renderPrompts bool
	tokens        TokenSource

	maxInFlight  int
	inFlight     atomic.Int64
	bodyTimeout  time.Duration
	writeTimeout time.Duration
}

// New builds the HTTP surface.
func New(o Options) *Server {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 4 << 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{
		core: o.Core, serve: o.Serve, keys: newKeyring(o.Keys), limiter: ratelimit.New(o.Now), maxBody: o.MaxBodyBytes, admission: o.Admission, static: o.Static, pools: o.Pools,
		log: o.Logger, metrics: newHTTPMetrics(o.Registerer),
		maxInFlight: o.MaxInFlight, bodyTimeout: o.BodyReadTimeout, writeTimeout: o.ClientWriteTimeout,
		renderPrompts: o.RenderPrompts, replicaFn: o.Replicas, tokens: o.Tokens, history: o.History,
	}
	s.replicas.Store(1)
	if o.Registerer != nil {
		o.Registerer.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tlgw_ratelimit_even_shares_total",
			Help: "Per-key limit shares taken as ⌈limit / replicas⌉ in a cluster because the replicas' traffic could not be exchanged through etcd (R13.5, R16).",
		}, func() float64 { return float64(s.limiter.Fallbacks()) }))
	}
	s.mux = s.routes()
	if o.Gatherer != nil {
		s.metricsH = promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{})
	}
	if s.keys.open() {
		s.log.Warn("no API keys configured: serving /v1 and /admin without authentication; /admin answers only loopback hosts and same-origin requests")
	}
	return s
}

// NewTransport is the engine-facing transport: HTTP/1.1 keep-alive with a pool deep enough for
// a fleet, no compression (bodies are relayed as the engine wrote them) and a dial timeout so
// a black-holed engine fails over instead of hanging. Its idle connections are bounded by
// MaxIdleConns in all (and per engine host) and each closes after IdleConnTimeout: those to an
// engine that left go within 90 s, without an eviction closing every engine's idle pool.
func NewTransport() *http.Transport { return NewCheckedTransport(nil, nil) }

// NewCheckedTransport is NewTransport whose dialer resolves engine names with res (nil: the
// default resolver) and lets control vet each connection's resolved address before it is made
// (engineaddr.Rules.Control, R20; nil: none): a refused address fails the attempt as a dial
// error, a connection never made, and its engine is unreachable.
func NewCheckedTransport(control func(network, address string, c syscall.RawConn) error, res *net.Resolver) *http.Transport {
	d := &net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second, Control: control, Resolver: res}
	return &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

// RateLimits is the per-key limiter, whose usage a cluster exchanges between replicas (R16).
func (s *Server) RateLimits() *ratelimit.Limiter { return s.limiter }

// SetReplicas sets how many gateway replicas share the rate limits (R16); n < 1 counts as 1.
func (s *Server) SetReplicas(n int) { s.replicas.Store(int64(max(n, 1))) }

// SetDraining makes new inference requests answer 503 shutting_down (graceful shutdown).
func (s *Server) SetDraining() { s.draining.Store(true) }

// requestID returns the client's X-Request-ID when valid, a generated id when absent, and an
// error for an invalid one (SPEC B2: ≤ 128 printable ASCII characters).
func (s *Server) requestID(r *http.Request) (string, error) {
	if id := r.Header.Get("X-Request-ID"); id != "" {
		if !oai.ValidRequestID(id) {
			return "", fmt.Errorf("X-Request-ID must be 1 to 128 printable ASCII characters: %w", errs.ErrInvalidRequest)
		}
		return id, nil
	}
	return newRequestID(), nil
}

// newRequestID is a generated request id: 26 random base32 characters, 130 bits from
// crypto/rand (as crypto/rand.Text makes them), so no client can predict another request's id
// (SPEC R13.4). Built in one buffer: one allocation per request.
func newRequestID() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	var b [len("req-") + 26]byte
	copy(b[:], "req-")
	_, _ = rand.Read(b[len("req-"):]) // never fails (crypto/rand)
	for i := len("req-"); i < len(b); i++ {
		b[i] = alphabet[b[i]&31]
	}
	return string(b[:])
}

// ServeHTTP answers every request with its X-Request-ID (the client's when valid, else a new
// one; an invalid one is a 400) and hands it to the routing table, under the client write
// timeout when one is set.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.writeTimeout > 0 {
		w = newDeadlineWriter(w, s.writeTimeout)
	}
	id, idErr := s.requestID(r)
	if idErr != nil {
		id = newRequestID()
	}
	w.Header()["X-Request-Id"] = []string{id} // the canonical key, set directly
	// R20: no answer is sniffed into another type (an engine's, or the gateway's own).
	w.Header()["X-Content-Type-Options"] = nosniff
	if idErr != nil {
		writeError(w, idErr)
		return
	}
	if !cleanPath(r.URL.Path) {
		// The mux would redirect it to the clean path; an API answers 404 instead, as a
		// client that sent it meant no path of the table.
		notFound(w, r)
		return
	}
	if s.keys.open() && !loopbackHost(r.Host) && loopbackListener(r) {
		// R20: with no keys, a loopback listener trusts that its clients are this machine's
		// own; a request addressed to another name (a web page whose DNS name was rebound to
		// 127.0.0.1) is refused on every path: inference, metrics and admin alike.
		writeError(w, fmt.Errorf("without API keys a gateway listening on loopback answers only requests to a loopback host, not %s: %w", errs.Echo(r.Host), errs.ErrForbiddenOrigin))
		return
	}
	s.mux.ServeHTTP(w, r)
}

var nosniff = []string{"nosniff"}

// cleanPath reports whether p is a path the mux serves as it is: rooted, without empty, "." or
// ".." segments.
func cleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if p[len(p)-1] == '/' && c != "/" {
		c += "/"
	}
	return c == p
}

// requestIDOf is the id ServeHTTP answers r with.
func requestIDOf(w http.ResponseWriter) string { return w.Header()["X-Request-Id"][0] }

// routes is the gateway's HTTP table (SPEC B2) on one http.ServeMux with method patterns; the
// key checks are middleware per API (inferenceAPI, adminAPI). Every path also has a pattern
// without a method, so a wrong method is the OpenAI-shaped 405 with Allow, and every unknown
// path is the OpenAI-shaped 404 — under /v1/ and /admin/ only after the key check, so a caller
// without a key learns nothing of which paths exist.
func (s *Server) routes() *http.ServeMux {
	m := http.NewServeMux()
	public := func(h http.HandlerFunc) http.HandlerFunc { return h }
	route(m, public, "/healthz", on("GET", s.healthz))
	route(m, public, "/readyz", on("GET", s.readyz))
	route(m, public, "/metrics", on("GET", s.serveMetrics))
	uiRoutes(m)

	v1 := func(h http.HandlerFunc) http.HandlerFunc {
		return s.inferenceAPI(func(w http.ResponseWriter, r *http.Request, _ keyMatch) { h(w, r) })
	}
	inference := func(kind oai.Kind) http.HandlerFunc {
		return s.inferenceAPI(func(w http.ResponseWriter, r *http.Request, km keyMatch) {
			s.inference(w, r, kind, requestIDOf(w), km)
		})
	}
	for _, k := range oai.Kinds() {
		route(m, v1, k.Path(), on("POST", inference(k)))
	}
	// R21: a stored response, at the worker that stored it.
	stored := func(method string) http.HandlerFunc {
		return s.inferenceAPI(func(w http.ResponseWriter, r *http.Request, km keyMatch) {
			s.storedResponse(w, r, method, requestIDOf(w), km)
		})
	}
	route(m, v1, "/v1/responses/{id}", on("GET", stored(http.MethodGet)), on("DELETE", stored(http.MethodDelete)))
	route(m, v1, "/v1/responses/{id}/cancel", on("POST", stored(http.MethodPost)))
	route(m, v1, "/v1/models", on("GET", v1(s.listModels)))
	route(m, v1, "/v1/models/{model...}", on("GET", v1(s.getModel)))
	m.HandleFunc("/v1/", v1(notFound))

	admin := s.adminAPI
	route(m, admin, "/admin/v1/workers", on("GET", admin(s.listWorkers)))
	route(m, admin, "/admin/v1/queue", on("GET", admin(s.getQueue)))
	route(m, admin, "/admin/v1/programs", on("GET", admin(s.getPrograms)))
	route(m, admin, "/admin/v1/replicas", on("GET", admin(s.getReplicas)))
	if s.history != nil {
		route(m, admin, "/admin/v1/history", on("GET", admin(s.getHistory)))
	}
	route(m, admin, "/admin/v1/routes", on("GET", admin(s.getRoutes)), on("PUT", admin(s.putRoutes)))
	if s.static != nil {
		route(m, admin, "/admin/v1/static-workers", on("GET", admin(s.getStatic)), on("PUT", admin(s.putStatic)))
	}
	if s.pools != nil {
		route(m, admin, "/admin/v1/engine-pools", on("GET", admin(s.getPools)), on("PUT", admin(s.putPools)))
	}
	route(m, admin, "/admin/v1/models/{action...}", on("POST", admin(s.drainModel)))
	route(m, admin, "/admin/v1/rollouts", on("GET", admin(s.getRollouts)))
	route(m, admin, "/admin/v1/rollouts/{action...}", on("POST", admin(s.rolloutAction)))
	m.HandleFunc("/admin/", admin(notFound))

	// Everything else is a 404 without a key check, "/v1" and "/admin" among it (the mux
	// would redirect them to their subtrees).
	m.HandleFunc("/", notFound)
	m.HandleFunc("/v1", notFound)
	m.HandleFunc("/admin", notFound)
	return m
}

// methodHandler is one method of a path and its handler, middleware applied.
type methodHandler struct {
	method string
	h      http.HandlerFunc
}

func on(method string, h http.HandlerFunc) methodHandler { return methodHandler{method, h} }

// route registers path for each method of hs (GET serves HEAD too) and path without a method,
// behind guard (the API's middleware), for the 405 that names the methods in Allow.
func route(m *http.ServeMux, guard func(http.HandlerFunc) http.HandlerFunc, path string, hs ...methodHandler) {
	allow := make([]string, 0, len(hs))
	for _, mh := range hs {
		m.Handle(mh.method+" "+path, mh.h)
		allow = append(allow, mh.method)
	}
	allowed := strings.Join(allow, ", ")
	m.HandleFunc(path, guard(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allowed)
		writeErrorFor(w, r, fmt.Errorf("%s %s: %w", errs.Echo(r.Method), errs.Echo(r.URL.Path), errs.ErrMethodNotAllowed))
	}))
}

// inferenceAPI checks the request's key for the inference scope and hands h what it grants;
// a refusal counts in the HTTP metrics.
func (s *Server) inferenceAPI(h func(http.ResponseWriter, *http.Request, keyMatch)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		km, err := s.keys.authorize(r, scopeInference)
		if err != nil {
			s.metrics.reject(writeErrorFor(w, r, err))
			return
		}
		h(w, r, km)
	}
}

// adminAPI checks the request's key for the admin scope; without keys it answers only
// loopback, same-origin requests (checkLocalAdmin).
func (s *Server) adminAPI(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.keys.authorize(r, scopeAdmin); err != nil {
			writeError(w, err)
			return
		}
		if s.keys.open() {
			if err := checkLocalAdmin(r); err != nil {
				writeError(w, err)
				return
			}
		}
		h(w, r)
	}
}

func notFound(w http.ResponseWriter, r *http.Request) {
	writeErrorFor(w, r, fmt.Errorf("no route for %s: %w", errs.Echo(r.URL.Path), errs.ErrNotFound))
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	n, err := s.core.Routable()
	if err != nil {
		writeError(w, err)
		return
	}
	if n == 0 || s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "routable_workers": n})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "routable_workers": n})
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.metricsH == nil {
		writeError(w, fmt.Errorf("metrics are not enabled: %w", errs.ErrNotFound))
		return
	}
	s.metricsH.ServeHTTP(w, r)
}
