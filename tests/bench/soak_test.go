package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/sim/engine"
)

// The CI-sized soak (SPEC R19): the whole gateway (app.Start: its actors, its registry over
// gRPC, its transports to the engines; requests enter through its HTTP handler, without a client
// socket, which the race detector would make dear) and its engines (sim/engine, over loopback
// sockets) in this process, the soak's mix of requests from soakClients clients, a worker
// joining or leaving and an engine closed and started again on new ports every soakChurnEvery
// requests. The process's live heap objects (the floor of readings after two collections, with
// the gateway's idle upstream connections closed and the fleet back to its base) are measured
// after soakWarmup requests, after soakRequests/2 more and after soakRequests/2 more again; the
// growth per request, the smaller of the two halves' slopes (a leak grows in both, a one-time
// step in one), must stay at or under soakMaxGrowth. A table that keeps one entry per request
// served grows by at least 1 per request (the worker holds leak of issue 34: about 1.5 here).
const (
	soakClients    = 16
	soakWarmup     = 10_000
	soakRequests   = 50_000
	soakChurnEvery = 5_000
	soakMaxGrowth  = 0.01
	// soakDistinct prompts: a bounded set, so the prefix index and the engines' caches are full
	// (at their bounds) before the warm-up ends and later requests only replace entries.
	soakDistinct = 997
)

// soakShortFiller makes the in-process test's prompts about 100 bytes (two prefix chunks).
const soakShortFiller = "tell me about routing requests across engines. what breaks first?"

// soakFleet is the in-process fleet: the base engines by id, and one joiner at a time.
type soakFleet struct {
	t       *testing.T
	gws     []string
	base    map[string]*engine.Engine
	roles   map[string]engine.Role
	models  map[string]string
	joiner  *engine.Engine
	joins   int
	restart int
}

func (f *soakFleet) start(id, model string, role engine.Role) *engine.Engine {
	f.t.Helper()
	e, err := engine.Start(engine.Config{ID: id, Model: model, Role: role, Gateways: f.gws,
		HeartbeatInterval: 200 * time.Millisecond, KVLease: 5 * time.Second,
		RegistryAuth: engine.RegistryAuth{Token: soakEngineToken}})
	if err != nil {
		f.t.Fatal(err)
	}
	return e
}

// churn is one step of the fleet's changes: a joiner leaves if there is one, else a new one
// (a new id, as a new pod) joins; and one base engine, in turn, is closed (its requests cut)
// and started again under its id on new ports (a crashed engine restarted).
func (f *soakFleet) churn() {
	if f.joiner != nil {
		f.joiner.Close()
		f.joiner = nil
	} else {
		f.joins++
		f.joiner = f.start(fmt.Sprint("join-", f.joins), "smol", engine.RoleUnified)
	}
	ids := make([]string, 0, len(f.base))
	for id := range f.base {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	id := ids[f.restart%len(ids)]
	f.restart++
	f.base[id].Close()
	f.base[id] = f.start(id, f.models[id], f.roles[id])
}

// restartAll closes every base engine and starts it again under its id on new ports, so that
// each measurement sees the engines (in this process, their heap counted with the gateway's)
// fresh, whatever their caches held: otherwise how full the caches of the engines restarted
// last are depends on how many requests came since, and moves a reading by about 1,000 objects.
func (f *soakFleet) restartAll() {
	for id, e := range f.base {
		e.Close()
		f.base[id] = f.start(id, f.models[id], f.roles[id])
	}
}

// settle brings the fleet back to its base (the joiner gone) and waits until the gateway lists
// exactly the base engines, each at its current address, with nothing in flight.
func (f *soakFleet) settle(a *app.App) {
	f.t.Helper()
	if f.joiner != nil {
		f.joiner.Close()
		f.joiner = nil
	}
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		l, err := a.Gateway.Workers()
		ok := err == nil && len(l.Workers) == len(f.base)
		for _, w := range l.Workers {
			e := f.base[w.Info.ID]
			ok = ok && e != nil && w.Info.HTTPAddress == e.HTTPAddr && w.InFlight == 0
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the fleet did not settle back to its %d base engines: %+v", len(f.base), l)
		}
		<-tick.C
	}
}

func (f *soakFleet) close() {
	if f.joiner != nil {
		f.joiner.Close()
	}
	for _, e := range f.base {
		e.Close()
	}
}

// soakWriter is the client's side of an answer: its status and the end of its body (enough to
// see a stream's data: [DONE]). It has the methods http.ResponseController looks for.
type soakWriter struct {
	h    http.Header
	code int
	tail []byte // the body's last bytes, at most 32
	head []byte // the body's first bytes, at most 256 (an error's message)
}

