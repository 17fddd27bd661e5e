package coldpool

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// key is a test request's internal key, derived from its readable id.
func key(id string) uint64 { return xxhash.Sum64String(id) }

var cpT0 = time.Unix(1_000_000, 0)

// cpView is a fixed view: the candidates and the time.
type cpView struct {
	ws  []admission.Worker
	now time.Time
}

func (v cpView) Workers() []admission.Worker { return v.ws }
func (v cpView) Now() time.Time              { return v.now }

// cpHarness drives one Policy over one route with a fake clock and per-worker load/full.
type cpHarness struct {
	t       *testing.T
	now     time.Time
	p       *Policy
	route   []string
	members []string // the route's pool
	others  []string // the route's workers outside the pool
	load    map[string]int64
	full    map[string]bool
}

const cpThreshold = 1000

func cpNew(t *testing.T, cfg Config, route ...string) *cpHarness {
	t.Helper()
	if cfg.ColdThresholdTokens == 0 {
		cfg.ColdThresholdTokens = cpThreshold
	}
	h := &cpHarness{t: t, now: cpT0, route: route, load: map[string]int64{}, full: map[string]bool{}}
	h.p = New(cfg, func() time.Time { return h.now })
	h.members = PoolMembers(route, PoolSize(len(route), cfg.Workers))
	for _, w := range route {
		if !slices.Contains(h.members, w) {
			h.others = append(h.others, w)
		}
	}
	return h
}

func cpRoute(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("w%d", i))
	}
	return out
}

// req classifies a new request with the given prompt and cached tokens (over any set).
func (h *cpHarness) req(id string, prompt, cached int) *admission.Request {
	r := &admission.Request{Key: key(id), ID: id, PromptTokens: prompt}
	h.p.Classify(r, h.route, func([]string) int { return cached })
	return r
}

// cold classifies a Cold request and enqueues it (the queue's order: Classify, then Enqueued).
func (h *cpHarness) cold(id string) *admission.Request {
	h.t.Helper()
	r := h.req(id, 2*cpThreshold, 0)
	if r.Tag != TagCold {
		h.t.Fatalf("%s: tag %q, want cold", id, r.Tag)
	}
	h.p.Enqueued(r)
	return r
}

func (h *cpHarness) warm(id string) *admission.Request { return h.req(id, cpThreshold/2, 0) }

// view is the request's candidates (route ∩ Allowed, id order) at the harness's time.
func (h *cpHarness) view(r *admission.Request) cpView {
	ids := slices.Clone(admission.Intersect(h.route, r.Allowed))
	slices.Sort(ids)
	v := cpView{now: h.now}
	for _, id := range ids {
		v.ws = append(v.ws, admission.Worker{ID: id, Load: h.load[id], Full: h.full[id]})
	}
	return v
}

func (h *cpHarness) check(r *admission.Request) admission.Decision { return h.p.Check(r, h.view(r)) }

func (h *cpHarness) want(r *admission.Request, want admission.Decision) {
	h.t.Helper()
	if got := h.check(r); got != want {
		h.t.Fatalf("%s at +%v: got %+v, want %+v", r.ID, h.now.Sub(cpT0), got, want)
	}
}

// empty asserts the ledger holds nothing (memory bounded once everything is done).
func (h *cpHarness) empty() {
	h.t.Helper()
	p := h.p
	if len(p.cold)+len(p.active)+len(p.activeCold)+len(p.activeWarm)+len(p.pendingOn) != 0 || p.pending != 0 {
		h.t.Fatalf("ledger not empty: cold %v active %v activeCold %v activeWarm %v pendingOn %v pending %d",
			p.cold, p.active, p.activeCold, p.activeWarm, p.pendingOn, p.pending)
	}
}

