package thunderagent

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// exact is a configuration whose shares are exact binary fractions, so boundaries are exact.
func exact() Config {
	c := cfg()
	c.PauseThreshold, c.PauseTarget, c.ResumeHysteresis = 0.75, 0.5, 0.25
	return c
}

// TestConfigBoundaries: pause_target and resume_hysteresis may equal pause_threshold.
func TestConfigBoundaries(t *testing.T) {
	if _, err := ParseConfig(map[string]any{"pause_threshold": 0.5, "pause_target": 0.5, "resume_hysteresis": 0.5}); err != nil {
		t.Fatal(err)
	}
}

// TestFinalTurnsCountTowardTheLimit: a final turn still tracked counts against
// max_tracked_requests.
func TestFinalTurnsCountTowardTheLimit(t *testing.T) {
	c := cfg()
	c.MaxTrackedRequests = 2
	g := newRig(t, c, 1000)
	g.turn("s", 10, 10)
	fin := g.req("s", 10)
	fin.Final = true
	g.check(fin) // tracked as a final turn now
	if r := g.req("a", 10); r.Refuse != nil {
		t.Fatalf("second tracked request refused: %v", r.Refuse)
	}
	if r := g.req("b", 10); !errors.Is(r.Refuse, admission.ErrQueueFull) {
		t.Fatalf("third (one final, one open): %v", r.Refuse)
	}
	if g.p.Tracked() != 3 { // programs a + requests a + final
		t.Fatalf("tracked %d, want 3", g.p.Tracked())
	}
}

// TestTrackedRequestsSharedAmongKeys (R20): max_tracked_requests is shared among the API keys
// with requests tracked — a key alone may use them all, but once another key has one, a key
// holding ⌈max / k⌉ is refused while the other still gets in; the per-key counts are gone once
// the requests end.
func TestTrackedRequestsSharedAmongKeys(t *testing.T) {
	c := cfg()
	c.MaxTrackedRequests = 4
	g := newRig(t, c, 1000)
	req := func(sid string, apiKey int) *admission.Request {
		g.key++
		r := &admission.Request{Key: g.key, SessionID: sid, PromptTokens: 10, APIKey: apiKey, Pool: "p"}
		g.p.Classify(r, nil, nil)
		return r
	}
	var live []*admission.Request
	for i := range 4 { // key 0 alone: all four (turns of one program: the program limit is far)
		if r := req("a", 0); r.Refuse != nil {
			t.Fatalf("key 0's request %d refused: %v", i, r.Refuse)
		} else {
			live = append(live, r)
		}
	}
	if r := req("b0", 1); !errors.Is(r.Refuse, admission.ErrQueueFull) || !strings.Contains(r.Refuse.Error(), "its limit of 4 requests") {
		t.Fatalf("a fifth request, of another key: %v", r.Refuse)
	}
	g.p.Left(live[0])
	g.p.Left(live[1])
	b0 := req("b0", 1) // k = 2, share 2: key 1 has none
	if b0.Refuse != nil {
		t.Fatalf("key 1's first: %v", b0.Refuse)
	}
	if r := req("a9", 0); !errors.Is(r.Refuse, admission.ErrQueueFull) || !strings.Contains(r.Refuse.Error(), "share of 2") {
		t.Fatalf("key 0 at its share of 2 with room left: %v", r.Refuse)
	}
	b1 := req("b1", 1)
	if b1.Refuse != nil {
		t.Fatalf("key 1's second: %v", b1.Refuse)
	}
	for _, r := range []*admission.Request{live[2], live[3], b0, b1} {
		g.p.Left(r)
	}
	if len(g.p.keyOf) != 0 || len(g.p.perKey) != 0 || len(g.p.reqs) != 0 {
		t.Fatalf("after every request left: %d keyed, %d keys, %d requests", len(g.p.keyOf), len(g.p.perKey), len(g.p.reqs))
	}
}

