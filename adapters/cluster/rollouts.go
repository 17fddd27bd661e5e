package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/rollout"
)

// Rollouts in a cluster (R25). The fleet runs one rollout per route, whichever replica serves a
// request:
//
//	P rollouts/<route>          the rollout's state (rollout.Stored, JSON; route path-escaped);
//	                            not leased: a restarted fleet resumes where it was
//	P rollout_leader            the replica that decides, under a lease of half the TTL
//	P rollout_windows/<id>      a replica's last closed window per rollout route (leased, binary)
//
// Every replica counts its own requests and, at each window's end, closes its window and
// publishes the counts (the router hands them over: CloseWindow). The replica holding
// rollout_leader (the first to create it, under a lease of half the replicas' TTL; when that
// lease ends, with it, the others race for it at once) judges each window once every live replica's counts for it are
// in, or RolloutGrace after its end, and stores the new state — a compare-and-swap on the
// state's revision, fenced on still holding the lease. Every replica follows the stored states
// through the watch (Applier.Rollouts). An operator's pause, resume, promote or abort, on any
// replica, is a compare-and-swap of the state too. While etcd is away nothing is decided: each
// replica keeps the split of the last state it applied.
//
// Bounds: at most config.MaxRollouts states (more keys are ignored, logged), each at most
// rollout.MaxStoredBytes; one rollout_windows value per live replica (at most MaxReplicas),
// each at most MaxRolloutWindowBytes and config.MaxRollouts windows. Writes: one window put per
// replica per interval, one state put per rollout per interval.

const (
	DirRollouts       = "rollouts/"
	DirRolloutWindows = "rollout_windows/"
	KeyRolloutLeader  = "rollout_leader"
	// MaxRolloutWindowBytes bounds a rollout_windows/ value: config.MaxRollouts windows of two
	// tallies of 19 counts, each at most 10 bytes, is 25,090 bytes.
	MaxRolloutWindowBytes = 26 << 10
	// RolloutGrace is how long after a window's end the decider waits for a replica's counts
	// that are not in yet (at most half the interval); then it judges on the counts it has.
	RolloutGrace         = 2 * time.Second
	rolloutWindowVersion = 1
)

// storedRollout is one rollouts/ key as last applied: its mod revision and its state.
type storedRollout struct {
	rev int64
	st  rollout.Stored
}

// closedWindow is one replica's counts of a route's window that began at window (Unix ns).
type closedWindow struct {
	window           int64
	canary, baseline rollout.Tally
}

// routeHash names a route in rollout_windows/ values: the replicas' tables name the same
// routes, and a value stays small whatever the ids' lengths.
func routeHash(route string) uint64 { return xxhash.Sum64String(route) }

