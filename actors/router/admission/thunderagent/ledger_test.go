package thunderagent

import (
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// TestLedgerSumsMatchAFromScratchCount (issue 34, review finding 7): over random sequences of
// program and request events — requests of a few sessions in two pools classified, asked
// about with changing workers and time, dispatched, moved, completed (whole or aborted) or
// leaving — the sums and sets kept as programs change equal what a pass over every program
// computes: each worker's reasoning sizes and acting tokens (exactly), its decayed acting use
// (to rounding), the paused programs, each worker's programs, the retained and the idle
// programs (and their heaps' order), the counts by state, and no index is left for a pool
// without programs.
func TestLedgerSumsMatchAFromScratchCount(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := cfg()
		c.BufferPerProgram = rapid.IntRange(0, 50).Draw(rt, "buffer")
		c.ActingTokenWeight = rapid.SampledFrom([]float64{1, 0.5, 1.5}).Draw(rt, "weight")
		c.ActingDecayTau = time.Duration(rapid.IntRange(1, 3).Draw(rt, "tau_s")) * time.Second
		c.ResumeTimeout = time.Duration(rapid.IntRange(1, 20).Draw(rt, "resume_timeout_s")) * time.Second
		c.SessionRetention = time.Duration(rapid.IntRange(1, 60).Draw(rt, "retention_s")) * time.Second
		c.MaxTrackedRequests = rapid.IntRange(2, 12).Draw(rt, "max_tracked")
		now := time.Unix(10000, 0)
		p := New(c, func() time.Time { return now })
		pools := map[string][]admission.Worker{
			"p": {{ID: "a", Capacity: 1000}, {ID: "b", Capacity: 2000}, {ID: "c", Capacity: 0}},
			"q": {{ID: "x", Capacity: 1500}, {ID: "y", Capacity: 500}},
		}
		type live struct {
			r          *admission.Request
			dispatched bool
			worker     string
			target     string
		}
		var reqs []*live
		key := uint64(0)
		pick := func(want func(*live) bool) *live {
			var xs []*live
			for _, l := range reqs {
				if want(l) {
					xs = append(xs, l)
				}
			}
			if len(xs) == 0 {
				return nil
			}
			return rapid.SampledFrom(xs).Draw(rt, "request")
		}
		drop := func(l *live) { reqs = slices.DeleteFunc(reqs, func(x *live) bool { return x == l }) }
		for range rapid.IntRange(1, 200).Draw(rt, "steps") {
			switch rapid.IntRange(0, 7).Draw(rt, "event") {
			case 0: // a request of a session
				key++
				pool := rapid.SampledFrom([]string{"p", "q"}).Draw(rt, "pool")
				r := &admission.Request{Key: key, Pool: pool, APIKey: rapid.IntRange(-1, 2).Draw(rt, "api_key"),
					SessionID:    rapid.SampledFrom([]string{"", "s1", "s2", "s3", "s4", "s5"}).Draw(rt, "session"),
					PromptTokens: rapid.IntRange(0, 1200).Draw(rt, "prompt"), Final: rapid.IntRange(0, 5).Draw(rt, "final") == 0}
				if rapid.IntRange(0, 4).Draw(rt, "pinned") == 0 {
					r.Allowed = []string{rapid.SampledFrom(pools[pool]).Draw(rt, "pin").ID}
				}
				p.Classify(r, nil, nil)
				if r.Refuse == nil {
					reqs = append(reqs, &live{r: r})
				}
			case 1: // a queued request asked about, with some of its pool's workers
				l := pick(func(l *live) bool { return !l.dispatched })
				if l == nil {
					continue
				}
				// Each worker is gone, live but not the head's to use, or a candidate; the
				// view tells the pool's live workers or not.
				var ws []admission.Worker
				var live []string
				for _, w := range pools[l.r.Pool] {
					switch rapid.IntRange(0, 5).Draw(rt, "worker_state") {
					case 0, 1:
					case 2:
						live = append(live, w.ID)
					default:
						live = append(live, w.ID)
						ws = append(ws, w)
					}
				}
				v := view{ws: ws, now: now}
				if rapid.Bool().Draw(rt, "pool_told") {
					v.pool = append([]string{}, live...)
				}
				d := p.Check(l.r, v)
				if d.Go {
					l.target = d.Target
					if l.target == "" {
						l.target = pools[l.r.Pool][0].ID
					}
				}
			case 2: // a request the gate let go is dispatched
				l := pick(func(l *live) bool { return !l.dispatched && l.target != "" })
				if l == nil {
					continue
				}
				l.dispatched, l.worker = true, l.target
				p.Dispatched(l.r, l.worker)
			case 3: // a failover moves it
				l := pick(func(l *live) bool { return l.dispatched })
				if l == nil {
					continue
				}
				to := rapid.SampledFrom(pools[l.r.Pool]).Draw(rt, "to").ID
				p.Moved(l.r, l.worker, to)
				l.worker = to
			case 4: // it ends
				l := pick(func(l *live) bool { return l.dispatched })
				if l == nil {
					continue
				}
				l.r.ContextTokens = rapid.IntRange(0, 3000).Draw(rt, "context")
				l.r.Aborted = rapid.IntRange(0, 3).Draw(rt, "aborted") == 0
				p.Completed(l.r, l.worker)
				drop(l)
			case 5: // a queued request leaves (cancelled, expired)
				l := pick(func(l *live) bool { return !l.dispatched })
				if l == nil {
					continue
				}
				p.Left(l.r)
				drop(l)
			case 6:
				now = now.Add(time.Duration(rapid.IntRange(0, 5000).Draw(rt, "advance_ms")) * time.Millisecond)
			case 7: // the waiting turn of a paused program leaves (the client gone, its wait over)
				l := pick(func(l *live) bool {
					pr := p.reqs[l.r.Key]
					return !l.dispatched && pr != nil && pr.state == paused
				})
				if l == nil {
					continue
				}
				p.Left(l.r)
				drop(l)
			}
			checkLedger(rt, p, now)
			checkBetweenTurns(rt, p)
		}
		// Every turn ends (the queued ones leave, the running ones complete) and the clock
		// passes every retention and forced resume: a probe asked in each pool (which settles
		// it and expires on read) and leaving finds an empty ledger.
		for _, l := range reqs {
			if l.dispatched {
				l.r.Aborted = rapid.Bool().Draw(rt, "end_aborted")
				p.Completed(l.r, l.worker)
			} else {
				p.Left(l.r)
			}
			checkLedger(rt, p, now)
			checkBetweenTurns(rt, p)
		}
		now = now.Add(c.SessionRetention + c.ResumeTimeout)
		for pool, ws := range pools {
			key++
			probe := &admission.Request{Key: key, Pool: pool, SessionID: "probe-" + pool, PromptTokens: 1}
			p.Classify(probe, nil, nil)
			p.Check(probe, view{ws: ws, now: now})
			p.Left(probe)
			checkLedger(rt, p, now)
		}
		if len(p.programs) != 0 || p.Tracked() != 0 || len(p.keyOf) != 0 || len(p.perKey) != 0 {
			for _, pr := range p.programs {
				rt.Logf("left: state %s (from %s) worker %q live %d running %d steps %d", stateNames[pr.state], stateNames[pr.pausedFrom], pr.worker, pr.live, pr.running, pr.steps)
			}
			rt.Fatalf("every turn ended and retention passed: %d programs, %d entries left", len(p.programs), p.Tracked())
		}
	})
}

