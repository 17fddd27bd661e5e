package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/proctest"
)

// rolloutState is what GET /admin/v1/rollouts says of one route's rollout.
type rolloutState struct {
	Route   string  `json:"route"`
	Percent float64 `json:"percent"`
	Status  string  `json:"status"`
	History []struct {
		Decision string `json:"decision"`
		Reason   string `json:"reason"`
		Canary   *struct {
			Requests uint64 `json:"requests"`
			Errors   uint64 `json:"errors"`
		} `json:"canary"`
	} `json:"history"`
}

func rolloutOf(t *testing.T, base string) rolloutState {
	t.Helper()
	resp, err := http.Get(base + "/admin/v1/rollouts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Rollouts []rolloutState `json:"rollouts"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil || len(v.Rollouts) != 1 {
		t.Fatalf("rollouts: %v %+v", err, v)
	}
	return v.Rollouts[0]
}

const rolloutConfig = fastHeartbeats + `
[[gateway.routes]]
model = "smol"
rollout = { canary = "smol-v4", baseline = "smol-v3", steps = [50, 100], step_interval = "1s", min_requests = 10 }
`

// TestRolloutOverProcesses (R25): a route's rollout over tlengine processes, requests every
// 20 ms from the first window on. A canary engine answering 503 is rolled back at the end of
// the first window (within two intervals of the start), and no client sees an error: each
// canary failure went on on the baseline. A healthy canary reaches 100% through its steps and
// then serves every request.
func TestRolloutOverProcesses(t *testing.T) {
	run := func(t *testing.T, canaryArgs []string, done func(rolloutState) bool, within time.Duration) (rolloutState, *fleet, time.Duration) {
		f := startFleet(t, rolloutConfig, []string{"base", "--model", "smol-v3"}, append([]string{"canary", "--model", "smol-v4"}, canaryArgs...))
		hc := &http.Client{Timeout: 5 * time.Second}
		start := time.Now()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var last rolloutState
		for i := 0; time.Since(start) < within; i++ {
			<-tick.C
			req, _ := http.NewRequest("POST", f.base+"/v1/completions", strings.NewReader(
				fmt.Sprintf(`{"model":"smol","prompt":"rollout %d","max_tokens":2}`, i)))
			req.Header.Set("X-Request-ID", fmt.Sprintf("ro-%d", i))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d — a client saw an error", i, resp.StatusCode)
			}
			if i%10 == 0 {
				if last = rolloutOf(t, f.base); done(last) {
					return last, f, time.Since(start)
				}
			}
		}
		t.Fatalf("not done within %v: %+v", within, last)
		return last, f, 0
	}
	t.Run("broken canary rolled back", func(t *testing.T) {
		st, f, took := run(t, []string{"--fault", "503"}, func(s rolloutState) bool { return s.Status == "rolled_back" }, 10*time.Second)
		t.Logf("rolled back after %v: %+v", took.Round(time.Millisecond), st.History)
		if st.Percent != 0 || len(st.History) != 1 || st.History[0].Decision != "rollback" || st.History[0].Canary.Errors == 0 {
			t.Fatalf("rollout %+v", st)
		}
		if took > 2500*time.Millisecond {
			t.Fatalf("rolled back after %v: want the first window's end (1 s; 2 s with a window held)", took)
		}
		if n := metricSum(t, f.base, "tlgw_rollout_decisions_total", `decision="rollback"`); n != 1 {
			t.Fatalf("tlgw_rollout_decisions_total{decision=\"rollback\"} = %v", n)
		}
	})
	t.Run("canary broken after its second step", func(t *testing.T) {
		f := startFleet(t, fastHeartbeats+`
[[gateway.routes]]
model = "smol"
rollout = { canary = "smol-v4", baseline = "smol-v3", steps = [20, 40, 60, 100], step_interval = "1s", min_requests = 10 }
`, []string{"base", "--model", "smol-v3"}, []string{"canary", "--model", "smol-v4"})
		hc := &http.Client{Timeout: 5 * time.Second}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		var broke time.Time
		var st rolloutState
		for i := 0; st.Status != "rolled_back"; i++ {
			if time.Since(start) > 15*time.Second {
				t.Fatalf("not rolled back within 15 s: %+v", st)
			}
			<-tick.C
			resp, err := hc.Post(f.base+"/v1/completions", "application/json", strings.NewReader(
				fmt.Sprintf(`{"model":"smol","prompt":"break %d","max_tokens":2}`, i)))
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d — a client saw an error", i, resp.StatusCode)
			}
			if i%5 != 0 {
				continue
			}
			st = rolloutOf(t, f.base)
			if broke.IsZero() && st.Percent == 60 {
				// Past its second step: the canary engine dies and comes back answering 503.
				if err := f.engines["canary"].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				proctest.StartEngine(t, tlengineBin, "--id", "canary-2", "--gateway", f.gw.GRPCAddr, "--model", "smol-v4", "--fault", "503")
				broke = time.Now()
			}
		}
		took := time.Since(broke)
		t.Logf("rolled back %v after the canary broke: %+v", took.Round(time.Millisecond), st.History)
		if broke.IsZero() || took > 2500*time.Millisecond || st.History[len(st.History)-1].Decision != "rollback" {
			t.Fatalf("rollback %v after the break (want within the window it broke in, or the next): %+v", took, st)
		}
		var advances int
		for _, h := range st.History {
			if h.Decision == "advance" {
				advances++
			}
		}
		if advances != 2 {
			t.Fatalf("%d advances before the rollback, want 2", advances)
		}
	})
	t.Run("healthy canary promoted", func(t *testing.T) {
		st, f, took := run(t, nil, func(s rolloutState) bool { return s.Status == "completed" }, 15*time.Second)
		t.Logf("promoted after %v: %+v", took.Round(time.Millisecond), st.History)
		if st.Percent != 100 || st.History[len(st.History)-1].Decision != "promote" {
			t.Fatalf("rollout %+v", st)
		}
		if n := metricSum(t, f.base, "tlgw_rollout_step", `route="smol"`); n != 100 {
			t.Fatalf("tlgw_rollout_step %v", n)
		}
		// Promoted: the baseline gets nothing more.
		before := metricSum(t, "http://"+f.engines["base"].HTTPAddr, "tlengine_requests_total")
		for i := range 20 {
			resp, err := http.Post(f.base+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"model":"smol","prompt":"after %d","max_tokens":2}`, i)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		if after := metricSum(t, "http://"+f.engines["base"].HTTPAddr, "tlengine_requests_total"); after != before {
			t.Fatalf("the baseline served %v requests after the promotion", after-before)
		}
	})
}