func TestPoolSize(t *testing.T) {
	want := []int{0, 0, 1, 1, 1, 1, 2, 2, 2, 3}
	for n, w := range want {
		if got := PoolSize(n, 10); got != w {
			t.Errorf("PoolSize(%d, 10) = %d, want %d", n, got, w)
		}
	}
	for _, c := range []struct{ n, workers, want int }{
		{9, 0, 0}, {9, -1, 0}, {1, 5, 0}, {2, 1, 1}, {3, 2, 1}, {12, 2, 2}, {12, 4, 4}, {12, 5, 4}, {100, 1, 1},
	} {
		if got := PoolSize(c.n, c.workers); got != c.want {
			t.Errorf("PoolSize(%d, %d) = %d, want %d", c.n, c.workers, got, c.want)
		}
	}
}

func TestPoolMembersBasics(t *testing.T) {
	ws := cpRoute(9)
	m := PoolMembers(ws, 3)
	if len(m) != 3 || !slices.IsSorted(m) {
		t.Fatalf("members %v: want 3 in id order", m)
	}
	rev := slices.Clone(ws)
	slices.Reverse(rev)
	dup := append(slices.Clone(ws), ws...)
	for _, in := range [][]string{rev, dup} {
		if got := PoolMembers(in, 3); !slices.Equal(got, m) {
			t.Fatalf("members depend on input order or duplicates: %v vs %v", got, m)
		}
	}
	if PoolMembers(ws, 0) != nil || PoolMembers(nil, 3) != nil {
		t.Fatal("size 0 or no workers must give no members")
	}
	if got := PoolMembers(ws, 20); len(got) != 9 {
		t.Fatalf("size above n: %v", got)
	}
	// Membership is a pure function of the ids: a restart, another gateway, another build all
	// agree. The value below pins the score function so a change to it is deliberate.
	if got, want := PoolMembers(ws, 3), []string{"w1", "w6", "w7"}; !slices.Equal(got, want) {
		t.Fatalf("PoolMembers(w1..w9, 3) = %v, want %v", got, want)
	}
}

func TestColdRankTiesToLowerID(t *testing.T) {
	got := coldRank([]string{"c", "a", "b", "a"}, func(string) uint64 { return 7 })
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("equal scores: %v, want [a b c]", got)
	}
	score := map[string]uint64{"a": 1, "b": 3, "c": 3, "d": 2}
	got = coldRank([]string{"a", "b", "c", "d"}, func(id string) uint64 { return score[id] })
	if !slices.Equal(got, []string{"b", "c", "d", "a"}) {
		t.Fatalf("ranking %v, want [b c d a]", got)
	}
}

