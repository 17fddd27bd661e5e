package bench

// Issue 13's benchmark: agent programs against a fleet whose KV is oversubscribed.
//
// A discrete-event simulation on a fake clock (a priority queue of events by time; no sleeps,
// no goroutines) drives the REAL admission.Queue with each policy — none (the default),
// session_serial and thunderagent — through a host written here (apSim, like the queue tests'
// fakeHost). Every policy sees the same workload (the random draws are made before the run).
//
// The model (apBase gives the numbers):
//
//   - Fleet: Workers workers, each with a KV capacity of Capacity tokens (admission.Worker.
//     Capacity) and a busy threshold of Busy running turns (admission.Worker.Full).
//   - Dispatch: the queue's target when it is given and not full, else the least-loaded
//     non-full worker (running turns; ties to the lowest id). The "+affinity" variant first
//     tries the worker of the program's previous turn (what a session-sticky or prefix-aware
//     picker would do); the real router's picker is not used.
//   - Prefix cache: per worker, an LRU of programs' contexts bounded by Capacity tokens. A turn
//     of a program on worker w hits min(cached context of that program on w, its prompt)
//     tokens and recomputes the rest. At dispatch the turn's whole KV (prompt + output) is
//     written to w's cache and pinned while the turn runs; when the cache is over capacity,
//     the least recently used unpinned contexts are evicted (whole). A copy left on a worker
//     the program moved away from stays until it is evicted.
//   - Program: a prompt of P0 tokens; T turns; each turn appends its Output tokens and then a
//     tool result of ToolResult tokens (so turn k's prompt is P0 + k·(Output+ToolResult), and
//     the best a turn can hit is the previous turn's prompt + output: the tool result is
//     always new). Between turns an acting pause (tool time) drawn from an exponential of mean
//     ToolMean (seeded). The last turn is Final. Programs start at uniform times in
//     [0, StartSpread).
//   - Turn time: prefill PrefillPerToken × recomputed tokens, then decode DecodePerToken ×
//     Output. Decode is memory-bound: the step time does not grow with the batch (at most
//     Busy turns per worker), and prefill does not slow the other turns on the worker
//     (SerialPrefill makes a worker prefill one turn at a time instead).
//   - A turn's request: SessionID = the program, PromptTokens = its prompt, Pool "p", Route =
//     every worker, Final on the last turn; at its end ContextTokens = prompt + output, then
//     queue.Completed and queue.WakeCapacity. The host's ArmTimer times call queue.Tick.
//
// Reported per policy: prefix-cache hit rate (hit ÷ prompt tokens), recomputed prompt tokens,
// total completion time (simulated seconds until the last program ends), mean turn latency
// (queue wait + prefill + decode) and mean queue wait.

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
)

// apModel is the simulated fleet and workload.
type apModel struct {
	Workers         int
	Capacity        int64 // KV tokens per worker (also its prefix cache's size)
	Busy            int   // running turns per worker at which it is full
	Programs        int
	Turns           int
	P0              int // system + task prompt, tokens
	Output          int // tokens generated per turn
	ToolResult      int // tokens appended per tool call
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	ToolMean        time.Duration // mean of the exponential acting pause
	StartSpread     time.Duration
	SerialPrefill   bool
	Seed            uint64
}

// apBase is the benchmark's setting: 8 workers × 40,000 tokens (a 320k-token fleet cache),
// 64 programs whose contexts grow to 8,500 tokens (544k at the end: ~1.7× oversubscribed;
// ~1.05× averaged over a program's life).
var apBase = apModel{
	Workers: 8, Capacity: 40_000, Busy: 4,
	Programs: 64, Turns: 10, P0: 2_000, Output: 200, ToolResult: 500,
	PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 20 * time.Millisecond,
	ToolMean: 2 * time.Second, StartSpread: 5 * time.Second, Seed: 1,
}

