package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// clusterRollouts is GET /admin/v1/rollouts of a replica: the decider, the ETag and the one
// rollout.
type clusterRollouts struct {
	Decider string
	ETag    string
	Rollout rolloutState
}

func (c *cluster) rollouts(t *testing.T, i int) (clusterRollouts, bool) {
	t.Helper()
	resp, body := c.do(t, i, "GET", "/admin/v1/rollouts", "", "")
	var v struct {
		Decider  string         `json:"decider"`
		Rollouts []rolloutState `json:"rollouts"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &v) != nil || len(v.Rollouts) != 1 {
		return clusterRollouts{}, false
	}
	return clusterRollouts{Decider: v.Decider, ETag: resp.Header.Get("ETag"), Rollout: v.Rollouts[0]}, true
}

// TestClusterRolloutTakeover (R25 with [cluster]): three replicas share one rollout under load
// spread over them. The replicas agree on its state and on the replica that decides; an
// operator's pause on one replica holds it on all, and a resume on another (If-Match) goes on;
// the deciding replica is killed (SIGKILL) and another takes the decision over within the
// lease TTL (3 s); the rollout goes on from the step it had reached to 100%, and no request to
// a live replica fails.
func TestClusterRolloutTakeover(t *testing.T) {
	// A lease TTL of 3 s: the decider holds rollout_leader under half of it, which etcd raises
	// to its floor (1.5 s at its default election timeout).
	c := startClusterOf(t, `
[[gateway.routes]]
model = "smol"
rollout = { canary = "smol-v4", baseline = "smol-v3", steps = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100], step_interval = "1s", min_requests = 5 }
`, "3s", [][2]string{{"base", "smol-v3"}, {"canary", "smol-v4"}})
	eventually(t, "the replicas agree on the decider", 15*time.Second, func() bool {
		var ds []string
		for i := range c.replicas {
			if r, ok := c.rollouts(t, i); ok && r.Decider != "" {
				ds = append(ds, r.Decider)
			}
		}
		return len(ds) == 3 && ds[0] == ds[1] && ds[1] == ds[2]
	})

	// Load: two clients, each request to the next live replica.
	var dead atomic.Int32 // 1 + the index of the killed replica (0: none)
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				i := (n + g) % 3
				if int(dead.Load()) == i+1 {
					continue
				}
				code, body := completeOnce(c.base(i), "smol")
				sent.Add(1)
				if code != 200 && int(dead.Load()) != i+1 { // a request in flight to the killed replica may fail
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("replica %d: %d %s", i+1, code, body))
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	// The replicas agree; an operator's pause on replica 3 holds the rollout on all three.
	var at clusterRollouts
	eventually(t, "the rollout advances", 15*time.Second, func() bool {
		r, ok := c.rollouts(t, 1)
		at = r
		return ok && r.Rollout.Percent >= 20
	})
	resp, body := c.do(t, 2, "POST", "/admin/v1/rollouts/smol:pause", "", "")
	if resp.StatusCode != 200 {
		t.Fatalf("pause on replica 3: %d %s", resp.StatusCode, body)
	}
	var paused clusterRollouts
	for i := range 3 {
		eventually(t, fmt.Sprintf("replica %d holds the pause", i+1), 5*time.Second, func() bool {
			r, ok := c.rollouts(t, i)
			paused = r
			return ok && r.Rollout.Status == "paused"
		})
	}
	if paused.Decider != at.Decider {
		t.Fatalf("the decider moved from %s to %s with every replica alive", at.Decider, paused.Decider)
	}
	if resp, body := c.do(t, 1, "POST", "/admin/v1/rollouts/smol:resume", `"1"`, ""); resp.StatusCode != 412 {
		t.Fatalf("resume with a stale If-Match: %d %s", resp.StatusCode, body)
	}
	resp, body = c.do(t, 1, "POST", "/admin/v1/rollouts/smol:resume", paused.ETag, "")
	if resp.StatusCode != 200 {
		t.Fatalf("resume on replica 2 (If-Match %s): %d %s", paused.ETag, resp.StatusCode, body)
	}

	// Kill the decider once the rollout has gone a step further.
	eventually(t, "the rollout goes on after the resume", 10*time.Second, func() bool {
		r, ok := c.rollouts(t, 0)
		at = r
		return ok && r.Rollout.Status == "running" && r.Rollout.Percent > paused.Rollout.Percent
	})
	victim, err := strconv.Atoi(strings.TrimPrefix(at.Decider, "gw-"))
	if err != nil || victim < 1 || victim > 3 {
		t.Fatalf("decider %q", at.Decider)
	}
	dead.Store(int32(victim))
	if err := c.replicas[victim-1].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.replicas[victim-1].Exited()
	killed := time.Now()
	survivor := victim % 3 // another replica's index
	var took time.Duration
	eventually(t, "another replica decides", 5*time.Second, func() bool {
		r, ok := c.rollouts(t, survivor)
		if ok && r.Decider != "" && r.Decider != at.Decider {
			took = time.Since(killed)
			return true
		}
		return false
	})
	t.Logf("%s killed at %v%%; another replica decides %v later", at.Decider, at.Rollout.Percent, took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("took over after %v; lease TTL 3 s", took)
	}
	var done clusterRollouts
	eventually(t, "the rollout reaches 100%", 20*time.Second, func() bool {
		r, ok := c.rollouts(t, survivor)
		done = r
		return ok && r.Rollout.Status == "completed"
	})
	var after int
	for _, h := range done.Rollout.History {
		if h.Decision == "advance" || h.Decision == "promote" {
			after++
		}
	}
	if done.Rollout.Percent != 100 || after < 9 {
		t.Fatalf("completed with %d advances: %+v", after, done.Rollout.History)
	}
	other := 4 - victim - survivor // the third replica's index: the three indexes sum to 3
	if other < 0 || other > 2 || other == victim-1 || other == survivor {
		t.Fatalf("index arithmetic: victim %d survivor %d other %d", victim-1, survivor, other)
	}
	eventually(t, "the third replica agrees", 5*time.Second, func() bool {
		r, ok := c.rollouts(t, other)
		return ok && r.Rollout.Status == "completed" && len(r.Rollout.History) == len(done.Rollout.History)
	})
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests to live replicas failed; first: %v", n, sent.Load(), firstErr.Load())
	}
	t.Logf("%d requests, none failed on a live replica; history %+v", sent.Load(), done.Rollout.History)
}
