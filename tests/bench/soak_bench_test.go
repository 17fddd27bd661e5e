package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// The soak over processes (SPEC R19, tests/bench/soak.sh): tlgw and its tlengines as separate
// processes pinned to serverCore, wrk pinned to loadCore driving the soak mix (soakLua), while
// the fleet changes under the load: a new worker joins (a new id) or the last one leaves every
// TLGW_SOAK_JOIN_EVERY, and one base engine, in turn, is SIGKILLed and started again under its
// id every TLGW_SOAK_KILL_EVERY. The gateway's heap in use, heap objects, goroutines and RSS
// (from its /metrics) are read after the first tenth of the requests and after all of them,
// each time in an idle window with the fleet back to its base.
//
// How the figures are read: the gateway offers no way to force a collection, so each reading
// is an idle window of TLGW_SOAK_IDLE (150 s by default) sampled every 2 s. The Go runtime
// forces a collection after 2 minutes without one, and the gateway's upstream connections
// close after 90 s idle (httpapi.NewTransport's IdleConnTimeout), so by the end of the window
// at least one collection ran (the window's collection count is printed) and no idle
// connection is left. Heap in use, live heap (go_memstats_heap_alloc_bytes) and heap objects
// are the window's minimum (the reading right after a collection); goroutines and RSS are the
// window's last reading. Heap in use counts whole spans, the free slots in them included; the
// live heap only the objects.

// soakSample is one reading of the gateway's /metrics.
type soakSample struct {
	heapInuse, heapAlloc, heapObjects, goroutines, rss, gcs float64
}

func scrapeSoak(url string) (soakSample, error) {
	resp, err := http.Get(url)
	if err != nil {
		return soakSample{}, err
	}
	defer resp.Body.Close()
	var s soakSample
	want := map[string]*float64{
		"go_memstats_heap_inuse_bytes": &s.heapInuse, "go_memstats_heap_objects": &s.heapObjects,
		"go_memstats_heap_alloc_bytes": &s.heapAlloc,
		"go_goroutines":                &s.goroutines, "process_resident_memory_bytes": &s.rss,
		"go_gc_duration_seconds_count": &s.gcs,
	}
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if p := want[name]; ok && p != nil {
			if *p, err = strconv.ParseFloat(v, 64); err != nil {
				return s, fmt.Errorf("%s: %w", name, err)
			}
			found++
		}
	}
	if found != len(want) {
		return s, fmt.Errorf("%s: %d of the %d series read", url, found, len(want))
	}
	return s, sc.Err()
}

// soakReading is what an idle window measured.
type soakReading struct {
	soakSample      // heap: the window's minimum; goroutines, RSS: its last reading
	collections int // collections that ran in the window
}

func (r soakReading) String() string {
	return fmt.Sprintf("heap in use %.2f MiB (live %.2f MiB), heap objects %.0f, goroutines %.0f, RSS %.1f MiB (%d collections in the window)",
		r.heapInuse/(1<<20), r.heapAlloc/(1<<20), r.heapObjects, r.goroutines, r.rss/(1<<20), r.collections)
}

// soakPhase is what one wrk run answered.
type soakPhase struct {
	answered, ok, interrupted, truncated, s4xx, s429, s502, s503, s504, s5xx, sockErr int
	seconds                                                                           float64
	p50, p99                                                                          time.Duration
	kills, joins, leaves                                                              int
}

func (p soakPhase) String() string {
	return fmt.Sprintf("%d answers in %.0f s (%.0f/s; p50 %v, p99 %v): %d complete, %d streams interrupted by the error event, %d streams cut without it, 4xx %d (429: %d), 502 %d, 503 %d, 504 %d, other 5xx %d, socket errors %d; %d engines SIGKILLed and restarted, %d joins, %d leaves",
		p.answered, p.seconds, float64(p.answered)/p.seconds, p.p50, p.p99, p.ok, p.interrupted, p.truncated,
		p.s4xx+p.s429, p.s429, p.s502, p.s503, p.s504, p.s5xx, p.sockErr, p.kills, p.joins, p.leaves)
}