// apResult is one run's bookkeeping.
type apResult struct {
	Turns, Rejected, Unfinished int
	PromptTokens, HitTokens     int64
	RecomputedTokens            int64
	EvictedTokens               int64
	Makespan                    time.Duration // start to the last program's end
	LatencySum, WaitSum         time.Duration // over turns
	ProgramSum                  time.Duration // over programs: first submission to end
	Pauses, ForcedResumes       uint64        // thunderagent only
	// SameWorker counts turns (after a program's first) run on their previous turn's worker;
	// Targeted the dispatches the gate gave a target, TargetFull those whose target was full.
	SameWorker, Targeted, TargetFull int
}

func (r apResult) hitRate() float64 { return float64(r.HitTokens) / float64(r.PromptTokens) }
func (r apResult) meanLatency() float64 {
	return r.LatencySum.Seconds() / float64(max(r.Turns, 1))
}
func (r apResult) meanWait() float64 { return r.WaitSum.Seconds() / float64(max(r.Turns, 1)) }

// apPolicies are the policies compared, by name.
var apPolicies = []string{"default", "session_serial", "thunderagent"}

const (
	apSubmit  = iota // a program's next turn arrives (its tool time is over)
	apTurnEnd        // a running turn ends
	apTimer          // a time the queue armed
)

type apEvent struct {
	at   time.Time
	seq  uint64
	kind int
	p    *apProg
}

type apEvents []apEvent

func (h apEvents) Len() int { return len(h) }
func (h apEvents) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h apEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *apEvents) Push(x any)   { *h = append(*h, x.(apEvent)) }
func (h *apEvents) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type apCached struct {
	tokens int64
	stamp  uint64 // LRU: last use
	pinned bool   // a turn of the program runs on this worker
}

type apWorker struct {
	id          string
	running     int
	cache       map[int]*apCached // program → its cached context
	used        int64
	prefillFree time.Time
}

type apProg struct {
	id        int
	sid       string
	start     time.Duration
	tools     []time.Duration // the acting pause after turn k
	turn      int             // turns completed
	prompt    int             // the next (or running) turn's prompt
	worker    int             // the worker of its last turn (-1: none)
	entry     *admission.Entry
	submitted time.Time
	done      bool
	end       time.Time
}

type apSim struct {
	m        apModel
	affinity bool
	t0, now  time.Time
	q        *admission.Queue
	ta       *thunderagent.Policy
	events   apEvents
	seq      uint64
	stamp    uint64
	key      uint64
	workers  []apWorker
	view     []admission.Worker
	route    []string
	progs    []*apProg
	armed    map[time.Time]bool
	left     int
	res      apResult
}

// apWorkload draws every program's start and tool times from the seed (the same for every
// policy).
func apWorkload(m apModel) []*apProg {
	rng := rand.New(rand.NewPCG(m.Seed, 0x13))
	progs := make([]*apProg, m.Programs)
	for i := range progs {
		p := &apProg{id: i, sid: "prog-" + strconv.Itoa(i), worker: -1, prompt: m.P0}
		p.start = time.Duration(rng.Float64() * float64(m.StartSpread))
		for k := 0; k < m.Turns-1; k++ {
			p.tools = append(p.tools, time.Duration(rng.ExpFloat64()*float64(m.ToolMean)))
		}
		progs[i] = p
	}
	return progs
}