// TestFinalTurnsCountTowardTheLimitForEveryKey: a final turn still tracked counts against
// max_tracked_requests whatever key the next request comes with — the per-key shares divide
// the limit, they do not add to it.
func TestFinalTurnsCountTowardTheLimitForEveryKey(t *testing.T) {
	c := cfg()
	c.MaxTrackedRequests = 2
	g := newRig(t, c, 1000)
	g.turn("s", 10, 10)
	fin := g.req("s", 10)
	fin.Final = true
	g.check(fin) // key 0's final turn, tracked
	req := func(sid string, apiKey int) *admission.Request {
		g.key++
		r := &admission.Request{Key: g.key, SessionID: sid, PromptTokens: 10, APIKey: apiKey, Pool: "p"}
		g.p.Classify(r, nil, nil)
		return r
	}
	if r := req("a", 1); r.Refuse != nil {
		t.Fatalf("key 1's request with one of two tracked: %v", r.Refuse)
	}
	if r := req("b", 2); !errors.Is(r.Refuse, admission.ErrQueueFull) || !strings.Contains(r.Refuse.Error(), "its limit of 2 requests") {
		t.Fatalf("key 2's request with a final turn and a request tracked: %v", r.Refuse)
	}
}

// TestEvictionTiesGoToTheOlderProgram: idle programs acting since the same instant: the one
// made first is evicted.
func TestEvictionTiesGoToTheOlderProgram(t *testing.T) {
	c := cfg()
	c.MaxTrackedRequests = 2
	g := newRig(t, c, 1000)
	a, b := g.req("a", 10), g.req("b", 10)
	g.run(a, "w1", 10)
	g.run(b, "w1", 10)
	g.req("c", 10)
	if g.p.programs[g.p.sessionKey("a")] != nil || g.p.programs[g.p.sessionKey("b")] == nil {
		t.Fatal("the newer of two equally idle programs was evicted")
	}
}

// TestRoomBoundaries: a new program fits a worker whose room is exactly its prompt plus the
// buffer, and not one token less; the buffer counts.
func TestRoomBoundaries(t *testing.T) {
	c := exact()
	c.BufferPerProgram = 50
	g := newRig(t, c, 1000)
	g.turn("a", 400, 400) // acting 400: room 600
	if d := g.check(g.req("fits", 550)); !d.Go || d.Target != "w1" {
		t.Fatalf("550 + 50 in a room of 600: %+v", d)
	}
	h := newRig(t, c, 1000)
	h.turn("a", 400, 400)
	if d := h.check(h.req("over", 551)); d.Go {
		t.Fatalf("551 + 50 in a room of 600 went: %+v", d)
	}
}

// TestLeastUsedWins: the least-used worker with room goes first whatever its id, and equal
// use goes to the lowest id.
func TestLeastUsedWins(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000, 1000)
	g.run(g.req("x", 300), "w1", 300)
	g.run(g.req("y", 100), "w2", 100)
	g.run(g.req("z", 200), "w3", 200)
	if d := g.check(g.req("n", 10)); d.Target != "w2" {
		t.Fatalf("%+v, want the least used w2", d)
	}
}

// TestContinuingProgramIsNotDeferredBehindPaused (rule 5.5 applies to new programs only): a
// program with completed turns whose worker left goes where it fits although another program
// is paused.
func TestContinuingProgramIsNotDeferredBehindPaused(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000)
	g.turn("old", 100, 100)
	g.prog("old").worker = "gone"
	g.req("waiting", 5000) // too big anywhere: paused
	g.check(g.p.reqsOf("waiting"))
	// 900 fits a worker (1000) but not under the resume ceiling (850): only rule 5.7 lets it go.
	if d := g.check(g.req("old", 900)); !d.Go {
		t.Fatalf("%+v", d)
	}
}

// reqsOf finds a tracked request of session sid (tests only).
func (p *Policy) reqsOf(sid string) *admission.Request {
	for k, pr := range p.reqs {
		if pr.sid == p.sessionKey(sid) {
			return &admission.Request{Key: k, SessionID: sid, PromptTokens: max(pr.tokens, pr.turnTokens), Pool: pr.pool}
		}
	}
	return nil
}

