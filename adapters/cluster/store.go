// Package cluster is the control plane several gateway replicas share (SPEC R16): the route
// table, the static worker table, the engine pool table (R23) and the drained models live in etcd under one prefix, every
// replica applies each change through a watch, and each replica holds a lease under replicas/.
//
// Keys under the prefix P:
//
//	P routes           {"routes":[…]}: the route table; its mod revision is the ETag and the epoch
//	P static_workers   {"static_workers":[…]}: the static worker table; its mod revision is the ETag
//	P engine_pools     {"engine_pools":[…]}: the engine pool table (R23); its mod revision is the ETag
//	P drained/<model>  a drained model (the key exists while it is drained; model path-escaped)
//	P canary_key       the canary draw's key, 64 hex digits (R20): the first replica stores its
//	                   own, every replica draws with the stored one
//	P peer_secret      the secret replicas present to each other's ReplicaLoad service, 64 hex
//	                   digits (R23): the first replica to ask creates it (secret.go)
//	P replicas/<id>    a live replica (leased): {"id","http_address","grpc_address","started_at"}
//	P ratelimits/<id>  a live replica's per-key rate-limit usage (leased, binary; rates.go)
//	P rollouts/<route> a route's rollout state (R25; rollouts.go), rollout_leader the replica
//	                   that decides them (leased), rollout_windows/<id> a replica's closed
//	                   windows (leased, binary)
//
// etcd is the one owner of these facts. A replica's router, registry and scrapers hold the
// last state the store applied to them, so requests keep flowing while etcd is away; writes
// then answer errs.ErrConfigStoreUnavailable. Every value read from etcd is bounded and
// validated before it is applied: an invalid table is logged and not applied.
//
// The store only uses etcd's v3 API as 3.4 serves it: range, put, delete, txn, watch, lease
// grant and keep-alive.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/rollout"
)

// Key names under the prefix.
const (
	KeyRoutes        = "routes"
	KeyStaticWorkers = "static_workers"
	KeyEnginePools   = "engine_pools"
	KeyCanary        = "canary_key"
	KeyPeerSecret    = "peer_secret"
	DirDrained       = "drained/"
	DirReplicas      = "replicas/"
)

// Bounds on what the store accepts from etcd (anyone with write access to the prefix can put
// anything there).
const (
	MaxTableBytes   = 4 << 20 // a routes, static_workers or engine_pools value
	MaxReplicaBytes = 4 << 10 // a replicas/ value
	MaxReplicas     = 1024    // replicas listed; more keys are ignored (and logged)
	MaxDrained      = 10000   // drained models; more keys are ignored (and logged)
	MaxModelIDLen   = 256     // a drained model id
	// MaxAnswer bounds any one answer from etcd: a session's read, a watch answer. The read
	// at its largest, with every key as long as the bounds let it be, is 36.5 MiB: the three
	// tables (3 × MaxTableBytes), MaxReplicas+1 entries of MaxReplicaBytes and as many of
	// MaxRateBytes, the keys of MaxDrained+1 drained models (each up to 1,032 bytes: a 256-byte prefix, "drained/" and
	// a model id path-escaped), and config.MaxRollouts+1 stored rollouts of
	// rollout.MaxStoredBytes (the replicas' rollout windows are read in an answer of their own). An answer over it ends the session (logged, and retried with
	// backoff) instead of growing the process without end; the replica keeps serving what it
	// last applied.
	MaxAnswer = 38 << 20
	// maxWrite bounds what the store sends etcd in one call: a table and the transaction
	// around it.
	maxWrite = MaxTableBytes + 64<<10
)

// Applier receives the state the store reads from etcd; each function is called from one
// goroutine at a time, in revision order per key, and must return quickly (send a message).
type Applier struct {
	// Routes installs the route table at epoch rev (the key's mod revision, the ETag).
	Routes func(rev uint64, routes []config.Route)
	// Static installs the static worker table at epoch rev.
	Static func(rev uint64, ws []config.StaticWorker)
	// Pools installs the engine pool table (R23) at epoch rev.
	Pools func(rev uint64, pools []config.EnginePool)
	// Drains sets the drained models to exactly this set (sorted).
	Drains func(models []string)
	// Replicas tells the live replica count (≥ 1: this replica counts itself).
	Replicas func(n int)
	// CanaryKey installs the canary draw's key the replicas share (R20); nil = not followed.
	CanaryKey func(key [32]byte)
	// Rollouts installs the stored rollout states (R25, rollouts.go) by route id, at version
	// (their newest revision), with the replica that decides ("" none); nil = not followed.
	Rollouts func(version uint64, decider string, states map[string]rollout.Stored)
}