// apRun simulates the workload of m under policy (a name of apPolicies).
func apRun(m apModel, policy string, affinity bool) apResult {
	s := &apSim{m: m, affinity: affinity, t0: time.Unix(1_000_000, 0), armed: map[time.Time]bool{}}
	s.now = s.t0
	for i := 0; i < m.Workers; i++ {
		id := fmt.Sprintf("w%02d", i)
		s.workers = append(s.workers, apWorker{id: id, cache: map[int]*apCached{}})
		s.route = append(s.route, id)
	}
	s.view = make([]admission.Worker, m.Workers)
	now := func() time.Time { return s.now }
	var pol admission.Policy
	switch policy {
	case "default":
	case "session_serial":
		pol = sessionserial.New()
	case "thunderagent":
		s.ta = thunderagent.New(thunderagent.DefaultConfig(), now)
		pol = s.ta
	default:
		panic("unknown policy " + policy)
	}
	s.q = admission.New(admission.Config{
		Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 100_000, MaxWait: 24 * time.Hour}},
		DefaultClass: "default", Policy: pol, Now: now,
	})
	s.progs = apWorkload(m)
	s.left = len(s.progs)
	for _, p := range s.progs {
		s.push(s.t0.Add(p.start), apSubmit, p)
	}
	for s.left > 0 && len(s.events) > 0 {
		ev := heap.Pop(&s.events).(apEvent)
		s.now = ev.at
		switch ev.kind {
		case apSubmit:
			s.submit(ev.p)
		case apTurnEnd:
			s.turnEnd(ev.p)
		case apTimer:
			delete(s.armed, ev.at)
			s.q.Tick(s)
		}
	}
	s.res.Unfinished = s.left
	for _, p := range s.progs {
		if p.done {
			s.res.Makespan = max(s.res.Makespan, p.end.Sub(s.t0))
			s.res.ProgramSum += p.end.Sub(s.t0.Add(p.start))
		}
	}
	if s.ta != nil {
		st := s.ta.Stats()
		s.res.Pauses, s.res.ForcedResumes = st.Pauses, st.ForcedResumes
	}
	return s.res
}

func (s *apSim) push(at time.Time, kind int, p *apProg) {
	s.seq++
	heap.Push(&s.events, apEvent{at: at, seq: s.seq, kind: kind, p: p})
}

// submit admits a program's next turn.
func (s *apSim) submit(p *apProg) {
	s.key++
	r := &admission.Request{Key: s.key, ID: p.sid + "/" + strconv.Itoa(p.turn), SessionID: p.sid,
		PromptTokens: p.prompt, Final: p.turn == s.m.Turns-1}
	p.entry = &admission.Entry{Req: r, Payload: p, Route: s.route, Pool: "p"}
	p.submitted = s.now
	s.q.Admit(p.entry, s, func(ws []string) int {
		best := 0
		for i := range s.workers {
			if c := s.workers[i].cache[p.id]; c != nil && slices.Contains(ws, s.workers[i].id) {
				best = max(best, min(int(c.tokens), p.prompt))
			}
		}
		return best
	})
}

// turnEnd ends a program's running turn: the queue learns it, then the acting pause (or the
// program's end).
func (s *apSim) turnEnd(p *apProg) {
	w := &s.workers[p.worker]
	w.running--
	if c := w.cache[p.id]; c != nil {
		c.pinned = false
		s.stamp++
		c.stamp = s.stamp
	}
	p.entry.Req.ContextTokens = p.prompt + s.m.Output
	s.q.Completed(p.entry, s)
	s.q.WakeCapacity(s)
	p.turn++
	if p.turn == s.m.Turns {
		p.done, p.end = true, s.now
		s.left--
		return
	}
	p.prompt += s.m.Output + s.m.ToolResult
	s.push(s.now.Add(p.tools[p.turn-1]), apSubmit, p)
}

// View is every worker (the route), with its running turns and capacity.
func (s *apSim) View(*admission.Entry) admission.View {
	for i := range s.workers {
		w := &s.workers[i]
		s.view[i] = admission.Worker{ID: w.id, Load: int64(w.running), Full: w.running >= s.m.Busy, Capacity: s.m.Capacity}
	}
	return apView{s}
}

type apView struct{ s *apSim }

func (v apView) Workers() []admission.Worker { return v.s.view }
func (v apView) Now() time.Time              { return v.s.now }

// Dispatch starts the turn: on target if given and not full (or, with affinity, on the
// program's previous worker if not full), else on the least-loaded non-full worker.
func (s *apSim) Dispatch(e *admission.Entry, target string) (string, bool) {
	p := e.Payload.(*apProg)
	free := func(i int) bool { return i >= 0 && s.workers[i].running < s.m.Busy }
	pick := -1
	if target != "" {
		s.res.Targeted++
		if i := slices.Index(s.route, target); free(i) {
			pick = i
		} else {
			s.res.TargetFull++
		}
	}
	if pick < 0 && s.affinity && free(p.worker) {
		pick = p.worker
	}
	if pick < 0 {
		for i := range s.workers {
			if free(i) && (pick < 0 || s.workers[i].running < s.workers[pick].running) {
				pick = i
			}
		}
	}
	if pick < 0 {
		return "", false
	}
	s.start(p, pick)
	return s.workers[pick].id, true
}