// TestPoolsAreSeparate: a paused program of another pool neither defers a new program here
// nor loses its state when this pool's workers are settled; a program whose worker left this
// pool is unassigned, a running one is not.
func TestPoolsAreSeparate(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	other := &admission.Request{Key: 999, SessionID: "o", PromptTokens: 5000, Pool: "q"}
	g.p.Classify(other, nil, nil)
	g.p.Check(other, view{ws: []admission.Worker{{ID: "v1", Capacity: 100}}, now: g.now})
	if g.prog("o").state != paused {
		t.Fatal("setup: o not paused")
	}
	// 900: it fits, but not under the resume ceiling, so only rule 5.7 (not a resume) lets it go.
	if d := g.check(g.req("n", 900)); !d.Go {
		t.Fatalf("a new program deferred behind another pool's paused one: %+v", d)
	}
	g.run(g.req("left", 10), "w9", 10) // w9 is not among this pool's workers
	run := g.req("running", 10)
	g.check(run)
	g.p.Dispatched(run, "w8")
	g.check(g.req("n2", 10))
	if g.prog("left").worker != "" || g.prog("running").worker != "w8" || g.prog("o").state != paused {
		t.Fatalf("left %q, running %q, o %v", g.prog("left").worker, g.prog("running").worker, stateNames[g.prog("o").state])
	}
}

// TestSizeIsContextOrTurnPlusBuffer: a reasoning program takes the larger of its context and
// its turn's prompt, plus the buffer.
func TestSizeIsContextOrTurnPlusBuffer(t *testing.T) {
	c := cfg()
	c.BufferPerProgram = 7
	g := newRig(t, c, 1000)
	g.turn("a", 100, 300)
	r := g.req("a", 200)
	g.check(r)
	g.p.Dispatched(r, "w1")
	if u := g.p.usage("p", g.now, false)["w1"]; u != 307 {
		t.Fatalf("usage %v, want 300 + 7", u)
	}
	r2 := g.req("b", 400)
	g.check(r2)
	g.p.Dispatched(r2, "w1")
	if u := g.p.usage("p", g.now, false)["w1"]; u != 307+407 {
		t.Fatalf("usage %v, want 714", u)
	}
}

// TestActingUse: the pause side weighs an acting program's tokens; the resume side decays them
// by 2^(−idle/τ).
func TestActingUse(t *testing.T) {
	c := cfg()
	c.ActingTokenWeight = 1.5
	c.ActingDecayTau = 2 * time.Second
	g := newRig(t, c, 1000)
	g.turn("a", 400, 400)
	if u := g.p.usage("p", g.now, false)["w1"]; u != 600 {
		t.Fatalf("pause side %v, want 600", u)
	}
	g.now = g.now.Add(4 * time.Second)
	if u := g.p.usage("p", g.now, true)["w1"]; math.Abs(u-100) > 1e-9 {
		t.Fatalf("resume side after 2τ %v, want 100", u)
	}
}

// TestPauseThresholdBoundary: at exactly pause_threshold nothing is paused; one token over,
// programs are paused down to pause_target, and reasoning ones are marked only if acting ones
// cannot bring it there.
func TestPauseThresholdBoundary(t *testing.T) {
	g := newRig(t, exact(), 1000) // threshold 750, target 500
	g.turn("a", 250, 250)
	g.turn("b", 250, 250)
	r := g.req("c", 250)
	g.check(r)
	g.p.Dispatched(r, "w1") // 750: at the threshold
	g.p.pauseUntilSafe("p", g.ws, g.now)
	if g.prog("a").state == paused || g.prog("b").state == paused || g.prog("c").markPause {
		t.Fatal("paused at exactly the threshold")
	}
	h := newRig(t, exact(), 1000)
	h.turn("a", 250, 250)
	h.turn("b", 251, 251)
	r = h.req("c", 250)
	h.check(r)
	h.p.Dispatched(r, "w1") // 751: one over; pausing a (250) leaves 501 > 500, then b: 250
	h.p.pauseUntilSafe("p", h.ws, h.now)
	if h.prog("a").state != paused || h.prog("b").state != paused || h.prog("c").markPause {
		t.Fatalf("a %v b %v c marked %v", stateNames[h.prog("a").state], stateNames[h.prog("b").state], h.prog("c").markPause)
	}
}

