package admission

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// askLog is a gate that lets every head go and records the order it was asked in.
type askLog struct{ asked []string }

func (g *askLog) Check(r *Request, _ View) Decision {
	g.asked = append(g.asked, r.ID)
	return Decision{Go: true}
}
func (g *askLog) Dispatched(*Request, string)    {}
func (g *askLog) Completed(*Request, string)     {}
func (g *askLog) Moved(*Request, string, string) {}
func (g *askLog) Recheck() time.Duration         { return 0 }
func (g *askLog) reset()                         { g.asked = g.asked[:0] }
func (g *askLog) String() string                 { return strings.Join(g.asked, " ") }
func (g *askLog) equal(want ...string) bool      { return slices.Equal(g.asked, want) }

// TestDRRCarriesOnlyAClassWithCredit: a class whose dispatch spent its last credit is not
// tried first on the next choice; the ring goes on from the class after it, so the gate is
// asked about B's head before A's next one.
func TestDRRCarriesOnlyAClassWithCredit(t *testing.T) {
	h := newHost("w")
	h.threshold, h.loads["w"] = 1, 1
	g := &askLog{}
	q := newQueue(h, gatePolicy{g: g},
		ClassConfig{Name: "A", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour},
		ClassConfig{Name: "B", Quantum: 1, QueueLimit: 10, MaxWait: time.Hour})
	for _, id := range []string{"a0", "a1", "b0", "b1"} {
		q.Admit(entry(id, strings.ToUpper(id[:1]), "", "w"), h, nil)
	}
	g.reset()
	h.release(q, "w") // a0 goes and spends A's one credit; the worker is full again
	if got := ids(h.dispatched); !slices.Equal(got, []string{"a0"}) {
		t.Fatalf("dispatched %v, want a0", got)
	}
	if !g.equal("a0", "b0", "a1") {
		t.Fatalf("asked %q, want a0 b0 a1 (B's head before A's next)", g)
	}
}

// TestNoRecheckWhileNothingIsQueued: the periodic recheck runs only while requests wait; once
// the queue is empty a tick arms nothing more.
func TestNoRecheckWhileNothingIsQueued(t *testing.T) {
	h := newHost("w")
	h.threshold, h.loads["w"] = 1, 1
	q := New(Config{Classes: []ClassConfig{{Name: "c", Quantum: 1, QueueLimit: 10, MaxWait: time.Second}},
		DefaultClass: "c", Now: func() time.Time { return h.now }, Recheck: 100 * time.Millisecond})
	q.Admit(entry("a", "c", "", "w"), h, nil)
	h.release(q, "w")
	if q.Len() != 0 || len(h.dispatched) != 1 {
		t.Fatalf("queued %d, dispatched %d: want the request gone", q.Len(), len(h.dispatched))
	}
	armed := len(h.armed)
	h.advance(q, 10*time.Second) // the recheck and the deadline armed while it waited fire
	if len(h.armed) != armed {
		t.Fatalf("armed %v after the queue emptied", h.armed[armed:])
	}
}

// holdColdWhileRunning holds a classifier-lane head while any request runs, until told of a
// completion (no time of its own: only a wake asks it again).
type holdColdWhileRunning struct{ running int }

func (g *holdColdWhileRunning) Check(r *Request, _ View) Decision {
	if r.Lane == "cold" && g.running > 0 {
		return Decision{Wait: waitTest}
	}
	return Decision{Go: true}
}
func (g *holdColdWhileRunning) Dispatched(*Request, string)    { g.running++ }
func (g *holdColdWhileRunning) Completed(*Request, string)     { g.running-- }
func (g *holdColdWhileRunning) Moved(*Request, string, string) {}
func (g *holdColdWhileRunning) Recheck() time.Duration         { return 0 }

// TestCompletionWakesHeldClassifierLanes: a completion asks held classifier-lane heads again:
// it may change what the policy allows.
func TestCompletionWakesHeldClassifierLanes(t *testing.T) {
	h := newHost("w1", "w2")
	g := &holdColdWhileRunning{}
	q := newQueue(h, gatePolicy{g: g, lane: func(r *Request) {
		if strings.HasPrefix(r.ID, "cold") {
			r.Lane = "cold"
		}
	}})
	hot := entry("hot", "", "", "w1")
	q.Admit(hot, h, nil)
	q.Admit(entry("cold", "", "", "w1", "w2"), h, nil)
	if got := ids(h.dispatched); !slices.Equal(got, []string{"hot"}) {
		t.Fatalf("dispatched %v, want hot alone while it runs", got)
	}
	h.finish(q, hot)
	if got := ids(h.dispatched); !slices.Equal(got, []string{"hot", "cold"}) {
		t.Fatalf("dispatched %v after hot completed, want cold too", got)
	}
}