// soakRig is the running fleet.
type soakRig struct {
	b              *testing.B
	tlengine, gRPC string
	base           map[string]*proctest.Proc // id → its current process
	baseArgs       map[string][]string
	order          []string // the SIGKILL rotation
	joiner         *proctest.Proc
	joins          int
	next           int
	gwBase         string
}

func (r *soakRig) start(id, model, role string) *proctest.Proc {
	r.b.Helper()
	return proctest.Start(r.b, "taskset", []string{"-c", serverCore, r.tlengine, "--id", id, "--model", model,
		"--role", role, "--gateway", r.gRPC, "--token", soakEngineToken, "--max-running", "1024",
		"--log-level", "error"})
}

// kill SIGKILLs the next base engine in turn and starts it again under its id (new ports, as a
// crashed pod comes back).
func (r *soakRig) kill() {
	r.b.Helper()
	id := r.order[r.next%len(r.order)]
	r.next++
	p := r.base[id]
	if err := p.Cmd.Process.Kill(); err != nil {
		r.b.Fatalf("SIGKILL %s: %v", id, err)
	}
	<-p.Exited()
	a := r.baseArgs[id]
	r.base[id] = r.start(id, a[0], a[1])
}

// toggleJoiner starts a new worker (a new id) or stops the one there is (SIGTERM: it stops
// heartbeating and serving, and the gateway evicts it after k·T).
func (r *soakRig) toggleJoiner() (joined bool) {
	r.b.Helper()
	if r.joiner != nil {
		r.stopJoiner()
		return false
	}
	r.joins++
	r.joiner = r.start(fmt.Sprint("join-", r.joins), "smol", "unified")
	return true
}

func (r *soakRig) stopJoiner() {
	r.b.Helper()
	if r.joiner == nil {
		return
	}
	_ = r.joiner.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.joiner.Exited():
	case <-time.After(10 * time.Second):
		_ = r.joiner.Cmd.Process.Kill()
		<-r.joiner.Exited()
	}
	r.joiner = nil
}

// settle stops the joiner and waits until the gateway lists exactly the base engines, each at
// its current address, with nothing in flight.
func (r *soakRig) settle() {
	r.b.Helper()
	r.stopJoiner()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := r.listsBase()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			r.b.Fatalf("the fleet did not settle back to its base engines within 60 s: %v", err)
		}
		<-tick.C
	}
}

func (r *soakRig) listsBase() (bool, error) {
	req, err := http.NewRequest("GET", r.gwBase+"/admin/v1/workers", nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+soakKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var list struct {
		Workers []struct {
			ID        string `json:"id"`
			InFlight  int64  `json:"in_flight"`
			Addresses struct {
				HTTP string `json:"http"`
			} `json:"addresses"`
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return false, err
	}
	if len(list.Workers) != len(r.base) {
		return false, fmt.Errorf("%d workers listed, %d base engines", len(list.Workers), len(r.base))
	}
	for _, w := range list.Workers {
		p := r.base[w.ID]
		if p == nil || w.Addresses.HTTP != p.HTTPAddr || w.InFlight != 0 {
			return false, fmt.Errorf("worker %+v", w)
		}
	}
	return true, nil
}

// idleWindow samples the gateway's /metrics every 2 s for d (see the comment at the top).
func (r *soakRig) idleWindow(d time.Duration) soakReading {
	r.b.Helper()
	var out soakReading
	out.heapInuse, out.heapAlloc, out.heapObjects = math.Inf(1), math.Inf(1), math.Inf(1)
	first := -1.0
	end := time.Now().Add(d)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		s, err := scrapeSoak(r.gwBase + "/metrics")
		if err != nil {
			r.b.Fatal(err)
		}
		if first < 0 {
			first = s.gcs
		}
		out.heapInuse, out.heapObjects = min(out.heapInuse, s.heapInuse), min(out.heapObjects, s.heapObjects)
		out.heapAlloc = min(out.heapAlloc, s.heapAlloc)
		out.goroutines, out.rss, out.collections = s.goroutines, s.rss, int(s.gcs-first)
		if time.Now().After(end) {
			return out
		}
		<-tick.C
	}
}

// phase drives n requests of the mix through wrk while the fleet changes, then settles it.
func (r *soakRig) phase(script string, n, offset int, killEvery, joinEvery time.Duration) soakPhase {
	r.b.Helper()
	const threads, conns = 2, 64
	quota := (n + threads - 1) / threads
	// At worst 100 requests/s before wrk gives up (the run is then reported as failed).
	limit := time.Duration(n/100+60) * time.Second
	cmd := exec.Command("taskset", "-c", loadCore, "wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", fmt.Sprintf("%ds", int(limit.Seconds())), "--timeout", "30s", "-s", script, r.gwBase+"/",
		"--", strconv.Itoa(quota), strconv.Itoa(threads), strconv.Itoa(offset))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.b.Fatal(err)
	}
	out := make(chan []byte, 1)
	go func() {
		var all []byte
		done := 0
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			all = append(append(all, sc.Bytes()...), '\n')
			if sc.Text() == "SOAK-QUOTA" {
				if done++; done == threads {
					_ = cmd.Process.Signal(os.Interrupt) // wrk then prints its summary and exits
				}
			}
		}
		out <- all
	}()
	var p soakPhase
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastKill, lastJoin := time.Now(), time.Now()
	var o []byte
