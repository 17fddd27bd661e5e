package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// chaosCounts is what the clients of one chaos phase saw.
type chaosCounts struct {
	requests int
	// early: the request failed before its first byte (a transport error before the answer,
	// or a status other than 200).
	early int
	// cut: a 200 stream that did not end with data: [DONE] (interrupted after its first byte).
	cut int
	// codes counts the early failures by status (0: a transport error).
	codes map[int]int
	// first is the first early failure's answer (or error), for the log.
	first string
}

func (c chaosCounts) String() string {
	s := fmt.Sprintf("%d requests, %d failed before their first byte %v, %d interrupted after it",
		c.requests, c.early, c.codes, c.cut)
	if c.first != "" {
		s += "; the first failure: " + c.first
	}
	return s
}

// chaosLoad runs clients streaming clients against base until stop is closed (each request
// bounded by the client's timeout), and returns their counts once every client has returned.
// phase, read at each answer, names the counts the answer goes to.
func chaosLoad(t *testing.T, base string, clients int, ramp time.Duration, stop <-chan struct{}, phase func() int, phases int) []chaosCounts {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var mu sync.Mutex
	out := make([]chaosCounts, phases)
	for i := range out {
		out[i].codes = map[int]int{}
	}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(c) * ramp):
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := phase()
				status, done, answer := chaosStream(hc, base, fmt.Sprintf("chaos client %d request %d", c, i))
				mu.Lock()
				out[p].requests++
				switch {
				case status != 200: // a transport error before the answer is status 0
					out[p].early++
					out[p].codes[status]++
					if out[p].first == "" {
						out[p].first = answer
					}
				case !done:
					out[p].cut++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// chaosStream sends one streamed completion and reads it to its end: the answer's status (0:
// none), whether it ended with data: [DONE], and the error or the body of an answer other
// than 200.
func chaosStream(hc *http.Client, base, prompt string) (int, bool, string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":16,"stream":true}`, prompt)
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return resp.StatusCode, false, string(b)
	}
	last := ""
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			last = line
		}
	}
	return resp.StatusCode, sc.Err() == nil && last == "data: [DONE]", ""
}

// chaosSeconds is how long each chaos phase runs: TLGW_CHAOS_SECONDS (the scenario is
// 15), else a CI-sized default.
func chaosSeconds(t *testing.T, def int) time.Duration {
	t.Helper()
	if s := os.Getenv("TLGW_CHAOS_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 120 {
			t.Fatalf("TLGW_CHAOS_SECONDS=%q: want 1 to 120", s)
		}
		return time.Duration(n) * time.Second
	}
	return time.Duration(def) * time.Second
}

// chaosRamp spaces the clients' first requests: all 32 are running within 160 ms. (A burst of
// 32 first requests in the same millisecond, on a fleet the gateway has never seen fail, sends
// about a sixth of them to each faulty engine before any failure is known; the 503 and crash
// engines' failures together can then exceed R14.3's max(3, 20% of in flight) concurrent
// retries, and the budget answers the rest 503, as it is meant to.)
const chaosRamp = 5 * time.Millisecond

// chaosKnobs are the engines' time per token and the clients' ramp: TLGW_CHAOS_TOKEN and
// TLGW_CHAOS_RAMP (Go durations) override the defaults, 2ms and chaosRamp. TLGW_CHAOS_TOKEN=0
// is the engines (tlengine's default: no time per token); TLGW_CHAOS_RAMP=0 starts
// every client in the same millisecond (see chaosRamp for what R14.3 does with that burst).
func chaosKnobs(t *testing.T) (token string, ramp time.Duration) {
	t.Helper()
	token, ramp = "2ms", chaosRamp
	if s := os.Getenv("TLGW_CHAOS_TOKEN"); s != "" {
		if d, err := time.ParseDuration(s); err != nil || d < 0 || d > time.Second {
			t.Fatalf("TLGW_CHAOS_TOKEN=%q: want a duration from 0 to 1s", s)
		}
		token = s
	}
	if s := os.Getenv("TLGW_CHAOS_RAMP"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 || d > time.Second {
			t.Fatalf("TLGW_CHAOS_RAMP=%q: want a duration from 0 to 1s", s)
		}
		ramp = d
	}
	return token, ramp
}

const chaosConfig = `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
max_attempts = 4
`

