package router

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/coldpool"
	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
)

// runBounded runs f and fails the test if it has not returned within a second (a router that
// loops never returns).
func runBounded(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatalf("%s: the router did not return within a second", what)
	}
}

// TestNoWorkerAnswersAtOnce (item 1): with session_serial and no busy threshold, a request to
// a route whose backend has no worker is answered 503 no_capacity at once — before, the gate
// said Go, the dispatch failed and the queue asked again forever. The same for a
// disaggregated route with a decode worker and no prefill worker.
func TestNoWorkerAnswersAtOnce(t *testing.T) {
	r := newRig(t, Config{
		Routes:    []config.Route{routeOf("r", "r-v1"), {Model: "pd", Targets: []string{config.TargetDisaggregated}}},
		Admission: admissionCfg(sessionserial.New(), 0),
	})
	r.joinRole("d1", "pd", RoleDecode, 0)
	for _, model := range []string{"r", "pd"} {
		q := r.newRequester()
		runBounded(t, model, func() { q.pick("x", model, "alice") })
		if p := q.picked(); !errors.Is(p.Err, errs.ErrNoCapacity) {
			t.Fatalf("%s: %+v, want no_capacity", model, p)
		}
	}
	if n := r.st.adm.q.Len(); n != 0 {
		t.Fatalf("%d queued", n)
	}
}

// TestQueuedRequestOutlivesItsLastWorker (item 1): a queued request whose last worker leaves
// waits (no loop: the work of each message is bounded) until a worker comes back or max_wait
// passes (then 503 queue_timeout). Also for a Cold request whose whole frozen pool left.
func TestQueuedRequestOutlivesItsLastWorker(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("w1", "smol", 1) // full at threshold 1
	a, b := r.newRequester(), r.newRequester()
	a.pick("a", "smol", "")
	b.pick("b", "smol", "")
	a.queued()
	b.queued()
	runBounded(t, "eviction", func() { r.leave("w1") })
	a.silent()
	if v := r.st.adm.q.Snapshot().Classes[0].Lanes[0].Head; v.Reason != "no_worker" {
		t.Fatalf("head waits for %q, want no_worker", v.Reason)
	}
	runBounded(t, "return", func() { r.join("w1", "smol", 0) })
	if p := a.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("a after w1 came back: %+v", p)
	}
	runBounded(t, "eviction", func() { r.leave("w1") })
	r.advance(30*time.Second - time.Nanosecond)
	b.silent()
	r.advance(time.Nanosecond)
	if p := b.picked(); !errors.Is(p.Err, errs.ErrQueueTimeout) {
		t.Fatalf("b at max_wait: %+v", p)
	}
}

// TestColdPoolGoneWaits (item 1): every member of a queued Cold request's pool leaves; it
// does not go elsewhere and the router does not loop; when a member is back it goes there.
func TestColdPoolGoneWaits(t *testing.T) {
	cp := coldpool.New(coldpool.Config{ColdThresholdTokens: 100, Workers: 1,
		SoftDrainTimeout: time.Hour, SteerWarm: true, MaxWait: 30 * time.Second, QueueLimit: 10}, nil)
	r := newRig(t, Config{Admission: admissionCfg(cp, 1)})
	ids := []string{"w1", "w2", "w3"}
	for _, id := range ids {
		r.join(id, "smol", 1) // all full
	}
	member := coldpool.PoolMembers(ids, 1)[0]
	c := r.newRequester()
	c.tag++
	r.deliver(c.pid, &Pick{Model: "smol", RequestID: "c", Key: c.key, Requester: c.pid, Tag: c.tag,
		Admit: &AdmitInfo{PromptTokens: 1000}})
	c.queued()
	runBounded(t, "member leaves", func() { r.leave(member) })
	for _, id := range ids {
		if id != member {
			runBounded(t, "others free", func() { r.join(id, "smol", 0) })
		}
	}
	c.silent() // not on a non-member
	runBounded(t, "member back", func() { r.join(member, "smol", 0) })
	if p := c.picked(); p.Err != nil || p.WorkerID != member {
		t.Fatalf("cold request: %+v, want %s", p, member)
	}
}

