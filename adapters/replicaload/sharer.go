package replicaload

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
	"github.com/tlgw/tlgw/internal/clock"
)

// Peer is another replica: its id and the address of its gRPC listener (its grpc_address).
type Peer struct {
	ID, Address string
}

// SharerOptions configure a Sharer. Self, Secret, Router, Peers and DialOptions are required.
type SharerOptions struct {
	// Self is this replica's id, which every table names.
	Self string
	// Secret is the fleet's peer secret (cluster's PeerSecret), sent in hex as the bearer.
	Secret []byte
	// Router answers this replica's own load (only OwnLoad is called).
	Router Router
	// Peers lists the other live replicas; it is read every tick, and Self among them is
	// skipped.
	Peers func() []Peer
	// DialOptions make each peer's connection: at least its transport credentials.
	DialOptions []grpc.DialOption
	// Interval is how often the own load is read (default 100 ms); Refresh how long an
	// unchanged table goes unsent at most (default 1 s), so a peer's new stream is filled.
	// Refresh also bounds one OwnLoad call.
	Interval, Refresh time.Duration
	// MaxPeers bounds the peers streamed to (default MaxReplicas): beyond it, peers are
	// ignored (first by id kept) and counted. MaxWorkers bounds a table's entries as the peers'
	// Servers do (default DefaultMaxWorkers).
	MaxPeers, MaxWorkers int
	Clock                clock.Clock // nil: the real clock
	Logger               *slog.Logger
	Registerer           prometheus.Registerer // nil: the metrics are not registered
}

// Defaults of SharerOptions.
const (
	DefaultInterval = 100 * time.Millisecond
	DefaultRefresh  = time.Second
)

