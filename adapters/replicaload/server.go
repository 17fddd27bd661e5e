package replicaload

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
)

// Options configure a Server. Self, Secret, Live and Router are required.
type Options struct {
	// Self is this replica's id: a stream naming it is refused.
	Self string
	// Secret is the fleet's peer secret (cluster's PeerSecret): a stream must carry the
	// metadata `authorization: Bearer <Secret in hex>`.
	Secret []byte
	// Live reports whether id is a live replica (listed under replicas/). It is asked for every
	// table, so it must be quick.
	Live   func(id string) bool
	Router Router
	// MaxWorkers bounds a table's entries (default DefaultMaxWorkers); the gRPC server's
	// MaxRecvMsgSize should be at least TableBytes(MaxWorkers). MaxReplicas bounds the replicas
	// whose tables are held at once, and apart from them the streams waiting for their first
	// table (default MaxReplicas).
	MaxWorkers, MaxReplicas int
	// IdleTimeout ends a stream that sends no table for that long, and forgets its table: its
	// sender has stopped without the connection saying so (default 5 s; a Sharer sends at least
	// every second).
	IdleTimeout time.Duration
	Clock       clock.Clock // nil: the real clock
	Logger      *slog.Logger
	Registerer  prometheus.Registerer // nil: the metrics are not registered
}

// DefaultIdleTimeout is Options.IdleTimeout's default.
const DefaultIdleTimeout = 5 * time.Second

// Server serves tl.replica.v1.ReplicaLoad.
type Server struct {
	replicav1.UnimplementedReplicaLoadServer
	o      Options
	bearer [sha256.Size]byte // the digest of the token a stream must carry
	m      *serverMetrics
	log    *slog.Logger

	// mu guards what follows and is held across the calls into o.Router, so that what the
	// router hears of one replica is in the order it happened here.
	mu sync.Mutex
	// held is each replica's current stream: at most o.MaxReplicas entries, each deleted when
	// its stream ends. A holder is that stream's generation: a replica's newer stream replaces
	// it, and only the current one's end forgets the replica.
	held map[string]*holder
	// pending counts the streams authenticated and waiting for their first table (at most
	// o.MaxReplicas).
	pending int
}

// holder is one admitted stream of a replica.
type holder struct {
	replaced chan struct{} // closed when a newer stream of the same replica takes over
}

var _ replicav1.ReplicaLoadServer = (*Server)(nil)

// NewServer makes a Server; it panics when a required option is missing (a wiring error).
func NewServer(o Options) *Server {
	if o.Self == "" || len(o.Secret) == 0 || o.Live == nil || o.Router == nil {
		panic("replicaload: NewServer needs Self, Secret, Live and Router")
	}
	o.MaxWorkers = cmp.Or(o.MaxWorkers, DefaultMaxWorkers)
	o.MaxReplicas = cmp.Or(o.MaxReplicas, MaxReplicas)
	o.IdleTimeout = cmp.Or(o.IdleTimeout, DefaultIdleTimeout)
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Server{
		o: o, bearer: sha256.Sum256([]byte(hex.EncodeToString(o.Secret))),
		m: newServerMetrics(o.Registerer), log: o.Logger.With("component", "replicaload"),
		held: make(map[string]*holder),
	}
}

// Register serves the Server on gs.
func (s *Server) Register(gs *grpc.Server) { replicav1.RegisterReplicaLoadServer(gs, s) }

// Share receives one replica's tables. The secret is checked before anything else; the first
// table names the replica, which must be live and not this one; each table is validated and
// then replaces the replica's previous one. The stream's end (any reason: the sender's, an
// invalid table, the idle timeout, the replica leaving replicas/, the server stopping) forgets
// the replica, unless a newer stream of it has taken over, which also ends this one.
func (s *Server) Share(stream replicav1.ReplicaLoad_ShareServer) error {
	ctx := stream.Context()
	if err := s.authenticate(metadata.ValueFromIncomingContext(ctx, "authorization")); err != nil {
		s.m.tables.WithLabelValues(outcomeUnauthenticated).Inc()
		s.log.Debug("refused a load stream", "err", err)
		return err
	}
	if !s.enterPending() {
		return s.reject("", codes.ResourceExhausted, "already %d load streams wait for their first table", s.o.MaxReplicas)
	}
	msgs := make(chan received) // unbuffered: the receiver holds at most one table
	done := make(chan struct{})
	defer close(done)
	// The receiver is this stream's one other goroutine: it ends at its first failed Recv,
	// which is at the latest when this handler has returned and gRPC has ended the stream.
	go receive(stream, msgs, done)

	id, loads, err := s.table(msgs, nil, ctx.Done(), "")
	s.leavePending()
	if errors.Is(err, io.EOF) {
		return s.reject("", codes.InvalidArgument, "the stream ended before its first table")
	}
	if err != nil {
		return err
	}
	h, err := s.admit(id, loads)
	if err != nil {
		return err
	}
	defer s.end(id, h)
	s.log.Info("a replica shares its load", "replica", id)
	for {
		_, loads, err := s.table(msgs, h.replaced, ctx.Done(), id)
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&replicav1.ShareAck{})
		}
		if err != nil {
			return err
		}
		if err := s.apply(id, h, loads); err != nil {
			return err
		}
	}
}

