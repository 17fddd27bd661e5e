package gateway_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"

	"github.com/cespare/xxhash/v2"
)

// TestHandExample is the seed's worked example (§3): least_outstanding over queue depths
// a = 2, b = 0, c = 1; eviction at exactly k·T = 6 s after the last heartbeat.
func TestHandExample(t *testing.T) {
	h := gwtest.New(t)
	h.Beat(gwtest.Worker("a", "smol", 2))
	h.Beat(gwtest.Worker("b", "smol", 0))
	h.Beat(gwtest.Worker("c", "smol", 1))

	// r1: loads 2, 0, 1 → b.
	if got := h.MustPick("smol"); got != "b" {
		t.Fatalf("r1 went to %s, want b", got)
	}
	// A second request: loads 2, 1, 1 → b (tie with c, smallest id). Two now in flight on b.
	if got := h.MustPick("smol"); got != "b" {
		t.Fatalf("second request went to %s, want b", got)
	}
	h.InFlight("b", 2)
	// r2: loads 2, 2, 1 → c. Queue depth counts: with in-flight only, a (0) would win.
	if got := h.MustPick("smol"); got != "c" {
		t.Fatalf("r2 went to %s, want c", got)
	}

	// a heartbeats at t0+2 s and t0+4 s; b and c send nothing more.
	h.Clock.Advance(2 * time.Second)
	h.Beat(gwtest.Worker("a", "smol", 2))
	h.Clock.Advance(2 * time.Second)
	h.Beat(gwtest.Worker("a", "smol", 2))

	// t0+5.999 s: 5.999 < 6, all three listed; no deadline has fired.
	pending := h.Clock.Pending()
	h.Clock.Advance(1999 * time.Millisecond)
	if h.Clock.Pending() != pending {
		t.Fatalf("a deadline fired before 6 s (pending %d → %d)", pending, h.Clock.Pending())
	}
	if got := h.IDs(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("at 5.999 s listed %v, want [a b c]", got)
	}
	// t0+6 s: 6 − 0 ≥ 3·2: b and c are evicted; a's last heartbeat was 2 s ago.
	h.Clock.Advance(time.Millisecond)
	h.WaitIDs("a")
	if got := h.MustPick("smol"); got != "a" {
		t.Fatalf("r3 went to %s, want a", got)
	}
}

// TestWeightedByCapacity: capacities 1 and 3 (kv_total_blocks) give big, big, small, big twice.
func TestWeightedByCapacity(t *testing.T) {
	h := gwtest.New(t, gwtest.WithPolicy("weighted"))
	small := gwtest.Worker("a-small", "smol", 0)
	small.KVTotalBlocks, small.KVFreeBlocks = 1, 1
	big := gwtest.Worker("b-big", "smol", 0)
	big.KVTotalBlocks, big.KVFreeBlocks = 3, 3
	h.Beat(small)
	h.Beat(big)
	var got []string
	for i := 0; i < 8; i++ {
		got = append(got, h.MustPick("smol"))
		if i == 4 {
			// Heartbeats in the middle of the sequence update the workers in place: the
			// round robin counters carry on.
			h.Beat(small)
			h.Beat(big)
		}
	}
	want := []string{"b-big", "b-big", "a-small", "b-big", "b-big", "b-big", "a-small", "b-big"}
	if !slices.Equal(got, want) {
		t.Fatalf("picks %v, want %v", got, want)
	}
}

