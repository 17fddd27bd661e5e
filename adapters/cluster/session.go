package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

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
	octx, ocancel := s.op(ctx)
	resp, err := s.c().Get(octx, s.prefix, clientv3.WithPrefix())
	ocancel()
	if err != nil {
		return time.Time{}, fmt.Errorf("read %s: %w", s.prefix, err)
	}
	ka, err := s.register(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("register replica: %w", err)
	}
	s.applySnapshot(resp.Header.Revision, resp.Kvs)
	wch := s.c().Watch(clientv3.WithRequireLeader(ctx), s.prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	s.setUp(true)
	upAt := s.cfg.Clock.Now()
	s.log.Info("following the control plane in etcd", "revision", resp.Header.Revision, "replicas", s.replicaCount())
	probe := make(chan struct{}, 1)
	t := s.cfg.Clock.AfterFunc(s.cfg.ProbeInterval, func() { probe <- struct{}{} })
	defer func() { t.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return upAt, ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return upAt, errors.New("watch closed")
			}
			if err := wr.Err(); err != nil {
				return upAt, fmt.Errorf("watch: %w", err)
			}
			for _, ev := range wr.Events {
				s.applyEvent(ev)
			}
		case _, ok := <-ka:
			if !ok {
				return upAt, errors.New("lease keep-alive ended (the lease expired or etcd is away)")
			}
		case <-probe:
			if err := s.probe(ctx); err != nil {
				return upAt, err
			}
			t = s.cfg.Clock.AfterFunc(s.cfg.ProbeInterval, func() { probe <- struct{}{} })
		}
	}
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

// seed stores this replica's configured tables where etcd has none yet (the first replica
// of a fleet brings the fleet's tables; later ones take what is stored).
func (s *Store) seed(ctx context.Context) error {
	s.mu.Lock()
	routes, static := s.cfg.SeedRoutes, s.cfg.SeedStatic
	s.mu.Unlock()
	for _, t := range []struct {
		name string
		doc  any
	}{{KeyRoutes, routesDoc{Routes: nonNil(routes)}}, {KeyStaticWorkers, staticDoc{StaticWorkers: nonNil(static)}}} {
		val, err := marshal(t.doc)
		if err != nil {
			return err
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
	old := s.lease
	s.mu.Unlock()
	if old != 0 {
		_, _ = s.c().Revoke(octx, old) // best effort: it may have expired already
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
	for _, kv := range kvs {
		name := strings.TrimPrefix(string(kv.Key), s.prefix)
		switch {
		case name == KeyRoutes:
			s.putRoutesKV(kv)
		case name == KeyStaticWorkers:
			s.putStaticKV(kv)
		case strings.HasPrefix(name, DirDrained):
			if m, ok := s.modelOf(name); ok && len(drains) < s.maxDrained {
				drains[m] = true
			}
		case strings.HasPrefix(name, DirReplicas):
			s.putReplicaLocked(name, kv.Value)
		}
	}
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
}

// applyEvent takes one watched change.
func (s *Store) applyEvent(ev *clientv3.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := strings.TrimPrefix(string(ev.Kv.Key), s.prefix)
	put := ev.Type == clientv3.EventTypePut
	switch {
	case name == KeyRoutes || name == KeyStaticWorkers:
		if put {
			if name == KeyRoutes {
				s.putRoutesKV(ev.Kv)
			} else {
				s.putStaticKV(ev.Kv)
			}
			return
		}
		// A deleted table is put back as this replica last applied it (a table always exists,
		// so its ETag is always a revision).
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.reseed()
		}()
	case strings.HasPrefix(name, DirDrained):
		m, ok := s.modelOf(name)
		if !ok {
			return
		}
		if len(s.drained)-s.live > 64 {
			s.compactDrainsLocked(ev.Kv.ModRevision)
		}
		if put && s.drained[m] <= 0 && s.live >= s.maxDrained {
			s.log.Error("drained models over the store's bound: ignored", "bound", s.maxDrained)
			return
		}
		if s.setDrainLocked(m, put, ev.Kv.ModRevision) {
			s.pushDrainsLocked()
		}
	case strings.HasPrefix(name, DirReplicas):
		if put {
			s.putReplicaLocked(name, ev.Kv.Value)
		} else {
			delete(s.replicas, strings.TrimPrefix(name, DirReplicas))
		}
		s.pushReplicasLocked()
	}
}

// reseed puts a deleted table back (the configured table if none was ever applied).
func (s *Store) reseed() {
	s.mu.Lock()
	s.cfg.SeedRoutes, s.cfg.SeedStatic = s.routes.rows, s.static.rows
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

func (s *Store) putRoutesKV(kv *mvccpb.KeyValue) {
	if kv.ModRevision <= s.routes.rev {
		return
	}
	routes, err := decodeRoutes(kv.Value)
	if err != nil {
		// Keep serving the last good table, under the stored revision, so an operator's PUT
		// (If-Match: that revision) can replace what is there.
		s.log.Error("the stored route table is invalid; keeping the last good one", "revision", kv.ModRevision, "err", err)
		routes = s.routes.rows
	}
	s.applyRoutesLocked(kv.ModRevision, routes)
}

func (s *Store) putStaticKV(kv *mvccpb.KeyValue) {
	if kv.ModRevision <= s.static.rev {
		return
	}
	ws, err := decodeStatic(kv.Value)
	if err != nil {
		s.log.Error("the stored static worker table is invalid; keeping the last good one", "revision", kv.ModRevision, "err", err)
		ws = s.static.rows
	}
	s.applyStaticLocked(kv.ModRevision, ws)
}

func (s *Store) applyRoutesLocked(rev int64, routes []config.Route) {
	if rev <= s.routes.rev {
		return
	}
	s.routes = table[config.Route]{rev: rev, rows: routes}
	if s.cfg.Apply.Routes != nil {
		s.cfg.Apply.Routes(uint64(rev), routes)
	}
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