// TestSharedRequestIDs (item 2): two live requests with one X-Request-ID are two requests:
// one leaving does not cancel the other, and under session_serial a retry reusing the id of
// a running turn waits for it and then runs, after which the session is free.
func TestSharedRequestIDs(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("w1", "smol", 1)
	a, b := r.newRequester(), r.newRequester()
	a.pick("dup", "smol", "")
	b.pick("dup", "smol", "")
	a.queued()
	b.queued()
	b.stop() // b's client leaves
	r.join("w1", "smol", 0)
	if p := a.picked(); p.Err != nil {
		t.Fatalf("a: %+v", p)
	}
	b.silent()

	s := newRig(t, Config{Admission: admissionCfg(sessionserial.New(), 0)})
	s.join("w1", "smol", 0)
	first, retry, next := s.newRequester(), s.newRequester(), s.newRequester()
	first.pick("turn", "smol", "alice")
	if p := first.picked(); p.Err != nil {
		t.Fatalf("first: %+v", p)
	}
	retry.pick("turn", "smol", "alice")
	retry.queued()
	first.stop()
	if p := retry.picked(); p.Err != nil {
		t.Fatalf("retry: %+v", p)
	}
	retry.stop()
	next.pick("next", "smol", "alice")
	if p := next.picked(); p.Err != nil {
		t.Fatalf("the session stayed busy: %+v", p)
	}
}

// recordingGate wraps a policy and records the gate's bookkeeping per request key.
type recordingGate struct {
	admission.Policy
	g      admission.Gate
	events map[uint64][]string
}

func record(p admission.Policy) *recordingGate {
	return &recordingGate{Policy: p, g: p.Gate(), events: map[uint64][]string{}}
}

func (g *recordingGate) Gate() admission.Gate { return g }
func (g *recordingGate) Check(r *admission.Request, v admission.View) admission.Decision {
	return g.g.Check(r, v)
}
func (g *recordingGate) Dispatched(r *admission.Request, w string) {
	g.events[r.Key] = append(g.events[r.Key], "dispatched "+w)
	g.g.Dispatched(r, w)
}
func (g *recordingGate) Moved(r *admission.Request, from, to string) {
	g.events[r.Key] = append(g.events[r.Key], "moved "+from+" "+to)
	g.g.Moved(r, from, to)
}
func (g *recordingGate) Completed(r *admission.Request, w string) {
	g.events[r.Key] = append(g.events[r.Key], "completed "+w)
	g.g.Completed(r, w)
}
func (g *recordingGate) Recheck() time.Duration { return g.g.Recheck() }