func prefixHash(t *testing.T, system, user string) uint64 {
	t.Helper()
	body := fmt.Sprintf(`{"model":"smol","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, user)
	key, err := oai.PrefixKey(oai.Chat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return xxhash.Sum64(key)
}

// TestAffinityKeepsPrefixTogether: requests sharing a system prompt land on one worker
// (reason affinity), distinct prefixes spread over the pool, and an overloaded owner is
// skipped (reason load).
func TestAffinityKeepsPrefixTogether(t *testing.T) {
	h := gwtest.New(t, gwtest.WithPolicy("affinity"))
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		h.Beat(gwtest.Worker(id, "smol", 0))
	}
	system := "You are a helpful assistant for the ACME corporation. Answer briefly and politely."
	var owner string
	for i := 0; i < 20; i++ {
		res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: fmt.Sprint(i), PrefixHash: prefixHash(t, system, fmt.Sprint("question ", i))})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			owner = res.WorkerID
		}
		if res.WorkerID != owner || res.Reason.String() != "affinity" {
			t.Fatalf("request %d: %s (%v), want %s (affinity)", i, res.WorkerID, res.Reason, owner)
		}
		h.GW.Release(res) // complete the request, as the proxy does
		h.InFlight(res.WorkerID, 0)
	}

	spread := map[string]int{}
	for i := 0; i < 40; i++ {
		res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: fmt.Sprint("d", i), PrefixHash: prefixHash(t, fmt.Sprintf("distinct system prompt number %d ........", i), "q")})
		if err != nil {
			t.Fatal(err)
		}
		spread[res.WorkerID]++
		h.GW.Release(res)
		h.InFlight(res.WorkerID, 0)
	}
	if len(spread) < 3 {
		t.Fatalf("40 distinct prefixes used only %d of 4 workers: %v", len(spread), spread)
	}

	// Overload the owner as in the seed: load 3 on it, none elsewhere (R2: load is in-flight
	// plus queue depth; here the owner's engine reports 3 queued). The cap is
	// ⌈1.25·(3+1)/4⌉ = 2, so the owner is skipped and the next worker clockwise takes it.
	key := prefixHash(t, system, "another")
	first, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: "o", PrefixHash: key})
	if err != nil || first.WorkerID != owner {
		t.Fatalf("idle pool: got %v, %v; want owner %s", first, err, owner)
	}
	h.GW.Release(first)
	h.InFlight(owner, 0)
	h.Beat(gwtest.Worker(owner, "smol", 3))
	res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: "over", PrefixHash: key})
	if err != nil {
		t.Fatal(err)
	}
	if res.WorkerID == owner || res.Reason.String() != "load" {
		t.Fatalf("overloaded owner: got %s (%v), want another worker (load)", res.WorkerID, res.Reason)
	}
}

// TestModelNotFoundAndNoCapacity: an unknown model is model_not_found; a routed model with no
// routable worker is no_capacity; readiness needs a routable worker.
func TestModelNotFoundAndNoCapacity(t *testing.T) {
	h := gwtest.New(t, gwtest.WithRoutes(config.Route{Model: "smol", Aliases: []string{"small"}, Targets: []string{"unified"}}))
	if n, err := h.GW.Routable(); err != nil || n != 0 {
		t.Fatalf("routable = %d, %v; want 0 (not ready)", n, err)
	}
	if _, err := h.GW.Pick(&router.Pick{Model: "gpt-9", RequestID: "1"}); !errors.Is(err, errs.ErrModelNotFound) {
		t.Fatalf("unknown model: %v, want ErrModelNotFound", err)
	}
	for _, m := range []string{"smol", "small"} {
		if _, err := h.GW.Pick(&router.Pick{Model: m, RequestID: "1"}); !errors.Is(err, errs.ErrNoCapacity) {
			t.Fatalf("%s with no worker: %v, want ErrNoCapacity", m, err)
		}
	}
	// A worker registers, then reports draining: known model, still no capacity.
	w := gwtest.Worker("w1", "smol", 0)
	h.Beat(w)
	if n, _ := h.GW.Routable(); n != 1 {
		t.Fatalf("routable = %d, want 1", n)
	}
	if got := h.MustPick("small"); got != "w1" {
		t.Fatalf("alias picked %s", got)
	}
	w.Draining = true
	h.Beat(w)
	if _, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: "2"}); !errors.Is(err, errs.ErrNoCapacity) {
		t.Fatalf("draining worker: %v, want ErrNoCapacity", err)
	}
	// A model with no route is its own route while a worker serves it.
	h.Beat(gwtest.Worker("w2", "big", 0))
	if got := h.MustPick("big"); got != "w2" {
		t.Fatalf("unrouted model picked %s", got)
	}
	// Once its last worker is evicted, the unrouted model is unknown again.
	h.Clock.Advance(6 * time.Second)
	h.WaitIDs()
	if _, err := h.GW.Pick(&router.Pick{Model: "big", RequestID: "3"}); !errors.Is(err, errs.ErrModelNotFound) {
		t.Fatalf("evicted model: %v, want ErrModelNotFound", err)
	}
	if n, _ := h.GW.Routable(); n != 0 {
		t.Fatalf("routable = %d after eviction, want 0", n)
	}
}

// TestCanarySplit: a 0.9/0.1 split over 10,000 request ids lands within 4 standard deviations
// of 0.1; one id always gets one backend; a route without backends serves its own model.
func TestCanarySplit(t *testing.T) {
	h := gwtest.New(t, gwtest.WithRoutes(
		config.Route{Model: "smol", Backends: []config.Backend{{Model: "smol-v3", Weight: 0.9}, {Model: "smol-v4", Weight: 0.1}}, Targets: []string{"unified"}},
		config.Route{Model: "plain", Targets: []string{"unified"}},
	))
	h.Beat(gwtest.Worker("v3", "smol-v3", 0))
	h.Beat(gwtest.Worker("v4", "smol-v4", 0))
	h.Beat(gwtest.Worker("p", "plain", 0))
	const n = 10000
	canary := 0
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("req-%d", i)
		res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		if res.ServedModel == "smol-v4" {
			canary++
		}
		if i%1000 == 0 { // one id, one backend
			again, _ := h.GW.Pick(&router.Pick{Model: "smol", RequestID: id})
			if again.ServedModel != res.ServedModel {
				t.Fatalf("id %s drew %s then %s", id, res.ServedModel, again.ServedModel)
			}
		}
	}
	sd := math.Sqrt(n * 0.1 * 0.9)
	if diff := math.Abs(float64(canary) - n*0.1); diff > 4*sd {
		t.Fatalf("canary got %d of %d, want %v ± %.0f", canary, n, n*0.1, 4*sd)
	}
	res, err := h.GW.Pick(&router.Pick{Model: "plain", RequestID: "x"})
	if err != nil || res.ServedModel != "plain" {
		t.Fatalf("route without backends served %v (%v)", res, err)
	}
}

// crash is a test-only message that makes the receiving actor panic.
type crash struct{}

func crashInjector(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		if _, ok := env.Message.(crash); ok {
			panic("injected crash")
		}
		next(c, env)
	}
}

// TestSupervisionKeepsRegistry: a panicking router, registry or worker actor is restarted by
// its supervisor without losing the route table, the registry or the in-flight counts.
func TestSupervisionKeepsRegistry(t *testing.T) {
	h := gwtest.New(t, gwtest.WithActorOptions(func(string) []actor.PropsOption {
		return []actor.PropsOption{actor.WithReceiverMiddleware(crashInjector)}
	}))
	h.Beat(gwtest.Worker("a", "smol", 0))
	h.Beat(gwtest.Worker("b", "smol", 5))
	res, err := h.Pick(router.Pick{Model: "smol", RequestID: "1"})
	if err != nil || res.WorkerID != "a" {
		t.Fatalf("pick: %v %v", res, err)
	}
	h.InFlight("a", 1)

	var restarts atomic.Int32
	sub := h.GW.System.EventStream.Subscribe(func(ev any) {
		if se, ok := ev.(*actor.SupervisorEvent); ok && se.Directive == actor.RestartDirective {
			restarts.Add(1)
		}
	})
	defer h.GW.System.EventStream.Unsubscribe(sub)
	root := h.GW.System.Root
	root.Send(h.GW.Router, crash{})
	root.Send(h.GW.Registry, crash{})
	root.Send(res.Worker, crash{})

	h.Eventually("three restarts", func() bool { return restarts.Load() == 3 })
	// Everything is still known after the restarts.
	h.Eventually("router answers after restart", func() bool { return slices.Equal(h.IDs(), []string{"a", "b"}) })
	h.InFlight("a", 1)
	h.Beat(gwtest.Worker("a", "smol", 0)) // the registry still knows a: no second actor
	h.GW.Release(res)
	h.InFlight("a", 0)
	// The worker's deadline survived its restart: a and b are still evicted on time.
	h.Clock.Advance(6 * time.Second)
	h.WaitIDs()
}

// TestCrashedRequesterReleasesItsPick: the worker owns the in-flight count. A pick counts on
// the worker before its requester hears of it, and a requester that stops without releasing
// (it crashed between the pick and its answer, or anywhere later) is released by the worker,
// which watches it — at once, with no heartbeat and no time passing.
func TestCrashedRequesterReleasesItsPick(t *testing.T) {
	h := gwtest.New(t)
	h.Beat(gwtest.Worker("a", "smol", 0))
	doomed := h.NewProbe()
	res, err := h.Pick(router.Pick{Model: "smol", RequestID: "lost", Requester: doomed.PID})
	if err != nil {
		t.Fatal(err)
	}
	h.InFlight("a", 1)
	kept := h.NewProbe()
	res2, err := h.Pick(router.Pick{Model: "smol", RequestID: "kept", Requester: kept.PID})
	if err != nil {
		t.Fatal(err)
	}
	h.InFlight("a", 2)
	if err := h.GW.System.Root.StopFuture(doomed.PID).Wait(); err != nil {
		t.Fatal(err)
	}
	h.InFlight("a", 1) // the stopped requester's hold ended; the live one's stays
	h.GW.Release(res)  // a late release of a ticket already ended changes nothing
	h.GW.Release(res2)
	h.InFlight("a", 0)
	h.GW.Release(res2) // nor does a second release
	h.Beat(gwtest.Worker("a", "smol", 0))
	h.InFlight("a", 0)
}

// TestPrefixAwareFollowsThePrefixIndex: prefix_aware sends a prompt back to the worker that
// served its prefix (reason prefix), while that worker is under the bounded-load cap.
func TestPrefixAwareFollowsThePrefixIndex(t *testing.T) {
	h := gwtest.New(t, gwtest.WithPolicy("prefix_aware"), gwtest.WithPrefixIndex(1024))
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		h.Beat(gwtest.Worker(id, "smol", 0))
	}
	prompt := []byte(strings.Repeat("You are a careful assistant. ", 20))
	hashes := prefixindex.Hashes(nil, prompt)
	first, err := h.Pick(router.Pick{Model: "smol", RequestID: "1", PrefixHashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	h.GW.Release(first)
	h.InFlight(first.WorkerID, 0)
	for i := 0; i < 5; i++ {
		res, err := h.Pick(router.Pick{Model: "smol", RequestID: fmt.Sprint("r", i), PrefixHashes: hashes[:len(hashes)-1]})
		if err != nil {
			t.Fatal(err)
		}
		if res.WorkerID != first.WorkerID || res.Reason.String() != "prefix" {
			t.Fatalf("request %d went to %s (%v), want %s (prefix)", i, res.WorkerID, res.Reason, first.WorkerID)
		}
		h.GW.Release(res)
		h.InFlight(res.WorkerID, 0)
	}
	// A prompt nobody has seen goes by least load.
	other := prefixindex.Hashes(nil, []byte(strings.Repeat("Entirely different words here. ", 20)))
	if res, _ := h.Pick(router.Pick{Model: "smol", RequestID: "x", PrefixHashes: other}); res.Reason.String() != "least_load" {
		t.Fatalf("unseen prompt: reason %v", res.Reason)
	}
}

// TestStaticWorkerLiveness: a static worker is live while now − last good scrape < k·interval,
// evicted at exactly k·interval, and back on its next good scrape; a failed scrape shows on
// the worker and does not move its deadline.
func TestStaticWorkerLiveness(t *testing.T) {
	h := gwtest.New(t)
	info := gwtest.Worker("vllm-0", "llama", 0)
	info.Static = true
	const interval = 500 * time.Millisecond
	ttl := 3 * interval
	scrape := func() {
		if err := h.GW.Scraped(info, ttl); err != nil {
			t.Fatal(err)
		}
	}
	scrape()
	h.WaitIDs("vllm-0")
	h.Clock.Advance(interval)
	h.GW.ScrapeFailed("vllm-0", "timeout")
	h.Eventually("scrape error shown", func() bool { v, _ := h.View("vllm-0"); return v.Info.ScrapeError == "timeout" })
	pending := h.Clock.Pending()
	h.Clock.Advance(ttl - interval - time.Millisecond) // 1.499 s after the last good scrape
	if h.Clock.Pending() != pending {
		t.Fatal("the deadline fired before k·interval")
	}
	if got := h.IDs(); !slices.Equal(got, []string{"vllm-0"}) {
		t.Fatalf("at 1.499 s listed %v", got)
	}
	h.Clock.Advance(time.Millisecond) // 1.5 s: gone
	h.WaitIDs()
	scrape() // the next good scrape brings it back, error cleared
	h.Eventually("back", func() bool { v, ok := h.View("vllm-0"); return ok && v.Routable && v.Info.ScrapeError == "" })
}

// TestOnEvictTold: the registry tells OnEvict about each worker it evicts, with its addresses
// (the app closes its gRPC connections, R13.4), and only then.
func TestOnEvictTold(t *testing.T) {
	evicted := make(chan router.WorkerInfo, 4)
	h := gwtest.New(t, func(c *gateway.Config) { c.OnEvict = func(i router.WorkerInfo) { evicted <- i } })
	w := gwtest.Worker("a", "smol", 0)
	w.GRPCAddress, w.KVAddress = "127.0.0.1:7001", "127.0.0.1:7002"
	h.Beat(w)
	h.Clock.Advance(6*time.Second - time.Nanosecond)
	select {
	case i := <-evicted:
		t.Fatalf("told before the deadline: %+v", i)
	default:
	}
	h.Clock.Advance(time.Nanosecond)
	select {
	case i := <-evicted:
		if i.ID != "a" || i.GRPCAddress != "127.0.0.1:7001" || i.KVAddress != "127.0.0.1:7002" {
			t.Fatalf("told %+v", i)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnEvict was not told")
	}
}

// TestCanaryKeyShared (R20, R16): two gateways draw each request id's backend from their
// canary keys: with their own random keys they disagree on about half the ids of a 50/50 split,
// with one key (Config.CanaryKey, or SetCanaryKey as a cluster's store installs it) they agree
// on every id, as replicas sharing a key must.
func TestCanaryKeyShared(t *testing.T) {
	routes := gwtest.WithRoutes(config.Route{Model: "smol", Targets: []string{"unified"},
		Backends: []config.Backend{{Model: "a", Weight: 1}, {Model: "b", Weight: 1}}})
	shared := router.CanaryKey{7}
	gws := []*gwtest.Harness{
		gwtest.New(t, routes),
		gwtest.New(t, routes),
		gwtest.New(t, routes, func(c *gateway.Config) { c.CanaryKey = &shared }),
	}
	for _, h := range gws {
		h.Beat(gwtest.Worker("wa", "a", 0))
		h.Beat(gwtest.Worker("wb", "b", 0))
	}
	served := func(h *gwtest.Harness, id string) string {
		res, err := h.GW.Pick(&router.Pick{Model: "smol", RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		return res.ServedModel
	}
	disagree := func() int {
		n := 0
		for i := range 400 {
			id := fmt.Sprintf("req-%d", i)
			want := "a"
			if router.CanaryDraw(shared, id) >= 0.5 {
				want = "b"
			}
			if got := served(gws[2], id); got != want {
				t.Fatalf("%s: the gateway with the shared key served %s, the key draws %s", id, got, want)
			}
			if served(gws[0], id) != served(gws[1], id) {
				n++
			}
		}
		return n
	}
	if n := disagree(); n < 140 || n > 260 {
		t.Fatalf("two random keys disagree on %d of 400 ids, want about 200", n)
	}
	gws[0].GW.SetCanaryKey(shared)
	gws[1].GW.SetCanaryKey(shared)
	if n := disagree(); n != 0 { // SetCanaryKey is a Send; Pick, an ask after it, sees it
		t.Fatalf("with one key, %d of 400 ids drew different backends", n)
	}
}