wait:
	for {
		select {
		case o = <-out:
			break wait
		case now := <-tick.C:
			if now.Sub(lastKill) >= killEvery {
				r.kill()
				p.kills++
				lastKill = now
			}
			if now.Sub(lastJoin) >= joinEvery {
				if r.toggleJoiner() {
					p.joins++
				} else {
					p.leaves++
				}
				lastJoin = now
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		r.b.Fatalf("wrk: %v\n%s", err, o)
	}
	if r.joiner != nil {
		p.leaves++
	}
	r.settle()
	var durUS, p50, p99 int64
	for _, line := range strings.Split(string(o), "\n") {
		if !strings.HasPrefix(line, "SOAK ") {
			continue
		}
		if _, err := fmt.Sscanf(line, "SOAK answered=%d ok=%d interrupted=%d truncated=%d s4xx=%d s429=%d s502=%d s503=%d s504=%d s5xx=%d sockerr=%d duration_us=%d p50_us=%d p99_us=%d",
			&p.answered, &p.ok, &p.interrupted, &p.truncated, &p.s4xx, &p.s429, &p.s502, &p.s503, &p.s504, &p.s5xx, &p.sockErr, &durUS, &p50, &p99); err != nil {
			r.b.Fatalf("parsing %q: %v", line, err)
		}
	}
	if p.answered < n {
		r.b.Fatalf("wrk answered %d of %d requests:\n%s", p.answered, n, o)
	}
	p.seconds = float64(durUS) / 1e6
	p.p50, p.p99 = time.Duration(p50)*time.Microsecond, time.Duration(p99)*time.Microsecond
	return p
}

func envInt(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("%s=%q", name, v)
		}
		return n
	}
	return def
}

