// Package crash is the crash-injection harness: many concurrent requests through a real
// gateway and real simulated engines while actors panic and engines break, then the
// invariants every failure path must keep.
package crash

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/engine"
	"github.com/tlgw/tlgw/sim/faults"
)

// seed picks the workload and the crash schedule; TLGW_CRASH_SEED reproduces a run.
func seed(t *testing.T) uint64 {
	if v := os.Getenv("TLGW_CRASH_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TLGW_CRASH_SEED: %v", err)
		}
		return s
	}
	return 20261130
}

// call is one planned request.
type call struct {
	model     string // smol, big, auto (cascade) or smol-pd (disaggregated)
	prompt    string
	seed      int
	maxTokens int
	stream    bool
}

func (c call) body() string {
	return fmt.Sprintf(`{"model":%q,"prompt":%q,"seed":%d,"max_tokens":%d,"stream":%v}`, c.model, c.prompt, c.seed, c.maxTokens, c.stream)
}

// plan draws n calls from the seed.
func plan(s uint64, n int) []call {
	rng := rand.New(rand.NewPCG(s, 1))
	models := []string{"smol", "smol", "big", "auto", "smol-pd"}
	out := make([]call, n)
	for i := range out {
		out[i] = call{
			model:     models[rng.IntN(len(models))],
			prompt:    fmt.Sprintf("crash harness prompt %d about topic %d", i, rng.IntN(20)),
			seed:      rng.IntN(1 << 30),
			maxTokens: 4 + rng.IntN(20),
			stream:    rng.IntN(2) == 0,
		}
	}
	return out
}

// crasher panics request actors on every period-th message of the named types (the message
// is lost, as in a real panic), and long-lived actors on a crash message the harness sends
// them, recording their PIDs as they start.
type crasher struct {
	period int64
	types  map[string]bool
	n      atomic.Int64
	fired  atomic.Int64
	mu     sync.Mutex
	pids   []*actor.PID
}

// crash is the message that makes a long-lived actor panic.
type crash struct{}

func (cr *crasher) middleware(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		switch env.Message.(type) {
		case *actor.Started:
			cr.mu.Lock()
			cr.pids = append(cr.pids, c.Self())
			cr.mu.Unlock()
		case crash:
			cr.fired.Add(1)
			panic("crash harness: injected panic")
		}
		if cr.period > 0 && cr.types[reflect.TypeOf(env.Message).String()] && cr.n.Add(1)%cr.period == 0 {
			cr.fired.Add(1)
			panic("crash harness: injected panic")
		}
		next(c, env)
	}
}

func (cr *crasher) pick(rng *rand.Rand) *actor.PID {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if len(cr.pids) == 0 {
		return nil
	}
	return cr.pids[rng.IntN(len(cr.pids))]
}

// crashers are one run's panic schedules: request actors on their own results every
// reqPeriod-th message, workers when the test aims them, the router on every
// routerPeriod-th pick.
type crashers struct{ req, worker, router *crasher }

func newCrashers(reqPeriod, routerPeriod int64) *crashers {
	return &crashers{
		req: &crasher{period: reqPeriod, types: map[string]bool{
			"*router.Picked": true, "request.attemptResult": true, "request.relayResult": true, "request.prefilled": true}},
		worker: &crasher{},
		router: &crasher{period: routerPeriod, types: map[string]bool{"*router.Pick": true}},
	}
}

// options puts the schedule of an actor kind in its props.
func (cs *crashers) options(kind string) []actor.PropsOption {
	var c *crasher
	switch kind {
	case "request":
		c = cs.req
	case "worker":
		c = cs.worker
	case "router":
		c = cs.router
	default:
		return nil
	}
	return []actor.PropsOption{actor.WithReceiverMiddleware(c.middleware)}
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// protoactor's dead-letter throttle goroutine lives one throttle interval after a
		// dead letter, and this harness makes plenty on purpose.
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}

