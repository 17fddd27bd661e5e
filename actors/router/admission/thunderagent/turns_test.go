package thunderagent

import (
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// TestPausedTurnLeavingThenResumedChargesNoTurn: a later turn deferred (its program paused
// with a turn waiting) whose client leaves puts the program back between turns: when room
// comes back the program charges what it takes between turns (its acting tokens), never a
// reasoning size for a turn that is gone, and it expires session_retention after its last
// completed turn.
func TestPausedTurnLeavingThenResumedChargesNoTurn(t *testing.T) {
	c := cfg()
	c.SessionRetention = time.Minute
	g := newRig(t, c, 1000)
	g.turn("s", 300, 300) // acting on w1
	g.ws = []admission.Worker{{ID: "w2", Capacity: 1000}}
	g.turn("big", 900, 900) // acting on w2: no room for s's next turn
	r := g.req("s", 400)
	if d := g.check(r); d.Go || g.prog("s").state != paused || g.prog("s").pausedFrom != reasoning {
		t.Fatalf("s's turn: %+v, program %+v", d, g.prog("s"))
	}
	g.p.Left(r) // the client left while its program was paused
	g.ws = []admission.Worker{{ID: "w1", Capacity: 1000}, {ID: "w2", Capacity: 1000}}
	g.now = g.now.Add(10 * time.Second)
	g.check(g.req("probe", 1)) // w1 is back: the ask settles the ledger
	pr := g.prog("s")
	if pr.state != acting || pr.live != 0 {
		t.Fatalf("s after its turn left: %s (from %s), live %d", stateNames[pr.state], stateNames[pr.pausedFrom], pr.live)
	}
	for id, wl := range g.p.pools["p"].workers {
		if wl.reasoning > 1 {
			t.Fatalf("%s charges %d tokens of reasoning, want only the probe's 1", id, wl.reasoning)
		}
	}
	g.now = g.now.Add(time.Minute)
	g.check(g.req("probe2", 1))
	if g.p.programs[g.p.sessionKey("s")] != nil {
		t.Fatal("s outlived its retention")
	}
}

// TestFirstTurnLeavingLeavesAFreshProgram: a new program's first turn, deferred and then
// left while a second turn of its session waits, leaves the program as that second turn
// would find a new one: not paused since the first turn's deferral (its forced resume counts
// from its own), not sized by the first turn's prompt (which charged its worker and paused
// others for a turn that is gone).
func TestFirstTurnLeavingLeavesAFreshProgram(t *testing.T) {
	setup := func(t *testing.T, second int) (*rig, *admission.Request) {
		c := cfg()
		c.ResumeTimeout = 10 * time.Second
		c.ActingDecayTau = time.Hour // big's acting tokens keep w1 full on the resume side too
		g := newRig(t, c, 1000)
		g.turn("big", 900, 900) // acting on w1: 100 tokens of room left
		first, next := g.req("n", 900), g.req("n", second)
		if d := g.check(first); d.Go {
			t.Fatalf("the first turn went: %+v", d)
		}
		g.now = g.now.Add(9 * time.Second)
		g.p.Left(first)
		return g, next
	}
	t.Run("deferred", func(t *testing.T) {
		g, next := setup(t, 200) // does not fit either
		d := g.check(next)
		if d.Go || !d.Until.Equal(g.now.Add(10*time.Second)) {
			t.Fatalf("the second turn: %+v, want held until %v (its own resume timeout)", d, g.now.Add(10*time.Second))
		}
		if ps := g.prog("n").pausedSince; !ps.Equal(g.now) {
			t.Fatalf("paused since %v, want %v", ps, g.now)
		}
	})
	t.Run("released", func(t *testing.T) {
		g, next := setup(t, 50) // fits
		if d := g.check(next); !d.Go || d.Target != "w1" {
			t.Fatalf("the second turn: %+v", d)
		}
		if u := g.p.pauseUse(g.p.pools["p"], "w1"); u != 950 {
			t.Fatalf("w1's use %v, want 950 (big's 900 and the second turn's 50)", u)
		}
		if s := g.prog("big").state; s != acting {
			t.Fatalf("big is %s: paused for a turn that left", stateNames[s])
		}
	})
}

// TestHeadNarrowedViewClearsOnlyGoneWorkers (rule 9.2: assignments are cleared on dead
// workers): a head that may use only some of its pool's workers (a hard pin elsewhere, an
// allowed set, a pick's exclusions) leaves the other programs on the workers it may not use
// where they are, charging them; a worker that left the pool is cleared.
func TestHeadNarrowedViewClearsOnlyGoneWorkers(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000)
	if w := g.turn("a", 300, 300); w != "w1" {
		t.Fatalf("a went to %s", w)
	}
	w2 := []admission.Worker{g.ws[1]}
	pinned := g.req("b", 100, "w2")
	if d := g.p.Check(pinned, view{ws: w2, now: g.now, pool: []string{"w1", "w2"}}); !d.Go || d.Target != "w2" {
		t.Fatalf("the pinned head: %+v", d)
	}
	pl := g.p.pools["p"]
	if pr := g.prog("a"); pr.worker != "w1" || g.p.pauseUse(pl, "w1") != 300 {
		t.Fatalf("a pinned head elsewhere unassigned a: worker %q, w1's use %v", pr.worker, g.p.pauseUse(pl, "w1"))
	}
	if w := g.turn("a", 10, 310); w != "w1" {
		t.Fatalf("a's next turn went to %s, want w1 where it is", w)
	}
	// w1 leaves the pool: the next head (whatever it may use) clears a's place there.
	g.now = g.now.Add(time.Millisecond)
	if d := g.p.Check(g.req("c", 10, "w2"), view{ws: w2, now: g.now, pool: []string{"w2"}}); !d.Go {
		t.Fatalf("c: %+v", d)
	}
	if pr := g.prog("a"); pr.worker != "" || g.p.pauseUse(pl, "w1") != 0 {
		t.Fatalf("a kept its place on a worker gone: worker %q, w1's use %v", pr.worker, g.p.pauseUse(pl, "w1"))
	}
}

// TestPinIsTheTurns: a hard pin is a turn's (its request allowed on one worker only), not its
// program's for ever: a later turn that may go anywhere is resumed wherever room comes back,
// also when the worker an earlier turn was pinned to is gone (it waited for that worker, held
// until its queue's max wait, turn after turn).
func TestPinIsTheTurns(t *testing.T) {
	c := cfg()
	c.SessionRetention, c.ResumeTimeout = time.Minute, time.Hour
	g := newRig(t, c, 1000, 1000)
	first := g.req("s", 100, "w1")
	if d := g.check(first); !d.Go || d.Target != "w1" {
		t.Fatalf("the pinned turn: %+v", d)
	}
	g.run(first, "w1", 100)
	if w := g.turn("big", 900, 900); w != "w2" {
		t.Fatalf("big went to %s", w)
	}
	g.ws = g.ws[1:] // w1 leaves
	next := g.req("s", 200)
	if d := g.check(next); d.Go {
		t.Fatalf("s's next turn went with no room: %+v", d)
	}
	g.now = g.now.Add(time.Minute) // big's retention ends: w2 has room
	if d := g.check(next); !d.Go || d.Target != "w2" {
		t.Fatalf("s's next turn, free to go anywhere, was held: %+v (program pinned to %q)", d, g.prog("s").pin)
	}
}
