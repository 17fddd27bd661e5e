package thunderagent

import (
	"container/heap"
	"math"
	"slices"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// The ledger's indexes: what every ask and every settling step reads, kept as programs change
// instead of recomputed from every program (issue 34: an ask walked every program several
// times, 47 µs at 100 programs and 1.2 ms at 10,000, and every capacity free asked every held
// head).
//
// Every change of a program's fields ends with reindex, which takes back what the program
// contributed (as recorded when it was last indexed) and adds what it contributes now; a
// change that leaves its contribution as it was changes nothing, not even the pool's version.

// contrib is what a program contributes to the indexes: the fields the sums, the sets and the
// settling steps read. Equal contributions mean nothing changed for the indexes and the
// settling.
type contrib struct {
	pool        string
	state       state
	pausedFrom  state
	worker      string
	tokens      int
	turnTokens  int
	actingSince time.Time
	pausedSince time.Time
	live        int
	running     uint64
	steps       int
	pin         string
}

// ix is a program's place in the indexes.
type ix struct {
	in   bool    // indexed: c is what it contributes
	c    contrib // its contribution when last indexed
	wpos int     // its place in its worker's progs (c.worker != "")
	ppos int     // its place in its pool's paused (c.state == paused)
	// hpos is its places in the retention heap (retains(c)) and the idle heap (c.live == 0);
	// -1 where it is not in one.
	hpos [2]int
}

// The heaps of programs, by the index of their place in ix.hpos.
const (
	retainedHeap = iota
	idleHeap
)

// poolLedger is one pool's programs by worker and its paused programs.
type poolLedger struct {
	n       int                      // its programs in the ledger: the entry goes with the last
	workers map[string]*workerLedger // workers with a program assigned (bounded by the pool's workers)
	paused  []*program               // its paused programs, in no order (every reader sorts)
	// ver counts the changes of its programs' contributions; settledAt and settledVer are the
	// instant and version of its last settling, with the candidate workers ws (IDs and
	// capacities) it ran with; clearedVer the version of its last clearGone, with the live
	// workers it ran with.
	ver        uint64
	settledAt  time.Time
	settledVer uint64
	clearedVer uint64
	ws         []admission.Worker // a copy, bounded by the pool's workers
	live       []string           // a copy, bounded by the pool's workers
}

// workerLedger is one worker's programs of one pool and their usage.
type workerLedger struct {
	progs []*program // assigned to it (bounded by the pool's programs)
	// reasoning is the sum of its reasoning programs' sizes; acting the sum of its acting
	// programs' tokens (the pause side weighs it by acting_token_weight).
	reasoning int64
	acting    int64
	nActing   int
	// decay is Σ tokens × 2^((acting_since − ref)/τ) over its acting programs, so their decayed
	// use at t is decay × 2^(−(t − ref)/τ). ref moves forward to a newer acting_since (and decay
	// with it) when that one is more than decayRebase τ after it, so no term exceeds
	// tokens × 2^decayRebase; decay is reset to 0 with its last acting program, so what
	// rounding leaves of removed terms does not outlive them.
	ref   time.Time
	decay float64
}

// decayRebase bounds the exponent of a term of workerLedger.decay (in τ).
const decayRebase = 16

// retains reports whether a program with contribution c waits in the retention heap: between
// turns (acting, or paused while acting) with no request tracked.
func retains(c *contrib) bool {
	return (c.state == acting || c.state == paused && c.pausedFrom == acting) && c.live == 0
}

// sizeOf is a reasoning program's size (see size).
func (p *Policy) sizeOf(c *contrib) int64 {
	return int64(max(c.tokens, c.turnTokens) + p.cfg.BufferPerProgram)
}

// reindex brings pr's place in the indexes up to date with its fields (a forgotten program
// leaves them all).
func (p *Policy) reindex(pr *program) {
	var c contrib
	in := !pr.gone
	if in {
		c = contrib{pool: pr.pool, state: pr.state, pausedFrom: pr.pausedFrom, worker: pr.worker, tokens: pr.tokens,
			turnTokens: pr.turnTokens, actingSince: pr.actingSince, pausedSince: pr.pausedSince, live: pr.live,
			running: pr.running, steps: pr.steps, pin: pr.pin}
		if pr.ix.in && pr.ix.c == c {
			return
		}
	}
	if pr.ix.in {
		p.unindex(pr)
	}
	if in {
		p.index(pr, c)
	}
}

// index adds pr's contribution c.
func (p *Policy) index(pr *program, c contrib) {
	pl := p.pools[c.pool]
	if pl == nil {
		pl = &poolLedger{workers: make(map[string]*workerLedger)}
		p.pools[c.pool] = pl
	}
	pl.n++
	pl.ver++
	pr.ix = ix{in: true, c: c, hpos: [2]int{-1, -1}}
	p.counts[c.state]++
	if c.worker != "" {
		wl := pl.workers[c.worker]
		if wl == nil {
			wl = &workerLedger{}
			pl.workers[c.worker] = wl
		}
		pr.ix.wpos = len(wl.progs)
		wl.progs = append(wl.progs, pr)
		switch c.state {
		case reasoning:
			wl.reasoning += p.sizeOf(&c)
		case acting:
			wl.acting += int64(c.tokens)
			if wl.nActing == 0 {
				wl.ref, wl.decay = c.actingSince, 0
			} else if d := c.actingSince.Sub(wl.ref); float64(d) > decayRebase*float64(p.cfg.ActingDecayTau) {
				wl.decay *= math.Exp2(-float64(d) / float64(p.cfg.ActingDecayTau))
				wl.ref = c.actingSince
			}
			wl.nActing++
			wl.decay += p.decayTerm(wl, &c)
		}
	}
	if c.state == paused {
		pr.ix.ppos = len(pl.paused)
		pl.paused = append(pl.paused, pr)
	}
	if retains(&c) {
		heap.Push(&p.retained, pr)
	}
	if c.live == 0 {
		heap.Push(&p.idle, pr)
	}
}

// unindex takes back pr's recorded contribution.
func (p *Policy) unindex(pr *program) {
	c := &pr.ix.c
	pl := p.pools[c.pool]
	pl.ver++
	p.counts[c.state]--
	if c.worker != "" {
		wl := pl.workers[c.worker]
		last := wl.progs[len(wl.progs)-1]
		wl.progs[pr.ix.wpos], last.ix.wpos = last, pr.ix.wpos
		wl.progs[len(wl.progs)-1] = nil
		wl.progs = wl.progs[:len(wl.progs)-1]
		switch c.state {
		case reasoning:
			wl.reasoning -= p.sizeOf(c)
		case acting:
			wl.acting -= int64(c.tokens)
			if wl.nActing--; wl.nActing == 0 {
				wl.decay = 0
			} else {
				wl.decay = max(wl.decay-p.decayTerm(wl, c), 0)
			}
		}
		if len(wl.progs) == 0 {
			delete(pl.workers, c.worker)
		}
	}
	if c.state == paused {
		last := pl.paused[len(pl.paused)-1]
		pl.paused[pr.ix.ppos], last.ix.ppos = last, pr.ix.ppos
		pl.paused[len(pl.paused)-1] = nil
		pl.paused = pl.paused[:len(pl.paused)-1]
	}
	if i := pr.ix.hpos[retainedHeap]; i >= 0 {
		heap.Remove(&p.retained, i)
	}
	if i := pr.ix.hpos[idleHeap]; i >= 0 {
		heap.Remove(&p.idle, i)
	}
	pr.ix.in = false
	if pl.n--; pl.n == 0 {
		delete(p.pools, c.pool)
	}
}

// decayTerm is an acting program's term of its worker's decay sum.
func (p *Policy) decayTerm(wl *workerLedger, c *contrib) float64 {
	return float64(c.tokens) * math.Exp2(float64(c.actingSince.Sub(wl.ref))/float64(p.cfg.ActingDecayTau))
}

// pauseUse is worker's use by pl's programs on the pause side: reasoning sizes plus acting
// tokens × acting_token_weight.
func (p *Policy) pauseUse(pl *poolLedger, worker string) float64 {
	if pl == nil {
		return 0
	}
	wl := pl.workers[worker]
	if wl == nil {
		return 0
	}
	return float64(wl.reasoning) + float64(wl.acting)*p.cfg.ActingTokenWeight
}

// resumeUse is worker's use by pl's programs on the resume side at now: reasoning sizes plus
// acting tokens decayed by 2^(−idle/τ).
func (p *Policy) resumeUse(pl *poolLedger, worker string, now time.Time) float64 {
	if pl == nil {
		return 0
	}
	wl := pl.workers[worker]
	if wl == nil {
		return 0
	}
	u := float64(wl.reasoning)
	if wl.nActing > 0 {
		u += wl.decay * math.Exp2(-float64(now.Sub(wl.ref))/float64(p.cfg.ActingDecayTau))
	}
	return u
}

// sameLive reports whether live are the live workers pl last cleared with.
func (pl *poolLedger) sameLive(live []string) bool {
	return pl != nil && slices.Equal(pl.live, live)
}

// sameWorkers reports whether ws are the workers (IDs and capacities) pl last settled with.
func (pl *poolLedger) sameWorkers(ws []admission.Worker) bool {
	if pl == nil || len(pl.ws) != len(ws) {
		return false
	}
	for i := range ws {
		if pl.ws[i].ID != ws[i].ID || pl.ws[i].Capacity != ws[i].Capacity {
			return false
		}
	}
	return true
}

// remember keeps a copy of ws for sameWorkers.
func (pl *poolLedger) remember(ws []admission.Worker) {
	pl.ws = append(pl.ws[:0], ws...)
}

// nextRetention is the earliest retention deadline after now.
func (p *Policy) nextRetention(now time.Time) (time.Time, bool) {
	var at time.Time
	found := false
	p.retained.each(func(pr *program) bool {
		d := pr.actingSince.Add(p.cfg.SessionRetention)
		if !d.After(now) {
			return true // past (expired on read): look below it
		}
		if !found || d.Before(at) {
			at, found = d, true
		}
		return false // nothing below it is earlier
	})
	return at, found
}

// progHeap is programs by acting_since (the never set first), ties to the older program: the
// retained programs (so by retention deadline) or the idle ones (eviction order). slot is which
// of a program's ix.hpos is its place in it.
type progHeap struct {
	h    []*program
	slot int
}

func (q *progHeap) Len() int { return len(q.h) }
func (q *progHeap) Less(i, j int) bool {
	a, b := q.h[i].ix.c.actingSince, q.h[j].ix.c.actingSince
	if !a.Equal(b) {
		return a.Before(b)
	}
	return q.h[i].seq < q.h[j].seq
}
func (q *progHeap) Swap(i, j int) {
	q.h[i], q.h[j] = q.h[j], q.h[i]
	q.h[i].ix.hpos[q.slot], q.h[j].ix.hpos[q.slot] = i, j
}
func (q *progHeap) Push(x any) {
	pr := x.(*program)
	pr.ix.hpos[q.slot] = len(q.h)
	q.h = append(q.h, pr)
}
func (q *progHeap) Pop() any {
	pr := q.h[len(q.h)-1]
	q.h[len(q.h)-1] = nil
	q.h = q.h[:len(q.h)-1]
	pr.ix.hpos[q.slot] = -1
	return pr
}

// top is the first program (nil when none).
func (q *progHeap) top() *program {
	if len(q.h) == 0 {
		return nil
	}
	return q.h[0]
}

// each visits the heap from its top; where visit returns false, the entries below that one
// are not visited (they come later in its order).
func (q *progHeap) each(visit func(*program) bool) {
	var walk func(i int)
	walk = func(i int) {
		if i >= len(q.h) || !visit(q.h[i]) {
			return
		}
		walk(2*i + 1)
		walk(2*i + 2)
	}
	walk(0)
}
