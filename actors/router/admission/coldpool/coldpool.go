// Package coldpool is the cold_pool admission classifier (SPEC R10.6; COLD-POOL.md §1): it tags
// requests Warm or Cold by their uncached prompt size and gates Cold prefills onto a small,
// stable pool of workers. It parses its own keys of [admission] classifier (ParseConfig) and is
// registered by name in actors/router/admission/classifiers.
package coldpool

import (
	"cmp"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// Lane is the classifier-named lane Cold requests wait in; the queue's per-lane limits for
// it come from Policy.LaneLimits.
const Lane = "cold"

// Cold Pool tags (Request.Tag). An unclassified request has no tag.
const (
	TagWarm = "warm"
	TagCold = "cold"
)

// The Cold Pool gate's wait kinds.
var (
	// WaitClean: a Cold head waits for a pool member with no active Warm work, at most
	// until its soft drain timeout.
	WaitClean = admission.NewWait("cold_waiting_for_clean_member")
	// WaitBusy: a Cold head may go to some member, but every such member is full.
	WaitBusy = admission.NewWait("cold_pool_busy")
	// WaitWarmSteered: a Warm head's workers outside the pool are all full while a pool
	// member has room.
	WaitWarmSteered = admission.NewWait("warm_steered_off_pool")
)

const (
	// coldRecheck is the gate's periodic recheck: upstream caps the Cold Pool's at 100 ms.
	coldRecheck = 100 * time.Millisecond
	// coldRecordTTL: a Cold request classified this long ago and never enqueued nor dispatched
	// was turned away (e.g. over its lane's limit); its record is dropped at the next sweep.
	coldRecordTTL = time.Minute
	// coldSweepMin is the record count below which no sweep runs.
	coldSweepMin = 256
)

// Config configures the Cold Pool policy (R10.6). ParseConfig validates it; the policy only
// treats negative durations and worker counts as zero.
type Config struct {
	// ColdThresholdTokens: a prompt under it is Warm; a prompt whose uncached part (prompt
	// minus the best cached prefix) reaches it is Cold; anything else is unclassified.
	ColdThresholdTokens int
	// Workers is the wanted pool size, clamped to [1, max(⌊n/3⌋, 1)] for n ≥ 2 workers (no pool
	// below 2). 0 is the baseline: Warm/Cold tags and the Cold lane, no containment, no holds.
	Workers int
	// SoftDrainTimeout: once this long has passed since a Cold request was enqueued
	// (inclusive; 0 = at once), any non-full member may take it, Warm work or not.
	SoftDrainTimeout time.Duration
	// SteerWarm keeps Warm off the pool while Cold is pending, and off the workers running
	// Cold otherwise.
	SteerWarm bool
	// MaxWait and QueueLimit are the Cold lane's own limits (GATE-PITFALLS 15); the queue
	// applies them through LaneLimits.
	MaxWait    time.Duration
	QueueLimit int
}

// DefaultConfig is the configuration of a classifier table that gives only the threshold
// (which has no default): the defaults written in contracts/runtime.schema.json.
func DefaultConfig() Config {
	return Config{Workers: 1, SteerWarm: true, QueueLimit: 256, MaxWait: 60 * time.Second}
}

// ParseConfig reads the cold_pool keys of [admission] classifier (raw: the table without
// type), filling DefaultConfig's values for absent keys:
//
//	cold_threshold_tokens  integer >= 1, required   → ColdThresholdTokens
//	workers                integer >= 0             → Workers
//	soft_drain_timeout     duration >= 0 ("0s")     → SoftDrainTimeout
//	steer_warm             boolean                  → SteerWarm
//	cold_queue_limit       integer >= 0             → QueueLimit
//	cold_max_wait          duration > 0             → MaxWait
//
// Every problem is an *admission.OptionError naming its key, e.g.
// "admission.classifier.cold_max_wait: must be > 0"; an unknown key is one too.
func ParseConfig(raw map[string]any) (Config, error) {
	cfg := DefaultConfig()
	o := admission.NewOptions(raw)
	if !o.Has("cold_threshold_tokens") {
		o.Fail("cold_threshold_tokens", `required with type = "cold_pool"`)
	}
	o.Int("cold_threshold_tokens", &cfg.ColdThresholdTokens, 1)
	o.Int("workers", &cfg.Workers, 0)
	o.Duration("soft_drain_timeout", &cfg.SoftDrainTimeout, true)
	o.Bool("steer_warm", &cfg.SteerWarm)
	o.Int("cold_queue_limit", &cfg.QueueLimit, 0)
	o.Duration("cold_max_wait", &cfg.MaxWait, false)
	return cfg, o.Err()
}

// Factory is the cold_pool classifier's admission.Factory: ParseConfig, then New on the
// injected clock.
func Factory(raw map[string]any, env admission.Env) (admission.Policy, error) {
	cfg, err := ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	return New(cfg, env.Now), nil
}

// Policy is the Cold Pool policy (R10.6; COLD-POOL.md §1): a classifier that tags requests
// Warm or Cold by their uncached prompt size, and a gate that keeps long cache-missing (Cold)
// prefills on a small, stable pool of workers, each Cold request waiting until a member has no
// Warm work, while Warm work is steered off the pool.
//
// Containment. A Cold request gets its own lane (Lane) and its allowed workers narrowed to
// the pool members of its route (∩ the caller's allowed set). When that leaves no member — a
// route of fewer than 2 workers, or a caller's set with no member — or in the baseline
// (Workers = 0), it keeps the tag and the lane but its allowed set is left alone and the gate
// treats it as ordinary work: it is never held and counts as non-Cold work on its worker.
//
// Ledger. Updated in the same actor turn as the event (GATE-PITFALLS 14):
//   - active Cold per worker and active non-Cold ("Warm work": Warm, unclassified and uncontained
//     Cold) per worker, from Dispatched and Completed;
//   - pending Cold: contained Cold requests in the queue, from Enqueued, and down again at
//     Dispatched or Left. Each pending request also marks every member of its route's pool,
//     which is the Warm avoid set while it waits.
//
// The queue calls Enqueued and Left (Policy is an admission.QueueObserver). The request carries
// no enqueue time, so the policy keeps one per Cold request: Classify records the arrival time
// (the gate may be asked at arrival, before the request is queued), Enqueued replaces it with
// the enqueue time, and Dispatched or Left drop the record. A request the queue turns away
// after Classify gets none of those calls; its record is dropped by a sweep, run from Classify
// once the records have doubled since the last one, of records older than a minute that were
// never enqueued. So memory follows the Cold requests queued or in flight.
//
// Every method is called on the router actor's goroutine; Policy is not safe for concurrent
// use.
type Policy struct {
	cfg Config
	now func() time.Time

	// Bounds: cold holds the Cold requests queued or about to be (the lane's queue_limit),
	// plus those turned away after Classify until a sweep (at most coldRecordTTL old, once the
	// records have doubled); active one per dispatched request not yet completed; the
	// per-worker counts are deleted at zero (coldDec). All are empty when nothing is queued
	// or in flight (Tracked).
	cold    map[uint64]*coldRecord // Cold requests classified, not yet dispatched nor gone
	sweepAt int                    // len(cold) that triggers the next sweep

	active     map[uint64]coldActive // request key → where it runs and what it counts as
	activeCold map[string]int        // worker → contained Cold in flight
	activeWarm map[string]int        // worker → other work in flight
	pending    int                   // contained Cold requests queued
	pendingOn  map[string]int        // worker → queued contained Cold whose pool holds it
}

// coldRecord is what the policy keeps of one Cold request until it is dispatched or leaves.
type coldRecord struct {
	contained bool
	pool      []string  // the full pool of its route: Warm avoids it while this waits
	since     time.Time // arrival, then enqueue time: the soft drain counts from it
	enqueued  bool      // counted in pending
}

// coldActive is one dispatched request in the ledger.
type coldActive struct {
	worker string
	cold   bool
}

var (
	_ admission.Policy        = (*Policy)(nil)
	_ admission.Gate          = (*Policy)(nil)
	_ admission.QueueObserver = (*Policy)(nil)
	_ admission.LaneLimiter   = (*Policy)(nil)
	_ admission.PrefixReader  = (*Policy)(nil)
	_ admission.Factory       = Factory
)

// New returns a Cold Pool policy reading time from now (time.Now when nil).
func New(cfg Config, now func() time.Time) *Policy {
	if now == nil {
		now = time.Now
	}
	cfg.Workers = max(cfg.Workers, 0)
	cfg.SoftDrainTimeout = max(cfg.SoftDrainTimeout, 0)
	return &Policy{
		cfg:        cfg,
		now:        now,
		cold:       make(map[uint64]*coldRecord),
		sweepAt:    coldSweepMin,
		active:     make(map[uint64]coldActive),
		activeCold: make(map[string]int),
		activeWarm: make(map[string]int),
		pendingOn:  make(map[string]int),
	}
}

// Gate returns the policy itself.
func (p *Policy) Gate() admission.Gate { return p }

// NeedsPrefixIndex is true: Classify reads the best cached prefix (admission.PrefixReader),
// in the baseline too.
func (p *Policy) NeedsPrefixIndex() bool { return true }

// LaneLimits is the Cold lane's own queue limit and max wait (admission.LaneLimiter).
func (p *Policy) LaneLimits() map[string]admission.LaneLimit {
	return map[string]admission.LaneLimit{Lane: {QueueLimit: p.cfg.QueueLimit, MaxWait: p.cfg.MaxWait}}
}

// PoolSize is the pool size for n distinct workers: 0 when n < 2 or workers ≤ 0 (the
// baseline), else clamp(workers, 1, max(⌊n/3⌋, 1)). "A third" is the floor (R10.6): with
// workers = 10, n = 0…9 gives 0 0 1 1 1 1 2 2 2 3.
func PoolSize(n, workers int) int {
	if n < 2 || workers <= 0 {
		return 0
	}
	return min(workers, max(n/3, 1))
}

// PoolMembers is the pool of size members among workers, by rendezvous hashing on the workers'
// stable ids: each distinct id gets a fixed score (coldScore), the size highest scores win,
// equal scores going to the lower id. It returns the members in id order (nil for size ≤ 0).
//
// A member's place depends only on its own id, never on the others, so removing a non-member
// never changes the members while the size stays, adding a worker changes at most one, and a
// worker that restarts under the same id keeps its place (GATE-PITFALLS 13).
func PoolMembers(workers []string, size int) []string {
	if size <= 0 {
		return nil
	}
	return coldTop(coldRank(workers, coldScore), size)
}

// coldTop is the first size ids of a ranking, in id order (nil when none).
func coldTop(ranked []string, size int) []string {
	n := min(max(size, 0), len(ranked))
	if n == 0 {
		return nil
	}
	out := ranked[:n:n]
	slices.Sort(out)
	return out
}

// coldScore is a worker id's rendezvous score: the id's xxHash64, plus the golden-ratio
// increment 0x9e3779b97f4a7c15, through the SplitMix64 finalizer (shifts 30/27/31), as upstream
// scores its worker ids. It has no per-process key on purpose: membership must be the same in
// every gateway and after every restart, and a client cannot choose worker ids.
func coldScore(id string) uint64 {
	z := xxhash.Sum64String(id) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// coldRank returns the distinct ids, highest score first, equal scores by lower id.
func coldRank(ids []string, score func(string) uint64) []string {
	type scored struct {
		id string
		s  uint64
	}
	all := make([]scored, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			all = append(all, scored{id, score(id)})
		}
	}
	slices.SortFunc(all, func(a, b scored) int {
		if c := cmp.Compare(b.s, a.s); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	out := make([]string, len(all))
	for i, x := range all {
		out[i] = x.id
	}
	return out
}

// coldPoolOf is the pool of a route's workers under the configured size.
func (p *Policy) coldPoolOf(route []string) []string {
	ranked := coldRank(route, coldScore) // distinct ids: n counts each worker once
	return coldTop(ranked, PoolSize(len(ranked), p.cfg.Workers))
}

// Classify tags the request (R10.6): Warm when its prompt is under the threshold (the cache is
// not read); otherwise Cold when prompt − best cached prefix over its allowed workers (route ∩
// Allowed) reaches the threshold, and unclassified (no tag) when it does not — a long prompt
// that is mostly cached routes normally. A Cold request gets Lane and, when its route has a
// pool with a member it may use, Allowed = those members. Class is never changed.
func (p *Policy) Classify(r *admission.Request, route []string, cached func(workers []string) int) {
	r.Tag = ""
	if r.PromptTokens < p.cfg.ColdThresholdTokens {
		r.Tag = TagWarm
		return
	}
	allowed := admission.Intersect(route, r.Allowed)
	best := 0
	if cached != nil {
		best = cached(allowed)
	}
	if r.PromptTokens-best < p.cfg.ColdThresholdTokens {
		return
	}
	r.Tag, r.Lane = TagCold, Lane
	if p.cfg.Workers == 0 {
		return // baseline: no containment, no state
	}
	now := p.now()
	if len(p.cold) >= p.sweepAt {
		p.sweep(now)
	}
	if old := p.cold[r.Key]; old != nil {
		p.forget(r.Key, old) // classified again: the new answer replaces the old
	}
	rec := &coldRecord{pool: p.coldPoolOf(route), since: now}
	var members []string
	for _, w := range allowed {
		if _, ok := slices.BinarySearch(rec.pool, w); ok {
			members = append(members, w)
		}
	}
	if len(members) > 0 {
		r.Allowed, rec.contained = members, true
	}
	p.cold[r.Key] = rec
}

// sweep drops the records of Cold requests that were classified long ago and never enqueued
// nor dispatched (turned away after Classify). They never counted as pending.
func (p *Policy) sweep(now time.Time) {
	for id, rec := range p.cold {
		if !rec.enqueued && now.Sub(rec.since) >= coldRecordTTL {
			delete(p.cold, id)
		}
	}
	p.sweepAt = max(2*len(p.cold), coldSweepMin)
}

// Enqueued records a Cold request's enqueue time and counts it as pending (admission.QueueObserver).
func (p *Policy) Enqueued(r *admission.Request) {
	if r.Tag != TagCold || p.cfg.Workers == 0 {
		return
	}
	rec := p.cold[r.Key]
	if rec == nil {
		// Not classified here (or swept): assume it was contained to its allowed set.
		rec = &coldRecord{contained: true, pool: slices.Clone(r.Allowed)}
		p.cold[r.Key] = rec
	}
	if rec.enqueued {
		return
	}
	rec.since, rec.enqueued = p.now(), true
	if rec.contained {
		p.pending++
		for _, w := range rec.pool {
			p.pendingOn[w]++
		}
	}
}

// Left forgets a queued request that leaves without being dispatched (cancelled or expired);
// the queue may call it for a request it turned away after Classify too (admission.QueueObserver).
func (p *Policy) Left(r *admission.Request) {
	if rec := p.cold[r.Key]; rec != nil {
		p.forget(r.Key, rec)
	}
}

// forget drops a Cold request's record and its pending count.
func (p *Policy) forget(id uint64, rec *coldRecord) {
	if rec.enqueued && rec.contained {
		p.pending--
		for _, w := range rec.pool {
			coldDec(p.pendingOn, w)
		}
	}
	delete(p.cold, id)
}

// Dispatched moves the request from pending (if it was queued) to the worker's active Cold or
// active Warm work.
func (p *Policy) Dispatched(r *admission.Request, worker string) {
	if p.cfg.Workers == 0 {
		return
	}
	isCold := false
	if rec := p.cold[r.Key]; rec != nil {
		isCold = rec.contained
		p.forget(r.Key, rec)
	} else {
		isCold = r.Tag == TagCold
	}
	if prev, ok := p.active[r.Key]; ok {
		p.release(prev) // dispatched again: the last worker counts
	}
	a := coldActive{worker: worker, cold: isCold}
	p.active[r.Key] = a
	p.acquire(a)
}

func (p *Policy) acquire(a coldActive) {
	if a.cold {
		p.activeCold[a.worker]++
	} else {
		p.activeWarm[a.worker]++
	}
}

// Moved carries a dispatched request's work, Cold or not, to the worker it runs on now.
func (p *Policy) Moved(r *admission.Request, _, to string) {
	a, ok := p.active[r.Key]
	if !ok {
		return
	}
	p.release(a)
	a.worker = to
	p.active[r.Key] = a
	p.acquire(a)
}

// Completed takes a dispatched request off its worker. An unknown request (never dispatched,
// or already completed) changes nothing.
func (p *Policy) Completed(r *admission.Request, _ string) {
	a, ok := p.active[r.Key]
	if !ok {
		return
	}
	delete(p.active, r.Key)
	p.release(a)
}

func (p *Policy) release(a coldActive) {
	if a.cold {
		coldDec(p.activeCold, a.worker)
	} else {
		coldDec(p.activeWarm, a.worker)
	}
}

// coldDec decrements m[k], deleting it at zero (never below).
func coldDec(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

// Recheck is 100 ms, upstream's cap for the Cold Pool (a Warm head held off the pool is
// released when Cold stops pending, which is no capacity change); 0 in the baseline, which
// never holds.
func (p *Policy) Recheck() time.Duration {
	if p.cfg.Workers == 0 {
		return 0
	}
	return coldRecheck
}

// Check answers for a lane head: Cold by checkCold, Warm by checkWarm, anything else Go.
func (p *Policy) Check(head *admission.Request, v admission.View) admission.Decision {
	if p.cfg.Workers == 0 {
		return admission.Decision{Go: true}
	}
	switch head.Tag {
	case TagCold:
		return p.checkCold(head, v)
	case TagWarm:
		return p.checkWarm(v)
	}
	return admission.Decision{Go: true}
}

// checkCold: the candidates are the head's pool members. It goes to a clean member (no active
// Warm work) that is not full, the least loaded (ties to the lower id). Once the soft drain
// timeout has passed since enqueue (inclusive) it goes to any non-full member, least loaded
// first. Otherwise it is held: until the timeout when that is still ahead, or, past it with
// every member full, until capacity frees. An uncontained Cold request always goes. The wait
// counts from the record's time: arrival when asked before the queue has the request, then
// its enqueue time.
func (p *Policy) checkCold(head *admission.Request, v admission.View) admission.Decision {
	now := v.Now()
	// With no record (never classified here, or swept as turned away) the wait's start is
	// unknown: it counts as over, so such a head is never held for long.
	var since time.Time
	if rec := p.cold[head.Key]; rec != nil {
		if !rec.contained {
			return admission.Decision{Go: true}
		}
		since = rec.since
	}
	cands := v.Workers()
	if len(cands) == 0 {
		return admission.Decision{Go: true} // nothing to choose among: the queue's capacity check decides
	}
	clean := func(w admission.Worker) bool { return p.activeWarm[w.ID] == 0 }
	if w, ok := coldLeast(cands, clean); ok {
		return admission.Decision{Go: true, Target: w}
	}
	deadline := since.Add(p.cfg.SoftDrainTimeout)
	if !now.Before(deadline) {
		if w, ok := coldLeast(cands, nil); ok {
			return admission.Decision{Go: true, Target: w}
		}
		return admission.Decision{Wait: WaitBusy}
	}
	wait := WaitClean
	if slices.ContainsFunc(cands, clean) {
		wait = WaitBusy // clean members exist, but all of them are full
	}
	return admission.Decision{Until: deadline, Wait: wait}
}

// checkWarm steers a Warm head (SteerWarm) off the avoid set: every pool member a pending Cold
// request waits for, and every worker running Cold. With no candidate in that set, or none
// outside it, the head goes untouched (the picker's own policy). Otherwise it goes with a soft
// target, the least-loaded non-full candidate outside the set; when all of those are full but
// an avoided one has room, it is held (until capacity frees or the recheck finds Cold gone) —
// the upstream rule: Warm waits for its preferred workers rather than landing on the pool.
// When every candidate is full it goes, and the queue's capacity check holds it.
func (p *Policy) checkWarm(v admission.View) admission.Decision {
	if !p.cfg.SteerWarm {
		return admission.Decision{Go: true}
	}
	var outside []admission.Worker
	avoided, avoidedFree := 0, false
	for _, w := range v.Workers() {
		if p.pendingOn[w.ID] > 0 || p.activeCold[w.ID] > 0 {
			avoided++
			avoidedFree = avoidedFree || !w.Full
			continue
		}
		outside = append(outside, w)
	}
	if avoided == 0 || len(outside) == 0 {
		return admission.Decision{Go: true}
	}
	if w, ok := coldLeast(outside, nil); ok {
		return admission.Decision{Go: true, Target: w}
	}
	if avoidedFree {
		return admission.Decision{Wait: WaitWarmSteered}
	}
	return admission.Decision{Go: true}
}

// coldLeast is the least-loaded non-full worker of ws that keep accepts (all when keep is nil),
// ties to the lower id.
func coldLeast(ws []admission.Worker, keep func(admission.Worker) bool) (string, bool) {
	var best *admission.Worker
	for i := range ws {
		w := &ws[i]
		if w.Full || (keep != nil && !keep(*w)) {
			continue
		}
		if best == nil || w.Load < best.Load || (w.Load == best.Load && w.ID < best.ID) {
			best = w
		}
	}
	if best == nil {
		return "", false
	}
	return best.ID, true
}

// Tracked counts the entries of the policy's ledgers (records, active requests, per-worker
// counts, pending): 0 once every request it has seen has ended or left.
func (p *Policy) Tracked() int {
	return len(p.cold) + len(p.active) + len(p.activeCold) + len(p.activeWarm) + p.pending + len(p.pendingOn)
}