// TestGreedyBoundaries: a worker with exactly one buffer of headroom takes nothing; a set
// whose size equals the total headroom is taken whole; a program fits a room of exactly its
// size; an acting program resumed starts its retention anew.
func TestGreedyBoundaries(t *testing.T) {
	c := exact() // resume ceiling 0.5
	c.BufferPerProgram = 10
	h := newRig(t, c, 1000)
	h.turn("s", 290, 290)
	h.p.pause(h.prog("s"), acting, h.now)
	completed := h.prog("s").actingSince
	h.now = h.now.Add(time.Second)
	// Headroom 500 − 0 = 500; s's size 290 + 10 = 300 fits: resumed as acting; its retention
	// still counts from its last completed turn.
	h.p.greedyResume("p", h.ws, h.now)
	if pr := h.prog("s"); pr.state != acting || !pr.actingSince.Equal(completed) || pr.worker != "w1" {
		t.Fatalf("%+v", pr)
	}
	k := newRig(t, c, 620) // headroom 310: exactly s1 + s2 (150 + 160 with buffers)
	for _, x := range []struct {
		sid string
		n   int
	}{{"s1", 140}, {"s2", 150}} {
		k.turn(x.sid, x.n, x.n)
		k.p.pause(k.prog(x.sid), acting, k.now)
	}
	k.now = k.now.Add(time.Second) // nothing else uses w1
	k.p.greedyResume("p", k.ws, k.now)
	if k.prog("s1").state == paused || k.prog("s2").state == paused {
		t.Fatalf("a set exactly the headroom was not taken whole: s1 %v, s2 %v", stateNames[k.prog("s1").state], stateNames[k.prog("s2").state])
	}
	m := newRig(t, c, 20) // headroom 10: exactly one buffer: takes nothing
	m.turn("tiny", 0, 0)
	m.p.pause(m.prog("tiny"), acting, m.now)
	m.p.greedyResume("p", m.ws, m.now)
	if m.prog("tiny").state != paused {
		t.Fatal("a worker with one buffer of headroom took a program")
	}
}

// TestForcedResumeRespectsPinAndTies: a pinned program is forced only onto its pin (and waits
// if its pin is gone); among equals the lowest id wins; the roomiest wins otherwise.
func TestForcedResumeRespectsPinAndTies(t *testing.T) {
	c := cfg()
	c.ResumeTimeout = time.Second
	g := newRig(t, c, 1000, 1000, 1000)
	g.run(g.req("busy", 500), "w1", 500)
	pinned := g.req("pinned", 5000, "w1")
	g.check(pinned)
	free := g.req("free", 5000)
	g.check(free)
	gone := g.req("gone", 5000, "w9")
	g.check(gone)
	g.now = g.now.Add(time.Second)
	g.p.forceTimedOut("p", g.ws, g.now)
	if g.prog("pinned").worker != "w1" || g.prog("free").worker != "w2" || g.prog("gone").state != paused {
		t.Fatalf("pinned %q, free %q (want w2: w2 and w3 tie, w1 has less), gone %v",
			g.prog("pinned").worker, g.prog("free").worker, stateNames[g.prog("gone").state])
	}
}

// TestCompletionWithoutUsageKeepsTheLargerEstimate: a turn completed with no usage keeps the
// larger of the program's context and the turn's prompt.
func TestCompletionWithoutUsageKeepsTheLargerEstimate(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	g.turn("a", 100, 0)
	if pr := g.prog("a"); pr.tokens != 100 || pr.state != acting {
		t.Fatalf("%+v", pr)
	}
	g.turn("a", 50, 0)
	if pr := g.prog("a"); pr.tokens != 100 {
		t.Fatalf("tokens %d, want 100", pr.tokens)
	}
}