// Redial backoff of a peer's stream: from minBackoff, doubling to maxBackoff; a stream that
// lasted maxBackoff starts it over.
const (
	minBackoff = 200 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// Sharer streams this replica's load table to every peer.
type Sharer struct {
	o      SharerOptions
	bearer string
	m      *sharerMetrics
	log    *slog.Logger
}

// NewSharer makes a Sharer; it panics when a required option is missing (a wiring error).
func NewSharer(o SharerOptions) *Sharer {
	if o.Self == "" || len(o.Secret) == 0 || o.Router == nil || o.Peers == nil || len(o.DialOptions) == 0 {
		panic("replicaload: NewSharer needs Self, Secret, Router, Peers and DialOptions")
	}
	o.Interval = cmp.Or(o.Interval, DefaultInterval)
	o.Refresh = cmp.Or(o.Refresh, DefaultRefresh)
	o.MaxPeers = cmp.Or(o.MaxPeers, MaxReplicas)
	o.MaxWorkers = cmp.Or(o.MaxWorkers, DefaultMaxWorkers)
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Sharer{
		o: o, bearer: "Bearer " + hex.EncodeToString(o.Secret),
		m: newSharerMetrics(o.Registerer), log: o.Logger.With("component", "replicaload"),
	}
}

// peer is one peer's stream: one goroutine (stream), one connection at a time.
type peer struct {
	Peer
	// slot holds the latest table the goroutine has not taken yet (capacity 1): a newer table
	// replaces it, so a slow peer holds up neither the tick nor the others, and nothing queues.
	slot   chan []*replicav1.LoadTable
	cancel context.CancelFunc
}

// offer puts t in the slot, in place of an unsent older table. Only the tick calls it.
func (p *peer) offer(t []*replicav1.LoadTable) {
	select {
	case <-p.slot:
	default:
	}
	p.slot <- t // never blocks: only the tick fills the slot, which is now empty
}

// Run shares until ctx ends, then closes every peer's stream and connection and returns.
func (s *Sharer) Run(ctx context.Context) {
	peers := make(map[string]*peer) // by id: at most o.MaxPeers, each deleted when it leaves
	var wg sync.WaitGroup           // the peers' goroutines, also those of peers closing
	defer func() {
		for _, p := range peers {
			p.cancel()
		}
		wg.Wait()
	}()
	var last sent
	ignored := 0
	wake := make(chan struct{}, 1) // the next tick's signal; one timer is pending at a time
	for {
		ignored = s.reconcile(ctx, peers, &wg, last.msg, ignored)
		last = s.share(ctx, peers, last)
		tm := s.o.Clock.AfterFunc(s.o.Interval, func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
		select {
		case <-wake:
		case <-ctx.Done():
			tm.Stop()
			return
		}
	}
}

// sent is the table last offered to the peers (msg nil: none yet).
type sent struct {
	loads []WorkerLoad
	msg   []*replicav1.LoadTable // the table's parts (encode)
	at    time.Time
}

// share reads the own load and offers it to every peer when it changed since last, or
// Refresh has passed since; it answers what was last offered.
func (s *Sharer) share(ctx context.Context, peers map[string]*peer, last sent) sent {
	octx, cancel := context.WithCancel(ctx)
	tm := s.o.Clock.AfterFunc(s.o.Refresh, cancel) // bounds this call; stopped when it returns
	loads, err := s.o.Router.OwnLoad(octx)
	tm.Stop()
	cancel()
	if err != nil {
		s.log.Debug("no own load to share this tick", "err", err)
		return last
	}
	t := sanitize(loads, s.o.MaxWorkers)
	now := s.o.Clock.Now()
	if last.msg != nil && slices.Equal(t, last.loads) && now.Sub(last.at) < s.o.Refresh {
		return last
	}
	msg := encode(s.o.Self, t, MaxPartBytes)
	for _, p := range peers {
		p.offer(msg)
	}
	return sent{loads: t, msg: msg, at: now}
}

// reconcile follows Peers: a peer gone (or at a new address) is closed, a new one started and
// offered last (unless nil). It answers how many peers are ignored over MaxPeers.
func (s *Sharer) reconcile(ctx context.Context, peers map[string]*peer, wg *sync.WaitGroup, last []*replicav1.LoadTable, wasIgnored int) int {
	want, ignored := s.choose(s.o.Peers())
	s.m.ignored.Set(float64(ignored))
	if ignored > 0 && ignored != wasIgnored {
		s.log.Warn("more replicas than this replica shares its load with: some are ignored", "ignored", ignored, "max_peers", s.o.MaxPeers)
	}
	for id, p := range peers {
		if addr, ok := want[id]; !ok || addr != p.Address {
			p.cancel()
			delete(peers, id)
		}
	}
	for id, addr := range want {
		if peers[id] != nil {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p := &peer{Peer: Peer{ID: id, Address: addr}, slot: make(chan []*replicav1.LoadTable, 1), cancel: cancel}
		if last != nil {
			p.offer(last)
		}
		peers[id] = p
		wg.Add(1)
		// The peer's one goroutine; it ends soon after p.cancel (a peer closing may overlap
		// with the same id's new one at a new address, for as long as its close takes).
		go func() {
			defer wg.Done()
			s.runPeer(pctx, p)
		}()
	}
	return ignored
}

// choose is the peers to stream to, id → address: Peers without Self, an empty id or address,
// each id once (its first address by order); of more than MaxPeers, the first MaxPeers by id,
// the others counted.
func (s *Sharer) choose(ps []Peer) (map[string]string, int) {
	ok := make([]Peer, 0, len(ps)) // at most len(ps)
	for _, p := range ps {
		if p.ID != "" && p.Address != "" && p.ID != s.o.Self {
			ok = append(ok, p)
		}
	}
	slices.SortStableFunc(ok, func(a, b Peer) int { return strings.Compare(a.ID, b.ID) })
	ok = slices.CompactFunc(ok, func(a, b Peer) bool { return a.ID == b.ID })
	ignored := max(0, len(ok)-s.o.MaxPeers)
	want := map[string]string{} // at most MaxPeers
	for _, p := range ok[:len(ok)-ignored] {
		want[p.ID] = p.Address
	}
	return want, ignored
}

// runPeer keeps a stream open to p until ctx ends, redialling with backoff after a failure.
func (s *Sharer) runPeer(ctx context.Context, p *peer) {
	var latest []*replicav1.LoadTable // the table last taken from the slot: a new stream starts with it
	var delay time.Duration
	for {
		start := s.o.Clock.Now()
		err := s.stream(ctx, p, &latest)
		if ctx.Err() != nil {
			return
		}
		s.m.failures.Inc()
		delay = nextBackoff(delay, s.o.Clock.Now().Sub(start))
		level := slog.LevelDebug
		if delay == minBackoff {
			level = slog.LevelWarn // the first failure after a stream that held
		}
		s.log.Log(ctx, level, "a load stream to a replica failed; redialling", "replica", p.ID, "address", p.Address, "in", delay, "err", err)
		if !s.wait(ctx, delay) {
			return
		}
	}
}

// nextBackoff is the wait before the next try, after a stream that held for held and the
// wait d before it: twice d within [minBackoff, maxBackoff], or minBackoff again after a
// stream that held for maxBackoff.
func nextBackoff(d, held time.Duration) time.Duration {
	if held >= maxBackoff {
		return minBackoff
	}
	return min(max(2*d, minBackoff), maxBackoff)
}

// wait waits d on the clock, or until ctx ends (false).
func (s *Sharer) wait(ctx context.Context, d time.Duration) bool {
	fire := make(chan struct{})
	tm := s.o.Clock.AfterFunc(d, func() { close(fire) }) // one per wait, stopped if ctx ends first
	select {
	case <-fire:
		return true
	case <-ctx.Done():
		tm.Stop()
		return false
	}
}

// stream is one connection and one Share stream to p: it sends latest, then every table the
// slot holds, until a send fails or ctx ends. The connection is closed on return.
func (s *Sharer) stream(ctx context.Context, p *peer, latest *[]*replicav1.LoadTable) error {
	// The peer's one connection: closed before the next is dialled.
	conn, err := grpc.NewClient(p.Address, s.o.DialOptions...)
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", s.bearer))
	defer cancel()
	st, err := replicav1.NewReplicaLoadClient(conn).Share(sctx)
	if err != nil {
		return err
	}
	if err := sendTable(st, *latest); err != nil {
		return err
	}
	for {
		select {
		case t := <-p.slot:
			*latest = t
			if err := sendTable(st, t); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sendTable sends a table's parts in order (nothing for nil).
func sendTable(st replicav1.ReplicaLoad_ShareClient, parts []*replicav1.LoadTable) error {
	for _, part := range parts {
		if err := st.Send(part); err != nil {
			return ended(st, err)
		}
	}
	return nil
}

// ended is why a stream's Send failed: io.EOF says the peer ended it, with the status that
// RecvMsg answers.
func ended(st replicav1.ReplicaLoad_ShareClient, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	if rerr := st.RecvMsg(new(replicav1.ShareAck)); rerr != nil {
		return rerr
	}
	return errors.New("the replica ended the stream")
}