// RateInterval is how often a replica publishes its rate-limit usage (rates.go) by default.
const RateInterval = time.Second

// Replica is one entry of replicas/ (GET /admin/v1/replicas).
type Replica struct {
	ID          string    `json:"id"`
	HTTPAddress string    `json:"http_address"`
	GRPCAddress string    `json:"grpc_address"`
	StartedAt   time.Time `json:"started_at"`
	Self        bool      `json:"self"`
}

// Config is what the store needs.
type Config struct {
	Cluster config.Cluster // Enabled, endpoints, prefix, lease TTL, TLS and auth
	// Self is this replica (ID must be valid: config.ValidReplicaID).
	Self Replica
	// Seed is what this replica's configuration holds: stored only where etcd has no table yet.
	SeedRoutes []config.Route
	SeedStatic []config.StaticWorker
	SeedPools  []config.EnginePool
	// CanaryKey is this replica's own canary key: stored where etcd has none yet.
	CanaryKey  [32]byte
	Apply      Applier
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// OpTimeout bounds every etcd call (default 2 s); ProbeInterval is how often the store
	// checks etcd is there (default 1 s).
	OpTimeout, ProbeInterval time.Duration
	// Rates is the limiter whose usage this replica exchanges with the others (rates.go);
	// nil: none. RateInterval is how often it publishes (default RateInterval).
	Rates        RateLimits
	RateInterval time.Duration
	// RateKeys is the fingerprint of this replica's [[auth.keys]] (RateKeysFingerprint): the
	// exchange sums usage only between replicas whose key tables agree.
	RateKeys uint64
	// maxAnswer, maxDrained and maxReplicas replace MaxAnswer, MaxDrained and MaxReplicas
	// (tests lower them).
	maxAnswer, maxDrained, maxReplicas int
}

// Store is a replica's connection to the shared control plane.
type Store struct {
	cfg    Config
	etcd   clientv3.Config
	client atomic.Pointer[clientv3.Client] // set once the first connection succeeds
	prefix string
	log    *slog.Logger
	m      *metrics

	mu      sync.Mutex // guards the state below and orders every call into cfg.Apply
	up      bool
	routes  table[config.Route]
	static  table[config.StaticWorker]
	pools   table[config.EnginePool]
	drained map[string]int64 // model → revision it was last seen at; < 0 = undrained at -rev
	live    int              // entries of drained that are drained (> 0)
	// The bounds on what etcd may list (MaxDrained, MaxReplicas; tests lower them): drained
	// holds at most maxDrained drained models, and its undrained ones (tombstones) only until a
	// newer watched revision (compactDrainsLocked); replicas at most maxReplicas, each deleted
	// with its key (its lease ends with its replica).
	maxDrained, maxReplicas int
	replicas                map[string]Replica
	rates                   map[string]rateEntry // other replicas' usage: at most maxReplicas, deleted with the key
	lease                   clientv3.LeaseID
	ratesNow                chan struct{} // asks the session to publish its usage now (cap 1)
	canary                  *[32]byte     // the canary key last applied (nil: none yet)

	// Rollouts (R25, rollouts.go). rollouts: the stored states by route id, at most
	// config.MaxRollouts; rolloutRev their version. windows: other replicas' closed windows by
	// replica id (at most maxReplicas, deleted with the key), each at most config.MaxRollouts;
	// own: this replica's, pruned to the table's rollout routes. leader, leaderLease,
	// leaderRev: rollout_leader as last applied.
	rollouts    map[string]storedRollout
	rolloutRev  int64
	windows     map[string]map[uint64]closedWindow
	own         map[uint64]closedWindow
	leader      string
	leaderLease int64
	leaderRev   int64
	// deciderLease is the lease this replica won rollout_leader under (0: none); at most one
	// at a time, revoked when a session ends or the store closes.
	deciderLease clientv3.LeaseID
	rolloutsNow  chan struct{} // asks the session for a rollout pass now (cap 1)
	closedClient bool          // Close has run

	cancel context.CancelFunc
	done   chan struct{}
	bg     sync.WaitGroup // reseeds in flight
}

// table is one whole-table key as last applied: its mod revision and its rows.
type table[T any] struct {
	rev  int64
	rows []T
}

// ErrUnavailable is what writes answer while etcd cannot be reached (503
// config_store_unavailable). It wraps errs.ErrConfigStoreUnavailable.
var ErrUnavailable = fmt.Errorf("the configuration store (etcd) cannot be reached; nothing was changed: %w", errs.ErrConfigStoreUnavailable)