// start runs p's turn on worker i: the prefix cache is read and written, and the turn's end
// is scheduled.
func (s *apSim) start(p *apProg, i int) {
	w := &s.workers[i]
	w.running++
	if p.worker == i {
		s.res.SameWorker++
	}
	p.worker = i
	hit := 0
	c := w.cache[p.id]
	if c != nil {
		hit = min(int(c.tokens), p.prompt)
		w.used -= c.tokens
	} else {
		c = &apCached{}
		w.cache[p.id] = c
	}
	recomputed := p.prompt - hit
	c.tokens, c.pinned = int64(p.prompt+s.m.Output), true
	s.stamp++
	c.stamp = s.stamp
	w.used += c.tokens
	for w.used > s.m.Capacity {
		victim, vs := -1, uint64(0)
		for id, x := range w.cache {
			if !x.pinned && (victim < 0 || x.stamp < vs) {
				victim, vs = id, x.stamp
			}
		}
		if victim < 0 {
			break // every context here belongs to a running turn
		}
		w.used -= w.cache[victim].tokens
		s.res.EvictedTokens += w.cache[victim].tokens
		delete(w.cache, victim)
	}

	prefill := time.Duration(recomputed) * s.m.PrefillPerToken
	begin := s.now
	if s.m.SerialPrefill {
		begin = later(s.now, w.prefillFree)
		w.prefillFree = begin.Add(prefill)
	}
	end := begin.Add(prefill + time.Duration(s.m.Output)*s.m.DecodePerToken)
	s.push(end, apTurnEnd, p)

	s.res.Turns++
	s.res.PromptTokens += int64(p.prompt)
	s.res.HitTokens += int64(hit)
	s.res.RecomputedTokens += int64(recomputed)
	s.res.WaitSum += s.now.Sub(p.submitted)
	s.res.LatencySum += end.Sub(p.submitted)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (s *apSim) Reject(e *admission.Entry, _ error) {
	p := e.Payload.(*apProg)
	s.res.Rejected++
	p.done, p.end = true, s.now // the program cannot go on
	s.left--
}

func (s *apSim) ArmTimer(at time.Time) {
	at = later(at, s.now)
	if !s.armed[at] {
		s.armed[at] = true
		s.push(at, apTimer, nil)
	}
}

// TestAgentProgramsSim runs a tiny instance under each policy and checks the simulator's
// bookkeeping: every turn completes, hit + recomputed = prompt tokens, the run takes time,
// and the same seed gives the same result.
func TestAgentProgramsSim(t *testing.T) {
	m := apModel{
		Workers: 2, Capacity: 6_000, Busy: 2,
		Programs: 6, Turns: 4, P0: 1_000, Output: 100, ToolResult: 300,
		PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 20 * time.Millisecond,
		ToolMean: time.Second, StartSpread: time.Second, Seed: 7,
	}
	wantPrompt := int64(0)
	for k := 0; k < m.Turns; k++ {
		wantPrompt += int64(m.P0 + k*(m.Output+m.ToolResult))
	}
	wantPrompt *= int64(m.Programs)
	for _, pol := range apPolicies {
		for _, aff := range []bool{false, true} {
			r := apRun(m, pol, aff)
			name := fmt.Sprintf("%s affinity=%v", pol, aff)
			if r.Rejected != 0 || r.Unfinished != 0 {
				t.Fatalf("%s: %d rejected, %d unfinished", name, r.Rejected, r.Unfinished)
			}
			if r.Turns != m.Programs*m.Turns {
				t.Fatalf("%s: %d turns, want %d", name, r.Turns, m.Programs*m.Turns)
			}
			if r.PromptTokens != wantPrompt || r.HitTokens+r.RecomputedTokens != r.PromptTokens {
				t.Fatalf("%s: prompt %d (want %d), hit %d + recomputed %d", name, r.PromptTokens, wantPrompt, r.HitTokens, r.RecomputedTokens)
			}
			// At least every first turn and every tool result is recomputed.
			if floor := int64(m.Programs * (m.P0 + (m.Turns-1)*m.ToolResult)); r.RecomputedTokens < floor {
				t.Fatalf("%s: recomputed %d < %d, the least possible", name, r.RecomputedTokens, floor)
			}
			if r.Makespan <= 0 || r.LatencySum <= 0 {
				t.Fatalf("%s: makespan %v, latency sum %v", name, r.Makespan, r.LatencySum)
			}
			for i := 0; i < 3; i++ {
				if again := apRun(m, pol, aff); again != r {
					t.Fatalf("%s: not deterministic: %+v then %+v", name, r, again)
				}
			}
		}
		// One worker with room for everything: every turn but the first hits the previous
		// turn's prompt and output, the most the model allows.
		one := m
		one.Workers, one.Capacity, one.Busy = 1, 1_000_000, 100
		r := apRun(one, pol, false)
		if want := wantPrompt - int64(m.Programs*(m.P0+(m.Turns-1)*m.ToolResult)); r.HitTokens != want || r.EvictedTokens != 0 {
			t.Fatalf("%s, one roomy worker: hit %d, evicted %d; want %d, 0", pol, r.HitTokens, r.EvictedTokens, want)
		}
	}
}

// BenchmarkAgentPrograms runs apBase under each policy (and with the session-affinity picker,
// "+affinity"). APBENCH_VARIANTS=1 adds the variants reported in README.md.
func BenchmarkAgentPrograms(b *testing.B) {
	type variant struct {
		name string
		m    apModel
	}
	vs := []variant{{"", apBase}}
	if os.Getenv("APBENCH_VARIANTS") != "" {
		roomy := apBase
		roomy.Capacity = 80_000 // not oversubscribed: 640k of cache for 544k of contexts
		serial := apBase
		serial.SerialPrefill = true
		longTools := apBase
		longTools.ToolMean = 10 * time.Second
		costly := longTools // where recomputation costs compute: 1 ms/token, one prefill at a time
		costly.PrefillPerToken, costly.SerialPrefill = time.Millisecond, true
		seed2 := apBase
		seed2.Seed = 2
		vs = append(vs, variant{"cap80k/", roomy}, variant{"serialprefill/", serial},
			variant{"tool10s/", longTools}, variant{"tool10s-prefill1ms-serial/", costly},
			variant{"seed2/", seed2})
	}
	for _, v := range vs {
		for _, pol := range apPolicies {
			for _, aff := range []bool{false, true} {
				if aff && pol == "session_serial" {
					continue // the same as default+affinity: a program never has two turns at once
				}
				name := v.name + pol
				if aff {
					name += "+affinity"
				}
				b.Run(name, func(b *testing.B) {
					var r apResult
					for b.Loop() {
						r = apRun(v.m, pol, aff)
					}
					if r.Rejected != 0 || r.Unfinished != 0 {
						b.Fatalf("%d rejected, %d unfinished", r.Rejected, r.Unfinished)
					}
					b.ReportMetric(100*r.hitRate(), "hit_%")
					b.ReportMetric(float64(r.RecomputedTokens), "recomputed_tok")
					b.ReportMetric(r.Makespan.Seconds(), "completion_s")
					b.ReportMetric(r.meanLatency(), "turn_latency_s")
					b.ReportMetric(r.meanWait(), "queue_wait_s")
					b.ReportMetric(r.ProgramSum.Seconds()/float64(v.m.Programs), "program_s")
					b.ReportMetric(float64(r.EvictedTokens), "evicted_tok")
					b.ReportMetric(float64(r.Pauses), "pauses")
					b.ReportMetric(float64(r.ForcedResumes), "forced_resumes")
					b.ReportMetric(100*float64(r.SameWorker)/float64(r.Turns-v.m.Programs), "same_worker_%")
					b.ReportMetric(float64(r.Targeted), "targeted")
					b.ReportMetric(float64(r.TargetFull), "target_full")
				})
			}
		}
	}
}

// BenchmarkProgramsLoadReport is the router's time for one LoadReport whose load fell while
// thunderagent tracks 2,000 programs, 500 of them paused with their next turn held in the
// admission queue (issue 34, review finding 7). It drives the production router through
// router.Sim on its fake clock: 16 workers of model "m" (110,400 KV tokens each) run 1,500
// admitted turns that are never completed (reasoning, 1,100 tokens with the buffer: ~94 per
// worker, over the resume ceiling and under the pause threshold), then 500 new programs of
// 20,000 tokens find no room and wait, paused. Each op is one request of another client
// picked (untimed) and released (timed): the worker's LoadReport says its load fell, a wake
// for the queue. Between ops the clock moves 1 ms (each report is its own instant).
//
// same_pool: the request ran on a worker of "m", whose held heads it could serve. other_pool:
// on a worker of model "n" (4 workers, no admission traffic), which can serve none of them.
func BenchmarkProgramsLoadReport(b *testing.B) {
	for _, model := range []string{"m", "n"} {
		name := map[string]string{"m": "same_pool", "n": "other_pool"}[model]
		b.Run(name, func(b *testing.B) {
			s := newLoadReportSim(b)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				s.Advance(time.Millisecond)
				pk, ok := s.Pick(&router.Pick{Model: model})
				if !ok || pk.Err != nil {
					b.Fatalf("pick: %+v", pk)
				}
				b.StartTimer()
				s.Release(pk, router.OutcomeSuccess)
			}
			b.StopTimer()
			if ds := s.Deliveries(); len(ds) != 0 {
				b.Fatalf("%d paused turns left the queue: the set-up is not steady", len(ds))
			}
		})
	}
}