func TestCrashInjection(t *testing.T) {
	s := seed(t)
	t.Logf("crash harness seed %d (TLGW_CRASH_SEED reproduces it)", s)
	const requests, clients = 600, 24
	calls := plan(s, requests)
	if again := plan(s, requests); !reflect.DeepEqual(again, calls) {
		t.Fatal("the same seed planned two different runs")
	}
	rng := rand.New(rand.NewPCG(s, 2))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Crash schedules: request actors panic while routing, attempting and relaying; the
	// router and workers panic on their own traffic.
	// The router also loses a pick now and then (its requester asks again after a timeout).
	cs := newCrashers(9+rng.Int64N(5), 151+rng.Int64N(20))
	reqCrash, workerCrash, routerCrash, opts := cs.req, cs.worker, cs.router, cs.options

	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.HeartbeatInterval = 200 * time.Millisecond
	cfg.Gateway.Routes = config.NormalizeRoutes([]config.Route{
		{Model: "auto", Cascade: []config.CascadeStep{{Model: "smol", AcceptIf: "mean_logprob > -1.0"}, {Model: "big"}}},
		{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	})
	gw, err := app.Start(cfg, app.Options{Logger: quiet, ActorOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	gws := []string{gw.GRPCAddr}
	eng := func(id, model string, role engine.Role, f faults.Fault) *engine.Engine {
		e, err := engine.Start(engine.Config{ID: id, Model: model, Role: role, Fault: f, Gateways: gws,
			Logger: quiet, PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 200 * time.Microsecond,
			KVLease: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	fleet := map[string]*engine.Engine{
		"smol-1":    eng("smol-1", "smol", engine.RoleUnified, faults.Fault{}),
		"smol-2":    eng("smol-2", "smol", engine.RoleUnified, faults.Fault{}),
		"smol-cut":  eng("smol-cut", "smol", engine.RoleUnified, faults.Fault{Kind: faults.CutAfter, N: 3}),
		"smol-503":  eng("smol-503", "smol", engine.RoleUnified, faults.Fault{Kind: faults.Unavailable}),
		"big-1":     eng("big-1", "big", engine.RoleUnified, faults.Fault{}),
		"big-2":     eng("big-2", "big", engine.RoleUnified, faults.Fault{}),
		"prefill-1": eng("prefill-1", "smol", engine.RolePrefill, faults.Fault{}),
		"prefill-2": eng("prefill-2", "smol", engine.RolePrefill, faults.Fault{}),
		"decode-1":  eng("decode-1", "smol", engine.RoleDecode, faults.Fault{}),
		"decode-2":  eng("decode-2", "smol", engine.RoleDecode, faults.Fault{}),
	}
	// The reference: engines outside the fleet (no heartbeats) give each call's full answer.
	ref := map[string]*engine.Engine{"smol": startRef(t, "smol", quiet), "big": startRef(t, "big", quiet)}
	gwtest.Eventually(t, "fleet registered", func() bool {
		l, err := gw.Gateway.Workers()
		return err == nil && len(l.Workers) == len(fleet)
	})

	base := "http://" + gw.HTTPAddr
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	type outcome struct {
		status int
		text   string
		done   bool // a stream ended with [DONE]
		errEv  bool // a stream ended with an error event
		err    error
	}
	outcomes := make([]outcome, requests)
	var next atomic.Int64
	var started atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(50 * time.Second)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= requests || time.Now().After(deadline) {
					return
				}
				started.Add(1)
				resp, err := hc.Post(base+pathOf(calls[i]), "application/json", strings.NewReader(calls[i].body()))
				if err != nil {
					outcomes[i] = outcome{err: err}
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				o := outcome{status: resp.StatusCode, err: err}
				o.text, o.done, o.errEv = parseAnswer(string(b), calls[i].stream)
				outcomes[i] = o
			}
		}()
	}
	// Long-lived actors panic while the load runs: a worker or the router every few ms.
	stopCrashes := make(chan struct{})
	crashesDone := make(chan struct{})
	go func() {
		defer close(crashesDone)
		tick := time.NewTicker(7 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopCrashes:
				return
			case <-tick.C:
			}
			target := workerCrash
			if i%5 == 4 {
				target = routerCrash
			}
			if pid := target.pick(rng); pid != nil {
				gw.Gateway.System.Root.Send(pid, crash{})
			}
		}
	}()
	// Engines break mid-run: a unified smol engine is killed (streams cut before and after
	// headers), then a prefill engine during prefills, then a decode engine during KV pushes.
	for k, victim := range []string{"smol-2", "prefill-2", "decode-2"} {
		at := int64((k + 1) * requests / 4)
		gwtest.Eventually(t, "load reaches the kill point", func() bool { return started.Load() >= at })
		fleet[victim].Close()
		delete(fleet, victim)
	}
	wg.Wait()
	close(stopCrashes)
	<-crashesDone
	tr.CloseIdleConnections()

	// Invariant 1: every client got exactly one terminal outcome, in time.
	counts := map[string]int{}
	for i, o := range outcomes {
		switch {
		case o.err != nil:
			t.Errorf("request %d (%s): no terminal outcome: %v", i, calls[i].model, o.err)
		case o.status == 0:
			t.Errorf("request %d was never sent (the harness ran out of time)", i)
		case calls[i].stream && o.status == 200 && o.done == o.errEv:
			t.Errorf("request %d: a stream must end with exactly one of [DONE] or an error event (done %v, error %v)", i, o.done, o.errEv)
		}
		counts[strconv.Itoa(o.status)]++
	}
	// Invariant 2: no tokens repeated or spliced: a finished answer is the reference answer;
	// an interrupted stream is a prefix of it.
	refText := func(c call, model string) string {
		r := c
		r.model, r.stream = model, false
		resp, err := http.Post("http://"+ref[model].HTTPAddr+pathOf(r), "application/json", strings.NewReader(r.body()))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		txt, _, _ := parseAnswer(string(b), false)
		return txt
	}
	for i, o := range outcomes {
		if o.status != 200 {
			continue
		}
		c := calls[i]
		var want []string
		switch c.model {
		case "big":
			want = []string{refText(c, "big")}
		case "auto":
			want = []string{refText(c, "smol"), refText(c, "big")}
		default:
			want = []string{refText(c, "smol")}
		}
		ok := false
		for _, w := range want {
			if (o.done || !c.stream) && o.text == w || o.errEv && strings.HasPrefix(w, o.text) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("request %d (%s, stream %v): got %q, want one of %q", i, c.model, c.stream, o.text, want)
		}
	}
	// Invariant 3: every in-flight count is back to 0.
	gwtest.Idle(t, gw.Gateway)
	// Invariant 4: no KV handle held and no KV block in use on any live engine.
	gwtest.Eventually(t, "no KV handle held", func() bool {
		for _, e := range fleet {
			if st := e.Status(); st.KVHandlesHeld != 0 || st.Running != 0 || st.KVFreeBlocks != st.KVTotalBlocks {
				return false
			}
		}
		return true
	})
	t.Logf("outcomes by status %v; injected panics: %d request, %d worker, %d router",
		counts, reqCrash.fired.Load(), workerCrash.fired.Load(), routerCrash.fired.Load())
	if reqCrash.fired.Load() == 0 || workerCrash.fired.Load() == 0 || routerCrash.fired.Load() == 0 {
		t.Errorf("every crash schedule must fire at least once")
	}
	if counts["200"] < requests/2 {
		t.Errorf("only %d of %d requests succeeded", counts["200"], requests)
	}

	// Invariant 5 (TestMain): no goroutine leaked once everything is shut down.
	for _, e := range fleet {
		e.Close()
	}
	for _, e := range ref {
		e.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = gw.Shutdown(ctx)
}

func startRef(t *testing.T, model string, log *slog.Logger) *engine.Engine {
	e, err := engine.Start(engine.Config{ID: "ref-" + model, Model: model, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func pathOf(call) string { return "/v1/completions" }

// parseAnswer extracts the text of a completions answer (JSON or SSE) and how a stream ended.
func parseAnswer(body string, stream bool) (text string, done, errEvent bool) {
	if !stream || !strings.HasPrefix(body, "data: ") && !strings.HasPrefix(body, "event: ") {
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(body), &c) == nil && len(c.Choices) > 0 {
			return c.Choices[0].Text, false, false
		}
		return "", false, false
	}
	var b strings.Builder
	for _, line := range strings.Split(body, "\n") {
		switch {
		case line == "data: [DONE]":
			done = true
		case line == "event: error":
			errEvent = true
		case strings.HasPrefix(line, "data: {\"choices\""):
			var c struct {
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &c) == nil && len(c.Choices) > 0 {
				b.WriteString(c.Choices[0].Text)
			}
		}
	}
	return b.String(), done, errEvent
}
