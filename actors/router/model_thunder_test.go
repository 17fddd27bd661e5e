package router

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
)

// Under thunderagent the model's requests carry sessions of a small set (several turns each,
// more sessions than the smallest program limit), prompts from tiny to over a small worker's
// pause threshold, and some are their session's final turn; workers have KV capacities.
var (
	thunderSessions = []string{"", "s1", "s2", "s3", "s4", "s5"}
	thunderPrompts  = []int{10, 200, 1000, 3000}
)

// TestAdmissionRouterModelThunderAgent is TestAdmissionRouterModel with the thunderagent
// classifier (small limits, short durations on the test's clock), workers with KV capacities,
// sessions of several turns, final turns, and ends that carry what the answer cost and
// whether it was aborted. Besides the model's invariants it checks after every step: a
// request the policy refuses is answered queue_full at once; the policy enforces its
// tracked-request limit and refuses only at a limit; its ledger stays within
// max_tracked_requests (programs and requests); two turns of one program are never in flight
// at once; and, once every request has ended and the clock has passed resume_timeout and
// session_retention, the ledger is empty.
func TestAdmissionRouterModelThunderAgent(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		threshold := rapid.Int64Range(0, 2).Draw(rt, "busy_threshold")
		cfg := thunderagent.Config{PauseThreshold: 0.9, PauseTarget: 0.7, ResumeHysteresis: 0.1,
			ResumeTimeout:      time.Duration(rapid.IntRange(1, 5).Draw(rt, "resume_timeout_s")) * time.Second,
			SessionRetention:   time.Duration(rapid.IntRange(1, 6).Draw(rt, "session_retention_s")) * time.Second,
			ActingTokenWeight:  1,
			ActingDecayTau:     time.Second,
			BufferPerProgram:   50,
			MaxTrackedRequests: rapid.IntRange(2, 8).Draw(rt, "max_tracked_requests"),
		}
		tw := &thunderWatch{cfg: cfg, refused: map[uint64]bool{}, tracked: map[uint64]bool{},
			classSeq: map[uint64]uint64{}, lastFinal: map[string]uint64{}, lastFinalKey: map[string]uint64{}}
		tw.p = thunderagent.New(cfg, func() time.Time {
			if tw.early {
				return time.Time{} // Programs then lists every program, expired or not
			}
			return tw.r.clk.Now()
		})
		pol := checked(tw.p)
		pol.tw = tw
		runRouterModel(rt, pol, threshold)
	})
}

// thunderWatch is the model's view of the thunderagent policy under test.
type thunderWatch struct {
	p     *thunderagent.Policy
	cfg   thunderagent.Config
	r     *rig
	early bool // the policy's clock reads the zero time (see ledger)
	// refused: requests the policy's Classify refused; tracked: session requests it tracks.
	refused, tracked map[uint64]bool
	// classSeq orders classifications and final turns' admissions: lastFinal is the latest
	// final turn of each session the policy let go (lastFinalKey its request), after which
	// the session's earlier turns belong to an ended program.
	seq          uint64
	classSeq     map[uint64]uint64
	lastFinal    map[string]uint64
	lastFinalKey map[string]uint64
}

// ledger is the policy's programs (every one, expired or not: Programs reads the clock only to
// leave out expired programs, and at the zero time none is) and tracked requests (Tracked is
// programs + requests + final turns).
func (w *thunderWatch) ledger() (programs, requests int) {
	w.early = true
	programs = len(w.p.Programs())
	w.early = false
	return programs, w.p.Tracked() - programs
}

// classify runs the policy's Classify and checks its limits (rule 3): a session request is
// refused, with ErrQueueFull, exactly when the tracked requests are at the limit, when its API
// key holds its share of them (R20), or when it would start a program beyond the program limit
// with none idle to evict.
func (w *thunderWatch) classify(p *checkedPolicy, r *admission.Request, route []string, cached func([]string) int) {
	progs, reqs := w.ledger()
	held, share := w.p.KeyShare(r.APIKey)
	p.inner.Classify(r, route, cached)
	if r.SessionID == "" {
		if r.Refuse != nil {
			p.fail("request %d without a session refused: %v", r.Key, r.Refuse)
		}
		return
	}
	w.seq++
	w.classSeq[r.Key] = w.seq
	_, after := w.ledger()
	limit := w.cfg.MaxTrackedRequests
	if r.Refuse != nil {
		switch {
		case !errors.Is(r.Refuse, admission.ErrQueueFull):
			p.fail("request %d refused with %v, not wrapping ErrQueueFull", r.Key, r.Refuse)
		case reqs < limit && progs < limit && held < share:
			p.fail("request %d refused below the limits (%d programs, %d requests, limit %d; its key %d of %d): %v", r.Key, progs, reqs, limit, held, share, r.Refuse)
		case after != reqs:
			p.fail("request %d refused but tracked (%d → %d requests)", r.Key, reqs, after)
		}
		w.refused[r.Key] = true
		return
	}
	if reqs >= limit || held >= share {
		p.fail("request %d of session %s accepted with %d requests tracked, limit %d (its key %d of %d)", r.Key, r.SessionID, reqs, limit, held, share)
	}
	w.tracked[r.Key] = after > reqs
}

