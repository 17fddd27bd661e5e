package sessionserial

import (
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// ssView is a fixed view: two idle workers and a fixed time.
type ssView struct{}

func (ssView) Workers() []admission.Worker { return []admission.Worker{{ID: "w1"}, {ID: "w2"}} }
func (ssView) Now() time.Time              { return time.Unix(1000, 0) }

func ssReq(id, session string) *admission.Request {
	return &admission.Request{Key: key(id), ID: id, SessionID: session}
}

func ssWantGo(t *testing.T, s *Policy, r *admission.Request) {
	t.Helper()
	if d := s.Check(r, ssView{}); !d.Go || d.Target != "" {
		t.Fatalf("%s: got %+v, want Go without target", r.ID, d)
	}
}

func ssWantHold(t *testing.T, s *Policy, r *admission.Request) {
	t.Helper()
	d := s.Check(r, ssView{})
	if d.Go || d.Wait != WaitBusy || !d.Until.IsZero() || !d.SessionOnly {
		t.Fatalf("%s: got %+v, want a session-only hold with no time", r.ID, d)
	}
}

func TestSessionSerialPolicyShape(t *testing.T) {
	s := New()
	if s.Gate() != admission.Gate(s) {
		t.Fatal("Gate() must return the policy itself")
	}
	if s.Recheck() != 0 {
		t.Fatalf("Recheck = %v, want 0", s.Recheck())
	}
	r := &admission.Request{Key: key("a"), ID: "a", Class: "c", SessionID: "s", Allowed: []string{"w1"}}
	s.Classify(r, []string{"w1", "w2"}, func([]string) int { t.Fatal("cache read"); return 0 })
	if r.Class != "c" || r.Lane != "" || len(r.Allowed) != 1 || r.Tag != "" {
		t.Fatalf("Classify changed the request: %+v", r)
	}
}

// TestSessionSecondTurnHeldUntilFirstCompletes: one turn in flight per session; the second is
// held until the first completes, then goes.
func TestSessionSecondTurnHeldUntilFirstCompletes(t *testing.T) {
	s := New()
	t1, t2 := ssReq("t1", "alice"), ssReq("t2", "alice")
	ssWantGo(t, s, t1)
	s.Dispatched(t1, "w1")
	ssWantHold(t, s, t2)
	ssWantHold(t, s, t2) // asking again changes nothing
	s.Completed(t1, "w1")
	ssWantGo(t, s, t2)
	s.Dispatched(t2, "w2")
	ssWantHold(t, s, ssReq("t3", "alice"))
	s.Completed(t2, "w2")
	if len(s.inFlight) != 0 || len(s.bySID) != 0 {
		t.Fatalf("ledger not empty after every turn completed: %v %v", s.inFlight, s.bySID)
	}
}

// TestSessionOthersNotDelayed: a busy session delays neither other sessions nor requests
// without a session.
func TestSessionOthersNotDelayed(t *testing.T) {
	s := New()
	s.Dispatched(ssReq("a1", "alice"), "w1")
	ssWantHold(t, s, ssReq("a2", "alice"))
	ssWantGo(t, s, ssReq("b1", "bob"))
	s.Dispatched(ssReq("b1", "bob"), "w2")
	ssWantHold(t, s, ssReq("b2", "bob"))
	s.Completed(ssReq("a1", "alice"), "w1")
	ssWantGo(t, s, ssReq("a2", "alice"))
	ssWantHold(t, s, ssReq("b2", "bob"))
}

// TestSessionNoSessionAlwaysGoes: requests without a session are never held nor counted, even
// many at once.
func TestSessionNoSessionAlwaysGoes(t *testing.T) {
	s := New()
	for _, id := range []string{"n1", "n2", "n3"} {
		r := ssReq(id, "")
		ssWantGo(t, s, r)
		s.Dispatched(r, "w1")
	}
	ssWantGo(t, s, ssReq("n4", ""))
	if len(s.inFlight) != 0 || len(s.bySID) != 0 {
		t.Fatalf("sessionless requests were counted: %v %v", s.inFlight, s.bySID)
	}
	s.Completed(ssReq("n1", ""), "w1")
}

// TestSessionCompletedTwiceIsHarmless: a second Completed, a Completed for a request never
// dispatched and a duplicate Dispatched change no count and never drive one negative.
func TestSessionCompletedTwiceIsHarmless(t *testing.T) {
	s := New()
	a1, a2 := ssReq("a1", "alice"), ssReq("a2", "alice")
	s.Completed(ssReq("ghost", "alice"), "w1") // unknown: no-op
	s.Dispatched(a1, "w1")
	s.Dispatched(a1, "w1") // duplicate: counted once
	s.Completed(a1, "w1")
	ssWantGo(t, s, a2)
	s.Completed(a1, "w1") // twice: no-op
	if len(s.inFlight) != 0 || len(s.bySID) != 0 {
		t.Fatalf("ledger not empty: %v %v", s.inFlight, s.bySID)
	}
	// A stale Completed must not release a later turn that is really in flight.
	s.Dispatched(a2, "w2")
	s.Completed(a1, "w1")
	ssWantHold(t, s, ssReq("a3", "alice"))
	if got := s.inFlight["alice"]; got != 1 {
		t.Fatalf("in flight = %d, want 1", got)
	}
}

// TestSessionOverlappingTurns: if two turns of a session are in flight (e.g. one bypassed the
// queue), the session stays busy until both have completed.
func TestSessionOverlappingTurns(t *testing.T) {
	s := New()
	s.Dispatched(ssReq("a1", "alice"), "w1")
	s.Dispatched(ssReq("a2", "alice"), "w2")
	s.Completed(ssReq("a1", "alice"), "w1")
	ssWantHold(t, s, ssReq("a3", "alice"))
	s.Completed(ssReq("a2", "alice"), "w2")
	ssWantGo(t, s, ssReq("a3", "alice"))
}

// key is a test request's internal key, derived from its readable id.
func key(id string) uint64 { return xxhash.Sum64String(id) }

// TestFactory: session_serial takes no keys.
func TestFactory(t *testing.T) {
	p, err := Factory(nil, admission.Env{})
	if _, ok := p.(*Policy); !ok || err != nil || admission.NeedsPrefixIndex(p) {
		t.Fatalf("Factory: %T, %v", p, err)
	}
	_, err = Factory(map[string]any{"workers": int64(2)}, admission.Env{})
	if err == nil || err.Error() != "admission.classifier.workers: unknown key" {
		t.Fatalf("a key: %v", err)
	}
}

// TestTracked: one turn in flight is one session count and one request record; none after it
// completes.
func TestTracked(t *testing.T) {
	s := New()
	a, b := ssReq("a", "alice"), ssReq("b", "bob")
	s.Dispatched(a, "w1")
	s.Dispatched(b, "w2")
	if s.Tracked() != 4 {
		t.Fatalf("two turns: %d, want 4", s.Tracked())
	}
	s.Completed(a, "w1")
	s.Completed(b, "w2")
	if s.Tracked() != 0 {
		t.Fatalf("after completion: %d", s.Tracked())
	}
}
