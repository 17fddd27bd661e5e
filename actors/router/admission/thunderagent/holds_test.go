package thunderagent

import (
	"testing"
	"time"
)

// TestPausedTurnIsHeldUntilTheGateNamesIt (admission.Decision.GateWakes): the held turn of a
// program deferred for want of room is marked as one the gate names when it resumes the
// program, so a capacity free asks one such head per candidate set instead of every one.
// A turn held only behind its session's running turn is not: nothing but the session frees
// it.
func TestPausedTurnIsHeldUntilTheGateNamesIt(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	big := g.req("big", 5000)
	if d := g.check(big); d.Go || d.Wait != WaitPaused || !d.GateWakes {
		t.Fatalf("a turn with no room anywhere: %+v, want held paused until the gate names it", d)
	}
	a := g.req("s", 100)
	if d := g.check(a); !d.Go {
		t.Fatalf("s's first turn: %+v", d)
	}
	g.p.Dispatched(a, "w1")
	if d := g.check(g.req("s", 100)); d.Go || d.Wait != WaitTurn || d.GateWakes {
		t.Fatalf("s's second turn while its first runs: %+v, want held for the session only", d)
	}
}

// TestReleasedTurnHoldsTheSessionsNextOne (rule 4): a turn the gate has let go but that is not
// dispatched yet is the session's current turn: the session's next turn waits for it (a
// decision is never taken over one not yet settled), and goes once it has run or left.
func TestReleasedTurnHoldsTheSessionsNextOne(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000)
	first := g.req("s", 100)
	if d := g.check(first); !d.Go || d.Target != "w1" {
		t.Fatalf("first turn: %+v", d)
	}
	second := g.req("s", 200)
	if d := g.check(second); d.Go || d.Wait != WaitTurn || !d.SessionOnly {
		t.Fatalf("second turn while the first is released but not dispatched: %+v", d)
	}
	g.p.Left(first) // its client left before it was dispatched
	if d := g.check(second); !d.Go {
		t.Fatalf("second turn after the first left: %+v", d)
	}
}

// TestDecayResetWithTheLastActingProgram (ledger.go, workerLedger.decay): once the last acting
// program leaves a worker, its decayed acting use is exactly nothing, whatever rounding left
// of the removed terms: the resume side then reads the worker's reasoning sizes alone, so a
// worker that kept only running turns is not charged for programs long gone.
func TestDecayResetWithTheLastActingProgram(t *testing.T) {
	g := newRig(t, cfg(), 1_000_000)
	run := g.req("run", 1) // small: what rounding leaves shows beside it
	g.check(run)
	g.p.Dispatched(run, "w1") // reasoning on w1 throughout: the worker's ledger stays
	g.turn("a", 10, 1000)
	g.now = g.now.Add(300 * time.Millisecond) // a term of a non-integral power of two
	g.turn("b", 10, 3)
	for _, sid := range []string{"a", "b"} {
		fin := g.req(sid, 10)
		fin.Final = true
		if d := g.check(fin); !d.Go {
			t.Fatalf("%s's final turn: %+v", sid, d)
		}
	}
	pl := g.p.pools["p"]
	if got := g.p.resumeUse(pl, "w1", g.now); got != 1 {
		t.Fatalf("resume-side use %v, want exactly the running turn's 1", got)
	}
}

// TestExpiredPausedProgramIsNotCounted (rule 9.1, on read): a program paused between turns
// (paused while acting) expires with its retention like an acting one: Stats and the admin
// view stop counting it then, before any ask removes it.
func TestExpiredPausedProgramIsNotCounted(t *testing.T) {
	c := cfg()
	c.SessionRetention = time.Minute
	g := newRig(t, c, 1000)
	g.turn("idle", 100, 100)
	g.p.pause(g.prog("idle"), acting, g.now)
	g.now = g.now.Add(time.Minute - time.Nanosecond)
	if s := g.p.Stats(); s.Paused != 1 || s.Acting != 0 || len(g.p.Programs()) != 1 {
		t.Fatalf("within its retention: %+v, %d listed", s, len(g.p.Programs()))
	}
	g.now = g.now.Add(time.Nanosecond)
	if s := g.p.Stats(); s.Paused != 0 || s.Acting != 0 || s.Reasoning != 0 || len(g.p.Programs()) != 0 {
		t.Fatalf("past its retention: %+v, %d listed", s, len(g.p.Programs()))
	}
}

// TestResumedForATurnThatLeftIsActingAgain: a program paused between turns and resumed for a
// turn that then leaves before it was ever asked about is acting again, as its last completed
// turn left it — not a reasoning program with no turn, which would be charged its size and
// never expire — and expires with its retention.
func TestResumedForATurnThatLeftIsActingAgain(t *testing.T) {
	c := cfg()
	c.SessionRetention = time.Minute
	g := newRig(t, c, 1000)
	g.turn("a", 100, 100)
	completed := g.prog("a").actingSince
	g.p.pause(g.prog("a"), acting, g.now)
	next := g.req("a", 300) // queued, not asked yet
	g.check(g.req("probe", 1))
	if pr := g.prog("a"); pr.state != reasoning || pr.worker != "w1" {
		t.Fatalf("a after the settling: %s on %q, want resumed for its waiting turn", stateNames[pr.state], pr.worker)
	}
	g.p.Left(next)
	if pr := g.prog("a"); pr.state != acting || pr.tokens != 100 || !pr.actingSince.Equal(completed) {
		t.Fatalf("a after its turn left: %s, %d tokens, acting since %v", stateNames[pr.state], pr.tokens, pr.actingSince)
	}
	g.now = completed.Add(time.Minute)
	if s := g.p.Stats(); s.Acting != 0 {
		t.Fatalf("past its retention: %+v", s)
	}
}