func (w *soakWriter) Header() http.Header { return w.h }

func (w *soakWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *soakWriter) Write(b []byte) (int, error) {
	w.WriteHeader(200)
	if len(w.head) < 256 {
		w.head = append(w.head, b[:min(len(b), 256-len(w.head))]...)
	}
	w.tail = append(w.tail, b[max(0, len(b)-32):]...)
	w.tail = w.tail[max(0, len(w.tail)-32):]
	return len(b), nil
}

func (w *soakWriter) Flush()                           {}
func (w *soakWriter) SetWriteDeadline(time.Time) error { return nil }
func (w *soakWriter) SetReadDeadline(time.Time) error  { return nil }

// errorMessage is an error answer's message without its numbers (so that the outcomes name a
// few kinds of failure).
func errorMessage(body []byte) string {
	m := errorMessageRE.FindSubmatch(body)
	if m == nil {
		return ""
	}
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return 'N'
		}
		return r
	}, string(m[1]))
}

var errorMessageRE = regexp.MustCompile(`"message":"([^"]{0,120})`)

// liveHeapObjects is the floor of the process's heap objects over soakSamples readings, each
// after two full collections (the second frees what the first's finalizers and sync.Pool victim
// caches let go), taken soakSampleEvery apart. At rest the heartbeats in flight (their gRPC
// frames, buffers and goroutines) still move a single reading by up to ±1,000 objects; the
// floor over two seconds of readings moves by a few tens.
func liveHeapObjects() uint64 {
	const soakSamples, soakSampleEvery = 20, 100 * time.Millisecond
	tick := time.NewTicker(soakSampleEvery)
	defer tick.Stop()
	floor := uint64(math.MaxUint64)
	for i := 0; i < soakSamples; i++ {
		<-tick.C
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		floor = min(floor, m.HeapObjects)
	}
	return floor
}

// writeHeapProfile writes the heap profile to dir/name when TLGW_SOAK_HEAP_PROFILES names a
// directory: `go tool pprof -sample_index=inuse_objects -base warm.prof end.prof` then shows
// what grew, by allocation site.
func writeHeapProfile(t *testing.T, name string) {
	dir := os.Getenv("TLGW_SOAK_HEAP_PROFILES")
	if dir == "" {
		return
	}
	fh, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := pprof.WriteHeapProfile(fh); err != nil {
		t.Fatal(err)
	}
}