// TestPoolMembershipStability (rapid). What is asserted, for any distinct ids and any
// configured size:
//   - removing a non-member never changes the members while the pool size stays the same (and
//     when the size shrinks, the new members are a subset of the old);
//   - adding a worker with the size unchanged changes at most one member, and only to the new
//     worker; when the size grows by one, every old member stays;
//   - a bigger size never drops a member (the ranking is one list, cut at the size);
//   - the members do not depend on the order the ids come in.
func TestPoolMembershipStability(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z0-9-]{1,8}`), 2, 40, rapid.ID[string]).Draw(t, "ids")
		k := rapid.IntRange(1, 15).Draw(t, "workers")
		n := len(ids)
		size := PoolSize(n, k)
		members := PoolMembers(ids, size)

		perm := rapid.Permutation(ids).Draw(t, "perm")
		if got := PoolMembers(perm, size); !slices.Equal(got, members) {
			t.Fatalf("order changed members: %v vs %v", got, members)
		}
		if bigger := PoolMembers(ids, size+1); !cpSubset(members, bigger) {
			t.Fatalf("size %d members %v not within size %d members %v", size, members, size+1, bigger)
		}

		var non []string
		for _, id := range ids {
			if !slices.Contains(members, id) {
				non = append(non, id)
			}
		}
		if len(non) > 0 {
			gone := rapid.SampledFrom(non).Draw(t, "gone")
			rest := slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == gone })
			size2 := PoolSize(len(rest), k)
			after := PoolMembers(rest, size2)
			switch {
			case size2 == size && !slices.Equal(after, members):
				t.Fatalf("removing non-member %q changed members %v → %v", gone, members, after)
			case size2 < size && !cpSubset(after, members):
				t.Fatalf("removing %q (size %d→%d): %v not within %v", gone, size, size2, after, members)
			}
		}

		added := rapid.StringMatching(`[a-z0-9-]{1,8}`).Filter(func(s string) bool { return !slices.Contains(ids, s) }).Draw(t, "added")
		grown := append(slices.Clone(ids), added)
		size3 := PoolSize(len(grown), k)
		after := PoolMembers(grown, size3)
		switch size3 {
		case size:
			var in, out []string
			for _, id := range after {
				if !slices.Contains(members, id) {
					in = append(in, id)
				}
			}
			for _, id := range members {
				if !slices.Contains(after, id) {
					out = append(out, id)
				}
			}
			if len(out) > 1 || len(in) > 1 || (len(in) == 1 && in[0] != added) {
				t.Fatalf("adding %q: %v → %v", added, members, after)
			}
		case size + 1:
			if !cpSubset(members, after) {
				t.Fatalf("adding %q grew the pool but dropped a member: %v → %v", added, members, after)
			}
		default:
			t.Fatalf("adding one worker moved the size %d → %d", size, size3)
		}
	})
}

func cpSubset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func TestColdPoolClassify(t *testing.T) {
	h := cpNew(t, Config{Workers: 2}, cpRoute(6)...)
	if len(h.members) != 2 {
		t.Fatalf("pool %v", h.members)
	}
	m0, o0 := h.members[0], h.others[0]

	// Warm: the cache is not read; nothing but the tag changes.
	r := &admission.Request{Key: key("w"), ID: "w", Class: "c", PromptTokens: cpThreshold - 1, Allowed: []string{o0}}
	h.p.Classify(r, h.route, func([]string) int { t.Fatal("Warm read the cache"); return 0 })
	if diff := cmp.Diff(&admission.Request{Key: key("w"), ID: "w", Class: "c", PromptTokens: cpThreshold - 1, Allowed: []string{o0}, Tag: TagWarm}, r); diff != "" {
		t.Fatalf("warm (-want +got):\n%s", diff)
	}

	// The cache is read over route ∩ Allowed.
	var asked []string
	r = &admission.Request{Key: key("c"), ID: "c", PromptTokens: 2 * cpThreshold, Allowed: []string{o0, m0, "elsewhere"}}
	h.p.Classify(r, h.route, func(ws []string) int { asked = ws; return 0 })
	if want := admission.Intersect(h.route, []string{o0, m0, "elsewhere"}); !slices.Equal(asked, want) {
		t.Fatalf("cache asked over %v, want %v", asked, want)
	}
	if r.Tag != TagCold || r.Lane != Lane || !slices.Equal(r.Allowed, []string{m0}) {
		t.Fatalf("cold narrowed by the caller: %+v", r)
	}

	for _, c := range []struct {
		name           string
		prompt, cached int
		tag            string
	}{
		{"at threshold, nothing cached", cpThreshold, 0, TagCold},
		{"uncached part exactly the threshold", 3 * cpThreshold, 2 * cpThreshold, TagCold},
		{"uncached part one under", 3 * cpThreshold, 2*cpThreshold + 1, ""},
		{"long but mostly cached", 100 * cpThreshold, 99*cpThreshold + 1, ""},
		{"cache above the prompt", cpThreshold, 5 * cpThreshold, ""},
	} {
		r := &admission.Request{Key: key(c.name), ID: c.name, Class: "k", PromptTokens: c.prompt}
		h.p.Classify(r, h.route, func([]string) int { return c.cached })
		if r.Tag != c.tag || r.Class != "k" {
			t.Errorf("%s: tag %q class %q, want tag %q", c.name, r.Tag, r.Class, c.tag)
		}
		if c.tag == TagCold {
			if r.Lane != Lane || !slices.Equal(r.Allowed, h.members) {
				t.Errorf("%s: lane %q allowed %v, want %q %v", c.name, r.Lane, r.Allowed, Lane, h.members)
			}
		} else if r.Lane != "" || r.Allowed != nil {
			t.Errorf("%s: unclassified changed lane/allowed: %+v", c.name, r)
		}
	}
}

// TestColdHeldUntilCleanMemberWhileWarmAvoidsPool: Cold waits while every member runs Warm
// work, Warm is steered off the pool meanwhile; when a member drains, Cold targets it; with
// Cold running and none pending, Warm avoids only the worker running Cold.
func TestColdHeldUntilCleanMemberWhileWarmAvoidsPool(t *testing.T) {
	h := cpNew(t, Config{Workers: 2, SoftDrainTimeout: 30 * time.Second, SteerWarm: true}, cpRoute(6)...)
	m0, m1 := h.members[0], h.members[1]
	busy0, busy1 := h.warm("busy0"), h.warm("busy1")
	h.p.Dispatched(busy0, m0)
	h.p.Dispatched(busy1, m1)
	h.load[m0], h.load[m1] = 1, 1

	c := h.cold("c1")
	h.now = h.now.Add(time.Second)
	h.want(c, admission.Decision{Until: cpT0.Add(30 * time.Second), Wait: WaitClean})

	// Warm avoids the whole pool while Cold is pending: least-loaded outside it.
	for _, o := range h.others {
		h.load[o] = 5
	}
	h.load[h.others[2]] = 2
	w := h.warm("warm")
	h.want(w, admission.Decision{Go: true, Target: h.others[2]})
	h.load[m0], h.load[m1] = 0, 0 // lightly loaded members are still avoided: the ledger decides
	h.want(w, admission.Decision{Go: true, Target: h.others[2]})

	// m1's Warm work ends: Cold targets it.
	h.p.Completed(busy1, m1)
	h.want(c, admission.Decision{Go: true, Target: m1})
	h.p.Dispatched(c, m1)
	if h.p.pending != 0 {
		t.Fatalf("pending %d after dispatch", h.p.pending)
	}

	// Cold runs on m1, none pending: Warm avoids only m1, so m0 (least loaded) is fine.
	h.load[m0] = 1
	h.want(w, admission.Decision{Go: true, Target: m0})

	h.p.Completed(busy0, m0)
	h.p.Completed(c, m1)
	h.want(w, admission.Decision{Go: true}) // nothing to avoid: the picker's own choice
	h.empty()
}

// TestColdSoftDrainInclusive: a Cold head is held until exactly enqueue + timeout, then takes
// the least-loaded non-full member even though it runs Warm work; 1 ns before it is held.
func TestColdSoftDrainInclusive(t *testing.T) {
	const timeout = 5 * time.Second
	h := cpNew(t, Config{Workers: 3, SoftDrainTimeout: timeout, SteerWarm: true}, cpRoute(9)...)
	for i, m := range h.members {
		h.p.Dispatched(h.warm(fmt.Sprint("busy", i)), m)
		h.load[m] = int64(10 - i)
	}
	h.now = cpT0.Add(2 * time.Second)
	c := h.cold("c")
	deadline := cpT0.Add(2*time.Second + timeout)

	h.want(c, admission.Decision{Until: deadline, Wait: WaitClean})
	h.now = deadline.Add(-time.Nanosecond)
	h.want(c, admission.Decision{Until: deadline, Wait: WaitClean})

	h.now = deadline
	last := h.members[len(h.members)-1] // least loaded
	h.full[last] = true                 // …but full: the next least loaded takes it
	h.want(c, admission.Decision{Go: true, Target: h.members[1]})
	h.now = deadline.Add(time.Hour)
	h.want(c, admission.Decision{Go: true, Target: h.members[1]})

	// Past the timeout with every member full: held until capacity frees, no time.
	for _, m := range h.members {
		h.full[m] = true
	}
	h.want(c, admission.Decision{Wait: WaitBusy})
}

// TestColdSoftDrainZero: a zero timeout lets Cold take a busy member at once.
func TestColdSoftDrainZero(t *testing.T) {
	h := cpNew(t, Config{Workers: 1}, cpRoute(3)...)
	m := h.members[0]
	h.p.Dispatched(h.warm("busy"), m)
	c := h.cold("c")
	h.want(c, admission.Decision{Go: true, Target: m})
	// Asked at arrival, before the queue has it, the same holds.
	c2 := h.req("c2", 2*cpThreshold, 0)
	h.want(c2, admission.Decision{Go: true, Target: m})
}

// TestColdCleanMemberFull: a clean member exists but is full: held with the reason saying so,
// until the soft drain timeout, when a busy member with room takes it.
func TestColdCleanMemberFull(t *testing.T) {
	h := cpNew(t, Config{Workers: 2, SoftDrainTimeout: time.Second}, cpRoute(6)...)
	m0, m1 := h.members[0], h.members[1]
	h.p.Dispatched(h.warm("busy"), m1)
	h.full[m0] = true
	c := h.cold("c")
	h.want(c, admission.Decision{Until: cpT0.Add(time.Second), Wait: WaitBusy})
	h.now = cpT0.Add(time.Second)
	h.want(c, admission.Decision{Go: true, Target: m1})
}

// TestColdWaitCountsFromEnqueue: the soft drain counts from Enqueued; asked at arrival (before
// the queue has it) it counts from classification.
func TestColdWaitCountsFromEnqueue(t *testing.T) {
	h := cpNew(t, Config{Workers: 1, SoftDrainTimeout: 10 * time.Second}, cpRoute(3)...)
	h.p.Dispatched(h.warm("busy"), h.members[0])
	c := h.req("c", 2*cpThreshold, 0)
	h.want(c, admission.Decision{Until: cpT0.Add(10 * time.Second), Wait: WaitClean})
	h.now = cpT0.Add(time.Second)
	h.p.Enqueued(c)
	h.p.Enqueued(c) // a repeat does not restart the wait
	h.now = cpT0.Add(3 * time.Second)
	h.p.Enqueued(c)
	h.want(c, admission.Decision{Until: cpT0.Add(11 * time.Second), Wait: WaitClean})
	if h.p.pending != 1 {
		t.Fatalf("pending %d, want 1", h.p.pending)
	}
}

// TestColdUnclassifiedIsWarmWork: an unclassified request (long, mostly cached) always goes,
// and on a member it counts as Warm work that a Cold head waits for.
func TestColdUnclassifiedIsWarmWork(t *testing.T) {
	h := cpNew(t, Config{Workers: 1, SoftDrainTimeout: time.Minute, SteerWarm: true}, cpRoute(3)...)
	c := h.cold("c")
	u := h.req("u", 5*cpThreshold, 4*cpThreshold+1)
	if u.Tag != "" {
		t.Fatalf("tag %q, want unclassified", u.Tag)
	}
	h.want(u, admission.Decision{Go: true}) // not steered, though Cold is pending
	h.p.Dispatched(u, h.members[0])
	h.want(c, admission.Decision{Until: cpT0.Add(time.Minute), Wait: WaitClean})
	h.p.Completed(u, h.members[0])
	h.want(c, admission.Decision{Go: true, Target: h.members[0]})
}

// TestColdBaseline: workers = 0 keeps the tags and the Cold lane, with no containment, no
// holds, no steering, no recheck and no state.
func TestColdBaseline(t *testing.T) {
	h := cpNew(t, Config{Workers: 0, SoftDrainTimeout: time.Hour, SteerWarm: true}, cpRoute(6)...)
	for _, w := range h.route {
		h.p.Dispatched(h.warm("busy-"+w), w)
	}
	c := h.cold("c")
	if c.Lane != Lane || c.Allowed != nil {
		t.Fatalf("baseline cold: %+v", c)
	}
	h.want(c, admission.Decision{Go: true})
	w := h.warm("w")
	if w.Tag != TagWarm {
		t.Fatalf("baseline warm tag %q", w.Tag)
	}
	h.want(w, admission.Decision{Go: true})
	h.p.Dispatched(c, "w1")
	h.want(h.warm("w2"), admission.Decision{Go: true})
	if h.p.Recheck() != 0 {
		t.Fatalf("baseline recheck %v", h.p.Recheck())
	}
	h.empty()
}

// TestColdUncontained: with fewer than 2 workers, or a caller's allowed set with no member,
// Cold keeps its tag and lane but is ordinary: never held, counted as non-Cold work.
func TestColdUncontained(t *testing.T) {
	h := cpNew(t, Config{Workers: 3, SoftDrainTimeout: time.Hour, SteerWarm: true}, "solo")
	h.p.Dispatched(h.warm("busy"), "solo")
	c := h.cold("c")
	if c.Tag != TagCold || c.Lane != Lane || c.Allowed != nil {
		t.Fatalf("single-worker cold: %+v", c)
	}
	h.want(c, admission.Decision{Go: true})
	h.p.Dispatched(c, "solo")
	if h.p.pending != 0 || len(h.p.activeCold) != 0 || h.p.activeWarm["solo"] != 2 {
		t.Fatalf("ledger: pending %d activeCold %v activeWarm %v", h.p.pending, h.p.activeCold, h.p.activeWarm)
	}

	h2 := cpNew(t, Config{Workers: 1, SoftDrainTimeout: time.Hour, SteerWarm: true}, cpRoute(6)...)
	for _, w := range h2.route {
		h2.p.Dispatched(h2.warm("busy-"+w), w)
	}
	r := &admission.Request{Key: key("c"), ID: "c", PromptTokens: 2 * cpThreshold, Allowed: h2.others[:2]}
	h2.p.Classify(r, h2.route, func([]string) int { return 0 })
	h2.p.Enqueued(r)
	if r.Tag != TagCold || r.Lane != Lane || !slices.Equal(r.Allowed, h2.others[:2]) {
		t.Fatalf("cold with no allowed member: %+v", r)
	}
	h2.want(r, admission.Decision{Go: true})
	if h2.p.pending != 0 {
		t.Fatalf("an uncontained Cold counted as pending")
	}
	h2.want(h2.warm("w"), admission.Decision{Go: true}) // nothing pending: no steering
}

// TestWarmNotSteered: with steer_warm off, Warm always goes without a target, even with Cold
// pending and running.
func TestWarmNotSteered(t *testing.T) {
	h := cpNew(t, Config{Workers: 2, SoftDrainTimeout: time.Hour}, cpRoute(6)...)
	h.cold("pending")
	running := h.cold("running")
	h.p.Dispatched(running, h.members[0])
	for _, o := range h.others {
		h.full[o] = true
	}
	h.want(h.warm("w"), admission.Decision{Go: true})
}

// TestWarmSteeredHold: while Cold is pending and every worker outside the pool is full but a
// member has room, Warm is held; when every candidate is full it goes (the capacity check
// holds it); a Warm request allowed only on the pool is not steered.
func TestWarmSteeredHold(t *testing.T) {
	h := cpNew(t, Config{Workers: 2, SoftDrainTimeout: time.Hour, SteerWarm: true}, cpRoute(6)...)
	c := h.cold("c")
	for _, o := range h.others {
		h.full[o] = true
	}
	w := h.warm("w")
	h.want(w, admission.Decision{Wait: WaitWarmSteered})
	for _, m := range h.members {
		h.full[m] = true
	}
	h.want(w, admission.Decision{Go: true})

	onPool := &admission.Request{Key: key("p"), ID: "p", PromptTokens: 1, Allowed: slices.Clone(h.members)}
	h.p.Classify(onPool, h.route, nil)
	h.want(onPool, admission.Decision{Go: true})

	// The Cold request leaves the queue (cancelled): nothing to avoid any more.
	h.p.Left(c)
	for _, m := range h.members {
		h.full[m] = false
	}
	h.want(w, admission.Decision{Go: true})
	h.empty()
}

// TestColdPendingScopedToItsRoute: a pending Cold request steers Warm off its own route's
// pool only; another route's workers are not avoided.
func TestColdPendingScopedToItsRoute(t *testing.T) {
	h := cpNew(t, Config{Workers: 1, SoftDrainTimeout: time.Hour, SteerWarm: true}, "a1", "a2", "a3")
	h.cold("c")
	h.route = []string{"b1", "b2", "b3"}
	h.load["b1"] = 3
	h.want(h.warm("w"), admission.Decision{Go: true})
}

// TestColdLedgerBounded: Completed twice or for an unknown request, Left for an unknown
// request and a repeated Dispatched change nothing; once everything has ended the ledger is
// empty.
func TestColdLedgerBounded(t *testing.T) {
	h := cpNew(t, Config{Workers: 2, SoftDrainTimeout: time.Hour, SteerWarm: true}, cpRoute(6)...)
	ghost := &admission.Request{Key: key("ghost"), ID: "ghost", Tag: TagCold}
	h.p.Completed(ghost, "w1")
	h.p.Left(ghost)
	h.empty()

	c1, c2, c3 := h.cold("c1"), h.cold("c2"), h.cold("c3")
	if h.p.pending != 3 {
		t.Fatalf("pending %d, want 3", h.p.pending)
	}
	h.p.Left(c3) // cancelled
	h.p.Left(c3)
	w := h.warm("w")
	h.p.Dispatched(w, h.others[0])
	h.p.Dispatched(w, h.others[1]) // counted once, where it went last
	h.p.Dispatched(c1, h.members[0])
	h.p.Dispatched(c2, h.members[1])
	if h.p.pending != 0 || h.p.activeCold[h.members[0]] != 1 || h.p.activeWarm[h.others[1]] != 1 || h.p.activeWarm[h.others[0]] != 0 {
		t.Fatalf("ledger: pending %d activeCold %v activeWarm %v", h.p.pending, h.p.activeCold, h.p.activeWarm)
	}
	for range 2 {
		h.p.Completed(c1, h.members[0])
		h.p.Completed(c2, h.members[1])
		h.p.Completed(w, h.others[1])
	}
	h.empty()
}

// TestColdTurnedAwayRecordsSwept: Cold requests classified but never queued nor dispatched
// (turned away over a limit, with no Left) are dropped once they are old; queued ones stay.
func TestColdTurnedAwayRecordsSwept(t *testing.T) {
	h := cpNew(t, Config{Workers: 1, SoftDrainTimeout: time.Hour}, cpRoute(3)...)
	kept := h.cold("kept")
	for i := range coldSweepMin - 1 { // with "kept", the next Classify finds coldSweepMin records
		h.req(fmt.Sprint("away", i), 2*cpThreshold, 0)
	}
	h.now = cpT0.Add(coldRecordTTL)
	h.req("fresh", 2*cpThreshold, 0)
	if len(h.p.cold) != 2 || h.p.cold[key("kept")] == nil || h.p.cold[key("fresh")] == nil {
		t.Fatalf("after the sweep %d records, want kept and fresh", len(h.p.cold))
	}
	if h.p.pending != 1 {
		t.Fatalf("pending %d, want 1", h.p.pending)
	}
	h.p.Left(kept)
	fresh := &admission.Request{Key: key("fresh"), ID: "fresh", Tag: TagCold}
	h.p.Dispatched(fresh, "w1")
	h.p.Completed(fresh, "w1")
	h.empty()
}

func TestColdPoolShape(t *testing.T) {
	p := New(Config{Workers: 2, QueueLimit: 7, MaxWait: 3 * time.Second, SoftDrainTimeout: -time.Second}, nil)
	if p.Gate() != admission.Gate(p) || p.Recheck() != 100*time.Millisecond {
		t.Fatalf("gate %v recheck %v", p.Gate(), p.Recheck())
	}
	if l := p.LaneLimits()[Lane]; l != (admission.LaneLimit{QueueLimit: 7, MaxWait: 3 * time.Second}) {
		t.Fatalf("lane limits %+v", l)
	}
	if p.cfg.SoftDrainTimeout != 0 {
		t.Fatal("a negative soft drain timeout is 0")
	}
	r := &admission.Request{Key: key("x"), ID: "x", Tag: "other"}
	if d := p.Check(r, cpView{now: cpT0}); d != (admission.Decision{Go: true}) {
		t.Fatalf("untagged head: %+v", d)
	}
	// A Cold head the policy has no record of is not held for its soft drain: its wait is
	// taken as over.
	p = New(Config{Workers: 1, SoftDrainTimeout: time.Hour}, func() time.Time { return cpT0 })
	p.Dispatched(&admission.Request{Key: key("busy"), ID: "busy", Tag: TagWarm}, "w1")
	v := cpView{now: cpT0, ws: []admission.Worker{{ID: "w1"}}}
	if d := p.Check(&admission.Request{Key: key("stranger"), ID: "stranger", Tag: TagCold, Lane: Lane}, v); d != (admission.Decision{Go: true, Target: "w1"}) {
		t.Fatalf("unknown cold head: %+v", d)
	}
}

// TestColdLeastTiesToLowerID: the least-loaded non-full worker wins, equal loads to the lower
// id whatever the order given; full ones and those keep rejects never.
func TestColdLeastTiesToLowerID(t *testing.T) {
	ws := []admission.Worker{{ID: "c", Load: 1}, {ID: "b", Load: 1}, {ID: "a", Load: 2}, {ID: "d", Load: 0, Full: true}}
	if w, ok := coldLeast(ws, nil); !ok || w != "b" {
		t.Fatalf("got %q, want b", w)
	}
	ws = []admission.Worker{{ID: "b", Load: 1}, {ID: "c", Load: 1}, {ID: "e", Load: 0}}
	if w, _ := coldLeast(ws, nil); w != "e" {
		t.Fatalf("got %q, want the least loaded e", w)
	}
	if w, _ := coldLeast(ws, func(w admission.Worker) bool { return w.ID != "e" }); w != "b" {
		t.Fatalf("got %q, want b once e is rejected", w)
	}
	if _, ok := coldLeast([]admission.Worker{{ID: "x", Full: true}}, nil); ok {
		t.Fatal("a full worker was chosen")
	}
}

// TestTracked: Tracked counts every ledger entry: a queued contained Cold request is its record,
// one pending and one pending mark per pool member; dispatched, one active entry and one
// per-worker count; nothing once it completed.
func TestTracked(t *testing.T) {
	h := cpNew(t, Config{Workers: 2, SteerWarm: true}, cpRoute(6)...)
	c := h.cold("c")
	if got, want := h.p.Tracked(), 1+1+len(h.members); got != want {
		t.Fatalf("queued: %d, want %d", got, want)
	}
	h.p.Dispatched(c, h.members[0])
	w := h.warm("w")
	h.p.Dispatched(w, h.others[0])
	if got := h.p.Tracked(); got != 4 {
		t.Fatalf("two dispatched: %d, want 4", got)
	}
	h.p.Completed(c, h.members[0])
	h.p.Completed(w, h.others[0])
	if h.p.Tracked() != 0 {
		t.Fatalf("after completion: %d", h.p.Tracked())
	}
	h.empty()
}

// TestColdSweepRunsOnceTheRecordsDouble: Classify sweeps the records of Cold requests turned
// away only once there are coldSweepMin records, and after a sweep that kept n, not before
// there are 2n — so a Classify costs O(1) amortized however many Cold requests are queued —
// and the sweep then drops every stale record.
func TestColdSweepRunsOnceTheRecordsDouble(t *testing.T) {
	h := cpNew(t, Config{Workers: 1, SoftDrainTimeout: time.Hour}, cpRoute(3)...)
	n := 0
	fill := func(records int) { // queued Cold requests until the next Classify finds records
		t.Helper()
		for len(h.p.cold) < records {
			h.cold(fmt.Sprint("q", n))
			n++
		}
	}
	staleUntilTheSweep := func(stale *admission.Request, at int) {
		t.Helper()
		fill(at)
		if h.p.cold[stale.Key] == nil {
			t.Fatalf("%s swept before the records reached %d", stale.ID, at)
		}
		h.cold(fmt.Sprint("q", n))
		n++
		if h.p.cold[stale.Key] != nil {
			t.Fatalf("%s not swept at %d records", stale.ID, at)
		}
	}
	away := h.req("away", 2*cpThreshold, 0) // turned away: never enqueued
	h.now = h.now.Add(coldRecordTTL)
	staleUntilTheSweep(away, coldSweepMin)
	kept := len(h.p.cold) - 1 // what the sweep kept, before the Classify that ran it
	away2 := h.req("away2", 2*cpThreshold, 0)
	h.now = h.now.Add(coldRecordTTL)
	staleUntilTheSweep(away2, 2*kept)
}