// TestConfigNeedsPrefixIndex: a queue reads cached tokens when a class orders by them (wspt),
// charges by them (uncached_tokens), or its policy does.
func TestConfigNeedsPrefixIndex(t *testing.T) {
	plain := ClassConfig{Name: "a", Quantum: 1, QueueLimit: 1, MaxWait: time.Second}
	wspt, uncached := plain, plain
	wspt.Name, wspt.Order = "b", OrderWSPT
	uncached.Name, uncached.Cost = "c", CostUncachedTokens
	for _, c := range []struct {
		name    string
		classes []ClassConfig
		policy  Policy
		want    bool
	}{
		{"fcfs by requests", []ClassConfig{plain}, nil, false},
		{"a policy that does not read them", []ClassConfig{plain}, gatePolicy{}, false},
		{"wspt in the last class", []ClassConfig{plain, wspt}, nil, true},
		{"uncached_tokens in the last class", []ClassConfig{plain, uncached}, nil, true},
		{"a policy that reads them", []ClassConfig{plain}, testPolicy{}, true},
	} {
		if got := (Config{Classes: c.classes, Policy: c.policy}).NeedsPrefixIndex(); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSnapshot: the admin view names each class's settings, queue and credit, and each lane
// that holds requests with its kind, length and head — here waiting for capacity or held (with
// the time it is held until, in UTC) — ordered by the head's request id; session lanes show no
// session id.
func TestSnapshot(t *testing.T) {
	h := newHost("w1", "w2")
	h.threshold, h.loads["w1"], h.loads["w2"] = 1, 1, 0
	gate := newGate()
	gate.held["held-0"] = true
	gate.until = h.now.Add(time.Minute).In(time.FixedZone("X", 3600))
	q := newQueue(h, gatePolicy{g: gate, lane: func(r *Request) {
		if strings.HasPrefix(r.ID, "named") {
			r.Lane = "cold"
		}
	}}, ClassConfig{Name: "main", Quantum: 3, QueueLimit: 50, MaxWait: 90 * time.Second},
		ClassConfig{Name: "idle", Quantum: 1, QueueLimit: 5, MaxWait: time.Second})
	for i := range 2 {
		q.Admit(entry(fmt.Sprint("cap-", i), "main", "", "w1"), h, nil)
		q.Admit(entry(fmt.Sprint("named-", i), "main", "", "w1"), h, nil)
	}
	sess := entry("sess-0", "main", "secret-session", "w1")
	sess.Req.Tag = "t1"
	q.Admit(sess, h, nil)
	held := entry("held-0", "main", "", "w2")
	held.Pool = "other" // a candidate set of its own: its own shared lane
	q.Admit(held, h, nil)
	h.now = h.now.Add(2 * time.Second)

	until := h.now.Add(58 * time.Second).UTC()
	want := Snapshot{Classes: []ClassView{
		{Name: "main", Quantum: 3, QueueLimit: 50, MaxWait: "1m30s", Queued: 6, Lanes: []LaneView{
			{Kind: "shared", Length: 2, Head: &HeadView{RequestID: "cap-0", Waiting: "2s", State: "capacity", Reason: "capacity"}},
			{Kind: "shared", Length: 1, Head: &HeadView{RequestID: "held-0", Waiting: "2s", State: "held", Reason: "test_hold", Until: &until}},
			{Kind: "classifier", Name: "cold", Length: 2, Head: &HeadView{RequestID: "named-0", Waiting: "2s", State: "capacity", Reason: "capacity"}},
			{Kind: "session", Length: 1, Head: &HeadView{RequestID: "sess-0", Tag: "t1", Waiting: "2s", State: "capacity", Reason: "capacity"}},
		}},
		{Name: "idle", Quantum: 1, QueueLimit: 5, MaxWait: "1s", Lanes: []LaneView{}},
	}}
	got := q.Snapshot()
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("snapshot (-want +got):\n%s", d)
	}
	if loc := got.Classes[0].Lanes[1].Head.Until.Location(); loc != time.UTC {
		t.Fatalf("held until in %v, want UTC", loc)
	}
	js, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"request_id":"sess-0"`) || strings.Contains(string(js), "secret-session") {
		t.Fatalf("want the session lane's head without the client's session id: %s", js)
	}
}