// TestRepicksKeepAdmission (item 3): a failover re-pick of a Cold request stays on its pool
// (never a non-member), the gate's bookkeeping follows the worker used, and a pick repeated
// after a timeout moves it too; the request's end completes it once, on the last worker.
func TestRepicksKeepAdmission(t *testing.T) {
	cp := coldpool.New(coldpool.Config{ColdThresholdTokens: 100, Workers: 2,
		SoftDrainTimeout: 0, SteerWarm: true, MaxWait: 30 * time.Second, QueueLimit: 10}, nil)
	g := record(cp)
	r := newRig(t, Config{Admission: admissionCfg(g, 0)})
	ids := []string{"w1", "w2", "w3", "w4", "w5", "w6"}
	for _, id := range ids {
		r.join(id, "smol", 0)
	}
	pool := coldpool.PoolMembers(ids, 2)
	c := r.newRequester()
	ask := func(exclude ...string) *Picked {
		c.tag++
		r.deliver(c.pid, &Pick{Model: "smol", RequestID: "c", Key: c.key, Requester: c.pid, Tag: c.tag,
			Exclude: exclude, Admit: &AdmitInfo{PromptTokens: 1000}})
		return c.picked()
	}
	p1 := ask()
	if p1.Err != nil || !slices.Contains(pool, p1.WorkerID) {
		t.Fatalf("first pick %+v, want a member of %v", p1, pool)
	}
	c.release(p1)
	p2 := ask(p1.WorkerID) // failover
	other := pool[0]
	if other == p1.WorkerID {
		other = pool[1]
	}
	if p2.Err != nil || p2.WorkerID != other || !p2.Admitted {
		t.Fatalf("failover pick %+v, want the other member %s", p2, other)
	}
	p3 := ask(p1.WorkerID, p2.WorkerID) // no member left: no capacity, never a non-member
	if !errors.Is(p3.Err, errs.ErrNoCapacity) {
		t.Fatalf("third pick %+v, want no_capacity", p3)
	}
	p4 := ask(p1.WorkerID) // a repeated pick (its first answer was late)
	c.release(p2)
	c.stop()
	want := []string{"dispatched " + p1.WorkerID, "moved " + p1.WorkerID + " " + other, "moved " + other + " " + p4.WorkerID,
		"completed " + p4.WorkerID}
	if got := g.events[c.key]; !slices.Equal(got, want) {
		t.Fatalf("gate bookkeeping %v, want %v", got, want)
	}
	for _, id := range ids {
		if n := r.inFlight(id); n != 0 {
			t.Fatalf("%s in flight %d after the request ended", id, n)
		}
	}
}

// TestNoCrossModelStarvation (item 4): threshold 1, a1 (model a) and b1 (model b) full; x
// queued for a, then y for b. When b1 frees, y goes before a1 frees.
func TestNoCrossModelStarvation(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("a1", "a", 1)
	r.join("b1", "b", 1)
	x, y := r.newRequester(), r.newRequester()
	x.pick("x", "a", "")
	y.pick("y", "b", "")
	x.queued()
	y.queued()
	r.join("b1", "b", 0)
	if p := y.picked(); p.Err != nil || p.WorkerID != "b1" {
		t.Fatalf("y: %+v", p)
	}
	x.silent()
	r.join("a1", "a", 0)
	if p := x.picked(); p.Err != nil || p.WorkerID != "a1" {
		t.Fatalf("x: %+v", p)
	}
}

// TestQueueLengthGauges: tlgw_queue_length follows the queue as requests wait and leave (the
// gauges are resolved once and reused), per class and lane kind.
func TestQueueLengthGauges(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("w1", "smol", 1) // full at threshold 1
	shared := func() float64 {
		return testutil.ToFloat64(r.st.adm.metrics.queueLength.WithLabelValues("default", "shared"))
	}
	a, b := r.newRequester(), r.newRequester()
	a.pick("a", "smol", "")
	a.queued()
	if n := shared(); n != 1 {
		t.Fatalf("one waiting: gauge %v", n)
	}
	b.pick("b", "smol", "")
	b.queued()
	if n := shared(); n != 2 {
		t.Fatalf("two waiting: gauge %v", n)
	}
	runBounded(t, "room", func() { r.join("w1", "smol", 0) })
	if p := a.picked(); p.Err != nil {
		t.Fatalf("a: %+v", p)
	}
	if n := shared(); n != 1 {
		t.Fatalf("one left the queue: gauge %v", n)
	}
	if len(r.st.adm.lengthGauges) == 0 {
		t.Fatal("no gauge kept")
	}
}

// panicOn is a classifier that panics on the request with the given id and lets the rest go.
type panicOn string

func (p panicOn) Classify(r *admission.Request, _ []string, _ func([]string) int) {
	if r.ID == string(p) {
		panic("classifier bug")
	}
}
func (p panicOn) Gate() admission.Gate { return nil }