// TestStatsCountsStates: the programs by state, an expired one not counted, and the counts of
// pauses and forced resumes.
func TestStatsCountsStates(t *testing.T) {
	c := cfg()
	c.SessionRetention = time.Minute
	g := newRig(t, c, 1000)
	g.turn("acting", 100, 100)
	g.check(g.req("reasoning", 100))
	g.check(g.req("paused", 5000))
	g.now = g.now.Add(30 * time.Second)
	g.turn("old", 10, 10)
	g.now = g.now.Add(30 * time.Second) // "acting" expires; "old" has 30 s left
	s := g.p.Stats()
	if s.Reasoning != 1 || s.Acting != 1 || s.Paused != 1 || len(g.p.Programs()) != 3 {
		t.Fatalf("%+v, %d listed", s, len(g.p.Programs()))
	}
	g.p.pauses, g.p.forced = 4, 2
	if s := g.p.Stats(); s.Pauses != 4 || s.ForcedResumes != 2 {
		t.Fatalf("%+v", s)
	}
}

// TestLeftLaterTurnRollsBack: a later turn decided (released) but cancelled before it ran
// puts its program back as it was; a new program's first turn cancelled the same way is gone.
func TestLeftLaterTurnRollsBack(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	g.turn("s", 100, 120)
	before := *g.prog("s")
	r := g.req("s", 300)
	if d := g.check(r); !d.Go {
		t.Fatalf("%+v", d)
	}
	g.p.Left(r) // e.g. the worker was full, the turn queued, the client left
	pr := g.prog("s")
	if pr.state != acting || pr.tokens != before.tokens || pr.turnTokens != 0 || pr.live != 0 || g.p.Tracked() != 1 {
		t.Fatalf("after the cancelled turn: %+v (tracked %d)", pr, g.p.Tracked())
	}
	held := g.req("big", 5000) // deferred: paused
	g.check(held)
	g.p.Left(held)
	if g.p.programs[g.p.sessionKey("big")] != nil || g.p.Tracked() != 1 {
		t.Fatalf("a deferred new program outlived its cancelled turn (tracked %d)", g.p.Tracked())
	}
}

// TestOversizedIdleProgramExpires: a program between turns bigger than its worker's pause
// threshold is paused, forced back after resume_timeout and paused again, but it expires
// session_retention after its last completed turn like any idle program.
func TestOversizedIdleProgramExpires(t *testing.T) {
	c := cfg()
	c.ResumeTimeout, c.SessionRetention = time.Second, 5*time.Second
	g := newRig(t, c, 1000, 1000)
	g.turn("huge", 100, 5000)
	for i := 0; i < 4; i++ {
		g.now = g.now.Add(time.Second)
		g.turn(fmt.Sprint("probe", i), 1, 1) // any ask settles the ledger
	}
	if g.p.programs[g.p.sessionKey("huge")] == nil || g.p.pauses == 0 {
		t.Fatalf("setup: huge %v, pauses %d", g.p.programs[g.p.sessionKey("huge")], g.p.pauses)
	}
	g.now = g.now.Add(time.Second) // 5 s after its last completed turn
	g.check(g.req("probe-last", 1))
	if g.p.programs[g.p.sessionKey("huge")] != nil {
		t.Fatalf("the idle program never expired (state %v)", stateNames[g.p.programs[g.p.sessionKey("huge")].state])
	}
}

// TestPausedActingProgramWithAWaitingTurnGoesWhenResumed: a program paused while acting whose
// next turn waits is resumed as reasoning (its turn goes next), so the same settling's pause
// step does not pause it again: forced back after resume_timeout, its turn goes.
func TestPausedActingProgramWithAWaitingTurnGoesWhenResumed(t *testing.T) {
	c := cfg()
	c.ResumeTimeout = 5 * time.Second
	g := newRig(t, c, 1000)
	g.turn("s", 300, 300)
	big := g.req("big", 800) // a continuing-size turn: pushes w1 over, s (acting) is paused
	g.p.Dispatched(big, "w1")
	g.check(g.req("probe", 1))
	if g.prog("s").state != paused {
		t.Fatalf("setup: s %v", stateNames[g.prog("s").state])
	}
	next := g.req("s", 320)
	if d := g.check(next); d.Go {
		t.Fatalf("%+v", d)
	}
	g.now = g.now.Add(5 * time.Second)
	d := g.check(next)
	if !d.Go || d.Target != "w1" || g.prog("s").state != reasoning {
		t.Fatalf("after resume_timeout: %+v, s %v", d, stateNames[g.prog("s").state])
	}
}

