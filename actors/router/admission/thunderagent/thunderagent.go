// Package thunderagent is the thunderagent admission classifier (SPEC R15.1; the upstream
// facts in COLD-POOL.md §5): agent programs — a session's turns of reasoning (a request in
// flight) and acting (tool time between turns) — kept on workers whose KV capacity holds
// them, paused when a worker's programs outgrow it and resumed when room comes back, so that a
// program's prefix stays cached on its worker instead of being evicted and recomputed.
//
// It is a DispatchGate on the one admission queue: no queue and no scheduler tick of its own.
// The ledger is settled, in upstream's tick order, on an ask about a lane head (expire
// retained programs, clear assignments on workers gone, decide the head, greedy resume,
// forced resume, pause until safe) and kept on every event (Dispatched, Moved, Completed,
// Left). No request in flight is ever preempted: pausing only holds a program's next turn.
//
// The work per ask is bounded (issue 34): each worker's usage is a sum kept as programs
// change (ledger.go), not recomputed; retained programs wait in a heap by their retention
// deadline; and the settling steps (greedy resume, forced resume, pause until safe) run at
// most once per instant, pool, candidate workers and state of the pool's ledger — a held head
// asked again with nothing changed (every paused program's head, on every wake) costs a few
// lookups, not a pass over the programs. A second settling with nothing changed could only
// repeat the first one's decisions, or undo and redo them (a program paused by one settling's
// last step and resumed by the next one's first).
//
// Like every gate it is used from the router actor's goroutine only.
package thunderagent

