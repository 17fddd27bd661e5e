package thunderagent

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestTurnEndedOnAWorkerGoneIsCleared (rule 9.2): a turn that ends on a worker that left the
// pool while it ran leaves its program assigned there; the next ask clears it, although the
// pool's live workers are the ones the last clearing saw.
func TestTurnEndedOnAWorkerGoneIsCleared(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000)
	g.turn("keep", 10, 10) // the pool keeps a program throughout, so its ledger (and memo) stays
	live := []string{"w1", "w2"}
	ask := func(sid string) {
		t.Helper()
		g.now = g.now.Add(time.Millisecond)
		if d := g.p.Check(g.req(sid, 10), view{ws: g.ws, now: g.now, pool: live}); !d.Go {
			t.Fatalf("%s: %+v", sid, d)
		}
	}
	ask("first")
	r := g.req("a", 100)
	g.p.Dispatched(r, "w3") // w3 served the turn and left the pool before it ended
	r.ContextTokens = 100
	g.p.Completed(r, "w3")
	ask("second")
	if pr := g.prog("a"); pr.worker != "" {
		t.Fatalf("a stayed on w3, gone: %q", pr.worker)
	}
}

// TestDecayRebase: an acting program that completes long after its worker's other acting
// ones (more than decayRebase τ) moves the worker's reference time: the decayed use stays
// what a pass over the programs computes, exactly enough to be compared, and finite however
// long the gap (2^(gap/τ) overflows past ~1024 τ). One that completes within decayRebase τ
// is a term against the older reference, and the sum is the same.
func TestDecayRebase(t *testing.T) {
	for _, gap := range []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 3 * time.Second} {
		c := cfg()
		c.ActingDecayTau = time.Millisecond
		g := newRig(t, c, 1_000_000)
		g.turn("a", 10, 1000)
		first := g.now
		g.now = g.now.Add(gap)
		g.turn("b", 10, 1000)
		g.now = g.now.Add(time.Millisecond)
		want := 1000*math.Exp2(-float64(g.now.Sub(first))/float64(time.Millisecond)) + 500
		got := g.p.resumeUse(g.p.pools["p"], "w1", g.now)
		if math.IsNaN(got) || math.Abs(got-want) > 1e-9*want {
			t.Fatalf("gap %v: decayed use %v, want %v", gap, got, want)
		}
	}
}

// TestNewProgramWaitsBehindPausedOnes (rule 5.5): a new program is deferred while a program
// of its pool is paused, even with room for it on a worker (here room under capacity but not
// under the resume ceiling, so the settling does not resume it in the same ask).
func TestNewProgramWaitsBehindPausedOnes(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000)
	g.turn("big", 900, 900) // w1
	if d := g.check(g.req("huge", 5000)); d.Go {
		t.Fatalf("huge went: %+v", d)
	}
	if d := g.check(g.req("next", 900)); d.Go || d.Wait != WaitPaused {
		t.Fatalf("a new program went past a paused one: %+v", d)
	}
}

// TestResumedProgramsTurnIsWoken (admission.Waker): a settling that resumes a paused program
// names its held turn, once.
func TestResumedProgramsTurnIsWoken(t *testing.T) {
	c := cfg()
	c.SessionRetention, c.ActingDecayTau = time.Minute, time.Hour
	g := newRig(t, c, 1000)
	g.turn("big", 900, 900)
	held := g.req("n", 500)
	if d := g.check(held); d.Go {
		t.Fatalf("n went: %+v", d)
	}
	var woken []uint64
	g.p.Woken(func(k uint64) { woken = append(woken, k) })
	if len(woken) != 0 {
		t.Fatalf("woken before any resume: %v", woken)
	}
	g.now = g.now.Add(time.Minute) // big expires: room for n
	g.check(g.req("probe", 1))
	g.p.Woken(func(k uint64) { woken = append(woken, k) })
	if !slices.Contains(woken, held.Key) || g.prog("n").state != reasoning {
		t.Fatalf("woken %v, want n's turn %d (n is %s)", woken, held.Key, stateNames[g.prog("n").state])
	}
	woken = woken[:0]
	g.p.Woken(func(k uint64) { woken = append(woken, k) })
	if len(woken) != 0 {
		t.Fatalf("woken twice: %v", woken)
	}
}