// TestSessionIDsAreKeyedHashes: the ledger keys programs by a keyed hash of the session id —
// its memory does not follow a client's id length, the admin view never shows the id, and
// distinct ids are distinct programs.
func TestSessionIDsAreKeyedHashes(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	long := strings.Repeat("x", 64<<10)
	g.turn(long, 10, 10)
	g.turn(long+"y", 10, 10)
	vs := g.p.Programs()
	if len(vs) != 2 || vs[0].Session == vs[1].Session {
		t.Fatalf("%+v", vs)
	}
	for _, v := range vs {
		if len(v.Session) > 16 || strings.Contains(v.Session, "xxx") {
			t.Fatalf("the admin view shows %q", v.Session)
		}
	}
	other := New(cfg(), g.p.now) // another process: another key
	if other.sessionKey(long) == g.p.sessionKey(long) {
		t.Fatal("the session key is not keyed per process")
	}
}

// TestUnknownCapacityWorkersAreNeitherPlacedNorPaused: a worker of unknown capacity (0) is not
// where a new program goes when another's capacity is known, even for an empty prompt, and its
// programs are never paused.
func TestUnknownCapacityWorkersAreNeitherPlacedNorPaused(t *testing.T) {
	g := newRig(t, cfg(), 0, 1000)
	if d := g.check(g.req("empty", 0)); !d.Go || d.Target != "w2" {
		t.Fatalf("%+v, want w2 (the only known capacity)", d)
	}
	h := newRig(t, cfg(), 0)
	h.turn("a", 500, 500)
	h.turn("b", 500, 500)
	h.p.pauseUntilSafe("p", h.ws, h.now)
	if h.prog("a").state == paused || h.prog("b").state == paused || h.p.pauses != 0 {
		t.Fatal("programs on a worker of unknown capacity were paused")
	}
}

// TestPauseStopsExactlyAtTarget: once pausing acting programs brings a worker to exactly its
// pause_target, its reasoning programs are not marked.
func TestPauseStopsExactlyAtTarget(t *testing.T) {
	g := newRig(t, exact(), 1000) // threshold 750, target 500
	g.turn("a", 260, 260)
	r := g.req("c", 500)
	g.check(r)
	g.p.Dispatched(r, "w1") // 760 > 750: pause a (260) → 500, exactly the target
	g.p.pauseUntilSafe("p", g.ws, g.now)
	if g.prog("a").state != paused || g.prog("c").markPause {
		t.Fatalf("a %v, c marked %v", stateNames[g.prog("a").state], g.prog("c").markPause)
	}
}

// TestDeferredLaterTurnLeavingRestoresTheProgram: a later turn deferred (its program paused)
// that leaves undecided puts the program back between turns as it was when the turn was
// first decided.
func TestDeferredLaterTurnLeavingRestoresTheProgram(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	g.turn("s", 300, 300)
	g.ws = []admission.Worker{{ID: "w2", Capacity: 1000}} // w1 left
	r := g.req("s", 5000)
	if d := g.check(r); d.Go || g.prog("s").state != paused {
		t.Fatalf("%+v", d)
	}
	g.p.Left(r)
	if pr := g.prog("s"); pr.state != acting || pr.tokens != 300 || g.p.Tracked() != 1 {
		t.Fatalf("%+v", pr)
	}
}

// TestHardPinRoom (rule 5.6): a pinned new program goes to its pin when the room there is at
// least its prompt (exactly enough included), never elsewhere: with no room at its pin it is
// deferred even while another worker is empty.
func TestHardPinRoom(t *testing.T) {
	g := newRig(t, cfg(), 1000, 1000)
	if d := g.check(g.req("exact", 1000, "w2")); !d.Go || d.Target != "w2" {
		t.Fatalf("a pin with exactly enough room: %+v", d)
	}
	h := newRig(t, cfg(), 1000, 1000)
	h.run(h.req("other", 500), "w2", 500) // w2: 500 acting; w1 empty
	if d := h.check(h.req("pinned", 600, "w2")); d.Go {
		t.Fatalf("a pin without room at its worker went (w1 is empty): %+v", d)
	}
}

