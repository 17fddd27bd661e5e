package cluster

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tlgw/tlgw/internal/config"
)

// run keeps a session with etcd until the store closes: each session seeds the tables, reads
// the whole prefix, registers this replica under a fresh lease and follows a watch; a failed
// probe, a broken watch or a lost lease ends it, and the next one catches up from a fresh
// read (no update is lost however long etcd was away).
func (s *Store) run(ctx context.Context) {
	defer close(s.done)
	var b backoff
	for {
		var upAt time.Time
		err := s.connect()
		if err == nil {
			upAt, err = s.session(ctx)
		}
		s.setUp(false)
		s.mu.Lock()
		s.pushRatesLocked(false)
		s.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("etcd session ended; serving the last known state until it is back", "err", err)
		if !s.wait(ctx, b.next(s.held(upAt))) {
			return
		}
	}
}

// backoff is the wait before the next session: 100 ms at first and after a session that held
// (followed the watch for at least backoffMax), doubling up to backoffMax while sessions end
// sooner. An etcd that is away is tried every 2 s; one that blips after hours up is back within
// 100 ms; one whose sessions keep ending right after they get up is not hammered (each session
// grants a lease).
type backoff struct{ last time.Duration }

const (
	backoffFirst = 100 * time.Millisecond
	backoffMax   = 2 * time.Second
)

// held reports whether a session that got up at upAt (zero: never) held: it has been up for
// backoffMax.
func (s *Store) held(upAt time.Time) bool {
	return !upAt.IsZero() && s.cfg.Clock.Now().Sub(upAt) >= backoffMax
}

// next is the wait after a session that ended; held says it had been up for backoffMax.
func (b *backoff) next(held bool) time.Duration {
	if held || b.last == 0 {
		b.last = backoffFirst
	} else {
		b.last = min(2*b.last, backoffMax)
	}
	return b.last
}

// c is the connected client (set before any session starts).
func (s *Store) c() *clientv3.Client { return s.client.Load() }

// connect makes the client once: with a username it authenticates, which needs etcd.
func (s *Store) connect() error {
	if s.client.Load() != nil {
		return nil
	}
	cli, err := clientv3.New(s.etcd)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	s.client.Store(cli)
	return nil
}

// wait waits d on the store's clock, or until ctx ends (false).
func (s *Store) wait(ctx context.Context, d time.Duration) bool {
	tick := make(chan struct{})
	t := s.cfg.Clock.AfterFunc(d, func() { close(tick) })
	select {
	case <-tick:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

func (s *Store) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.OpTimeout)
}