// checkBetweenTurns: a program none of whose turns is tracked is between turns — acting, or
// paused from acting — and waits in the retention heap, so it expires when its retention ends
// (a program with no turn that charged a reasoning size, or paused as if a turn waited, would
// never expire); nothing it does not run is marked to pause at a completion.
func checkBetweenTurns(t *rapid.T, p *Policy) {
	for _, pr := range p.programs {
		if pr.live > 0 || pr.running != 0 {
			continue
		}
		if !(pr.state == acting || pr.state == paused && pr.pausedFrom == acting) || pr.ix.hpos[retainedHeap] < 0 {
			t.Fatalf("a program with no turn is %s (from %s), retained at %d", stateNames[pr.state], stateNames[pr.pausedFrom], pr.ix.hpos[retainedHeap])
		}
		if pr.markPause {
			t.Fatalf("a program with no turn is marked to pause at a completion")
		}
	}
}

// checkLedger compares the policy's indexes with a pass over its programs.
func checkLedger(t *rapid.T, p *Policy, now time.Time) {
	// The per-key counts follow the tracked requests exactly (R20).
	perKey := map[int]int{}
	for k, apiKey := range p.keyOf {
		if p.reqs[k] == nil && !p.final[k] {
			t.Fatalf("request %d has an API key but is not tracked", k)
		}
		perKey[apiKey]++
	}
	if len(p.keyOf) != len(p.reqs)+len(p.final) || !maps.Equal(perKey, p.perKey) {
		t.Fatalf("per-key counts %v of %d requests, want %v of %d", p.perKey, len(p.keyOf), perKey, len(p.reqs)+len(p.final))
	}
	type sums struct {
		reasoning, acting int64
		decayed           float64
		progs             []uint64
	}
	want := map[string]map[string]*sums{}
	pausedIn := map[string][]uint64{}
	var retained, idle []uint64
	var counts [3]int
	for _, pr := range p.programs {
		counts[pr.state]++
		if pr.state == paused {
			pausedIn[pr.pool] = append(pausedIn[pr.pool], pr.sid)
		}
		if (pr.state == acting || pr.state == paused && pr.pausedFrom == acting) && pr.live == 0 {
			retained = append(retained, pr.sid)
		}
		if pr.live == 0 {
			idle = append(idle, pr.sid)
		}
		if pr.worker == "" {
			continue
		}
		if want[pr.pool] == nil {
			want[pr.pool] = map[string]*sums{}
		}
		s := want[pr.pool][pr.worker]
		if s == nil {
			s = &sums{}
			want[pr.pool][pr.worker] = s
		}
		s.progs = append(s.progs, pr.sid)
		switch pr.state {
		case reasoning:
			s.reasoning += int64(max(pr.tokens, pr.turnTokens) + p.cfg.BufferPerProgram)
		case acting:
			s.acting += int64(pr.tokens)
			s.decayed += float64(pr.tokens) * math.Exp2(-float64(now.Sub(pr.actingSince))/float64(p.cfg.ActingDecayTau))
		}
	}
	if counts != p.counts {
		t.Fatalf("counts %v, from scratch %v", p.counts, counts)
	}
	sids := func(prs []*program) []uint64 {
		out := make([]uint64, 0, len(prs))
		for _, pr := range prs {
			out = append(out, pr.sid)
		}
		slices.Sort(out)
		return out
	}
	for _, x := range []struct {
		name string
		h    *progHeap
		want []uint64
	}{{"retained", &p.retained, retained}, {"idle", &p.idle, idle}} {
		slices.Sort(x.want)
		if got := sids(x.h.h); !slices.Equal(got, x.want) {
			t.Fatalf("%s %v, from scratch %v", x.name, got, x.want)
		}
		for i, pr := range x.h.h {
			if pr.ix.hpos[x.h.slot] != i {
				t.Fatalf("%s[%d] says it is at %d", x.name, i, pr.ix.hpos[x.h.slot])
			}
			if i > 0 && x.h.Less(i, (i-1)/2) {
				t.Fatalf("the %s heap is out of order at %d", x.name, i)
			}
		}
	}
	for name, pl := range p.pools {
		if pl.n == 0 {
			t.Fatalf("pool %q: %d programs", name, pl.n)
		}
		n := 0
		for _, pr := range p.programs {
			if pr.pool == name {
				n++
			}
		}
		if n != pl.n {
			t.Fatalf("pool %q counts %d programs, from scratch %d", name, pl.n, n)
		}
		ps := pausedIn[name]
		slices.Sort(ps)
		if got := sids(pl.paused); !slices.Equal(got, ps) {
			t.Fatalf("pool %q paused %v, from scratch %v", name, got, ps)
		}
		if len(pl.workers) != len(want[name]) {
			t.Fatalf("pool %q: %d workers indexed, %d from scratch", name, len(pl.workers), len(want[name]))
		}
		for id, wl := range pl.workers {
			s := want[name][id]
			if s == nil {
				t.Fatalf("pool %q: worker %s indexed with no program", name, id)
			}
			slices.Sort(s.progs)
			if got := sids(wl.progs); !slices.Equal(got, s.progs) {
				t.Fatalf("pool %q worker %s: programs %v, from scratch %v", name, id, got, s.progs)
			}
			if wl.reasoning != s.reasoning || wl.acting != s.acting {
				t.Fatalf("pool %q worker %s: reasoning %d acting %d, from scratch %d %d", name, id, wl.reasoning, wl.acting, s.reasoning, s.acting)
			}
			if got, want := p.pauseUse(pl, id), float64(s.reasoning)+float64(s.acting)*p.cfg.ActingTokenWeight; got != want {
				t.Fatalf("pool %q worker %s: pause side %v, from scratch %v", name, id, got, want)
			}
			got, want := p.resumeUse(pl, id, now), float64(s.reasoning)+s.decayed
			if math.Abs(got-want) > 1e-9*max(1, want) {
				t.Fatalf("pool %q worker %s: resume side %v, from scratch %v", name, id, got, want)
			}
		}
	}
	for name := range pausedIn {
		if p.pools[name] == nil {
			t.Fatalf("pool %q has paused programs and no index", name)
		}
	}
	for name := range want {
		if p.pools[name] == nil {
			t.Fatalf("pool %q has assigned programs and no index", name)
		}
	}
}