// Start starts following the prefix in etcd. It does not wait for etcd: with etcd away (or
// refusing the credentials, which is logged as an error at every try) the replica serves its
// configuration's tables (Up is false, writes fail) and takes etcd's state when it first
// answers. It fails only for an invalid configuration.
func Start(cfg Config) (*Store, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 2 * time.Second
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.RateInterval <= 0 {
		cfg.RateInterval = RateInterval
	}
	cfg.maxAnswer = cmp.Or(cfg.maxAnswer, MaxAnswer)
	cfg.maxDrained = cmp.Or(cfg.maxDrained, MaxDrained)
	cfg.maxReplicas = cmp.Or(cfg.maxReplicas, MaxReplicas)
	if !config.ValidReplicaID(cfg.Self.ID) {
		return nil, fmt.Errorf("cluster: replica id %q: want 1 to %d printable ASCII characters without spaces or \"/\"", cfg.Self.ID, config.MaxReplicaIDLen)
	}
	c := cfg.Cluster
	if !config.ValidClusterPrefix(c.Prefix) {
		return nil, fmt.Errorf("cluster: prefix %q must start and end with \"/\"", c.Prefix)
	}
	tc, err := tlsConfig(c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{
		cfg: cfg, prefix: c.Prefix, log: cfg.Logger.With("component", "cluster"),
		etcd: clientv3.Config{
			Endpoints: c.EtcdEndpoints, DialTimeout: cfg.OpTimeout, TLS: tc,
			Username: c.Username, Password: c.Password,
			DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: cfg.OpTimeout,
			MaxCallRecvMsgSize: cfg.maxAnswer, MaxCallSendMsgSize: min(maxWrite, cfg.maxAnswer),
			Logger: zap.NewNop(), // failures are reported by the store, once, through slog
		},
		m:       newMetrics(cfg.Registerer),
		drained: make(map[string]int64), replicas: make(map[string]Replica), rates: make(map[string]rateEntry),
		ratesNow: make(chan struct{}, 1),
		rollouts: make(map[string]storedRollout), windows: make(map[string]map[uint64]closedWindow),
		own: make(map[uint64]closedWindow), rolloutsNow: make(chan struct{}, 1),
		maxDrained: cfg.maxDrained, maxReplicas: cfg.maxReplicas,
		routes: table[config.Route]{rows: cfg.SeedRoutes}, static: table[config.StaticWorker]{rows: cfg.SeedStatic},
		pools:  table[config.EnginePool]{rows: cfg.SeedPools},
		cancel: cancel, done: make(chan struct{}),
	}
	s.m.replicas.Set(1)
	go s.run(ctx)
	return s, nil
}

// Close stops following etcd, revokes this replica's leases (so it leaves replicas/ and, if it
// decides the rollouts, rollout_leader at once) and closes the connection. Closing again
// does nothing.
func (s *Store) Close() {
	s.cancel()
	<-s.done
	s.bg.Wait()
	s.mu.Lock()
	lease, decider := s.lease, s.deciderLease
	s.lease, s.deciderLease = 0, 0
	closed := s.closedClient
	s.closedClient = true
	s.mu.Unlock()
	if closed {
		return
	}
	cli := s.client.Load()
	if cli == nil {
		return
	}
	for _, l := range []clientv3.LeaseID{decider, lease} { // the decider's first: another takes over at once
		if l != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
			_, _ = cli.Revoke(ctx, l)
			cancel()
		}
	}
	_ = cli.Close()
}

// connected is the client while the store is up, else nil.
func (s *Store) connected() *clientv3.Client {
	if !s.Up() {
		return nil
	}
	return s.client.Load()
}

// Up reports whether etcd answered the last probe.
func (s *Store) Up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up
}

// Replicas lists the live replicas by id (this one always among them).
func (s *Store) Replicas() []Replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Replica, 0, len(s.replicas)+1)
	seen := false
	for _, r := range s.replicas {
		r.Self = r.ID == s.cfg.Self.ID
		seen = seen || r.Self
		out = append(out, r)
	}
	if !seen {
		me := s.cfg.Self
		me.Self = true
		out = append(out, me)
	}
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (s *Store) key(name string) string { return s.prefix + name }

// drainedKey is the key of a drained model: the model id path-escaped, so no model id can
// name a key outside drained/.
func (s *Store) drainedKey(model string) string {
	return s.prefix + DirDrained + url.PathEscape(model)
}