// session is one connected stretch; it returns when it got up (began following the watch;
// zero if it never did) and why it ended.
func (s *Store) session(parent context.Context) (time.Time, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	if err := s.seed(ctx); err != nil {
		return time.Time{}, fmt.Errorf("seed: %w", err)
	}
	rev, kvs, err := s.read(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read %s: %w", s.prefix, err)
	}
	ka, err := s.register(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("register replica: %w", err)
	}
	s.applySnapshot(rev, kvs)
	wch := s.c().Watch(clientv3.WithRequireLeader(ctx), s.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	s.setUp(true)
	upAt := s.cfg.Clock.Now()
	s.log.Info("following the control plane in etcd", "revision", rev, "replicas", s.replicaCount())
	probe := make(chan struct{}, 1)
	t := s.cfg.Clock.AfterFunc(s.cfg.ProbeInterval, func() { probe <- struct{}{} })
	defer func() { t.Stop() }()
	// The rate-limit exchange: published at once, then every RateInterval (one timer).
	var published []byte // what this session last put under ratelimits/
	rates := make(chan struct{}, 1)
	var rt interface{ Stop() bool }
	if s.cfg.Rates != nil {
		s.mu.Lock()
		lease := s.lease
		s.mu.Unlock()
		if published, err = s.publishRates(ctx, lease, nil); err != nil {
			return upAt, err
		}
		rt = s.cfg.Clock.AfterFunc(s.cfg.RateInterval, func() { rates <- struct{}{} })
		defer func() { rt.Stop() }()
	}
	// The rollouts (rollouts.go): a pass at once, then when asked (rolloutsNow) or owed (one
	// timer, for the decider's next verdict).
	var windows []byte                                  // what this session last put under rollout_windows/
	var decider <-chan *clientv3.LeaseKeepAliveResponse // rollout_leader's lease, while this replica holds it
	owed := make(chan struct{}, 1)
	var ot interface{ Stop() bool }
	defer func() {
		if ot != nil {
			ot.Stop()
		}
	}()
	pass := func() error {
		var next time.Time
		var err error
		var won <-chan *clientv3.LeaseKeepAliveResponse
		windows, next, won, err = s.rolloutPass(ctx, windows)
		if won != nil {
			decider = won
		}
		if err != nil {
			return err
		}
		if ot != nil {
			ot.Stop()
			ot = nil
		}
		if !next.IsZero() {
			ot = s.cfg.Clock.AfterFunc(max(next.Sub(s.cfg.Clock.Now()), 0), func() {
				select {
				case owed <- struct{}{}:
				default:
				}
			})
		}
		return nil
	}
	if err := pass(); err != nil {
		return upAt, err
	}
	for {
		select {
		case <-ctx.Done():
			return upAt, ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return upAt, errors.New("watch closed")
			}
			if err := wr.Err(); err != nil {
				return upAt, fmt.Errorf("watch: %w", s.overBound(err))
			}
			s.applyEvents(wr.Events)
		case _, ok := <-ka:
			if !ok {
				return upAt, errors.New("lease keep-alive ended (the lease expired or etcd is away)")
			}
		case <-probe:
			if err := s.probe(ctx); err != nil {
				return upAt, err
			}
			t = s.cfg.Clock.AfterFunc(s.cfg.ProbeInterval, func() { probe <- struct{}{} })
		case <-rates:
			if published, err = s.publishSession(ctx, published); err != nil {
				return upAt, err
			}
			rt = s.cfg.Clock.AfterFunc(s.cfg.RateInterval, func() { rates <- struct{}{} })
		case <-s.rolloutsNow:
			if err := pass(); err != nil {
				return upAt, err
			}
		case <-owed:
			if err := pass(); err != nil {
				return upAt, err
			}
		case _, ok := <-decider:
			if !ok { // rollout_leader's lease is gone (the watch tells who holds the key now)
				decider = nil
				s.mu.Lock()
				s.deciderLease = 0
				s.mu.Unlock()
				s.log.Warn("this replica no longer decides the rollouts: its rollout_leader lease ended")
			}
		case <-s.ratesNow:
			if s.cfg.Rates != nil {
				if published, err = s.publishSession(ctx, published); err != nil {
					return upAt, err
				}
			}
		}
	}
}

// publishSession is publishRates under the session's lease.
func (s *Store) publishSession(ctx context.Context, last []byte) ([]byte, error) {
	s.mu.Lock()
	lease := s.lease
	s.mu.Unlock()
	return s.publishRates(ctx, lease, last)
}

// readDirs names read's ranges, in order.
var readDirs = [...]string{KeyRoutes, KeyStaticWorkers, KeyEnginePools, DirReplicas, DirDrained, KeyCanary, DirRates,
	KeyRolloutLeader, DirRollouts}