// TestForcedResumeGoesToTheRoomiestListedFirst (rule 11): the roomiest worker wins also when
// the view lists it first.
func TestForcedResumeGoesToTheRoomiestListedFirst(t *testing.T) {
	c := cfg()
	c.ResumeTimeout = time.Second
	g := newRig(t, c, 1000, 1000)
	g.run(g.req("busy", 500), "w2", 500)
	g.check(g.req("free", 5000))
	g.now = g.now.Add(time.Second)
	g.p.forceTimedOut("p", g.ws, g.now)
	if w := g.prog("free").worker; w != "w1" {
		t.Fatalf("resumed on %q, want w1 (w2 has less room)", w)
	}
}

// TestMovedTurnIsChargedWhereItRuns: a turn that fails over to another worker is charged
// there, and its program is there when it completes.
func TestMovedTurnIsChargedWhereItRuns(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000)
	r := g.req("a", 100)
	if d := g.check(r); !d.Go || d.Target != "w1" {
		t.Fatalf("%+v", d)
	}
	g.p.Dispatched(r, "w1")
	g.p.Moved(r, "w1", "w2")
	pl := g.p.pools["p"]
	if g.prog("a").worker != "w2" || g.p.pauseUse(pl, "w1") != 0 || g.p.pauseUse(pl, "w2") != 100 {
		t.Fatalf("after the move: on %q, w1 %v, w2 %v", g.prog("a").worker, g.p.pauseUse(pl, "w1"), g.p.pauseUse(pl, "w2"))
	}
	r.ContextTokens = 150
	g.p.Completed(r, "w2")
	if pr := g.prog("a"); pr.worker != "w2" || pr.state != acting {
		t.Fatalf("completed: %s on %q", stateNames[pr.state], pr.worker)
	}
}

// TestPauseSideActingUseIsWeighted: pausing an acting program takes its tokens × weight off
// its worker's pause-side use.
func TestPauseSideActingUseIsWeighted(t *testing.T) {
	c := cfg()
	c.ActingTokenWeight = 2
	g := newRig(t, c, 1000)
	g.turn("a", 10, 100)
	if u := g.p.actingUse(g.prog("a"), g.now, false); u != 200 {
		t.Fatalf("pause-side use %v, want 200", u)
	}
}

// TestResumeSizeCountsTheBuffer (rule 10): a paused program resumes only where its size —
// its context plus buffer_per_program — fits under the resume ceiling.
func TestResumeSizeCountsTheBuffer(t *testing.T) {
	c := cfg()
	c.BufferPerProgram = 100
	g := newRig(t, c, 1000)
	m := newRig(t, c, 1000)
	for _, x := range []*rig{g, m} {
		x.p.programs[1] = &program{sid: 1, pool: "p", seq: 1, state: paused, pausedFrom: acting, tokens: 700, steps: 1,
			actingSince: x.now, pausedSince: x.now}
		x.p.reindex(x.p.programs[1])
	}
	// 850 of room under the ceiling: 700 + 100 fits, 800 + 100 does not.
	g.p.greedyResume("p", g.ws, g.now)
	if pr := g.p.programs[1]; pr.state != acting || pr.worker != "w1" {
		t.Fatalf("800 in 850 of room: %s on %q", stateNames[pr.state], pr.worker)
	}
	m.p.programs[1].tokens = 800
	m.p.reindex(m.p.programs[1])
	m.p.greedyResume("p", m.ws, m.now)
	if pr := m.p.programs[1]; pr.state != paused {
		t.Fatalf("900 in 850 of room: %s", stateNames[pr.state])
	}
}