// table reads the stream's next whole table, its parts up to the one that says no more, and
// answers it validated (validatePart, finish) with the replica it is from: replica, or ("" for
// the stream's first table) the one its first part names, which must be a valid id, not this
// replica, and live. io.EOF when the sender closed the stream between two tables; an error
// with its status code otherwise (a stream that ends inside a table is InvalidArgument).
func (s *Server) table(msgs <-chan received, replaced, ctxDone <-chan struct{}, replica string) (string, []WorkerLoad, error) {
	var acc []WorkerLoad // the table's entries so far: at most MaxWorkers (validatePart)
	for part := 0; ; part++ {
		t, err := s.next(msgs, replaced, ctxDone)
		if errors.Is(err, io.EOF) && part > 0 {
			return "", nil, s.reject(replica, codes.InvalidArgument, "the stream ended inside a table, after %d parts", part)
		}
		if err != nil {
			return "", nil, err
		}
		if replica == "" {
			id := t.GetReplicaId()
			switch {
			case !config.ValidReplicaID(id):
				return "", nil, s.reject("", codes.PermissionDenied, "the first table's replica_id is not a valid replica id")
			case id == s.o.Self:
				return "", nil, s.reject(id, codes.PermissionDenied, "the first table names this replica itself")
			case !s.o.Live(id):
				return "", nil, s.reject(id, codes.PermissionDenied, "the first table names a replica that is not live")
			}
			replica = id
		} else if part == 0 && !s.o.Live(replica) {
			return "", nil, s.reject(replica, codes.PermissionDenied, "the replica is no longer live")
		}
		if acc, err = validatePart(t, replica, s.o.MaxWorkers, acc); err != nil {
			return "", nil, s.reject(replica, codes.InvalidArgument, "%v", err)
		}
		if !t.GetMore() {
			loads, err := finish(acc)
			if err != nil {
				return "", nil, s.reject(replica, codes.InvalidArgument, "%v", err)
			}
			return replica, loads, nil
		}
	}
}

// authenticate checks the authorization metadata against the secret, comparing digests in
// constant time.
func (s *Server) authenticate(vals []string) error {
	if len(vals) != 1 {
		return status.Errorf(codes.Unauthenticated, "want one authorization metadata value \"Bearer <peer secret>\", got %d", len(vals))
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return status.Error(codes.Unauthenticated, "the authorization metadata is not \"Bearer <peer secret>\"")
	}
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sum[:], s.bearer[:]) != 1 {
		return status.Error(codes.Unauthenticated, "not the fleet's peer secret")
	}
	return nil
}

// reject counts a refused table or stream and answers code; replica names the sender once it
// is known to be a valid id (never a string a stranger chose).
func (s *Server) reject(replica string, code codes.Code, format string, args ...any) error {
	s.m.tables.WithLabelValues(outcomeRejected).Inc()
	err := status.Errorf(code, format, args...)
	s.log.Warn("refused a replica's load table", "replica", replica, "err", err)
	return err
}

func (s *Server) enterPending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending >= s.o.MaxReplicas {
		return false
	}
	s.pending++
	return true
}

func (s *Server) leavePending() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending--
}

// admit makes a stream replica's current one, ending any older one, and applies its first
// table.
func (s *Server) admit(replica string, loads []WorkerLoad) (*holder, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.held[replica]
	if !ok && len(s.held) >= s.o.MaxReplicas {
		s.m.tables.WithLabelValues(outcomeRejected).Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "already holding the load of %d replicas", s.o.MaxReplicas)
	}
	if ok {
		close(old.replaced)
	}
	h := &holder{replaced: make(chan struct{})}
	s.held[replica] = h
	s.m.peers.Set(float64(len(s.held)))
	s.applyLocked(replica, loads)
	return h, nil
}

// apply hands a table of h's stream to the router, unless a newer stream took over.
func (s *Server) apply(replica string, h *holder, loads []WorkerLoad) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[replica] != h {
		return errReplaced
	}
	s.applyLocked(replica, loads)
	return nil
}

func (s *Server) applyLocked(replica string, loads []WorkerLoad) {
	s.o.Router.SetReplicaLoad(replica, loads)
	s.m.tables.WithLabelValues(outcomeApplied).Inc()
}

// end forgets the replica if h is still its current stream.
func (s *Server) end(replica string, h *holder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[replica] != h {
		return
	}
	delete(s.held, replica)
	s.m.peers.Set(float64(len(s.held)))
	s.o.Router.ForgetReplica(replica)
	s.log.Info("a replica's load is forgotten: its stream ended", "replica", replica)
}

var errReplaced = status.Error(codes.Aborted, "a newer load stream of this replica took over")

// received is one Recv's answer.
type received struct {
	t   *replicav1.LoadTable
	err error
}

// receive passes the stream's messages on until a Recv fails or the handler is done.
func receive(stream replicav1.ReplicaLoad_ShareServer, msgs chan<- received, done <-chan struct{}) {
	for {
		t, err := stream.Recv()
		select {
		case msgs <- received{t, err}:
		case <-done:
			return
		}
		if err != nil {
			return
		}
	}
}

// next is the stream's next table; io.EOF when the sender closed it, a status error when the
// stream failed, IdleTimeout passed, a newer stream of the replica took over, or the stream's
// context ended.
func (s *Server) next(msgs <-chan received, replaced, ctxDone <-chan struct{}) (*replicav1.LoadTable, error) {
	idle := make(chan struct{})
	tm := s.o.Clock.AfterFunc(s.o.IdleTimeout, func() { close(idle) }) // one per wait, stopped on return
	defer tm.Stop()
	select {
	case r := <-msgs:
		return r.t, r.err
	case <-idle:
		return nil, status.Errorf(codes.DeadlineExceeded, "no load table for %v", s.o.IdleTimeout)
	case <-replaced:
		return nil, errReplaced
	case <-ctxDone:
		return nil, status.Error(codes.Canceled, "the stream ended")
	}
}