// read takes what the store follows under the prefix, at one revision: the three tables,
// replicas/ and the keys of drained/ (a drain's value says nothing). Each directory is read
// up to one entry past its bound, and nothing else under the prefix is read, so what a
// session holds at once does not grow with what anyone else put there.
func (s *Store) read(ctx context.Context) (int64, []*mvccpb.KeyValue, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.c().Txn(octx).Then(
		clientv3.OpGet(s.key(KeyRoutes)),
		clientv3.OpGet(s.key(KeyStaticWorkers)),
		clientv3.OpGet(s.key(KeyEnginePools)),
		clientv3.OpGet(s.key(DirReplicas), clientv3.WithPrefix(), clientv3.WithLimit(int64(s.maxReplicas)+1)),
		clientv3.OpGet(s.key(DirDrained), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(s.maxDrained)+1)),
		clientv3.OpGet(s.key(KeyCanary)),
		clientv3.OpGet(s.key(DirRates), clientv3.WithPrefix(), clientv3.WithLimit(int64(s.maxReplicas)+1)),
		clientv3.OpGet(s.key(KeyRolloutLeader)),
		clientv3.OpGet(s.key(DirRollouts), clientv3.WithPrefix(), clientv3.WithLimit(config.MaxRollouts+1)),
	).Commit()
	if err != nil {
		return 0, nil, s.overBound(err)
	}
	if len(resp.Responses) != len(readDirs) {
		return 0, nil, fmt.Errorf("etcd answered %d ranges for %d", len(resp.Responses), len(readDirs))
	}
	var kvs []*mvccpb.KeyValue
	for i, r := range resp.Responses {
		rr := r.GetResponseRange()
		if rr == nil {
			return 0, nil, fmt.Errorf("etcd's answer %d is not a range", i)
		}
		if bound := [...]int{1, 1, 1, s.maxReplicas, s.maxDrained, 1, s.maxReplicas, 1, config.MaxRollouts}[i]; len(rr.Kvs) > bound {
			s.log.Error("more entries under a directory than the store's bound: the first are kept", "directory", readDirs[i], "bound", bound, "listed", rr.Count)
		}
		kvs = append(kvs, rr.Kvs...)
	}
	// The replicas' rollout windows, at the same revision, in an answer of their own (up to
	// MaxReplicas+1 of MaxRolloutWindowBytes: 26 MiB, within MaxAnswer alone).
	wresp, err := s.c().Get(octx, s.key(DirRolloutWindows), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision),
		clientv3.WithLimit(int64(s.maxReplicas)+1))
	if err != nil {
		return 0, nil, s.overBound(err)
	}
	return resp.Header.Revision, append(kvs, wresp.Kvs...), nil
}

// overBound says so when err is an answer the store refused as larger than its bound.
func (s *Store) overBound(err error) error {
	if status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("etcd's answer is over the store's bound of %d bytes (too much is stored under the prefix): %w", s.cfg.maxAnswer, err)
	}
	return err
}

// probe checks that etcd answers a linearizable read and still holds this replica's key.
func (s *Store) probe(ctx context.Context) error {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.c().Get(octx, s.key(DirReplicas+s.cfg.Self.ID), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if resp.Count == 0 {
		return errors.New("this replica's key is gone (its lease expired)")
	}
	return nil
}

// seed stores this replica's configured tables and its canary key where etcd has none yet
// (the first replica of a fleet brings the fleet's tables and key; later ones take what is
// stored).
func (s *Store) seed(ctx context.Context) error {
	s.mu.Lock()
	routes, static, pools := s.cfg.SeedRoutes, s.cfg.SeedStatic, s.cfg.SeedPools
	s.mu.Unlock()
	for _, t := range []struct {
		name string
		doc  any
	}{
		{KeyRoutes, routesDoc{Routes: nonNil(routes)}}, {KeyStaticWorkers, staticDoc{StaticWorkers: nonNil(static)}},
		{KeyEnginePools, poolsDoc{EnginePools: nonNil(pools)}}, {KeyCanary, nil},
	} {
		val := hex.EncodeToString(s.cfg.CanaryKey[:])
		if t.doc != nil {
			var err error
			if val, err = marshal(t.doc); err != nil {
				return err
			}
		}
		k := s.key(t.name)
		octx, cancel := s.op(ctx)
		resp, err := s.c().Txn(octx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, val)).Commit()
		cancel()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			s.log.Info("stored this replica's configured table in etcd (none was there)", "key", k)
		}
	}
	return nil
}

// register grants a fresh lease, puts replicas/<id> under it and keeps it alive; a previous
// session's lease is revoked.
func (s *Store) register(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	s.mu.Lock()
	old, decider := s.lease, s.deciderLease
	s.deciderLease = 0
	s.mu.Unlock()
	for _, l := range []clientv3.LeaseID{decider, old} {
		if l != 0 {
			_, _ = s.c().Revoke(octx, l) // best effort: it may have expired already
		}
	}
	g, err := s.c().Grant(octx, int64(s.cfg.Cluster.LeaseTTL/time.Second))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.lease = g.ID
	s.mu.Unlock()
	me := s.cfg.Self
	me.Self = false
	val, err := marshal(me)
	if err != nil {
		return nil, err
	}
	if _, err := s.c().Put(octx, s.key(DirReplicas+me.ID), val, clientv3.WithLease(g.ID)); err != nil {
		return nil, err
	}
	return s.c().KeepAlive(ctx, g.ID)
}

func (s *Store) setUp(up bool) {
	s.mu.Lock()
	s.up = up
	s.mu.Unlock()
	if up {
		s.m.up.Set(1)
	} else {
		s.m.up.Set(0)
	}
}

