package fleet

import (
	"slices"
	"testing"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// TestWarmupsCutTheSpillTail: on the shared-prefix trace at 0.8, the prefix policies' tail is
// the requests that spill from a long prompt's holders, all at the cap, to a worker that holds
// nothing. With warm-ups on (the config's default) the router copies such a prompt ahead of
// the spill: both policies run warm-ups, every one of them ends (Run checks that every ticket
// was released and every engine is idle; the audit, that engines start what reaches them in
// order and that warm-ups run as the model says), and the TTFT p99 falls.
func TestWarmupsCutTheSpillTail(t *testing.T) {
	run := func(warm int) *Report {
		t.Helper()
		rep, err := Run(Options{Trace: TraceSharedPrefix, Workers: 40, Requests: 4000, Load: 0.8, Seed: 1,
			Policies: []string{"prefix_aware", "precise_prefix", "least_outstanding"}, WarmupMinBytes: warm, audit: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("prefix_warmup_min_bytes %d:\n%s", warm, markdownOf(t, rep))
		return rep
	}
	off, on := run(-1), run(0)
	for i, pol := range []string{"prefix_aware", "precise_prefix"} {
		a, b := off.Results[i], on.Results[i]
		if a.Warmups != 0 || b.Warmups == 0 {
			t.Errorf("%s: %d warm-ups off, %d on", pol, a.Warmups, b.Warmups)
		}
		if b.Completed != b.Requests || b.TTFTP99Ms >= a.TTFTP99Ms {
			t.Errorf("%s: p99 %.1f ms with warm-ups, %.1f without (%d/%d completed)", pol, b.TTFTP99Ms, a.TTFTP99Ms, b.Completed, b.Requests)
		}
	}
	if lo := on.Results[2]; lo.Warmups != 0 {
		t.Errorf("least_outstanding ran %d warm-ups", lo.Warmups)
	}
}

// TestWarmTokens: a warm-up's prompt is the tokens that lie wholly within its bytes of the
// rendered prompt ("role\n", 4 bytes a token, "\n" per message), and a chat body of the
// messages those tokens make renders as a prefix of the request's render.
func TestWarmTokens(t *testing.T) {
	sys := message{role: roleSystem, seg: segID(segSystem, 1, 0), n: 40}
	user := message{role: roleUser, seg: segID(segUser, 2, 0), n: 10}
	msgs := []message{sys, user}
	all := appendTokens(appendTokens(nil, 7, sys), 7, user)
	// "system\n" is 7 bytes, then token k ends at byte 7 + 4(k+1); the system message's render
	// ends at 7 + 160 + 1 = 168, then "user\n" (5 bytes) and the user's tokens.
	for n, want := range map[int]int{0: 0, 7: 0, 10: 0, 11: 1, 14: 1, 15: 2, 167: 40, 168: 40, 173: 40, 176: 40, 177: 41, 1000: 50} {
		got := warmTokens(nil, 7, msgs, n)
		if len(got) != want || !slices.Equal(got, all[:want]) {
			t.Errorf("within %d bytes: %d tokens, want the first %d", n, len(got), want)
		}
	}
	body := chatBody(nil, 7, msgs, true)
	full := oai.RenderPrompt(oai.Chat, body, len(body))
	if len(full) != 168+5+40+1 {
		t.Fatalf("render of %d bytes", len(full))
	}
}

// handRunner is a run of tr driven by hand on one engine of model m, under precise_prefix,
// with the audit on.
func handRunner(t *testing.T, m EngineModel, tr *trace) *runner {
	t.Helper()
	s, err := router.NewSim(router.Config{Policy: "precise_prefix", LoadFactor: 1.25})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(router.WorkerInfo{ID: "w0", Model: model, KVEvents: true})
	r := &runner{o: &Options{Seed: 3, Engine: m}, tr: tr, sims: []*router.Sim{s}, precise: true, byID: map[string]int32{"w0": 0},
		jobs: make([]job, len(tr.reqs)), engines: []*engine{newEngine("w0", m)},
		audit: &audit{order: make([][]int32, 1)}}
	r.watch(0)
	return r
}

// finish runs r's events to the end and checks that the audit found nothing, the engine is
// idle and started requests have started.
func (r *runner) finish(t *testing.T, started int) {
	t.Helper()
	for len(r.q.h) > 0 {
		ev := r.q.pop()
		r.now = ev.at
		switch ev.kind {
		case evDone:
			r.done(ev.idx)
		case evWarmDone:
			r.warmDone(ev.idx)
		}
	}
	if len(r.audit.faults) > 0 {
		t.Fatalf("audit: %v", r.audit.faults)
	}
	if e := r.engines[0]; e.run != 0 || e.waiting() != 0 || r.warmLive != 0 || len(r.ttft) != started {
		t.Fatalf("after the run: running %d, waiting %d, warm-ups live %d, %d requests started", e.run, e.waiting(), r.warmLive, len(r.ttft))
	}
}

// TestWarmupIsReported: precise_prefix hears of a warm-up's blocks as of a request's: the
// ids its KV evicted when it started (another prompt's, here) at once, and the chunks of its
// prompt that it holds.
func TestWarmupIsReported(t *testing.T) {
	m := DefaultEngine
	m.KVBlocks = 30 // one 440-token prompt (28 blocks) at a time
	tr := sharedTrace(1)
	tr.reqs = append(tr.reqs, request{msgs: []message{{role: roleSystem, seg: segID(segSystem, 2, 0), n: 400}},
		out: message{role: roleAssistant, seg: segID(segAnswer, 9, 0), n: 1}})
	r := handRunner(t, m, tr)
	hashesOf := func(i int) []uint64 {
		body := chatBody(nil, r.o.Seed, tr.reqs[i].msgs, true)
		return prefixindex.Hashes(nil, oai.RenderPrompt(oai.Chat, body, len(body)))
	}
	reason := func(hashes []uint64) policy.Reason {
		t.Helper()
		p, ok := r.sims[0].Pick(&router.Pick{Model: model, RequestID: "probe", Key: 1 << 40, PrefixHashes: hashes})
		if !ok || p.Err != nil {
			t.Fatalf("probe pick: %+v", p)
		}
		r.sims[0].Release(p, router.OutcomeNone)
		return p.Reason
	}
	r.place(0, &router.Picked{WorkerID: "w0"})
	r.finish(t, 1)
	// The deep chunks of request 0's prompt (a lookup from chunk 24 on): evicted first.
	deep := hashesOf(0)[24:]
	if got := reason(deep); got != policy.ReasonPrefix {
		t.Fatalf("request 0's prompt: reason %v, want prefix (w0 holds it)", got)
	}
	r.warmup(1, &router.Warmup{PickedWorker: router.PickedWorker{WorkerID: "w0"}, Bytes: 20 * 64})
	if got := reason(deep); got != policy.ReasonLeastLoad {
		t.Fatalf("request 0's prompt after the warm-up evicted it: reason %v, want least_load", got)
	}
	r.finish(t, 1)
	if got := reason(hashesOf(1)[:18]); got != policy.ReasonPrefix {
		t.Fatalf("the warmed prompt: reason %v, want prefix", got)
	}
}

// sharedTrace is n requests of one 400-token system prompt, each with its own 40-token user
// message and an 8-token answer.
func sharedTrace(n int) *trace {
	sys := message{role: roleSystem, seg: segID(segSystem, 1, 0), n: 400}
	tr := &trace{}
	for i := range uint64(n) {
		tr.reqs = append(tr.reqs, request{msgs: []message{sys, {role: roleUser, seg: segID(segUser, i, 0), n: 40}},
			out: message{role: roleAssistant, seg: segID(segAnswer, i, 0), n: 8}})
	}
	return tr
}

// TestWarmupWaitsItsTurn: a warm-up that reaches an engine behind a request waiting for KV
// waits, though a slot is free and its own prompt (cached from the first request) would fit;
// it then costs the prefill of what the engine did not hold and one decode step.
func TestWarmupWaitsItsTurn(t *testing.T) {
	m := DefaultEngine
	m.MaxRunning, m.KVBlocks = 4, 30 // a prompt is 28 blocks; the next one's 3 new do not fit
	r := handRunner(t, m, sharedTrace(3))
	pick := &router.Picked{WorkerID: "w0"}
	r.place(0, pick)
	r.place(1, pick)
	r.warmup(2, &router.Warmup{PickedWorker: router.PickedWorker{WorkerID: "w0"}, Bytes: 20 * 64})
	if e := r.engines[0]; e.run != 1 || e.waiting() != 2 {
		t.Fatalf("running %d, waiting %d: the warm-up overtook the request before it", e.run, e.waiting())
	}
	r.finish(t, 2)
	if wj := r.warms[0]; wj.cached == 0 || wj.start < r.jobs[1].start {
		t.Fatalf("the warm-up found %d tokens cached and started at %d (request 1 at %d)", wj.cached, wj.start, r.jobs[1].start)
	}
}

// TestWarmupHandsOnItsSlot: on an engine of one slot, a request queued behind a warm-up starts
// when the warm-up ends.
func TestWarmupHandsOnItsSlot(t *testing.T) {
	m := DefaultEngine
	m.MaxRunning = 1
	r := handRunner(t, m, sharedTrace(3))
	pick := &router.Picked{WorkerID: "w0"}
	r.place(0, pick)
	r.warmup(1, &router.Warmup{PickedWorker: router.PickedWorker{WorkerID: "w0"}, Bytes: 20 * 64})
	r.place(2, pick)
	r.finish(t, 2)
	if wj := r.warms[0]; r.jobs[2].start <= wj.start {
		t.Fatalf("request 2 started at %d, the warm-up before it at %d", r.jobs[2].start, wj.start)
	}
}