// TestClassifierPanicAnswersInternalError (R15.3): the router answers the one request whose
// classification panicked with internal_error (500), counts it as a classifier_failed
// rejection, forgets it, and keeps serving the next request with the same classifier.
func TestClassifierPanicAnswersInternalError(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(panicOn("bad"), 0)})
	r.join("w1", "smol", 0)
	bad, good := r.newRequester(), r.newRequester()
	runBounded(t, "bad", func() { bad.pick("bad", "smol", "") })
	if p := bad.picked(); !errors.Is(p.Err, errs.ErrInternal) || !strings.Contains(p.Err.Error(), "classifier") {
		t.Fatalf("the panicking request got %+v, want internal_error", p)
	}
	runBounded(t, "good", func() { good.pick("good", "smol", "") })
	if p := good.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("the next request got %+v", p)
	}
	if n := len(r.st.adm.entries); n != 1 {
		t.Fatalf("%d admitted requests known, want only the good one", n)
	}
	if got := testutil.ToFloat64(r.st.adm.metrics.queueRejections.WithLabelValues("default", "classifier_failed")); got != 1 {
		t.Fatalf("classifier_failed rejections %v, want 1", got)
	}
}

// viewRecorder is a policy whose gate lets every head go and records each head it was asked
// about with the workers of its view.
// With allow set, every request may use those workers only; pools records each view's pool
// workers (admission.PoolView).
type viewRecorder struct {
	allow   []string
	heads   []admission.Request
	workers [][]admission.Worker
	pools   [][]string
}

var _ admission.Policy = (*viewRecorder)(nil)

func (p *viewRecorder) Classify(r *admission.Request, _ []string, _ func([]string) int) {
	if p.allow != nil {
		r.Allowed = p.allow
	}
}
func (p *viewRecorder) Gate() admission.Gate { return p }
func (p *viewRecorder) Check(head *admission.Request, v admission.View) admission.Decision {
	p.heads = append(p.heads, *head)
	p.workers = append(p.workers, slices.Clone(v.Workers())) // the view is valid during the call only
	var pool []string
	if pv, ok := v.(admission.PoolView); ok {
		pool = slices.Clone(pv.PoolWorkers())
	}
	p.pools = append(p.pools, pool)
	return admission.Decision{Go: true}
}