// applySnapshot takes the whole prefix as read at revision rev.
func (s *Store) applySnapshot(rev int64, kvs []*mvccpb.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	drains := make(map[string]bool)
	s.replicas = make(map[string]Replica)
	s.rates = make(map[string]rateEntry)
	s.rollouts, s.windows, s.rolloutRev = make(map[string]storedRollout), make(map[string]map[uint64]closedWindow), 0
	s.leader, s.leaderLease, s.leaderRev = "", 0, 0 // unless the snapshot holds the key
	for _, kv := range kvs {
		name := strings.TrimPrefix(string(kv.Key), s.prefix)
		switch {
		case name == KeyRoutes:
			s.putRoutesKV(kv)
		case name == KeyStaticWorkers:
			s.putStaticKV(kv)
		case name == KeyEnginePools:
			s.putPoolsKV(kv)
		case name == KeyCanary:
			s.putCanaryLocked(kv.Value)
		case strings.HasPrefix(name, DirDrained):
			if m, ok := s.modelOf(name); ok && len(drains) < s.maxDrained {
				drains[m] = true
			}
		case strings.HasPrefix(name, DirReplicas):
			s.putReplicaLocked(name, kv.Value)
		case strings.HasPrefix(name, DirRates):
			s.putRatesLocked(name, kv.Value)
		case name == KeyRolloutLeader:
			s.setLeaderLocked(kv, kv.ModRevision)
		case strings.HasPrefix(name, DirRollouts):
			s.putRolloutLocked(name, kv)
		case strings.HasPrefix(name, DirRolloutWindows):
			s.putWindowsLocked(name, kv.Value)
		}
	}
	s.pushRolloutsLocked()
	s.pokeRollouts()
	changed := false
	for m := range drains {
		changed = s.setDrainLocked(m, true, rev) || changed
	}
	for m, r := range s.drained {
		if r > 0 && !drains[m] {
			changed = s.setDrainLocked(m, false, rev) || changed
		}
	}
	// Tombstones older than the snapshot say nothing the snapshot does not.
	for m, r := range s.drained {
		if r < 0 && -r <= rev {
			delete(s.drained, m)
		}
	}
	if changed {
		s.pushDrainsLocked()
	}
	s.pushReplicasLocked()
	s.pushRatesLocked(true)
}

// applyEvents takes one watch answer's changes, in revision order. What it tells the
// gateway is pushed once for the whole answer, not once per event: an answer can carry
// thousands of events (one transaction, or a watch catching up), and each push sends the
// whole drained set. Every put to a table is decoded in order (an invalid one keeps the rows
// before it, as one event at a time would), and only the table they leave is applied.
func (s *Store) applyEvents(evs []*clientv3.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var drains, replicas, rates, reseed, rollouts bool
	routes, static, pools := s.routes, s.static, s.pools
	for _, ev := range evs {
		name := strings.TrimPrefix(string(ev.Kv.Key), s.prefix)
		put := ev.Type == clientv3.EventTypePut
		switch {
		case name == KeyRoutes || name == KeyStaticWorkers || name == KeyEnginePools || name == KeyCanary:
			if !put {
				// A deleted table is put back as this replica last applied it (a table always
				// exists, so its ETag is always a revision); a deleted canary key, by the
				// first replica to put its own back (every replica then takes that one).
				reseed = true
			} else if name == KeyCanary {
				s.putCanaryLocked(ev.Kv.Value)
			} else if name == KeyRoutes {
				routes = s.nextRoutes(routes, ev.Kv)
			} else if name == KeyEnginePools {
				pools = s.nextPools(pools, ev.Kv)
			} else {
				static = s.nextStatic(static, ev.Kv)
			}
		case strings.HasPrefix(name, DirDrained):
			drains = s.applyDrainLocked(name, put, ev.Kv.ModRevision) || drains
		case strings.HasPrefix(name, DirReplicas):
			if put {
				s.putReplicaLocked(name, ev.Kv.Value)
			} else {
				delete(s.replicas, strings.TrimPrefix(name, DirReplicas))
			}
			replicas = true
		case strings.HasPrefix(name, DirRates):
			if put {
				s.putRatesLocked(name, ev.Kv.Value)
			} else {
				delete(s.rates, strings.TrimPrefix(name, DirRates))
			}
			rates = true
		case name == KeyRolloutLeader:
			if put {
				s.setLeaderLocked(ev.Kv, ev.Kv.ModRevision)
			} else {
				s.setLeaderLocked(nil, ev.Kv.ModRevision)
			}
			rollouts = true
		case strings.HasPrefix(name, DirRollouts):
			if put {
				s.putRolloutLocked(name, ev.Kv)
			} else {
				s.deleteRolloutLocked(name, ev.Kv.ModRevision)
			}
			rollouts = true
		case strings.HasPrefix(name, DirRolloutWindows):
			if put {
				s.putWindowsLocked(name, ev.Kv.Value)
			} else {
				delete(s.windows, strings.TrimPrefix(name, DirRolloutWindows))
			}
			s.pokeRollouts() // the decider may have every replica's counts now
		}
	}
	s.applyRoutesLocked(routes.rev, routes.rows)
	s.applyStaticLocked(static.rev, static.rows)
	s.applyPoolsLocked(pools.rev, pools.rows)
	if drains {
		s.pushDrainsLocked()
	}
	if replicas {
		s.pushReplicasLocked()
	}
	if rates {
		s.pushRatesLocked(true)
	}
	if rollouts {
		s.pushRolloutsLocked()
		s.pokeRollouts()
	}
	if reseed {
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.reseed()
		}()
	}
}

