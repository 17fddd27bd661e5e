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
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/proctest"
	"github.com/tlgw/tlgw/sim/engine"
)

// requestsFromEnv is TLGW_CRASH_N (the number of requests of a real-engine run), else def.
func requestsFromEnv(t *testing.T, def int) int {
	v := os.Getenv("TLGW_CRASH_N")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("TLGW_CRASH_N = %q: want a positive request count", v)
	}
	return n
}

// within polls cond every 10 ms until it holds, failing the test after d.
func within(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", d, what)
		}
		<-tick.C
	}
}

// scrape sums the samples of the Prometheus series name at url whose labels contain every
// one of labels; ok is false when the page could not be read.
func scrape(url, name string, labels ...string) (sum float64, ok bool) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, false
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(line, l)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, false
		}
		sum += v
	}
	return sum, true
}

// adminWorker is one row of GET /admin/v1/workers.
type adminWorker struct {
	ID       string `json:"id"`
	InFlight int64  `json:"in_flight"`
	Routable bool   `json:"routable"`
}

func adminWorkers(base string) ([]adminWorker, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/admin/v1/workers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET /admin/v1/workers: %d", resp.StatusCode)
	}
	var out struct {
		Workers []adminWorker `json:"workers"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	return out.Workers, err
}

// engineProc is one tlengine process of the fleet, and how to start it again.
type engineProc struct {
	id   string
	args []string
	p    *proctest.Proc
}

// fleetProcs is the real-engine fleet, the groups the chaos picks its victims from, the
// victims not yet healed and the healed ones the gateway has not routed to again yet. A group
// is struck only when every member is in the gateway's view and routable, so every model and
// role keeps an engine the gateway knows.
type fleetProcs struct {
	t        *testing.T
	bin      string
	gateway  string
	procs    map[string]*engineProc
	groups   [][]string
	victims  map[string]victim    // by engine id
	healed   map[string]time.Time // by engine id: when it was SIGCONTed or restarted
	kills    int
	stops    int
	during   int             // strikes that found the victim with requests in flight
	back     time.Duration   // the longest a healed engine took to be routable again
	gone     map[string]bool // untouched engines out of the gateway's view now
	spurious int             // how often an untouched engine dropped out of the view
}

// untouchedGone counts the engines the chaos left alone that drop out of the gateway's view
// (evicted for late heartbeats on a starved machine), once per disappearance.
func (f *fleetProcs) untouchedGone(view map[string]workerView) {
	if len(view) == 0 {
		return // the view could not be read
	}
	for id := range f.procs {
		_, struck := f.victims[id]
		_, healing := f.healed[id]
		_, listed := view[id]
		switch {
		case struck || healing || listed:
			delete(f.gone, id)
		case !f.gone[id]:
			f.gone[id] = true
			f.spurious++
		}
	}
}

// workerView is one worker as the gateway sees it.
type workerView struct {
	inFlight int64
	routable bool
}

// see records the gateway's view: healed engines that are routable again are back.
func (f *fleetProcs) see(now time.Time, view map[string]workerView) {
	for id, at := range f.healed {
		if view[id].routable {
			f.back = max(f.back, now.Sub(at))
			delete(f.healed, id)
		}
	}
}

type victim struct {
	stopped bool // SIGSTOPped (else SIGKILLed)
	until   time.Time
}

// start runs the engine's process. A SIGSTOPped process gets SIGCONT before the process's own
// cleanup stops it (cleanups run last-registered first).
func (f *fleetProcs) start(e *engineProc) {
	args := append([]string{"--id", e.id, "--gateway", f.gateway}, e.args...)
	p := proctest.StartEngine(f.t, f.bin, args...)
	f.t.Cleanup(func() { _ = p.Cmd.Process.Signal(syscall.SIGCONT) })
	e.p = p
}

// strike SIGKILLs or SIGSTOPs one engine of a group whose members are all healthy and
// routable, preferring one the gateway has requests in flight on (the first of each kind
// waits for one). It reports whether it struck.
func (f *fleetProcs) strike(rng *rand.Rand, view map[string]workerView, stop bool) bool {
	var free [][]string
	for _, g := range f.groups {
		if !slices.ContainsFunc(g, func(id string) bool {
			_, struck := f.victims[id]
			_, healing := f.healed[id]
			return struck || healing || !view[id].routable
		}) {
			free = append(free, g)
		}
	}
	if len(free) == 0 {
		return false
	}
	var busy []string
	for _, g := range free {
		for _, id := range g {
			if view[id].inFlight > 0 {
				busy = append(busy, id)
			}
		}
	}
	// The first SIGKILL and the first SIGSTOP wait for a victim with requests in flight.
	if len(busy) == 0 && (f.kills == 0 || stop && f.stops == 0) {
		return false
	}
	g := free[rng.IntN(len(free))]
	id := g[rng.IntN(len(g))]
	if len(busy) > 0 {
		id = busy[rng.IntN(len(busy))]
		f.during++
	}
	e := f.procs[id]
	now := time.Now()
	if stop {
		e.p.Stop(f.t) // returns once every thread is stopped
		// Longer than the stream timeouts and the heartbeat eviction (k·T).
		f.victims[id] = victim{stopped: true, until: now.Add(2200*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))}
		f.stops++
		return true
	}
	if err := e.p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		f.t.Fatalf("SIGKILL %s: %v", id, err)
	}
	select {
	case <-e.p.Exited():
	case <-time.After(10 * time.Second):
		f.t.Fatalf("%s did not exit on SIGKILL", id)
	}
	f.victims[id] = victim{until: now.Add(300*time.Millisecond + time.Duration(rng.Int64N(int64(500*time.Millisecond))))}
	f.kills++
	return true
}

// heal SIGCONTs or restarts the victims due by now (every victim when now is zero).
func (f *fleetProcs) heal(now time.Time) {
	for id, v := range f.victims {
		if !now.IsZero() && now.Before(v.until) {
			continue
		}
		e := f.procs[id]
		if v.stopped {
			e.p.Cont(f.t)
		} else {
			f.start(e)
		}
		delete(f.victims, id)
		f.healed[id] = time.Now()
	}
}

// answerCode is the error code of a JSON error answer ("" when there is none).
func answerCode(body string) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil {
		return ""
	}
	return e.Error.Code
}

// TestCrashRealEngines is the harness over tlengine processes: the gateway runs in-process
// (its actors panic as in TestCrashInjection, and TestMain sees any goroutine it leaks) while
// every engine is a process that the harness SIGKILLs and restarts, or SIGSTOPs and later
// SIGCONTs, mid-stream. Short gateway timeouts bound what a stopped engine costs. Invariants:
// every client gets exactly one terminal outcome (a complete answer, an error status with an
// error body, or a stream ended by one error event) within the timeouts' bound; finished
// answers are the reference answers and interrupted streams prefixes of them; GET
// /admin/v1/workers shows every in-flight count back at 0 and the whole fleet routable again;
// no engine holds a KV handle, a running request or a KV block; the gateway still answers
// every model. TLGW_CRASH_N scales the run (default 500 requests).
func TestCrashRealEngines(t *testing.T) {
	s := seed(t)
	requests := requestsFromEnv(t, 500)
	const clients = 32
	t.Logf("real-engine crash harness: seed %d, %d requests, %d clients", s, requests, clients)
	bin, err := proctest.Build(t.TempDir(), "github.com/tlgw/tlgw/cmd/tlengine")
	if err != nil {
		t.Fatal(err)
	}
	calls := plan(s, requests)
	rng := rand.New(rand.NewPCG(s, 3))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Actor panics, sparser than TestCrashInjection's: the engines' failures are the subject.
	cs := newCrashers(61+rng.Int64N(7), 211+rng.Int64N(20))
	reqCrash, workerCrash, routerCrash, opts := cs.req, cs.worker, cs.router, cs.options

	cfg := config.Default()
	g := &cfg.Gateway
	g.HTTPListen, g.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	// Eviction after k·T = 2 s: a SIGSTOPped engine is evicted, while a live one whose
	// heartbeats are late on a starved machine (2 cores, the race detector) stays.
	g.HeartbeatInterval, g.HeartbeatMissLimit = 200*time.Millisecond, 10
	g.StreamFirstByteTimeout = time.Second
	g.StreamIdleTimeout = time.Second
	g.RequestTimeout = 3 * time.Second
	g.ControlTimeout = time.Second
	g.Outlier.BaseEjection, g.Outlier.MaxEjection = 500*time.Millisecond, 2*time.Second
	g.Routes = config.NormalizeRoutes([]config.Route{
		{Model: "auto", Cascade: []config.CascadeStep{{Model: "smol", AcceptIf: "mean_logprob > -1.0"}, {Model: "big"}}},
		{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	})
	// The longest a request may take: max_attempts attempts of tokenize, Prefill and the first
	// byte (control and first-byte timeouts), or request_timeout, then the idle timeout, with
	// slack for a loaded machine.
	hangBound := time.Duration(g.MaxAttempts)*(2*g.ControlTimeout+g.StreamFirstByteTimeout) +
		g.RequestTimeout + g.StreamIdleTimeout + 5*time.Second
	gw, err := app.Start(cfg, app.Options{Logger: quiet, ActorOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	// Shut down at the end, or on the way out of a failed run.
	shutdown := sync.OnceValue(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return gw.Shutdown(ctx)
	})
	t.Cleanup(func() { _ = shutdown() })
	base := "http://" + gw.HTTPAddr

	timing := []string{"--prefill-per-token", "50us", "--decode-per-token", "2ms", "--kv-lease", "3s", "--log-level", "error"}
	unified := func(model string, extra ...string) []string {
		return append(append([]string{"--model", model, "--role", "unified"}, timing...), extra...)
	}
	role := func(r string) []string { return append([]string{"--model", "smol", "--role", r}, timing...) }
	f := &fleetProcs{t: t, bin: bin, gateway: gw.GRPCAddr, procs: map[string]*engineProc{}, victims: map[string]victim{},
		healed: map[string]time.Time{}, gone: map[string]bool{},
		groups: [][]string{{"smol-1", "smol-2", "smol-3"}, {"big-1", "big-2"}, {"prefill-1", "prefill-2"}, {"decode-1", "decode-2"}}}
	for id, args := range map[string][]string{
		"smol-1": unified("smol"), "smol-2": unified("smol"), "smol-3": unified("smol"),
		"smol-cut": unified("smol", "--fault", "cut-after=3"),
		"big-1":    unified("big"), "big-2": unified("big"),
		"prefill-1": role("prefill"), "prefill-2": role("prefill"),
		"decode-1": role("decode"), "decode-2": role("decode"),
	} {
		f.procs[id] = &engineProc{id: id, args: args}
	}
	var ids []string
	for id := range f.procs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		f.start(f.procs[id])
	}
	// The reference: in-process engines outside the fleet give each call's full answer.
	ref := map[string]*engine.Engine{"smol": startRef(t, "smol", quiet), "big": startRef(t, "big", quiet)}
	closeRefs := sync.OnceFunc(func() {
		for _, e := range ref {
			e.Close()
		}
	})
	t.Cleanup(closeRefs)
	fleetBack := func() bool {
		ws, err := adminWorkers(base)
		if err != nil || len(ws) != len(ids) {
			return false
		}
		for _, w := range ws {
			if !w.Routable {
				return false
			}
		}
		return true
	}
	within(t, "the fleet registered", 20*time.Second, fleetBack)

	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	hc := &http.Client{Transport: tr, Timeout: 2 * hangBound}
	type outcome struct {
		status int
		code   string // the error code of an error answer
		text   string
		done   bool // a stream ended with [DONE]
		errEvs int  // error events in a stream
		took   time.Duration
		end    time.Time
		err    error
	}
	outcomes := make([]outcome, requests)
	var next, started atomic.Int64
	var wg sync.WaitGroup
	// Each client stops at this deadline; requests left unsent are reported.
	loadDeadline := time.Now().Add(time.Duration(requests)*20*time.Millisecond + time.Minute)
	begin := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= requests || time.Now().After(loadDeadline) {
					return
				}
				started.Add(1)
				t0 := time.Now()
				resp, err := hc.Post(base+pathOf(calls[i]), "application/json", strings.NewReader(calls[i].body()))
				if err != nil {
					outcomes[i] = outcome{err: err, took: time.Since(t0)}
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				o := outcome{status: resp.StatusCode, err: err, took: time.Since(t0), end: time.Now()}
				o.text, o.done, _ = parseAnswer(string(b), calls[i].stream)
				o.errEvs = strings.Count(string(b), "event: error\n")
				if resp.StatusCode != 200 {
					o.code = answerCode(string(b))
				}
				outcomes[i] = o
			}
		}()
	}
	loadDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(loadDone)
	}()

	// The chaos runs on the test goroutine (restarts may fail the test): a SIGKILL once an
	// eighth of the load has started, a SIGSTOP at a quarter, then one or the other every
	// 250 ms; victims come back when due. Worker and router actors panic every 50 ms.
	tick := time.NewTicker(10 * time.Millisecond)
	var nextStrike, nextPanic time.Time
	strikes := 0
chaos:
	for {
		select {
		case <-loadDone:
			break chaos
		case <-tick.C:
		}
		now := time.Now()
		if now.After(loadDeadline.Add(2 * hangBound)) {
			t.Fatal("the load did not end")
		}
		f.heal(now)
		view := map[string]workerView{}
		if l, err := gw.Gateway.Workers(); err == nil {
			for _, w := range l.Workers {
				view[w.Info.ID] = workerView{inFlight: w.InFlight, routable: w.Routable}
			}
		}
		f.see(time.Now(), view)
		f.untouchedGone(view)
		if now.After(nextPanic) {
			nextPanic = now.Add(50 * time.Millisecond)
			target := workerCrash
			if rng.IntN(4) == 0 {
				target = routerCrash
			}
			if pid := target.pick(rng); pid != nil {
				gw.Gateway.System.Root.Send(pid, crash{})
			}
		}
		n := started.Load()
		due := (f.kills == 0 && n >= int64(requests/8)) || (f.kills > 0 && f.stops == 0 && n >= int64(requests/4)) ||
			(f.kills > 0 && f.stops > 0 && now.After(nextStrike))
		if !due {
			continue
		}
		stop := f.kills > 0 && (f.stops == 0 || strikes%2 == 1)
		if f.strike(rng, view, stop) {
			strikes++
			nextStrike = now.Add(250 * time.Millisecond)
		}
	}
	tick.Stop()
	loadTook := time.Since(begin)
	f.heal(time.Time{})
	tr.CloseIdleConnections()

	// Invariant 1: every client got exactly one terminal outcome, within the timeouts' bound.
	kinds := map[string]int{}
	var slowest time.Duration
	for i, o := range outcomes {
		c := calls[i]
		slowest = max(slowest, o.took)
		switch {
		case o.err != nil:
			t.Errorf("request %d (%s): no terminal outcome: %v", i, c.model, o.err)
			continue
		case o.status == 0:
			t.Errorf("request %d was never sent (the load ran out of time)", i)
			continue
		case o.took > hangBound:
			t.Errorf("request %d (%s, stream %v) took %v, past the timeouts' bound %v", i, c.model, c.stream, o.took, hangBound)
		}
		switch {
		case o.status == 200 && c.stream && o.done && o.errEvs == 0:
			kinds["200 stream complete"]++
		case o.status == 200 && c.stream && !o.done && o.errEvs == 1:
			kinds["200 stream + error event"]++
		case o.status == 200 && c.stream:
			t.Errorf("request %d: a stream must end with exactly one of [DONE] or one error event ([DONE] %v, %d error events)", i, o.done, o.errEvs)
		case o.status == 200:
			kinds["200 JSON"]++
		case o.status == 502 || o.status == 503 || o.status == 504:
			if o.code == "" {
				t.Errorf("request %d: %d without an error body", i, o.status)
			}
			kinds[fmt.Sprintf("%d %s", o.status, o.code)]++
		default:
			t.Errorf("request %d (%s): status %d %s (took %v, ended %v)", i, c.model, o.status, o.code, o.took, o.end.Sub(begin).Round(time.Millisecond))
		}
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
		if o.status != 200 || o.err != nil {
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
			if (o.done || !c.stream) && o.text == w || o.errEvs == 1 && strings.HasPrefix(w, o.text) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("request %d (%s, stream %v): got %q, want one of %q", i, c.model, c.stream, o.text, want)
		}
	}
	// Invariant 3: the whole fleet is back and routable, and every in-flight count is 0.
	within(t, "every engine registered and routable again", 20*time.Second, fleetBack)
	within(t, "in-flight counts back to 0 in GET /admin/v1/workers", 10*time.Second, func() bool {
		ws, err := adminWorkers(base)
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.InFlight != 0 {
				return false
			}
		}
		return true
	})
	// Invariant 4: no engine holds a KV handle, a running request or a KV block (pushed KV
	// nobody used expires after --kv-lease).
	within(t, "no KV handle, running request or KV block held on any engine", 15*time.Second, func() bool {
		for _, id := range ids {
			u := "http://" + f.procs[id].p.HTTPAddr + "/metrics"
			held, ok1 := scrape(u, "tlengine_kv_handles_held")
			running, ok2 := scrape(u, "tlengine_running")
			free, ok3 := scrape(u, "tlengine_kv_blocks_free")
			total, ok4 := scrape(u, "tlengine_kv_blocks_total")
			if !ok1 || !ok2 || !ok3 || !ok4 || held != 0 || running != 0 || free != total {
				return false
			}
		}
		return true
	})
	// Invariant 5: the gateway is up (no listener failed) and answers every model.
	select {
	case err := <-gw.Err():
		t.Fatalf("a gateway listener failed: %v", err)
	default:
	}
	for _, model := range []string{"smol", "big", "auto", "smol-pd"} {
		c := call{model: model, prompt: "after the crash harness", seed: 1, maxTokens: 4}
		within(t, "a fresh "+model+" request answered 200", 10*time.Second, func() bool {
			resp, err := hc.Post(base+pathOf(c), "application/json", strings.NewReader(c.body()))
			if err != nil {
				return false
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}

	interrupted, _ := scrape(base+"/metrics", "tlgw_streams_interrupted_total")
	failovers, _ := scrape(base+"/metrics", "tlgw_failovers_total")
	budget, _ := scrape(base+"/metrics", "tlgw_retry_budget_exhausted_total")
	timeouts := map[string]float64{}
	for _, which := range []string{"stream_first_byte", "stream_idle", "request"} {
		timeouts[which], _ = scrape(base+"/metrics", "tlgw_upstream_timeouts_total", `timeout="`+which+`"`)
	}
	ok := 0
	for k, v := range kinds {
		if strings.HasPrefix(k, "200") {
			ok += v
		}
	}
	t.Logf("%d requests in %v (slowest %v, bound %v): outcomes %v", requests, loadTook.Round(time.Millisecond),
		slowest.Round(time.Millisecond), hangBound, kinds)
	t.Logf("engines: %d SIGKILLed and restarted, %d SIGSTOPped and SIGCONTed (%d with requests in flight), "+
		"routable again within %v, %d evictions of untouched engines; "+
		"gateway: %v failovers, %v streams interrupted, %v retry budget spent, timeouts %v; injected panics: %d request, %d worker, %d router",
		f.kills, f.stops, f.during, f.back.Round(time.Millisecond), f.spurious, failovers, interrupted, budget, timeouts,
		reqCrash.fired.Load(), workerCrash.fired.Load(), routerCrash.fired.Load())
	if f.kills == 0 || f.stops == 0 {
		t.Errorf("the chaos must SIGKILL and SIGSTOP at least one engine each (%d, %d)", f.kills, f.stops)
	}
	if f.during == 0 {
		t.Errorf("no engine was struck with requests in flight")
	}
	if timeouts["stream_first_byte"]+timeouts["stream_idle"]+timeouts["request"] == 0 {
		t.Errorf("no gateway timeout fired: the SIGSTOPped engines were never waited on")
	}
	if ok < requests/2 {
		t.Errorf("only %d of %d requests succeeded", ok, requests)
	}

	// Invariant 6 (TestMain): no goroutine leaked once the gateway is shut down.
	closeRefs()
	hc.CloseIdleConnections()
	if err := shutdown(); err != nil {
		t.Errorf("gateway shutdown: %v", err)
	}
}