// TestGateSeesThePoolBeyondTheHeadsWorkers: the gate's view of a head allowed on one worker
// lists that worker as its candidates and every routable worker of the pool as the pool's
// (admission.PoolView), so a gate tells a worker gone from one the head may not use.
func TestGateSeesThePoolBeyondTheHeadsWorkers(t *testing.T) {
	pol := &viewRecorder{allow: []string{"w2"}}
	r := newRig(t, Config{Admission: admissionCfg(pol, 0)})
	for _, id := range []string{"w3", "w1", "w2"} {
		r.join(id, "smol", 0)
	}
	q := r.newRequester()
	runBounded(t, "pick", func() { q.pick("pinned", "smol", "") })
	if p := q.picked(); p.Err != nil || p.WorkerID != "w2" {
		t.Fatalf("%+v", p)
	}
	q.stop()
	if len(pol.heads) != 1 {
		t.Fatalf("the gate was asked %d times, want 1", len(pol.heads))
	}
	if diff := cmp.Diff([]admission.Worker{{ID: "w2"}}, pol.workers[0]); diff != "" {
		t.Fatalf("the head's workers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"w1", "w2", "w3"}, pol.pools[0]); diff != "" {
		t.Fatalf("the pool's workers (-want +got):\n%s", diff)
	}
}
func (p *viewRecorder) Dispatched(*admission.Request, string)    {}
func (p *viewRecorder) Moved(*admission.Request, string, string) {}
func (p *viewRecorder) Completed(*admission.Request, string)     {}
func (p *viewRecorder) Recheck() time.Duration                   { return 0 }

// TestGateSeesCapacityAndFinal (R15.1): the gate's view gives each worker its KV capacity in
// tokens, kv_total_blocks × block_size (0 when the block size is unknown), and a pick's
// AdmitInfo.Final (X-TL-Session-Final) reaches the policy as the request's Final.
func TestGateSeesCapacityAndFinal(t *testing.T) {
	pol := &viewRecorder{}
	r := newRig(t, Config{Admission: admissionCfg(pol, 0)})
	r.joinWith("w1", "smol", RoleUnified, 0, func(i *WorkerInfo) { i.KVTotalBlocks, i.BlockSize = 2000, 16 })
	r.joinWith("w2", "smol", RoleUnified, 0, func(i *WorkerInfo) { i.KVTotalBlocks, i.BlockSize = 500, 0 })
	for _, final := range []bool{false, true} {
		q := r.newRequester()
		runBounded(t, "pick", func() { q.pickWith(fmt.Sprint("final-", final), "smol", AdmitInfo{SessionID: "prog-1", Final: final}) })
		if p := q.picked(); p.Err != nil {
			t.Fatalf("final %v: %+v", final, p)
		}
		q.stop()
	}
	if len(pol.heads) != 2 {
		t.Fatalf("the gate was asked %d times, want 2", len(pol.heads))
	}
	for i, final := range []bool{false, true} {
		if h := pol.heads[i]; h.Final != final || h.SessionID != "prog-1" {
			t.Fatalf("head %d: Final %v (session %q), want %v", i, h.Final, h.SessionID, final)
		}
	}
	want := []admission.Worker{{ID: "w1", Capacity: 2000 * 16}, {ID: "w2", Capacity: 0}}
	if diff := cmp.Diff(want, pol.workers[0]); diff != "" {
		t.Fatalf("the gate's view (-want +got):\n%s", diff)
	}
}

// refuser is a classifier that refuses the request with the given id with its own reason.
type refuser string

func (p refuser) Classify(r *admission.Request, _ []string, _ func([]string) int) {
	if r.ID == string(p) {
		r.Refuse = fmt.Errorf("the program limit is reached: %w", admission.ErrQueueFull)
	}
}
func (p refuser) Gate() admission.Gate { return nil }

// TestClassifierRefusalAnswersItsReason: a classifier's own refusal (Request.Refuse) is a 429
// queue_full that carries the classifier's reason, not a queue limit, counted as a "refused"
// rejection; the router forgets the request and serves the next.
func TestClassifierRefusalAnswersItsReason(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(refuser("over"), 0)})
	r.join("w1", "smol", 0)
	over, next := r.newRequester(), r.newRequester()
	runBounded(t, "over", func() { over.pickWith("over", "smol", AdmitInfo{Class: "default", SessionID: "prog-1"}) })
	p := over.picked()
	if !errors.Is(p.Err, errs.ErrQueueFull) || !strings.Contains(p.Err.Error(), "program limit") || strings.Contains(p.Err.Error(), "queue is full") || strings.Count(p.Err.Error(), "queue full") != 1 {
		t.Fatalf("the refused request got %+v, want queue_full naming the program limit", p)
	}
	runBounded(t, "next", func() { next.pickWith("next", "smol", AdmitInfo{Class: "default", SessionID: "prog-2"}) })
	if p := next.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("the next request got %+v", p)
	}
	if n := len(r.st.adm.entries); n != 1 {
		t.Fatalf("%d admitted requests known, want only the next one", n)
	}
	rej := r.st.adm.metrics.queueRejections
	if got := testutil.ToFloat64(rej.WithLabelValues("default", "refused")); got != 1 {
		t.Fatalf("refused rejections %v, want 1", got)
	}
	if got := testutil.ToFloat64(rej.WithLabelValues("default", "queue_full")); got != 0 {
		t.Fatalf("queue_full rejections %v, want 0", got)
	}
}

// TestUnknownModelWithAdmission: with the admission queue on, a model that no route names and
// no worker serves is answered 404 model_not_found at once, as without the queue — not 503.
func TestUnknownModelWithAdmission(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("w1", "smol", 1)
	q := r.newRequester()
	runBounded(t, "unknown model", func() { q.pick("x", "nope", "") })
	if p := q.picked(); !errors.Is(p.Err, errs.ErrModelNotFound) {
		t.Fatalf("%+v, want model_not_found", p)
	}
	if n := r.st.adm.q.Len(); n != 0 {
		t.Fatalf("%d queued", n)
	}
}