// applyDrainLocked takes one watched drained/ change; it reports whether the set changed.
func (s *Store) applyDrainLocked(name string, put bool, rev int64) bool {
	m, ok := s.modelOf(name)
	if !ok {
		return false
	}
	if len(s.drained)-s.live > 64 {
		s.compactDrainsLocked(rev)
	}
	if put && s.drained[m] <= 0 && s.live >= s.maxDrained {
		s.log.Error("drained models over the store's bound: ignored", "bound", s.maxDrained)
		return false
	}
	return s.setDrainLocked(m, put, rev)
}

// reseed puts a deleted table back (the configured table if none was ever applied).
func (s *Store) reseed() {
	s.mu.Lock()
	s.cfg.SeedRoutes, s.cfg.SeedStatic, s.cfg.SeedPools = s.routes.rows, s.static.rows, s.pools.rows
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	if err := s.seed(ctx); err != nil {
		s.log.Warn("could not put a deleted table back; the next session will", "err", err)
	}
}

func (s *Store) modelOf(name string) (string, bool) {
	m, err := unescapeModel(strings.TrimPrefix(name, DirDrained))
	if err != nil {
		s.log.Error("ignored a drained key that is not a path-escaped model id", "key", name)
		return "", false
	}
	return m, true
}

// putCanaryLocked applies a stored canary key: exactly 64 hex digits, else it is logged and the
// last one applied is kept.
func (s *Store) putCanaryLocked(val []byte) {
	k, err := decodeCanaryKey(val)
	if err != nil {
		s.log.Error("ignored a stored canary key; the last one applied stays", "err", err)
		return
	}
	if s.canary != nil && *s.canary == k {
		return
	}
	s.canary = &k
	if s.cfg.Apply.CanaryKey != nil {
		s.cfg.Apply.CanaryKey(k)
	}
}

func (s *Store) putRoutesKV(kv *mvccpb.KeyValue) {
	t := s.nextRoutes(s.routes, kv)
	s.applyRoutesLocked(t.rev, t.rows)
}

func (s *Store) putStaticKV(kv *mvccpb.KeyValue) {
	t := s.nextStatic(s.static, kv)
	s.applyStaticLocked(t.rev, t.rows)
}

func (s *Store) putPoolsKV(kv *mvccpb.KeyValue) {
	t := s.nextPools(s.pools, kv)
	s.applyPoolsLocked(t.rev, t.rows)
}

// nextRoutes is the route table after a put of kv on top of cur: the put's rows, or cur's
// when the stored table is invalid (the last good table keeps serving, under the stored
// revision, so an operator's PUT with If-Match: that revision can replace what is there).
func (s *Store) nextRoutes(cur table[config.Route], kv *mvccpb.KeyValue) table[config.Route] {
	return nextTable(cur, kv, decodeRoutes, func(err error) {
		s.log.Error("the stored route table is invalid; keeping the last good one", "revision", kv.ModRevision, "err", err)
	})
}