import (
	"cmp"
	"crypto/rand"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// WaitPaused is the wait of a paused program's next turn.
var WaitPaused = admission.NewWait("program_paused")

// WaitTurn is the wait of a session's turn while its previous turn runs.
var WaitTurn = admission.NewWait("program_turn_running")

// Program states, as the admin view and the metrics name them.
const (
	StateReasoning = "reasoning"
	StateActing    = "acting"
	StatePaused    = "paused"
)

type state uint8

const (
	reasoning state = iota // a turn is queued or running
	acting                 // between turns
	paused                 // held: its next turn waits for room
)

var stateNames = [...]string{reasoning: StateReasoning, acting: StateActing, paused: StatePaused}

// program is one session's ledger entry.
type program struct {
	sid   uint64 // the session's key (sessionKey): fixed-size, never the client's string
	pool  string // the pool its turns go to: it is balanced against that pool's workers
	seq   uint64 // creation order: the stable order among equals
	state state
	// pausedFrom is what a paused program resumes as (reasoning when a turn waits).
	pausedFrom state
	worker     string // the worker it is assigned to ("": none)
	// tokens is its context: the last completed turn's usage (prompt and completion), else
	// the estimate of its current turn's prompt.
	tokens      int
	turnTokens  int       // the current turn's prompt estimate
	actingSince time.Time // when its last turn completed (zero: never)
	pausedSince time.Time // when it was first deferred or paused (zero: not paused)
	markPause   bool      // pause at its next completion (it was reasoning on an overfull worker)
	steps       int       // turns completed
	live        int       // its requests tracked now (queued or running)
	running     uint64    // the key of its turn in flight (0: none)
	// prior is the program as it was before its current turn was first decided, restored if
	// the turn is aborted; nil when the program was new then (an aborted first turn removes
	// it). priorFor is the request it was taken for.
	prior    *program
	priorFor uint64
	gone     bool // forgotten: out of the ledger (a tracked request may still point to it)
	// pin is the one worker its current turn may go to (a request allowed on one worker only:
	// a hard pin, never rerouted), "" when none. It is the turn's, set when the turn is first
	// decided and gone with it: a later turn free to go anywhere is resumed anywhere.
	pin string
	// ix is its place in the ledger's indexes (ledger.go); a rollback, which copies a whole
	// earlier program over it, keeps it.
	ix ix
}

// Policy is the thunderagent classifier and gate.
//
// Bounds (R19): programs holds at most max_tracked_requests programs (a new one beyond it
// evicts the oldest idle one or is refused), each forgotten at its final turn or, once
// session_retention has passed since its last turn, at the next ask or event; the indexes
// below hold each program at most once. reqs and final hold the tracked requests, at most
// max_tracked_requests (Classify refuses beyond), and keyOf the same requests' API keys;
// perKey is bounded by the configured API keys (an entry is deleted at 0). Tracked counts
// programs and requests: 0 once every request ended and every program expired (and keyOf and
// perKey are then empty too).
//
// Per-key share (R20): max_tracked_requests is shared among the API keys that have requests
// tracked: one key may hold at most ⌈max_tracked_requests / k⌉ of them, k those keys counting
// the new request's. A key alone may use them all; a second key's request is refused only if
// nothing is left, and from then on neither may take more than half. (Tracked requests are
// queued or running: none is pushed out; a key's max_in_flight bounds it outright.)
type Policy struct {
	cfg      Config
	now      func() time.Time
	programs map[uint64]*program // by session key (sessionKey of the session id)
	// pools are the programs' indexes by pool (ledger.go): bounded by the pools that have a
	// program (an emptied pool's entry is dropped).
	pools map[string]*poolLedger
	// retained is the programs that expire when their retention ends (between turns, none
	// tracked), by deadline; idle is the programs with no request tracked, in eviction order.
	// At most one entry per program in each.
	retained, idle progHeap
	// counts is the programs by state (Stats), kept with the indexes.
	counts [3]int
	// scratch slices reused by the settling steps (bounded by the programs, cleared after use).
	cands, set []*program
	lefts      []float64
	ids        []string            // liveWorkers' scratch (bounded by a pool's workers)
	reqs       map[uint64]*program // tracked requests (request key) → their program
	final      map[uint64]bool     // tracked final turns, whose program is already gone
	keyOf      map[uint64]int      // tracked requests (reqs and final) → their API key
	perKey     map[int]int         // tracked requests per API key
	seq        uint64
	key        [16]byte // for the admin view's session hashes
	pauses     uint64
	forced     uint64
	// settles counts the settlings (greedy resume, forced resume, pause until safe) so far.
	settles uint64
	// woken is the held heads of programs resumed since the queue last read them (Woken,
	// after every call into the gate): bounded by the tracked requests.
	woken []uint64
}

var (
	_ admission.Policy        = (*Policy)(nil)
	_ admission.Gate          = (*Policy)(nil)
	_ admission.QueueObserver = (*Policy)(nil)
	_ admission.Waker         = (*Policy)(nil)
)

// New returns an empty policy reading time from now.
func New(cfg Config, now func() time.Time) *Policy {
	p := &Policy{cfg: cfg, now: now, programs: make(map[uint64]*program), reqs: make(map[uint64]*program),
		final: make(map[uint64]bool), pools: make(map[string]*poolLedger), keyOf: make(map[uint64]int),
		perKey: make(map[int]int)}
	p.retained.slot, p.idle.slot = retainedHeap, idleHeap
	_, _ = rand.Read(p.key[:])
	return p
}

// Gate returns the policy itself.
func (p *Policy) Gate() admission.Gate { return p }

// Recheck is 0: a held head carries its own time (Decision.Until: its forced resume, or the
// next retention deadline that frees room), and capacity frees and completions are wakes.
func (p *Policy) Recheck() time.Duration { return 0 }

// Classify tracks a session's request (rule 1: a request without a session passes through).
// The tracked-request limit is enforced before any state is made (rule 3); a new program
// beyond the program limit (the same number) evicts the oldest idle program, or is refused.
func (p *Policy) Classify(r *admission.Request, _ []string, _ func([]string) int) {
	if r.SessionID == "" {
		return
	}
	if len(p.reqs)+len(p.final) >= p.cfg.MaxTrackedRequests {
		r.Refuse = fmt.Errorf("the thunderagent classifier tracks its limit of %d requests: %w", p.cfg.MaxTrackedRequests, admission.ErrQueueFull)
		return
	}
	if share := p.share(r.APIKey); p.perKey[r.APIKey] >= share {
		r.Refuse = fmt.Errorf("the thunderagent classifier tracks this API key's share of %d of its %d requests: %w", share, p.cfg.MaxTrackedRequests, admission.ErrQueueFull)
		return
	}
	sid := p.sessionKey(r.SessionID)
	pr := p.programs[sid]
	if pr == nil {
		if r.Final {
			return // the last turn of a program not tracked: nothing to free
		}
		if len(p.programs) >= p.cfg.MaxTrackedRequests && !p.evictOne() {
			r.Refuse = fmt.Errorf("the thunderagent classifier holds its limit of %d programs, none idle: %w", p.cfg.MaxTrackedRequests, admission.ErrQueueFull)
			return
		}
		p.seq++
		pr = &program{sid: sid, pool: r.Pool, seq: p.seq, state: reasoning, tokens: r.PromptTokens}
		p.programs[sid] = pr
	}
	pr.live++
	p.reqs[r.Key] = pr
	p.keyOf[r.Key] = r.APIKey
	p.perKey[r.APIKey]++
	p.reindex(pr)
}

// share is the most requests API key may have tracked (see Policy: Per-key share).
func (p *Policy) share(key int) int {
	k := len(p.perKey)
	if _, ok := p.perKey[key]; !ok {
		k++
	}
	return (p.cfg.MaxTrackedRequests + k - 1) / k
}

// KeyShare is API key's tracked requests and the most it may have tracked now.
func (p *Policy) KeyShare(key int) (tracked, share int) { return p.perKey[key], p.share(key) }

// forgetKey ends the per-key count of the tracked request key (it left reqs and final).
func (p *Policy) forgetKey(key uint64) {
	k, ok := p.keyOf[key]
	if !ok {
		return
	}
	delete(p.keyOf, key)
	if p.perKey[k]--; p.perKey[k] == 0 {
		delete(p.perKey, k)
	}
}

// evictOne removes the program with the oldest acting_since (never set first) that has no
// request queued or running (ties to the older program): the idle heap's first; false when
// every program has one.
func (p *Policy) evictOne() bool {
	victim := p.idle.top()
	if victim == nil {
		return false
	}
	p.forget(victim)
	return true
}

// Check decides a lane head, settling the ledger first (see the package comment).
func (p *Policy) Check(head *admission.Request, v admission.View) admission.Decision {
	pr := p.reqs[head.Key]
	if pr == nil {
		return admission.Decision{Go: true} // no session (or a final turn already decided)
	}
	if p.programs[pr.sid] != pr {
		// A turn queued behind its program's final turn: the program is gone, the turn is
		// not tracked any more and passes through.
		delete(p.reqs, head.Key)
		p.forgetKey(head.Key)
		pr.live--
		return admission.Decision{Go: true}
	}
	now := v.Now()
	ws := v.Workers()
	p.expire(now)
	pl := p.pools[pr.pool]
	live := p.liveWorkers(v, ws)
	p.clearGone(pl, live)
	if turn := p.turnOf(pr); turn != 0 && turn != head.Key {
		return admission.Decision{Wait: WaitTurn, SessionOnly: true} // rule 4
	}
	if pr.priorFor != head.Key {
		// The turn's first decision: what an abort of it restores.
		pr.priorFor, pr.prior = head.Key, nil
		if pr.steps > 0 {
			snap := *pr
			snap.prior = nil
			pr.prior = &snap
		}
		pr.pin = ""
		if len(head.Allowed) == 1 {
			pr.pin = head.Allowed[0]
		}
	}
	d, decided := p.admit(head, pr, ws, now)
	if !pl.sameWorkers(ws) || !pl.settledAt.Equal(now) || pl.settledVer != pl.ver {
		p.greedyResume(pr.pool, ws, now)
		p.forceTimedOut(pr.pool, ws, now)
		p.pauseUntilSafe(pr.pool, ws, now)
		p.settles++
		if pl = p.pools[pr.pool]; pl != nil {
			pl.settledAt, pl.settledVer = now, pl.ver
			pl.remember(ws)
		}
	}
	if pl = p.pools[pr.pool]; pl != nil && pl.sameLive(live) {
		// Nothing in this ask assigned a program to a worker outside ws, which are among the
		// live workers (every step places programs on ws's workers only): the next clearGone
		// with these live workers has nothing to drop until something else changes the pool.
		pl.clearedVer = pl.ver
	}
	if !decided && pr.state != paused && p.programs[pr.sid] == pr {
		// Resumed in this settling: decided again at once rather than at the next wake.
		d, _ = p.admit(head, pr, ws, now)
	}
	if !d.Go {
		d.Until = p.holdUntil(pr, now)
		// A paused program's turn goes only when a settling resumes the program (which names
		// it in Woken), at Until, or when the workers change: a capacity free need not ask
		// every such head, one per candidate set settles for all.
		d.GateWakes = pr.state == paused && p.programs[pr.sid] == pr
	}
	return d
}

// turnOf is the program's current turn (0: none): the one running, else the one decided and
// not yet ended. Rule 4 holds every other turn of the program, also one waiting in another
// class's lane, so a decision is never taken over a decision not yet settled.
func (p *Policy) turnOf(pr *program) uint64 {
	if pr.running != 0 {
		return pr.running
	}
	if pr.priorFor != 0 && p.reqs[pr.priorFor] == pr {
		return pr.priorFor
	}
	return 0
}

// admit is rule 5 for the head of program pr; decided is false when it was deferred.
func (p *Policy) admit(head *admission.Request, pr *program, ws []admission.Worker, now time.Time) (admission.Decision, bool) {
	live := func(id string) bool {
		return id != "" && slices.ContainsFunc(ws, func(w admission.Worker) bool { return w.ID == id })
	}
	if head.Final {
		// 5.1: the program ends here; its capacity is free at once and not restored if
		// this turn is aborted.
		target := pr.worker
		p.forget(pr)
		delete(p.reqs, head.Key)
		p.final[head.Key] = true
		if !live(target) {
			target = ""
		}
		return admission.Decision{Go: true, Target: target}, true
	}
	if pr.state == paused {
		return p.deferHead(pr, head, now), false // 5.2
	}
	input := head.PromptTokens + p.cfg.BufferPerProgram
	if !slices.ContainsFunc(ws, func(w admission.Worker) bool { return w.Capacity > 0 }) {
		return p.release(pr, head, live(pr.worker), pr.worker), true // 5.3: no capacity known anywhere
	}
	if live(pr.worker) {
		return p.release(pr, head, true, pr.worker), true // 5.4: continuing where it is
	}
	if pr.steps == 0 && p.anyPaused(pr.pool) {
		return p.deferHead(pr, head, now), false // 5.5: a new program waits behind paused ones
	}
	pl := p.pools[pr.pool]
	if len(head.Allowed) == 1 {
		// 5.6: a hard pin goes only where it is pinned, and only with room there.
		w := head.Allowed[0]
		for _, x := range ws {
			if x.ID == w && x.Capacity > 0 && float64(x.Capacity)-p.pauseUse(pl, w) >= float64(input) {
				return p.release(pr, head, true, w), true
			}
		}
		return p.deferHead(pr, head, now), false
	}
	best, bestUsed := "", 0.0
	for _, w := range ws { // 5.7: the least-used worker that fits, ties to the lowest id
		used := p.pauseUse(pl, w.ID)
		if w.Capacity <= 0 || float64(w.Capacity)-used < float64(input) {
			continue
		}
		if best == "" || used < bestUsed || (used == bestUsed && w.ID < best) {
			best, bestUsed = w.ID, used
		}
	}
	if best == "" {
		return p.deferHead(pr, head, now), false
	}
	return p.release(pr, head, true, best), true
}

// release lets the head go, soft-targeted at worker when target is set.
func (p *Policy) release(pr *program, head *admission.Request, target bool, worker string) admission.Decision {
	pr.state, pr.pausedSince, pr.turnTokens = reasoning, time.Time{}, head.PromptTokens
	d := admission.Decision{Go: true}
	if target {
		pr.worker, d.Target = worker, worker
	}
	p.reindex(pr)
	return d
}

// deferHead is rule 6's defer: the program is paused (since the first time), unassigned; its
// waiting turn's prompt is what a resume must find room for.
func (p *Policy) deferHead(pr *program, head *admission.Request, now time.Time) admission.Decision {
	pr.turnTokens = head.PromptTokens
	p.pause(pr, reasoning, now)
	return admission.Decision{Wait: WaitPaused}
}

// pause holds pr, which resumes as from; its assignment is cleared.
func (p *Policy) pause(pr *program, from state, now time.Time) {
	if pr.state != paused {
		pr.pausedFrom = from
	}
	pr.state, pr.worker = paused, ""
	if pr.pausedSince.IsZero() {
		pr.pausedSince = now
	}
	p.reindex(pr)
}

// holdUntil is when a held head of pr must be asked again at the latest: its forced resume,
// or the next retention deadline (which frees room), whichever comes first.
func (p *Policy) holdUntil(pr *program, now time.Time) time.Time {
	var at time.Time
	if pr.state == paused {
		at = pr.pausedSince.Add(p.cfg.ResumeTimeout)
	}
	if d, ok := p.nextRetention(now); ok && (at.IsZero() || d.Before(at)) {
		at = d
	}
	return at
}

// expire forgets acting programs idle past their retention (rule 9.1), on read: the first
// ones of the retention heap, one step each.
func (p *Policy) expire(now time.Time) {
	for pr := p.retained.top(); pr != nil && p.expired(pr, now); pr = p.retained.top() {
		p.forget(pr)
	}
}

// liveWorkers is the ids of the pool's live workers, in id order: the view's pool
// (admission.PoolView) when it tells, else the head's candidates ws (a host that cannot tell
// a worker gone from one the head may not use; with no routable worker in the pool both are
// empty). The slice is scratch, valid until the next ask.
func (p *Policy) liveWorkers(v admission.View, ws []admission.Worker) []string {
	if pv, ok := v.(admission.PoolView); ok {
		if ids := pv.PoolWorkers(); ids != nil {
			return ids
		}
	}
	ids := p.ids[:0]
	for _, w := range ws {
		ids = append(ids, w.ID)
	}
	p.ids = ids
	return ids
}

// clearGone drops the assignments of the pool's programs to workers gone (rule 9.2: dead
// ranks), that is not among live (liveWorkers), their turns in flight excepted. A worker the
// asking head may not use (its hard pin elsewhere, an allowed set, a pick's exclusions) is
// not gone: the programs on it keep their place, and their use of it keeps counting. With the
// same live workers as at its last run and nothing changed in the pool since, there is
// nothing to drop.
func (p *Policy) clearGone(pl *poolLedger, live []string) {
	if pl == nil || (pl.sameLive(live) && pl.clearedVer == pl.ver) {
		return
	}
	drop := p.set[:0]
	for id, wl := range pl.workers {
		if slices.Contains(live, id) {
			continue
		}
		for _, pr := range wl.progs {
			if pr.running == 0 {
				drop = append(drop, pr)
			}
		}
	}
	for _, pr := range drop {
		pr.worker = ""
		p.reindex(pr)
	}
	clear(drop)
	p.set = drop[:0]
	pl.clearedVer = pl.ver
	pl.live = append(pl.live[:0], live...)
}

func (p *Policy) anyPaused(pool string) bool {
	pl := p.pools[pool]
	return pl != nil && len(pl.paused) > 0
}

// forget removes pr from the ledger (its tracked requests stay tracked until they end).
func (p *Policy) forget(pr *program) {
	if p.programs[pr.sid] != pr || pr.gone {
		return
	}
	delete(p.programs, pr.sid)
	pr.gone = true
	p.reindex(pr)
}

// size is what pr takes on a worker while it reasons: its context (or its turn's prompt, if
// larger) plus the buffer for its output.
func (p *Policy) size(pr *program) float64 {
	return float64(max(pr.tokens, pr.turnTokens) + p.cfg.BufferPerProgram)
}

// usage is each worker's use by pool's programs (rule 8), from the sums kept (pauseUse,
// resumeUse): a reasoning program its size; an acting one its tokens × acting_token_weight
// (pause side) or × 2^(−idle/τ) (resume side). For tests and views: the steps read one
// worker's sums at a time.
func (p *Policy) usage(pool string, now time.Time, resumeSide bool) map[string]float64 {
	used := make(map[string]float64)
	pl := p.pools[pool]
	if pl == nil {
		return used
	}
	for id := range pl.workers {
		if resumeSide {
			used[id] = p.resumeUse(pl, id, now)
		} else {
			used[id] = p.pauseUse(pl, id)
		}
	}
	return used
}

func (p *Policy) actingUse(pr *program, now time.Time, resumeSide bool) float64 {
	if !resumeSide {
		return float64(pr.tokens) * p.cfg.ActingTokenWeight
	}
	idle := now.Sub(pr.actingSince)
	return float64(pr.tokens) * math.Exp2(-float64(idle)/float64(p.cfg.ActingDecayTau))
}

// resumeKind orders resume candidates: continuing reasoning (a later turn waits), then new
// (a first turn waits), then acting (no turn waits).
func (p *Policy) resumeKind(pr *program) int {
	switch {
	case !p.waiting(pr):
		return 2
	case pr.steps == 0:
		return 1
	}
	return 0
}

// greedyResume is rule 10: the paused programs, ordered (continuing reasoning, new, acting;
// fewer tokens, then the older), are resumed as the longest prefix of that order that fits
// the workers' total headroom below pause_threshold − resume_hysteresis, packed largest
// first, first fit, onto workers by headroom (most first); workers with no more headroom
// than one buffer take none.
func (p *Policy) greedyResume(pool string, ws []admission.Worker, now time.Time) {
	pl := p.pools[pool]
	if pl == nil || len(pl.paused) == 0 {
		return
	}
	cands := append(p.cands[:0], pl.paused...)
	defer func() { clear(cands); p.cands = cands[:0] }()
	ceiling := p.cfg.PauseThreshold - p.cfg.ResumeHysteresis
	type room struct {
		id   string
		left float64
	}
	var rooms []room
	total := 0.0
	for _, w := range ws {
		if w.Capacity <= 0 {
			continue
		}
		if left := float64(w.Capacity)*ceiling - p.resumeUse(pl, w.ID, now); left > float64(p.cfg.BufferPerProgram) {
			rooms = append(rooms, room{w.ID, left})
			total += left
		}
	}
	slices.SortFunc(cands, func(a, b *program) int {
		return cmp.Or(cmp.Compare(p.resumeKind(a), p.resumeKind(b)), cmp.Compare(p.size(a), p.size(b)), cmp.Compare(a.seq, b.seq))
	})
	n, sum := 0, 0.0
	for n < len(cands) && sum+p.size(cands[n]) <= total {
		sum += p.size(cands[n])
		n++
	}
	set := append(p.set[:0], cands[:n]...)
	defer func() { clear(set); p.set = set[:0] }()
	slices.SortStableFunc(set, func(a, b *program) int { return cmp.Compare(p.size(b), p.size(a)) })
	slices.SortStableFunc(rooms, func(a, b room) int { return cmp.Or(cmp.Compare(b.left, a.left), cmp.Compare(a.id, b.id)) })
	for _, pr := range set {
		for i := range rooms {
			if (pr.pin == "" || rooms[i].id == pr.pin) && rooms[i].left >= p.size(pr) {
				rooms[i].left -= p.size(pr)
				p.resume(pr, rooms[i].id, now)
				break
			}
		}
	}
}

// resume puts a paused program back, on worker: as reasoning when a turn of it waits (that
// turn goes next, and a reasoning program is never paused before its turn completes), else as
// what it was. An acting program's retention still counts from its last completed turn, so
// an idle program paused and resumed over and over expires.
func (p *Policy) resume(pr *program, worker string, _ time.Time) {
	pr.state, pr.worker, pr.pausedSince = pr.pausedFrom, worker, time.Time{}
	if p.waiting(pr) {
		pr.state = reasoning
		if pr.priorFor != 0 && p.reqs[pr.priorFor] == pr {
			p.woken = append(p.woken, pr.priorFor) // its held turn: asked again at once
		}
	}
	p.reindex(pr)
}

// Woken implements admission.Waker: the held turns of the programs resumed since the last
// call.
func (p *Policy) Woken(wake func(key uint64)) {
	for _, k := range p.woken {
		wake(k)
	}
	p.woken = p.woken[:0]
}

// waiting reports whether a turn of pr waits (tracked, not running).
func (p *Policy) waiting(pr *program) bool { return pr.live > 0 && pr.running == 0 }

// forceTimedOut is rule 11: a program paused for resume_timeout is resumed on the worker with
// the most capacity left after its decayed usage (ties to the lowest id), room or not.
func (p *Policy) forceTimedOut(pool string, ws []admission.Worker, now time.Time) {
	pl := p.pools[pool]
	if pl == nil || len(ws) == 0 {
		return
	}
	due := p.cands[:0]
	defer func() { clear(due); p.cands = due[:0] }()
	for _, pr := range pl.paused {
		if !now.Before(pr.pausedSince.Add(p.cfg.ResumeTimeout)) {
			due = append(due, pr)
		}
	}
	if len(due) == 0 {
		return
	}
	slices.SortFunc(due, func(a, b *program) int { return cmp.Compare(a.seq, b.seq) })
	used := p.lefts[:0] // each of ws's decayed usage, as it was before this step and its resumes
	for _, w := range ws {
		used = append(used, p.resumeUse(pl, w.ID, now))
	}
	p.lefts = used[:0]
	for _, pr := range due {
		best, bestLeft := -1, 0.0
		for i, w := range ws {
			if pr.pin != "" && w.ID != pr.pin {
				continue // a hard pin is never rerouted
			}
			left := float64(w.Capacity) - used[i]
			if best < 0 || left > bestLeft || (left == bestLeft && w.ID < ws[best].ID) {
				best, bestLeft = i, left
			}
		}
		if best < 0 {
			continue // its pin is gone: it waits for it
		}
		p.resume(pr, ws[best].ID, now)
		used[best] += p.size(pr)
		p.forced++
	}
}

// pauseUntilSafe is rule 12: on each worker over pause_threshold of its capacity, the smallest
// acting programs are paused (equal sizes in their existing order) until it is at pause_target;
// if it is still above, every reasoning program there is marked to pause at its next
// completion. A turn in flight is never preempted.
func (p *Policy) pauseUntilSafe(pool string, ws []admission.Worker, now time.Time) {
	pl := p.pools[pool]
	if pl == nil {
		return
	}
	for _, w := range ws {
		u := p.pauseUse(pl, w.ID)
		if w.Capacity <= 0 || u <= float64(w.Capacity)*p.cfg.PauseThreshold {
			continue
		}
		target := float64(w.Capacity) * p.cfg.PauseTarget
		actors, reasoners := p.cands[:0], p.set[:0]
		for _, pr := range pl.workers[w.ID].progs {
			switch pr.state {
			case acting:
				actors = append(actors, pr)
			case reasoning:
				reasoners = append(reasoners, pr)
			}
		}
		slices.SortFunc(actors, func(a, b *program) int { return cmp.Or(cmp.Compare(a.tokens, b.tokens), cmp.Compare(a.seq, b.seq)) })
		for _, pr := range actors {
			if u <= target {
				break
			}
			u -= p.actingUse(pr, now, false)
			p.pause(pr, acting, now)
			p.pauses++
		}
		if u > target {
			for _, pr := range reasoners {
				pr.markPause = true
			}
		}
		clear(actors)
		clear(reasoners)
		p.cands, p.set = actors[:0], reasoners[:0]
	}
}

// Dispatched is Sent: the program is on the worker the request went to.
func (p *Policy) Dispatched(r *admission.Request, worker string) {
	pr := p.reqs[r.Key]
	if pr == nil || p.programs[pr.sid] != pr {
		return
	}
	pr.running, pr.worker, pr.state, pr.pausedSince = r.Key, worker, reasoning, time.Time{}
	pr.turnTokens = r.PromptTokens
	p.reindex(pr)
}

// Moved follows a turn to the worker it went on on.
func (p *Policy) Moved(r *admission.Request, _, to string) {
	if pr := p.reqs[r.Key]; pr != nil && pr.running == r.Key {
		pr.worker = to
		p.reindex(pr)
	}
}

// Completed ends a turn: a whole answer makes the program acting with the answer's context
// (and pauses it if it was marked); an aborted turn rolls the program back (or removes a new
// one). A final turn's program is gone already and is not restored.
func (p *Policy) Completed(r *admission.Request, _ string) {
	pr := p.untrack(r)
	if pr == nil || pr.running != r.Key {
		return
	}
	pr.running = 0
	now := p.now()
	if r.Aborted {
		p.rollback(pr)
		return
	}
	pr.prior, pr.priorFor, pr.pin = nil, 0, ""
	pr.state, pr.actingSince = acting, now
	if r.ContextTokens > 0 {
		pr.tokens = r.ContextTokens
	} else {
		pr.tokens = max(pr.tokens, pr.turnTokens)
	}
	pr.turnTokens = 0
	pr.steps++
	p.reindex(pr)
	if pr.markPause {
		pr.markPause = false
		p.pause(pr, acting, now)
		p.pauses++
	}
}

// untrack ends the tracking of request r and returns its program, nil when it has none in the
// ledger any more (untracked, a final turn, or a program already gone).
func (p *Policy) untrack(r *admission.Request) *program {
	if p.final[r.Key] {
		delete(p.final, r.Key)
		p.forgetKey(r.Key)
		return nil
	}
	pr := p.reqs[r.Key]
	if pr == nil {
		return nil
	}
	delete(p.reqs, r.Key)
	p.forgetKey(r.Key)
	pr.live--
	if p.programs[pr.sid] != pr {
		return nil
	}
	p.reindex(pr)
	return pr
}

// rollback undoes an aborted turn: the program as it was before it, or gone if it was new
// and nothing else of it waits. A new program another turn of which waits is left as that
// turn would find a new one: nothing of the turn that left stays (its deferral time, which
// would bring the waiting turn's forced resume forward; its prompt as the program's size,
// which would charge its worker for a turn that is gone; a mark to pause).
func (p *Policy) rollback(pr *program) {
	if pr.prior == nil {
		pr.state, pr.worker, pr.tokens, pr.turnTokens, pr.priorFor = reasoning, "", 0, 0, 0
		pr.pausedSince, pr.markPause, pr.pin = time.Time{}, false, ""
		p.reindex(pr)
		p.settleIdle(pr)
		return
	}
	live, x := pr.live, pr.ix
	*pr = *pr.prior
	pr.live, pr.running, pr.prior, pr.priorFor, pr.ix = live, 0, nil, 0, x
	p.reindex(pr)
	p.settleIdle(pr)
}

// Enqueued changes nothing: a waiting turn is counted from Classify.
func (p *Policy) Enqueued(*admission.Request) {}

// Left is a tracked request that leaves without being dispatched (cancelled, expired,
// rejected): a program it created and nothing else uses is dropped.
func (p *Policy) Left(r *admission.Request) {
	pr := p.untrack(r)
	if pr == nil {
		return
	}
	if pr.priorFor == r.Key {
		// It was decided (released, or deferred) and never ran: as an aborted turn, the
		// program goes back to what it was before, or away if it was new.
		p.rollback(pr)
		return
	}
	p.settleIdle(pr)
}

// settleIdle puts a program none of whose turns is tracked any more between turns: a new
// one is forgotten; one marked reasoning (resumed for a turn that then left, or rolled back to
// such a moment) is acting again as its last completed turn left it, so it expires like any
// idle program.
func (p *Policy) settleIdle(pr *program) {
	if pr.live > 0 || pr.running != 0 {
		return
	}
	switch {
	case pr.steps == 0 && pr.state != acting:
		p.forget(pr)
	case pr.state == reasoning:
		pr.state, pr.turnTokens, pr.markPause = acting, 0, false
		p.reindex(pr)
	}
}

// ProgramView is one program in GET /admin/v1/programs.
type ProgramView struct {
	Session     string     `json:"session"` // a keyed hash of the session id, never the id
	State       string     `json:"state"`
	Worker      string     `json:"worker,omitempty"`
	Tokens      int        `json:"tokens"`
	PausedSince *time.Time `json:"paused_since,omitempty"`
}

// Programs lists the programs (expired ones excluded), by session hash (the admin API: it
// walks them all).
func (p *Policy) Programs() []ProgramView {
	now := p.now()
	out := make([]ProgramView, 0, len(p.programs))
	for _, pr := range p.programs {
		if p.expired(pr, now) {
			continue // retention is computed on read
		}
		v := ProgramView{Session: strconv.FormatUint(pr.sid, 16), State: stateNames[pr.state], Worker: pr.worker, Tokens: pr.tokens}
		if pr.state == paused {
			t := pr.pausedSince
			v.PausedSince = &t
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b ProgramView) int { return cmp.Compare(a.Session, b.Session) })
	return out
}

// sessionKey is a session id's key in the ledger: a hash keyed once per process, so the
// ledger's memory does not follow the length of client-chosen ids and no client can choose
// an id that lands on another's program (the admin view shows it, never the id).
func (p *Policy) sessionKey(sid string) uint64 {
	d := xxhash.New()
	_, _ = d.Write(p.key[:])
	_, _ = d.WriteString(sid)
	return d.Sum64()
}

// Stats are the programs by state and the pause and forced-resume counts so far (metrics).
type Stats struct {
	Reasoning, Acting, Paused int
	Pauses, ForcedResumes     uint64
}

// Stats counts the programs (expired ones excluded) from the counts kept by state, less the
// expired ones (the retention heap's entries past their deadline: no pass over the others).
func (p *Policy) Stats() Stats {
	s := Stats{Pauses: p.pauses, ForcedResumes: p.forced,
		Reasoning: p.counts[reasoning], Acting: p.counts[acting], Paused: p.counts[paused]}
	now := p.now()
	p.retained.each(func(pr *program) bool {
		if !p.expired(pr, now) {
			return false
		}
		if pr.state == acting {
			s.Acting--
		} else {
			s.Paused--
		}
		return true
	})
	return s
}

// expired reports whether pr is a program between turns (acting, or paused while acting)
// whose next turn has not come within its retention since its last completed turn (gone on
// read).
func (p *Policy) expired(pr *program, now time.Time) bool {
	idle := pr.state == acting || (pr.state == paused && pr.pausedFrom == acting)
	return idle && pr.live == 0 && !now.Before(pr.actingSince.Add(p.cfg.SessionRetention))
}

// Tracked counts the ledger's entries: 0 once every program ended and every request left.
func (p *Policy) Tracked() int { return len(p.programs) + len(p.reqs) + len(p.final) }