// TestChaosNoFailureBeforeFirstByte (R19, R14): a half-broken fleet is routed around. Six
// engines for one model behind default settings (least_outstanding, heartbeats every 2 s,
// evicted after 3 missed, outlier ejection on, retry budget 20%) and max_attempts = 4; 32
// clients stream 16-token completions without pause (the engines take 2 ms a token, so a
// stream lasts about 35 ms after its first event). Each phase runs TLGW_CHAOS_SECONDS (15 for
// the scenario; 4 by default).
//
// Phase 1: an engine whose advertised address refuses connections, one answering 503, one
// cutting every stream after 3 tokens, one exiting after 5 tokens, and two healthy ones (the
// faulty ones sort first, so least_outstanding's ties go to them). No request fails before its
// first byte (streams cut after it by the cut and crash engines are counted, not failed).
//
// A worker whose address refuses a connection is unreachable at once, outside the ejection
// cap, and the refused failovers take no retry slot; the 503 and cut engines gather failure
// load and are ejected; the crash engine's last streams are cut and it refuses from then on.
// The streams the cut engine interrupts stay a handful (the least-connections black hole sent
// it most of the traffic).
//
// Phase 2: six healthy engines; after a while three of them are SIGKILLed at once under load.
// No request fails before its first byte. (Counts go to the phase a request started in: the
// streams the kill cut are counted before it.) Most requests a kill catches before their first
// byte were just written on a kept-alive connection the dead engine's kernel closed: they are
// sent again on a new connection, refused, and fail over with no retry slot (upstreamRequest).
func TestChaosNoFailureBeforeFirstByte(t *testing.T) {
	d := chaosSeconds(t, 4)
	token, ramp := chaosKnobs(t)
	const clients = 32

	t.Run("faulty fleet", func(t *testing.T) {
		f := startFleet(t, chaosConfig,
			[]string{"a-refuse", "--model", "smol", "--fault", "refuse", "--decode-per-token", token, "--log-level", "error"},
			[]string{"b-503", "--model", "smol", "--fault", "503", "--decode-per-token", token, "--log-level", "error"},
			[]string{"c-cut", "--model", "smol", "--fault", "cut-after=3", "--decode-per-token", token, "--log-level", "error"},
			[]string{"d-crash", "--model", "smol", "--fault", "crash-after=5", "--decode-per-token", token, "--log-level", "error"},
			[]string{"e-ok", "--model", "smol", "--decode-per-token", token, "--log-level", "error"},
			[]string{"f-ok", "--model", "smol", "--decode-per-token", token, "--log-level", "error"})
		stop := make(chan struct{})
		time.AfterFunc(d, func() { close(stop) })
		got := chaosLoad(t, f.base, clients, ramp, stop, func() int { return 0 }, 1)[0]
		t.Logf("faulty fleet, %v: %v", d, got)
		if got.requests == 0 || got.early != 0 {
			logFailures(t, f)
			t.Fatalf("faulty fleet: %v; want requests and none failed before its first byte", got)
		}
		// No black hole: the cut engine (and the crash engine's last streams) interrupt a
		// handful of streams before the cut engine is ejected, not a share of the traffic.
		if got.cut*50 > got.requests {
			t.Fatalf("faulty fleet: %v; want at most 2%% interrupted", got)
		}
	})

	t.Run("three of six killed", func(t *testing.T) {
		var engines [][]string
		for i := range 6 {
			engines = append(engines, []string{fmt.Sprintf("h%d", i), "--model", "smol", "--decode-per-token", token, "--log-level", "error"})
		}
		f := startFleet(t, chaosConfig, engines...)
		var mu sync.Mutex
		phase := 0
		stop := make(chan struct{})
		done := make(chan []chaosCounts, 1)
		go func() {
			done <- chaosLoad(t, f.base, clients, ramp, stop, func() int { mu.Lock(); defer mu.Unlock(); return phase }, 2)
		}()
		// Under load for a while, then three engines die at once.
		<-time.After(d / 2)
		mu.Lock()
		phase = 1
		mu.Unlock()
		for _, id := range []string{"h0", "h2", "h4"} {
			if err := f.engines[id].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Error(err)
			}
		}
		<-time.After(d)
		close(stop)
		got := <-done
		t.Logf("six healthy, %v before the kill: %v", d/2, got[0])
		t.Logf("three of six SIGKILLed, %v after: %v", d, got[1])
		for i, what := range []string{"before the kill", "after the kill"} {
			if got[i].requests == 0 || got[i].early != 0 {
				logFailures(t, f)
				t.Fatalf("%s: %v; want requests and none failed before its first byte", what, got[i])
			}
		}
	})
}

// logFailures logs the gateway's lines on the failovers it answered instead of retrying, with
// the failed attempts before each (at most 40 lines).
func logFailures(t *testing.T, f *fleet) {
	t.Helper()
	var keep []string
	for _, line := range strings.Split(f.gw.Logs(), "\n") {
		if strings.Contains(line, "retry budget spent") || strings.Contains(line, "attempt failed") ||
			strings.Contains(line, "tried, none answered") {
			keep = append(keep, line)
		}
	}
	var out []string
	for i, line := range keep {
		if strings.Contains(line, "retry budget spent") || strings.Contains(line, "none answered") {
			out = append(out, keep[max(0, i-3):i+1]...)
		}
		if len(out) >= 40 {
			break
		}
	}
	t.Logf("the gateway on its failures:\n%s", strings.Join(out, "\n"))
}