func (s *Store) nextStatic(cur table[config.StaticWorker], kv *mvccpb.KeyValue) table[config.StaticWorker] {
	return nextTable(cur, kv, decodeStatic, func(err error) {
		s.log.Error("the stored static worker table is invalid; keeping the last good one", "revision", kv.ModRevision, "err", err)
	})
}

func (s *Store) nextPools(cur table[config.EnginePool], kv *mvccpb.KeyValue) table[config.EnginePool] {
	return nextTable(cur, kv, decodePools, func(err error) {
		s.log.Error("the stored engine pool table is invalid; keeping the last good one", "revision", kv.ModRevision, "err", err)
	})
}

// nextTable is cur after a put of kv: the put's rows when they decode, else cur's rows under
// the put's revision; cur itself when the put is not newer.
func nextTable[T any](cur table[T], kv *mvccpb.KeyValue, decode func([]byte) ([]T, error), invalid func(error)) table[T] {
	if kv.ModRevision <= cur.rev {
		return cur
	}
	rows, err := decode(kv.Value)
	if err != nil {
		invalid(err)
		rows = cur.rows
	}
	return table[T]{rev: kv.ModRevision, rows: rows}
}

func (s *Store) applyRoutesLocked(rev int64, routes []config.Route) {
	if rev <= s.routes.rev {
		return
	}
	s.routes = table[config.Route]{rev: rev, rows: routes}
	if s.cfg.Apply.Routes != nil {
		s.cfg.Apply.Routes(uint64(rev), routes)
	}
	s.pokeRollouts() // the decider stores a state for a new rollout, drops a removed one's
}

func (s *Store) applyStaticLocked(rev int64, ws []config.StaticWorker) {
	if rev <= s.static.rev {
		return
	}
	s.static = table[config.StaticWorker]{rev: rev, rows: ws}
	if s.cfg.Apply.Static != nil {
		s.cfg.Apply.Static(uint64(rev), ws)
	}
}

func (s *Store) applyPoolsLocked(rev int64, pools []config.EnginePool) {
	if rev <= s.pools.rev {
		return
	}
	s.pools = table[config.EnginePool]{rev: rev, rows: pools}
	if s.cfg.Apply.Pools != nil {
		s.cfg.Apply.Pools(uint64(rev), pools)
	}
}

// setDrainLocked records model as drained or not as of revision rev, unless something newer
// is known; it reports whether the drained set changed.
func (s *Store) setDrainLocked(model string, drained bool, rev int64) bool {
	cur := s.drained[model]
	if abs(cur) >= rev {
		return false
	}
	was := cur > 0
	if drained {
		s.drained[model] = rev
	} else {
		s.drained[model] = -rev
	}
	switch {
	case drained && !was:
		s.live++
	case was && !drained:
		s.live--
	}
	return was != drained
}

// compactDrainsLocked forgets undrained models' revisions older than rev, a watched event's:
// the watch delivers nothing older from now on, so they order nothing any more.
func (s *Store) compactDrainsLocked(rev int64) {
	for m, r := range s.drained {
		if r < 0 && -r < rev {
			delete(s.drained, m)
		}
	}
}

func (s *Store) pushDrainsLocked() {
	var models []string
	for m, r := range s.drained {
		if r > 0 {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	if s.cfg.Apply.Drains != nil {
		s.cfg.Apply.Drains(models)
	}
}

func (s *Store) putReplicaLocked(name string, val []byte) {
	id := strings.TrimPrefix(name, DirReplicas)
	r, err := decodeReplica(id, val)
	if err != nil {
		s.log.Error("ignored an invalid replicas/ entry", "err", err)
		return
	}
	if _, ok := s.replicas[id]; !ok && len(s.replicas) >= s.maxReplicas {
		s.log.Error("replicas over the store's bound: ignored", "bound", s.maxReplicas)
		return
	}
	s.replicas[id] = r
}

func (s *Store) replicaCountLocked() int {
	n := len(s.replicas)
	if _, ok := s.replicas[s.cfg.Self.ID]; !ok {
		n++ // this replica serves whether or not etcd lists it
	}
	return n
}

func (s *Store) replicaCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replicaCountLocked()
}

func (s *Store) pushReplicasLocked() {
	n := s.replicaCountLocked()
	s.m.replicas.Set(float64(n))
	if s.cfg.Apply.Replicas != nil {
		s.cfg.Apply.Replicas(n)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