// PutRoutes stores the route table if its key is still at ifMatch (the ETag the operator
// read): errs.ErrEtagMismatch when another write came first, ErrUnavailable without etcd.
// On success the table is applied here at once and the new ETag returned.
func (s *Store) PutRoutes(ifMatch uint64, routes []config.Route) (uint64, error) {
	rev, err := s.putTable(KeyRoutes, "route table", ifMatch, routesDoc{Routes: nonNil(routes)})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyRoutesLocked(rev, routes)
	return uint64(rev), nil
}

// PutStatic is PutRoutes for the static worker table.
func (s *Store) PutStatic(ifMatch uint64, ws []config.StaticWorker) (uint64, error) {
	rev, err := s.putTable(KeyStaticWorkers, "static worker table", ifMatch, staticDoc{StaticWorkers: nonNil(ws)})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyStaticLocked(rev, ws)
	return uint64(rev), nil
}

// PutPools is PutRoutes for the engine pool table (R23); pools are valid and normalized.
func (s *Store) PutPools(ifMatch uint64, pools []config.EnginePool) (uint64, error) {
	rev, err := s.putTable(KeyEnginePools, "engine pool table", ifMatch, poolsDoc{EnginePools: nonNil(pools)})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyPoolsLocked(rev, pools)
	return uint64(rev), nil
}

// SetDrained drains (or undrains) a model on every replica: the key drained/<model> is put
// (or deleted) and the new set applied here at once.
func (s *Store) SetDrained(model string, drained bool) error {
	if model == "" || len(model) > MaxModelIDLen {
		return fmt.Errorf("model id must be 1 to %d bytes: %w", MaxModelIDLen, errs.ErrModelNotFound)
	}
	cli := s.connected()
	if cli == nil {
		return ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	var rev int64
	if drained {
		resp, err := cli.Put(ctx, s.drainedKey(model), "1")
		if err != nil {
			return s.unavailable("drain", err)
		}
		rev = resp.Header.Revision
	} else {
		resp, err := cli.Delete(ctx, s.drainedKey(model))
		if err != nil {
			return s.unavailable("undrain", err)
		}
		rev = resp.Header.Revision
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.setDrainLocked(model, drained, rev) {
		s.pushDrainsLocked()
	}
	return nil
}

// putTable is a compare-and-swap of one whole-table key on its mod revision.
func (s *Store) putTable(name, what string, ifMatch uint64, doc any) (int64, error) {
	cli := s.connected()
	if cli == nil {
		return 0, ErrUnavailable
	}
	val, err := marshal(doc)
	if err != nil {
		return 0, err
	}
	if len(val) > MaxTableBytes {
		// Every replica would refuse to read it back (decodeStrict), while this one had
		// applied it: the fleet would disagree on its tables.
		return 0, fmt.Errorf("the %s is %d bytes as stored, over the cluster's bound of %d: %w", what, len(val), MaxTableBytes, errs.ErrBodyTooLarge)
	}
	k := s.key(name)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", int64(min(ifMatch, 1<<62)))).
		Then(clientv3.OpPut(k, val)).
		Else(clientv3.OpGet(k, clientv3.WithKeysOnly())).
		Commit()
	// etcd refuses a request over --max-request-bytes with its own error, and one over that
	// plus its gRPC allowance (512 KiB) in gRPC, as ResourceExhausted (which etcd's own
	// errors, such as a full database, never are: the client turns them into its own type).
	if errors.Is(err, rpctypes.ErrRequestTooLarge) || status.Code(err) == codes.ResourceExhausted {
		return 0, fmt.Errorf("etcd refused the %s (%d bytes) as larger than its request limit (etcd's --max-request-bytes): %w", what, len(val), errs.ErrBodyTooLarge)
	}
	if err != nil {
		return 0, s.unavailable("put "+name, err)
	}
	if !resp.Succeeded {
		cur := int64(0)
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			cur = rr.Kvs[0].ModRevision
		}
		return 0, fmt.Errorf("the %s is at revision %d, If-Match names %d: %w", what, cur, ifMatch, errs.ErrEtagMismatch)
	}
	return resp.Header.Revision, nil
}

// unavailable logs an etcd failure (with whatever address it names) and returns the error
// a client may see, which names none.
func (s *Store) unavailable(op string, err error) error {
	s.log.Warn("etcd call failed", "op", op, "err", err)
	if errors.Is(err, context.Canceled) && s.closed() {
		return fmt.Errorf("the gateway is stopping: %w", errs.ErrShuttingDown)
	}
	return ErrUnavailable
}

func (s *Store) closed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func nonNil[T any](rows []T) []T {
	if rows == nil {
		return []T{}
	}
	return rows
}