// allowOnly is a classifier that narrows every request to the given workers (as Cold Pool
// does) and has no gate.
type allowOnly []string

func (p allowOnly) Classify(r *admission.Request, _ []string, _ func([]string) int) {
	r.Allowed = slices.Clone(p)
}
func (p allowOnly) Gate() admission.Gate { return nil }

// TestAllowedSetIsStrictInItsPoolAndWholeElsewhere (R10.1, Cold Pool containment): an
// admitted request narrowed to some workers goes only to those of its own pool — none of
// them there: it waits, never spilling to the rest of the pool — while a later cascade step's
// pool is narrowed to the allowed members it has, and taken whole when it has none.
func TestAllowedSetIsStrictInItsPoolAndWholeElsewhere(t *testing.T) {
	cascadeCfg := func(allowed ...string) Config {
		return Config{
			Routes: []config.Route{{Model: "auto", Targets: []string{config.TargetUnified},
				Cascade: []config.CascadeStep{{Model: "smol", AcceptIf: "mean_logprob > -1"}, {Model: "big"}}}},
			Admission: admissionCfg(allowOnly(allowed), 0),
		}
	}
	join := func(r *rig) {
		r.join("s1", "smol", 5) // the busier of smol's workers
		r.join("s2", "smol", 0)
		r.join("b1", "big", 5) // the busier of big's workers
		r.join("b2", "big", 0)
	}
	step := func(q *requester, n int) *Picked {
		q.tag++
		q.r.deliver(q.pid, &Pick{Model: "auto", RequestID: "c", Key: q.key, Requester: q.pid, Tag: q.tag,
			Step: n, Admit: &AdmitInfo{}})
		return q.picked()
	}

	// Allowed s1 and b1: each step goes to its pool's allowed member, the busier one.
	r := newRig(t, cascadeCfg("s1", "b1"))
	join(r)
	q := r.newRequester()
	if p := step(q, 0); p.Err != nil || p.WorkerID != "s1" {
		t.Fatalf("step 0: %+v, want s1 (the only allowed smol worker)", p)
	}
	if p := step(q, 1); p.Err != nil || p.WorkerID != "b1" {
		t.Fatalf("step 1: %+v, want b1 (the only allowed big worker)", p)
	}

	// Allowed s1 only: big has none of the allowed set, so its whole pool serves step 1.
	r = newRig(t, cascadeCfg("s1"))
	join(r)
	q = r.newRequester()
	if p := step(q, 0); p.Err != nil || p.WorkerID != "s1" {
		t.Fatalf("step 0: %+v, want s1", p)
	}
	if p := step(q, 1); p.Err != nil || p.WorkerID != "b2" {
		t.Fatalf("step 1 to a pool with none of the allowed set: %+v, want the least loaded big worker b2", p)
	}

	// Allowed b1 only: smol, the pool it is admitted to, has none of it: it waits.
	r = newRig(t, cascadeCfg("b1"))
	join(r)
	q = r.newRequester()
	q.tag++
	r.deliver(q.pid, &Pick{Model: "auto", RequestID: "c", Key: q.key, Requester: q.pid, Tag: q.tag, Admit: &AdmitInfo{}})
	q.queued()
	if v := r.st.adm.q.Snapshot().Classes[0].Lanes[0].Head; v.Reason != "no_worker" {
		t.Fatalf("head waits for %q, want no_worker (no allowed member in its pool)", v.Reason)
	}
}