// encodeWindows is a rollout_windows/ value: the version, the count, then per window the
// route's hash and the window start (8 bytes little-endian each) and the canary's and the
// baseline's tallies (requests, errors, the TTFT buckets) as unsigned varints; by route hash.
func encodeWindows(ws map[uint64]closedWindow) []byte {
	hs := make([]uint64, 0, len(ws))
	for h := range ws {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	b := binary.AppendUvarint([]byte{rolloutWindowVersion}, uint64(len(hs)))
	for _, h := range hs {
		w := ws[h]
		b = binary.LittleEndian.AppendUint64(b, h)
		b = binary.LittleEndian.AppendUint64(b, uint64(w.window))
		for _, t := range []rollout.Tally{w.canary, w.baseline} {
			b = binary.AppendUvarint(b, t.Requests)
			b = binary.AppendUvarint(b, t.Errors)
			for _, n := range t.TTFT {
				b = binary.AppendUvarint(b, n)
			}
		}
	}
	return b
}

// decodeWindows reads a rollout_windows/ value.
func decodeWindows(b []byte) (map[uint64]closedWindow, error) {
	if len(b) > MaxRolloutWindowBytes {
		return nil, fmt.Errorf("%d bytes, over the bound of %d", len(b), MaxRolloutWindowBytes)
	}
	if len(b) < 2 || b[0] != rolloutWindowVersion {
		return nil, fmt.Errorf("not a version %d value", rolloutWindowVersion)
	}
	r := bytes.NewReader(b[1:])
	n, err := binary.ReadUvarint(r)
	if err != nil || n > config.MaxRollouts {
		return nil, fmt.Errorf("window count: want ≤ %d", config.MaxRollouts)
	}
	out := make(map[uint64]closedWindow, n)
	var fixed [16]byte
	for i := range n {
		if _, err := io.ReadFull(r, fixed[:]); err != nil {
			return nil, fmt.Errorf("window %d: short", i)
		}
		h := binary.LittleEndian.Uint64(fixed[:8])
		if _, dup := out[h]; dup {
			return nil, fmt.Errorf("window %d: a route twice", i)
		}
		w := closedWindow{window: int64(binary.LittleEndian.Uint64(fixed[8:]))}
		for _, t := range []*rollout.Tally{&w.canary, &w.baseline} {
			vals := []*uint64{&t.Requests, &t.Errors}
			for j := range t.TTFT {
				vals = append(vals, &t.TTFT[j])
			}
			for _, v := range vals {
				if *v, err = binary.ReadUvarint(r); err != nil {
					return nil, fmt.Errorf("window %d: a count: %w", i, err)
				}
			}
		}
		out[h] = w
	}
	if r.Len() != 0 {
		return nil, errors.New("bytes after the last window")
	}
	return out, nil
}

// CloseWindow takes this replica's counts of route's window that began at window (the router
// calls it as the window ends) and publishes them: the decider judges the window from every
// replica's. It does not block.
func (s *Store) CloseWindow(route string, window time.Time, canary, baseline rollout.Tally) {
	s.mu.Lock()
	s.own[routeHash(route)] = closedWindow{window: window.UnixNano(), canary: canary, baseline: baseline}
	if len(s.own) > config.MaxRollouts {
		s.pruneOwnLocked()
	}
	s.mu.Unlock()
	s.pokeRollouts()
}

// pruneOwnLocked keeps this replica's windows of the table's rollout routes only.
func (s *Store) pruneOwnLocked() {
	keep := make(map[uint64]bool)
	for _, r := range s.routes.rows {
		if r.Rollout != nil {
			keep[routeHash(r.Model)] = true
		}
	}
	for h := range s.own {
		if !keep[h] {
			delete(s.own, h)
		}
	}
}

// pokeRollouts asks the session for a rollout pass now (dropped while one is pending).
func (s *Store) pokeRollouts() {
	select {
	case s.rolloutsNow <- struct{}{}:
	default:
	}
}

// putRolloutLocked applies a stored rollouts/ value (read or watched).
func (s *Store) putRolloutLocked(name string, kv *mvccpb.KeyValue) {
	route, err := url.PathUnescape(strings.TrimPrefix(name, DirRollouts))
	if err != nil || route == "" {
		s.log.Error("ignored a rollouts/ key that is not a path-escaped route id", "key", name)
		return
	}
	s.rolloutRev = max(s.rolloutRev, kv.ModRevision)
	cur, ok := s.rollouts[route]
	if ok && cur.rev >= kv.ModRevision {
		return
	}
	if !ok && len(s.rollouts) >= config.MaxRollouts {
		s.log.Error("stored rollouts over the store's bound: ignored", "bound", config.MaxRollouts, "route", errs.Echo(route))
		return
	}
	st, err := rollout.DecodeStored(kv.Value)
	if err != nil {
		s.log.Error("ignored an invalid stored rollout; the last one applied stays", "route", errs.Echo(route), "err", err)
		return
	}
	s.rollouts[route] = storedRollout{rev: kv.ModRevision, st: st}
}

// deleteRolloutLocked applies a watched delete of a rollouts/ key.
func (s *Store) deleteRolloutLocked(name string, rev int64) {
	if route, err := url.PathUnescape(strings.TrimPrefix(name, DirRollouts)); err == nil {
		delete(s.rollouts, route)
	}
	s.rolloutRev = max(s.rolloutRev, rev)
}

// putWindowsLocked applies another replica's rollout_windows/ value.
func (s *Store) putWindowsLocked(name string, val []byte) {
	id := strings.TrimPrefix(name, DirRolloutWindows)
	if id == s.cfg.Self.ID {
		return // this replica's own are s.own
	}
	if _, ok := s.windows[id]; !ok && len(s.windows) >= s.maxReplicas {
		s.log.Error("rollout window entries over the store's bound: ignored", "bound", s.maxReplicas)
		return
	}
	ws, err := decodeWindows(val)
	if err != nil {
		s.log.Error("ignored an unreadable rollout_windows/ entry: the decider waits out the grace for it", "replica", id, "err", err)
		delete(s.windows, id)
		return
	}
	s.windows[id] = ws
}

// setLeaderLocked applies the rollout_leader key as of revision rev (kv nil: there is none),
// unless something newer is known.
func (s *Store) setLeaderLocked(kv *mvccpb.KeyValue, rev int64) {
	if rev < s.leaderRev {
		return
	}
	s.leaderRev = rev
	id, lease := "", int64(0)
	if kv != nil {
		id, lease = string(kv.Value), kv.Lease
		if !config.ValidReplicaID(id) {
			s.log.Error("the rollout_leader key does not name a replica", "len", len(kv.Value))
			id = "?"
		}
	}
	if id != s.leader && id == s.cfg.Self.ID {
		s.log.Info("this replica decides the rollouts")
	}
	s.leader, s.leaderLease = id, lease
}

// decidesLocked reports whether this replica holds rollout_leader under the lease it won it
// with.
func (s *Store) decidesLocked() bool {
	return s.leader == s.cfg.Self.ID && s.deciderLease != 0 && s.leaderLease == int64(s.deciderLease)
}

// pushRolloutsLocked hands the router the stored states.
func (s *Store) pushRolloutsLocked() {
	if s.cfg.Apply.Rollouts == nil {
		return
	}
	states := make(map[string]rollout.Stored, len(s.rollouts))
	for route, r := range s.rollouts {
		states[route] = r.st
	}
	decider := s.leader
	if decider == "?" {
		decider = ""
	}
	s.cfg.Apply.Rollouts(uint64(s.rolloutRev), decider, states)
}

func (s *Store) rolloutKey(route string) string {
	return s.prefix + DirRollouts + url.PathEscape(route)
}

// rolloutWrite is one change the decider stores: route's state (nil: delete it) if its key is
// still at rev (0: absent).
type rolloutWrite struct {
	route string
	rev   int64
	val   *rollout.Stored
}

// planRollouts is the decider's pass at now: a state for each rollout route without one of its
// spec (a new or changed rollout starts at its first step), a verdict for each window that has
// ended once every live replica's counts for it are in or grace has passed since its end, and
// a delete for each state of a route that no longer has a rollout. It returns the writes and
// when the next pass is owed (zero: none).
func planRollouts(now time.Time, specs map[string]rollout.Spec, stored map[string]storedRollout,
	reports map[string]map[uint64]closedWindow, live []string, grace time.Duration) ([]rolloutWrite, time.Time) {
	var writes []rolloutWrite
	var next time.Time
	owe := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for route, spec := range specs {
		cur, ok := stored[route]
		if !ok || !cur.st.Fits(spec) {
			writes = append(writes, rolloutWrite{route, cur.rev, &rollout.Stored{Spec: rollout.SpecKey(spec), State: rollout.Start(now)}})
			owe(now.Add(spec.Interval))
			continue
		}
		st := cur.st.State
		if st.Status != rollout.Running {
			continue
		}
		due := st.WindowStart.Add(spec.Interval)
		if now.Before(due) {
			owe(due)
			continue
		}
		h, w := routeHash(route), st.WindowStart.UnixNano()
		var c, b rollout.Tally
		all := true
		for _, id := range live {
			rep, ok := reports[id][h]
			if !ok || rep.window != w {
				all = false
				continue
			}
			c, b = c.Add(rep.canary), b.Add(rep.baseline)
		}
		if g := due.Add(min(grace, spec.Interval/2)); !all && now.Before(g) {
			owe(g)
			continue
		}
		ns := st.Clone()
		ns.DecideAt(spec, due, now, c.Counts(), b.Counts())
		writes = append(writes, rolloutWrite{route, cur.rev, &rollout.Stored{Spec: cur.st.Spec, State: ns}})
		if ns.Status == rollout.Running {
			owe(ns.WindowStart.Add(spec.Interval))
		}
	}
	for route, cur := range stored {
		if _, ok := specs[route]; !ok {
			writes = append(writes, rolloutWrite{route: route, rev: cur.rev})
		}
	}
	slices.SortFunc(writes, func(a, b rolloutWrite) int { return strings.Compare(a.route, b.route) })
	return writes, next
}

// specsLocked are the applied route table's rollouts by route id.
func (s *Store) specsLocked() map[string]rollout.Spec {
	specs := make(map[string]rollout.Spec)
	for _, r := range s.routes.rows {
		if r.Rollout != nil && len(specs) < config.MaxRollouts {
			specs[r.Model] = r.Rollout.Spec()
		}
	}
	return specs
}

// rolloutPass is the session's rollout work: race for rollout_leader when no one holds it,
// publish this replica's closed windows when they changed (published: what this session last
// put), and, as the decider, store what planRollouts owes. It returns what is published, when
// the next pass is owed (zero: none), and, when it just won rollout_leader, the keep-alive of
// the lease it holds it under.
func (s *Store) rolloutPass(ctx context.Context, published []byte) ([]byte, time.Time, <-chan *clientv3.LeaseKeepAliveResponse, error) {
	s.mu.Lock()
	lease, noLeader := s.lease, s.leader == ""
	s.mu.Unlock()
	var ka <-chan *clientv3.LeaseKeepAliveResponse
	if noLeader {
		var err error
		if ka, err = s.campaign(ctx); err != nil {
			return published, time.Time{}, nil, err
		}
	}
	published, err := s.publishWindows(ctx, lease, published)
	if err != nil {
		return published, time.Time{}, ka, err
	}
	s.mu.Lock()
	if !s.decidesLocked() {
		s.mu.Unlock()
		return published, time.Time{}, ka, nil
	}
	reports := make(map[string]map[uint64]closedWindow, len(s.windows)+1)
	for id, ws := range s.windows {
		reports[id] = ws
	}
	reports[s.cfg.Self.ID] = s.own
	live := make([]string, 0, len(s.replicas)+1)
	for id := range s.replicas {
		live = append(live, id)
	}
	if _, ok := s.replicas[s.cfg.Self.ID]; !ok {
		live = append(live, s.cfg.Self.ID)
	}
	now, fence := s.cfg.Clock.Now(), s.deciderLease
	writes, next := planRollouts(now, s.specsLocked(), maps.Clone(s.rollouts), reports, live, RolloutGrace)
	s.mu.Unlock()
	for _, w := range writes {
		if err := s.storeRollout(ctx, w, fence, true); err != nil {
			return published, time.Time{}, ka, err
		}
	}
	return published, next, ka, nil
}

// deciderTTL is the TTL (seconds) of the lease the decider holds rollout_leader under: half
// the replicas' lease TTL, at least 1 s. When the decider dies, another takes over within it
// (and etcd's sweep of expired leases, every 500 ms; etcd raises a TTL under its minimum,
// 1.5 s at its default election timeout): inside the lease TTL after which its replica leaves.
func (s *Store) deciderTTL() int64 { return max(int64(s.cfg.Cluster.LeaseTTL/time.Second)/2, 1) }

// campaign creates rollout_leader under a lease of its own (deciderTTL) unless someone holds
// it; won, it returns the lease's keep-alive (the session follows it), lost, it revokes the
// lease.
func (s *Store) campaign(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	k := s.key(KeyRolloutLeader)
	octx, cancel := s.op(ctx)
	defer cancel()
	g, err := s.c().Grant(octx, s.deciderTTL())
	if err != nil {
		return nil, fmt.Errorf("rollout_leader lease: %w", err)
	}
	resp, err := s.c().Txn(octx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, s.cfg.Self.ID, clientv3.WithLease(g.ID)), clientv3.OpGet(k)).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil || !resp.Succeeded {
		_, _ = s.c().Revoke(octx, g.ID) // best effort: it expires by itself
	}
	if err != nil {
		return nil, fmt.Errorf("rollout_leader: %w", err)
	}
	var ka <-chan *clientv3.LeaseKeepAliveResponse
	if resp.Succeeded {
		if ka, err = s.c().KeepAlive(ctx, g.ID); err != nil {
			return nil, fmt.Errorf("rollout_leader lease: %w", err)
		}
	}
	rr := resp.Responses[len(resp.Responses)-1].GetResponseRange()
	s.mu.Lock()
	defer s.mu.Unlock()
	if resp.Succeeded {
		s.deciderLease = g.ID
	}
	if rr != nil && len(rr.Kvs) > 0 {
		s.setLeaderLocked(rr.Kvs[0], rr.Kvs[0].ModRevision)
		s.pushRolloutsLocked()
	}
	return ka, nil
}

