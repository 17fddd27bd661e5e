package thunderagent

import (
	"fmt"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// TestExpiryWhileWalkingKeepsEveryProgram (issue 34, review finding 2): the expiry of retained
// programs forgets them while it walks the ledger; an expiry that crosses the ledger's
// compaction point must neither panic (a compaction under the walk once left nil entries
// where the walk still read, and the innocent head being asked failed 500
// classifier_failed) nor skip a program: every expired program is gone, and the others stay.
func TestExpiryWhileWalkingKeepsEveryProgram(t *testing.T) {
	for _, idle := range []int{1, 2, 3, 4, 5, 8, 13} {
		t.Run(fmt.Sprint(idle, "idle"), func(t *testing.T) {
			c := cfg()
			c.SessionRetention = time.Minute
			c.MaxTrackedRequests = 100
			g := newRig(t, c, 1<<20)
			for i := range idle {
				g.turn(fmt.Sprint("idle", i), 10, 10) // acting: expires a minute from now
			}
			g.now = g.now.Add(30 * time.Second)
			for i := range 3 {
				g.turn(fmt.Sprint("recent", i), 10, 10) // acting: expires later
			}
			g.now = g.now.Add(30 * time.Second) // the idle programs' retention ends now
			head := g.req("innocent", 10)
			var d struct {
				went  bool
				panic any
			}
			func() {
				defer func() { d.panic = recover() }()
				d.went = g.check(head).Go
			}()
			if d.panic != nil {
				t.Fatalf("asking an innocent head panicked: %v", d.panic)
			}
			if !d.went {
				t.Fatal("the innocent head was held")
			}
			for i := range idle {
				if g.p.programs[g.p.sessionKey(fmt.Sprint("idle", i))] != nil {
					t.Fatalf("idle%d outlived its retention", i)
				}
			}
			for i := range 3 {
				g.prog(fmt.Sprint("recent", i))
			}
			if n := len(g.p.programs); n != 4 {
				t.Fatalf("%d programs, want the 3 recent ones and the innocent one", n)
			}
			if s := g.p.Stats(); s.Acting != 3 || s.Reasoning != 1 || s.Paused != 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// TestOneSettlingPerInstant (issue 34, review finding 7): held heads asked again with nothing
// changed — every paused program's head, on every wake — settle the ledger at most once per
// instant (and again only when an answer changed it): the rest of each ask is a few lookups.
// The answers are the ones a settling per ask gave.
func TestOneSettlingPerInstant(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	g.turn("big", 900, 900) // acting on w1: no room for anything new
	var held []*admission.Request
	for i := range 20 {
		r := g.req(fmt.Sprint("new", i), 500)
		if d := g.check(r); d.Go || d.Wait != WaitPaused {
			t.Fatalf("new%d: %+v", i, d)
		}
		held = append(held, r)
	}
	askAll := func() uint64 {
		before := g.p.settles
		for i, r := range held {
			if d := g.check(r); d.Go || d.Wait != WaitPaused || !d.Until.Equal(g.prog(fmt.Sprint("new", i)).pausedSince.Add(g.p.cfg.ResumeTimeout)) {
				t.Fatalf("new%d asked again: %+v", i, d)
			}
		}
		return g.p.settles - before
	}
	if n := askAll(); n != 0 {
		t.Fatalf("asking 20 held heads again in the same instant settled %d times, want 0", n)
	}
	g.now = g.now.Add(time.Millisecond)
	if n := askAll(); n != 1 {
		t.Fatalf("asking 20 held heads at a new instant settled %d times, want 1", n)
	}
	// An answer that changes the ledger is settled after: big's next turn goes (it continues
	// where it is), and the next head asked settles again.
	g.turn("big", 10, 950)
	if n := askAll(); n != 1 {
		t.Fatalf("after a turn, %d settlings, want 1", n)
	}
}