// TestClassWaitingForCapacityEarnsNoCredit (R11, deficit round robin): with a busy threshold,
// a class whose only head waits because every worker is full is blocked — it keeps its credit
// and earns none, however often the queue is woken (the admin view shows its deficit at 0) —
// and its head goes as soon as a worker has room.
func TestClassWaitingForCapacityEarnsNoCredit(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("w1", "smol", 1) // full at threshold 1
	x := r.newRequester()
	x.pick("x", "smol", "")
	x.queued()
	for range 3 {
		r.join("w1", "smol", 1) // a heartbeat, still full
		r.advance(time.Second)  // the queue's recheck
	}
	x.silent()
	c := r.st.adm.q.Snapshot().Classes[0]
	if c.Deficit != 0 || c.Lanes[0].Head.Reason != "capacity" {
		t.Fatalf("class %+v: want deficit 0 and its head waiting for capacity", c)
	}
	r.join("w1", "smol", 0)
	if p := x.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("after w1 had room: %+v, want w1", p)
	}
}

// TestContinuationsAreAdmittedToTheirWorker (R21): a new response continuing a stored one
// passes the admission queue like any generation, with the worker holding the stored response
// as its only candidate: it waits while that worker is full though another is idle, and goes
// there when it frees. A read of the stored response passes no queue, and reaches its worker
// while it drains; a continuation then is a 503.
func TestContinuationsAreAdmittedToTheirWorker(t *testing.T) {
	r := newRig(t, Config{Admission: admissionCfg(nil, 1)})
	r.join("w1", "m", 0)
	r.join("w2", "m", 0)
	r.deliver(nil, &StoreResponse{ID: "resp_1", WorkerID: "w1", Reg: r.regOf("w1"), Owner: 2})
	busy := r.newRequester()
	busy.pick("busy", "m", "")
	hold := busy.picked()
	if hold.WorkerID != "w1" {
		t.Fatalf("the first request went to %q", hold.WorkerID)
	}
	cont := r.newRequester()
	continues := func() {
		cont.tag++
		r.deliver(cont.pid, &Pick{Model: "m", RequestID: "c", Key: cont.key, Requester: cont.pid, Tag: cont.tag,
			Response: "resp_1", Owner: 2, Continues: true, Admit: &AdmitInfo{APIKey: 2}})
	}
	continues()
	cont.queued() // w1 is full (threshold 1); w2 idle does not hold the response
	read := r.newRequester()
	read.tag++
	r.deliver(read.pid, &Pick{Model: "m", Key: read.key, Requester: read.pid, Tag: read.tag, Response: "resp_1", Owner: 2})
	if p := read.picked(); p.Err != nil || p.WorkerID != "w1" || p.Admitted {
		t.Fatalf("a read of the stored response: %+v", p)
	} else {
		read.release(p)
	}
	busy.release(hold)
	busy.stop()
	runBounded(t, "w1 frees", func() { r.join("w1", "m", 0) })
	p := cont.picked()
	if p.Err != nil || p.WorkerID != "w1" || !p.Admitted {
		t.Fatalf("the continuation after w1 freed: %+v", p)
	}
	cont.release(p)
	cont.stop()
	if n := r.st.adm.q.Len(); n != 0 {
		t.Fatalf("%d still queued", n)
	}

	w1 := r.workers[r.workerPID("w1").Id]
	w1.info.Draining = true
	r.report(w1)
	late := r.newRequester()
	late.tag++
	r.deliver(late.pid, &Pick{Model: "m", RequestID: "l", Key: late.key, Requester: late.pid, Tag: late.tag,
		Response: "resp_1", Owner: 2, Continues: true, Admit: &AdmitInfo{APIKey: 2}})
	if p := late.picked(); !errors.Is(p.Err, errs.ErrNoCapacity) || !strings.Contains(p.Err.Error(), "draining") {
		t.Fatalf("a continuation at a draining holder: %+v", p)
	}
	read.tag++
	r.deliver(read.pid, &Pick{Model: "m", Key: read.key, Requester: read.pid, Tag: read.tag, Response: "resp_1", Owner: 2})
	if p := read.picked(); p.Err != nil || p.WorkerID != "w1" {
		t.Fatalf("a read at a draining holder: %+v", p)
	}
}