// newLoadReportSim builds BenchmarkProgramsLoadReport's router (see there).
func newLoadReportSim(b *testing.B) *router.Sim {
	b.Helper()
	const workers, running, paused = 16, 1500, 500
	c := thunderagent.DefaultConfig()
	c.MaxTrackedRequests = 4000
	var s *router.Sim
	ta := thunderagent.New(c, func() time.Time { return s.Now() })
	s, err := router.NewSim(router.Config{Policy: "least_outstanding", Admission: &router.AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10_000, MaxWait: time.Hour}},
			DefaultClass: "default", Policy: ta,
		},
		PolicyName: "thunderagent",
	}})
	if err != nil {
		b.Fatal(err)
	}
	for i := range workers {
		s.SetWorker(router.WorkerInfo{ID: fmt.Sprintf("m%02d", i), Model: "m", KVTotalBlocks: 6_900, KVFreeBlocks: 6_900, BlockSize: 16})
	}
	for i := range 4 {
		s.SetWorker(router.WorkerInfo{ID: fmt.Sprintf("n%02d", i), Model: "n", KVTotalBlocks: 6_900, KVFreeBlocks: 6_900, BlockSize: 16})
	}
	pick := func(i, tokens int) (*router.Picked, bool) {
		pid := actor.NewPID("bench", fmt.Sprint("req/", i))
		return s.Pick(&router.Pick{Model: "m", RequestID: fmt.Sprint(i), Key: uint64(i), Requester: pid, Tag: 1,
			Admit: &router.AdmitInfo{SessionID: fmt.Sprint("prog-", i), PromptTokens: tokens}})
	}
	for i := 1; i <= running; i++ {
		if pk, ok := pick(i, 1000); !ok || pk.Err != nil {
			b.Fatalf("running turn %d: %+v %v", i, pk, ok)
		}
	}
	for i := running + 1; i <= running+paused; i++ {
		if _, ok := pick(i, 20_000); ok {
			b.Fatalf("turn %d went: there was room for it", i)
		}
	}
	if st := ta.Stats(); st.Reasoning != running || st.Paused != paused {
		b.Fatalf("set-up: %+v", st)
	}
	s.Deliveries()
	return s
}