// publishWindows puts this replica's closed windows of the table's rollout routes under its
// lease when they changed since last.
func (s *Store) publishWindows(ctx context.Context, lease clientv3.LeaseID, last []byte) ([]byte, error) {
	s.mu.Lock()
	s.pruneOwnLocked()
	if len(s.own) == 0 && last == nil {
		s.mu.Unlock()
		return nil, nil
	}
	val := encodeWindows(s.own)
	s.mu.Unlock()
	if bytes.Equal(val, last) {
		return last, nil
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	if _, err := s.c().Put(octx, s.key(DirRolloutWindows+s.cfg.Self.ID), string(val), clientv3.WithLease(lease)); err != nil {
		return last, fmt.Errorf("publish rollout windows: %w", err)
	}
	return val, nil
}

// storeRollout stores one write if the state's key is still at w.rev — and, for the decider
// (fenced), if this replica still holds rollout_leader under lease — and applies it here at
// once. A write that lost the race is not an error: the watch brings the state that won
// (fenced), or errs.ErrEtagMismatch (an operator's).
func (s *Store) storeRollout(ctx context.Context, w rolloutWrite, lease clientv3.LeaseID, fenced bool) error {
	k := s.rolloutKey(w.route)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", w.rev)}
	if fenced {
		cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(s.key(KeyRolloutLeader)), "=", int64(lease)))
	}
	op := clientv3.OpDelete(k)
	if w.val != nil {
		val, err := w.val.Encode()
		if err != nil {
			return err
		}
		op = clientv3.OpPut(k, string(val))
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.c().Txn(octx).If(cmps...).Then(op).Commit()
	if err != nil {
		return fmt.Errorf("store the rollout of %s: %w", errs.Echo(w.route), err)
	}
	if !resp.Succeeded {
		if fenced {
			return nil
		}
		return fmt.Errorf("the rollout of %s changed meanwhile; read it again: %w", errs.Echo(w.route), errs.ErrEtagMismatch)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rev := resp.Header.Revision
	if w.val == nil {
		s.deleteRolloutLocked(DirRollouts+url.PathEscape(w.route), rev)
	} else if cur, ok := s.rollouts[w.route]; !ok || cur.rev < rev {
		s.rollouts[w.route] = storedRollout{rev: rev, st: *w.val}
		s.rolloutRev = max(s.rolloutRev, rev)
	}
	s.pushRolloutsLocked()
	return nil
}

// RolloutAction stores an operator's pause, resume, promote or abort of route's rollout (R25)
// for every replica, when ifMatch (if given) is the rollouts' version (the stored states'
// newest revision). A rollout with no state stored yet is acted on from its first step.
// Errors wrap errs.ErrNotFound (no rollout on route), errs.ErrInvalidRequest (an unknown action,
// an ended rollout), errs.ErrEtagMismatch, or ErrUnavailable.
func (s *Store) RolloutAction(route, action string, ifMatch *uint64) error {
	if s.connected() == nil {
		return ErrUnavailable
	}
	s.mu.Lock()
	spec, ok := s.specsLocked()[route]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("no rollout on route %s: %w", errs.Echo(route), errs.ErrNotFound)
	}
	if ifMatch != nil && *ifMatch != uint64(s.rolloutRev) {
		defer s.mu.Unlock()
		return fmt.Errorf("the rollouts are at version %d, If-Match names %d: %w", s.rolloutRev, *ifMatch, errs.ErrEtagMismatch)
	}
	now := s.cfg.Clock.Now()
	cur := s.rollouts[route]
	st := rollout.Start(now)
	if cur.st.Fits(spec) {
		st = cur.st.State.Clone()
	}
	lease := s.lease
	s.mu.Unlock()
	_, did, err := st.Act(spec, action, now)
	if err != nil {
		return fmt.Errorf("route %s: %v: %w", errs.Echo(route), err, errs.ErrInvalidRequest)
	}
	if !did {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	err = s.storeRollout(ctx, rolloutWrite{route: route, rev: cur.rev, val: &rollout.Stored{Spec: rollout.SpecKey(spec), State: st}}, lease, false)
	if err != nil && !errors.Is(err, errs.ErrEtagMismatch) {
		return s.unavailable("rollout "+action, err)
	}
	if err == nil {
		s.log.Info("rollout action stored", "route", route, "action", action)
	}
	return err
}