// TestHoldUntilCountsPausedIdlePrograms: an idle program paused between turns still frees its
// room when its retention ends, so a held head is asked again then.
func TestHoldUntilCountsPausedIdlePrograms(t *testing.T) {
	c := cfg()
	c.SessionRetention, c.ResumeTimeout = 10*time.Second, time.Hour
	g := newRig(t, c, 1000)
	g.turn("idle", 100, 100)
	g.p.pause(g.prog("idle"), acting, g.now)
	d := g.check(g.req("huge", 5000))
	if d.Go || !d.Until.Equal(g.now.Add(10*time.Second)) {
		t.Fatalf("%+v, want held until the paused idle program's retention ends", d)
	}
}

// TestProgramsView: paused_since is given for paused programs only, and the list is ordered by
// session hash.
func TestProgramsView(t *testing.T) {
	g := newRig(t, cfg(), 1000)
	g.turn("a", 10, 10)
	g.check(g.req("b", 5000))
	vs := g.p.Programs()
	if len(vs) != 2 || vs[0].Session > vs[1].Session {
		t.Fatalf("%+v", vs)
	}
	for _, v := range vs {
		if (v.State == StatePaused) != (v.PausedSince != nil) {
			t.Fatalf("%+v", v)
		}
	}
}

// TestHardPinRoomIsThePinnedWorkers: a pin's room is its own worker's capacity, whatever room
// a bigger worker has; and among workers used alike the lowest id wins, in whatever order the
// view lists them.
func TestHardPinRoomIsThePinnedWorkers(t *testing.T) {
	g := newRig(t, cfg(), 2000, 1000)
	g.run(g.req("other", 500), "w2", 500) // w2: 500 acting; w1 empty and twice as big
	if d := g.check(g.req("pinned", 600, "w2")); d.Go {
		t.Fatalf("a pin without room at its worker went (w1 has 2,000): %+v", d)
	}

	h := newRig(t, cfg(), 1000, 1000, 1000)
	h.ws[0], h.ws[2] = h.ws[2], h.ws[0] // the view lists w3, w2, w1
	if d := h.check(h.req("n", 10)); !d.Go || d.Target != "w1" {
		t.Fatalf("%+v, want the lowest id w1 among workers used alike", d)
	}
}

// TestForcedResumeTiesInAnyOrder: the forced resume's tie goes to the lowest id whatever order
// the view lists the workers in.
func TestForcedResumeTiesInAnyOrder(t *testing.T) {
	c := cfg()
	c.ResumeTimeout = time.Second
	g := newRig(t, c, 1000, 1000, 1000)
	g.ws[0], g.ws[2] = g.ws[2], g.ws[0] // w3, w2, w1
	g.run(g.req("busy", 500), "w1", 500)
	free := g.req("free", 5000)
	g.check(free)
	g.now = g.now.Add(time.Second)
	g.p.forceTimedOut("p", g.ws, g.now)
	if w := g.prog("free").worker; w != "w2" {
		t.Fatalf("resumed on %q, want w2 (w2 and w3 tie, w1 has less room)", w)
	}
}

// TestGreedyResumeTakesAPrefixThenPacksIt (rule 10): the programs resumed are the longest
// prefix of the resume order (fewer tokens first among equals) that fits the total headroom —
// not whatever packs: with room for 450 and programs of 100, 200 and 300, the 100 and the 200
// are resumed and the 300 stays paused, although 300 and 100 would pack too.
func TestGreedyResumeTakesAPrefixThenPacksIt(t *testing.T) {
	g := newRig(t, cfg(), 530) // 0.85 × 530 = 450.5
	for _, x := range []struct {
		sid    string
		tokens int
	}{{"a300", 300}, {"b200", 200}, {"c100", 100}} {
		g.turn(x.sid, x.tokens, x.tokens)
		g.p.pause(g.prog(x.sid), acting, g.now)
	}
	g.p.greedyResume("p", g.ws, g.now)
	got := map[string]string{}
	for _, sid := range []string{"a300", "b200", "c100"} {
		got[sid] = stateNames[g.prog(sid).state]
	}
	if want := map[string]string{"a300": StatePaused, "b200": StateActing, "c100": StateActing}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("states %v, want %v", got, want)
	}
}