// BenchmarkSoak is the soak of SPEC R19 over processes (see the top of this file): 1,000,000
// requests by default (TLGW_SOAK_REQUESTS), read after the first tenth and after all of them.
// Target: heap in use after all within 10% and within 8 MiB of after the first tenth, and the
// goroutines back to their idle count. Run with -benchtime 1x; tests/bench/soak.sh prints the
// figures.
func BenchmarkSoak(b *testing.B) {
	needTools(b)
	total := envInt(b, "TLGW_SOAK_REQUESTS", 1_000_000)
	killEvery := envDuration(b, "TLGW_SOAK_KILL_EVERY", 30*time.Second)
	joinEvery := envDuration(b, "TLGW_SOAK_JOIN_EVERY", 10*time.Second)
	idle := envDuration(b, "TLGW_SOAK_IDLE", 150*time.Second)
	first := total / 10
	dir := b.TempDir()
	var bins [2]string
	for i, pkg := range []string{"cmd/tlgw", "cmd/tlengine"} {
		bin, err := proctest.Build(dir, "github.com/tlgw/tlgw/"+pkg)
		if err != nil {
			b.Fatal(err)
		}
		bins[i] = bin
	}
	cfg := filepath.Join(dir, "tlgw.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(soakGatewayTOML, "2s")), 0o600); err != nil {
		b.Fatal(err)
	}
	gw := proctest.Start(b, "taskset", []string{"-c", serverCore, bins[0], "serve", "--config", cfg})
	r := &soakRig{b: b, tlengine: bins[1], gRPC: gw.GRPCAddr, gwBase: "http://" + gw.HTTPAddr,
		base: map[string]*proctest.Proc{}, baseArgs: map[string][]string{}}
	for _, e := range [][3]string{
		{"smol-1", "smol", "unified"}, {"big-1", "big", "unified"}, {"prefill-1", "smol", "prefill"}, {"decode-1", "smol", "decode"},
		{"smol-2", "smol", "unified"}, {"big-2", "big", "unified"}, {"prefill-2", "smol", "prefill"}, {"decode-2", "smol", "decode"},
	} {
		r.base[e[0]], r.baseArgs[e[0]] = r.start(e[0], e[1], e[2]), []string{e[1], e[2]}
		r.order = append(r.order, e[0])
	}
	gwtest.Eventually(b, "the base fleet registered", func() bool { ok, _ := r.listsBase(); return ok })
	script := filepath.Join(dir, "soak.lua")
	if err := os.WriteFile(script, []byte(soakLua()), 0o600); err != nil {
		b.Fatal(err)
	}
	before, err := scrapeSoak(r.gwBase + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("soak: %d requests (%d, then %d), a SIGKILL and restart every %v, a join or leave every %v, idle windows of %v\n",
		total, first, total-first, killEvery, joinEvery, idle)
	fmt.Printf("soak: before any request: %s\n", soakReading{soakSample: before})

	b.ResetTimer()
	start := time.Now()
	p1 := r.phase(script, first, 0, killEvery, joinEvery)
	fmt.Printf("soak: first phase: %s\n", p1)
	at1 := r.idleWindow(idle)
	fmt.Printf("soak: after %d requests: %s\n", first, at1)
	p2 := r.phase(script, total-first, first, killEvery, joinEvery)
	fmt.Printf("soak: second phase: %s\n", p2)
	at2 := r.idleWindow(idle)
	fmt.Printf("soak: after %d requests: %s\n", total, at2)
	b.StopTimer()

	growth := at2.heapInuse - at1.heapInuse
	fmt.Printf("soak: heap in use %+.2f MiB (%+.1f%%), live heap %+.2f MiB, heap objects %+.0f (%+.4f per request of the second phase), goroutines %+.0f, RSS %+.1f MiB; %v in all\n",
		growth/(1<<20), 100*growth/at1.heapInuse, (at2.heapAlloc-at1.heapAlloc)/(1<<20), at2.heapObjects-at1.heapObjects,
		(at2.heapObjects-at1.heapObjects)/float64(total-first), at2.goroutines-at1.goroutines,
		(at2.rss-at1.rss)/(1<<20), time.Since(start).Round(time.Second))
	if growth > 0.10*at1.heapInuse || growth > 8<<20 {
		b.Errorf("heap in use grew from %.2f to %.2f MiB: over 10%% or 8 MiB", at1.heapInuse/(1<<20), at2.heapInuse/(1<<20))
	}
	if at2.goroutines > at1.goroutines {
		b.Errorf("goroutines at rest grew from %.0f to %.0f", at1.goroutines, at2.goroutines)
	}
	if at1.collections == 0 || at2.collections == 0 {
		b.Errorf("an idle window saw no collection (%d, %d): lengthen TLGW_SOAK_IDLE", at1.collections, at2.collections)
	}
}