// TestSoakHeapObjects is the CI-sized soak: no growth per request beyond soakMaxGrowth heap
// objects over soakRequests requests of the soak mix, with worker churn and engine restarts
// (SPEC R19; tests/bench/soak.sh is the full soak over processes).
func TestSoakHeapObjects(t *testing.T) {
	cfg, err := config.Parse([]byte(fmt.Sprintf(soakGatewayTOML, "1s")), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's transport to its engines is the production one, kept here so that its idle
	// connections (bounded by MaxIdleConnsPerHost, closed after IdleConnTimeout) can be closed
	// before each measurement: how many of them are idle depends on the last moments' load.
	upstream := httpapi.NewTransport()
	a, err := app.Start(cfg, app.Options{Transport: upstream, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
	}()
	f := &soakFleet{t: t, gws: []string{a.GRPCAddr}, base: map[string]*engine.Engine{},
		roles: map[string]engine.Role{}, models: map[string]string{}}
	defer f.close()
	for _, e := range []struct {
		id, model string
		role      engine.Role
	}{
		{"smol-1", "smol", engine.RoleUnified}, {"smol-2", "smol", engine.RoleUnified},
		{"big-1", "big", engine.RoleUnified}, {"big-2", "big", engine.RoleUnified},
		{"prefill-1", "smol", engine.RolePrefill}, {"prefill-2", "smol", engine.RolePrefill},
		{"decode-1", "smol", engine.RoleDecode}, {"decode-2", "smol", engine.RoleDecode},
	} {
		f.base[e.id], f.roles[e.id], f.models[e.id] = f.start(e.id, e.model, e.role), e.role, e.model
	}
	f.settle(a)

	var statuses sync.Map // "200", "200-interrupted", "503", "error" … → *atomic.Int64
	count := func(key string) {
		v, _ := statuses.LoadOrStore(key, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	next := 0 // the next request number, across phases
	// run sends n requests of the mix from soakClients clients and churns the fleet every
	// soakChurnEvery requests; then every base engine restarts (restartAll), the fleet settles
	// and the gateway's idle upstream connections close.
	run := func(n int) {
		var sent atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(8 * time.Minute)
		for c := 0; c < soakClients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := c; i < n && time.Now().Before(deadline); i += soakClients {
					k := next + i
					kind := soakMix[k%len(soakMix)]
					req := httptest.NewRequest("POST", kind.path, strings.NewReader(soakBody(kind, k, soakDistinct, soakShortFiller)))
					req.Header.Set("Authorization", "Bearer "+soakKey)
					req.Header.Set("Content-Type", "application/json")
					if kind.session {
						req.Header.Set("X-Session-ID", soakSession(c, k))
					}
					w := &soakWriter{h: http.Header{}}
					a.HTTP.ServeHTTP(w, req)
					sent.Add(1)
					switch {
					case w.code == 200 && kind.stream && !bytes.Contains(w.tail, []byte("data: [DONE]")):
						count("200-interrupted")
					case w.code != 200:
						count(fmt.Sprint(w.code, " ", errorMessage(w.head)))
					default:
						count(fmt.Sprint(w.code))
					}
				}
			}()
		}
		churned := int64(0)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		tick := time.NewTicker(time.Millisecond)
	loop:
		for {
			select {
			case <-done:
				break loop
			case <-tick.C:
				if s := sent.Load(); s-churned >= soakChurnEvery {
					churned = s
					f.churn()
				}
			}
		}
		tick.Stop()
		if int(sent.Load()) != n {
			t.Fatalf("only %d of %d requests were sent in 8 minutes", sent.Load(), n)
		}
		next += n
		f.restartAll()
		f.settle(a)
		upstream.CloseIdleConnections()
	}

	// No process registry fill before the warm-up: every new actor id (a request actor per
	// request) lands in one of the registry's gateway.RegistryBuckets × 32 = 2,048 shard maps,
	// and a Go map keeps the slot group of its first insert, so first touches are a bound (about
	// 2,048 objects), not growth per request. The warm-up's 10,000 requests spawn at least
	// 10,000 actors: an expected 2,048 × e^(−10,000/2,048) ≈ 16 maps are still untouched after
	// it, at most ~16 objects over the measured 50,000 requests (0.0003 a request, 3% of
	// soakMaxGrowth).
	// Fewer collections while the load runs (the measurements collect explicitly): under the
	// race detector the collector's work on this small, busy heap is a large part of the CPU.
	defer debug.SetGCPercent(debug.SetGCPercent(800))
	if os.Getenv("TLGW_SOAK_HEAP_PROFILES") != "" {
		runtime.MemProfileRate = 1 // every allocation: slow, but the growth is small objects
	}
	run(soakWarmup)
	warm := liveHeapObjects()
	writeHeapProfile(t, "warm.prof")
	start := time.Now()
	run(soakRequests / 2)
	mid := liveHeapObjects()
	run(soakRequests - soakRequests/2)
	elapsed := time.Since(start)
	end := liveHeapObjects()
	writeHeapProfile(t, "end.prof")
	first := (float64(mid) - float64(warm)) / float64(soakRequests/2)
	second := (float64(end) - float64(mid)) / float64(soakRequests-soakRequests/2)
	// A table that keeps state per request grows in proportion to the requests: by the same
	// amount in each half. A one-time step (a registry shard map first touched, a table grown to
	// a new peak, a buffer or a pooled object alive at one reading and not the other) shows in
	// one half only. The growth per request is the smaller of the two halves' slopes: a leak
	// of soakMaxGrowth or more fails in both, a step passes.
	growth := min(first, second)
	var outcomes []string
	statuses.Range(func(k, v any) bool {
		outcomes = append(outcomes, fmt.Sprintf("%s: %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(outcomes)
	t.Logf("%d requests in %v after a %d-request warm-up; live heap objects %d → %d → %d: %+.4f and %+.4f per request in the two halves, %+.4f over both (limit %.2f on the smaller half); %d joins, %d restarts; outcomes %v",
		soakRequests, elapsed.Round(time.Millisecond), soakWarmup, warm, mid, end, first, second,
		(float64(end)-float64(warm))/soakRequests, soakMaxGrowth, f.joins, f.restart, outcomes)
	if growth > soakMaxGrowth {
		t.Errorf("the heap grew by %.4f objects per request (limit %.2f): something keeps state per request served", growth, soakMaxGrowth)
	}
	// The fleet's churn is routed around (R19): a few requests may fail while an engine is
	// closed under them with its retries at the budget (503 no_capacity: 3 of 60,000 in a run
	// on a loaded 2-core VM); before the decode-target and moved-address fixes, the
	// disaggregated route went down for 30 s at each decode restart (5,430 of 60,000).
	v, _ := statuses.Load("200")
	if v == nil || v.(*atomic.Int64).Load() < (soakWarmup+soakRequests)*99/100 {
		t.Errorf("fewer than 99%% of the requests succeeded: %v", outcomes)
	}
}