// checked notes a tracked final turn let go: its program ends there (rule 5.1).
func (w *thunderWatch) checked(r *admission.Request, d admission.Decision) {
	if d.Go && r.Final && w.tracked[r.Key] {
		w.seq++
		w.lastFinal[r.SessionID], w.lastFinalKey[r.SessionID] = w.seq, r.Key
	}
}

// dispatched checks that two turns of one program are never in flight at once (rule 4). A
// session's turns are one program until a final turn of it is let go: that turn, and turns
// classified before it (which pass through once their program is gone), are the ended
// program's; a final turn of a session with no program, which the policy does not track,
// belongs to none.
func (w *thunderWatch) dispatched(p *checkedPolicy, r *admission.Request) {
	if r.SessionID == "" {
		return
	}
	ended := func(x *admission.Request) bool {
		return !w.tracked[x.Key] ||
			(x.Key != w.lastFinalKey[x.SessionID] && w.classSeq[x.Key] < w.lastFinal[x.SessionID])
	}
	for _, o := range p.running {
		if o.SessionID == r.SessionID && !o.Final && !ended(o) && !ended(r) {
			p.fail("session %q has two turns of one program in flight (%d and %d)", r.SessionID, o.Key, r.Key)
		}
	}
}

// checkLedger: the ledger is bounded by max_tracked_requests, in programs and in requests.
func (w *thunderWatch) checkLedger(t *rapid.T) {
	progs, reqs := w.ledger()
	if limit := w.cfg.MaxTrackedRequests; progs > limit || reqs > limit {
		t.Fatalf("the policy tracks %d programs and %d requests, limit %d", progs, reqs, limit)
	}
}

// describe lists the programs left, for a failure message ("" for another policy).
func (w *thunderWatch) describe() string {
	if w == nil {
		return ""
	}
	w.early = true
	ps := w.p.Programs()
	w.early = false
	var b strings.Builder
	progs, reqs := len(ps), w.p.Tracked()-len(ps)
	fmt.Fprintf(&b, " (%d programs, %d requests or final turns)", progs, reqs)
	for _, v := range ps {
		fmt.Fprintf(&b, "; %s worker=%q tokens=%d", v.State, v.Worker, v.Tokens)
		if v.PausedSince != nil {
			fmt.Fprintf(&b, " paused_since=+%s", v.PausedSince.Sub(t0))
		}
	}
	fmt.Fprintf(&b, "; clock +%s", w.r.clk.Now().Sub(t0))
	return b.String()
}

// thunderActions adds the thunderagent run's actions: bursts of requests (a session's turns
// pile up, the policy's limits are reached) and more ends, so that rapid's short sequences
// reach full ledgers, paused programs and final turns.
func (m *routerModel) thunderActions(actions map[string]func(*rapid.T)) {
	actions["burst"] = func(t *rapid.T) {
		for range rapid.IntRange(2, 5).Draw(t, "burst") {
			m.admit(t)
		}
	}
	actions["finish_more"] = m.finish
}

// joinKV joins (or updates) a worker with a KV capacity of 1024, 2048 or 4096 tokens, or
// none known (block size 0).
func (m *routerModel) joinKV(t *rapid.T, id string) {
	queue := rapid.Int64Range(0, 2).Draw(t, "queue_depth")
	blocks := rapid.SampledFrom([]int64{64, 128, 256}).Draw(t, "kv_blocks")
	bs := rapid.SampledFrom([]int64{0, 16, 16, 16}).Draw(t, "block_size")
	m.r.joinWith(id, modelOf(id), RoleUnified, queue, func(i *WorkerInfo) { i.KVTotalBlocks, i.KVFreeBlocks, i.BlockSize = blocks, blocks, bs })
	m.collect()
}

// expireAll lets every program left end by expiry: with every request ended, each round moves
// the clock past resume_timeout and session_retention and sends a probe turn (a new session)
// to each pool, whose asks settle the ledger — paused programs are force-resumed, acting ones
// idle past retention forgotten — and which then ends aborted (its new program goes with it).
func (m *routerModel) expireAll() {
	big := func(i *WorkerInfo) { i.KVTotalBlocks, i.KVFreeBlocks, i.BlockSize = 256, 256, 16 }
	m.r.joinWith("a1", "a", RoleUnified, 0, big)
	m.r.joinWith("b1", "b", RoleUnified, 0, big)
	m.collect()
	wait := max(m.tw.cfg.ResumeTimeout, m.tw.cfg.SessionRetention) + time.Second
	for i := range 3 {
		m.r.advance(wait)
		m.collect()
		for _, model := range []string{"a", "b"} {
			q := &modelRequest{q: m.r.newRequester(), model: model, session: fmt.Sprintf("probe-%d-%s", i, model),
				id: "probe", prompt: 10, answered: map[uint64]int{}}
			m.reqs = append(m.reqs, q)
			m.pick(q, "")
			if q.q == nil {
				continue // answered an error (refused: the ledger is full)
			}
			if q.holding != nil {
				q.q.release(q.holding)
			}
			q.q.end(0, true)
			q.q = nil
			m.collect()
		}
	}
	a := m.r.st.adm
	if a.q.Len() != 0 || len(a.entries) != 0 || len(m.pol.running) != 0 {
		m.t.Fatalf("after the probes: %d queued, %d entries, %d running", a.q.Len(), len(a.entries), len(m.pol.running))
	}
}
