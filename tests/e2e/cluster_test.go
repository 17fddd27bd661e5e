package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// cluster is three `tlgw serve` replicas sharing one embedded etcd, with tlengine engines
// heartbeating to all three (R16).
type cluster struct {
	etcd     *etcdtest.Server
	replicas []*proctest.Proc
	engines  map[string]*proctest.Proc
}

const clusterKey = "sk-cluster-admin" // inference, admin and debug (X-TL-Route)

func clusterTOML(endpoint string, i int, routes string) string {
	return fmt.Sprintf(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3
route_policy = "affinity"
%s
[[auth.keys]]
key = %q
scopes = ["inference", "admin", "debug"]

[[auth.keys]]
key = "sk-limited"
scopes = ["inference"]
rpm = 7

[cluster]
etcd_endpoints = [%q]
prefix = "/e2e/"
replica_id = "gw-%d"
lease_ttl = "2s"
`, routes, clusterKey, endpoint, i)
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	return startClusterOf(t, "\n[[gateway.routes]]\nmodel = \"chat\"\nbackends = [{ model = \"smol\", weight = 1 }]\n", "2s",
		[][2]string{{"s1", "smol"}, {"s2", "smol"}, {"s3", "smol"}, {"b1", "big"}})
}

// startClusterOf starts three replicas with lease_ttl ttl, the first bringing routes (the
// others take the table from etcd), and a tlengine per engine {id, model} heartbeating to all
// three; it returns when every replica sees every engine and every replica.
func startClusterOf(t *testing.T, routes, ttl string, engines [][2]string) *cluster {
	t.Helper()
	c := &cluster{etcd: etcdtest.Start(t), engines: map[string]*proctest.Proc{}}
	for i := 1; i <= 3; i++ {
		toml := strings.Replace(clusterTOML(c.etcd.Endpoint(), i, ""), `lease_ttl = "2s"`, fmt.Sprintf("lease_ttl = %q", ttl), 1)
		if i == 1 { // the first replica brings the fleet's table; the others take it from etcd
			toml = strings.Replace(clusterTOML(c.etcd.Endpoint(), i, routes), `lease_ttl = "2s"`, fmt.Sprintf("lease_ttl = %q", ttl), 1)
		}
		c.replicas = append(c.replicas, startTLGW(t, toml))
		if i == 1 {
			eventually(t, "replica 1 stores its table", 10*time.Second, func() bool {
				return metricSum(t, c.base(0), "tlgw_config_store_up") == 1
			})
		}
	}
	var grpcs []string
	for _, r := range c.replicas {
		grpcs = append(grpcs, r.GRPCAddr)
	}
	for _, e := range engines {
		c.engines[e[0]] = proctest.StartEngine(t, tlengineBin, "--id", e[0], "--model", e[1], "--gateway", strings.Join(grpcs, ","))
	}
	for i := range c.replicas {
		eventually(t, fmt.Sprintf("replica %d sees every engine and every replica", i+1), 15*time.Second, func() bool {
			var rows []workerRow
			if c.getJSON(t, i, "/admin/v1/workers", &rows, "workers") != 200 || len(rows) != len(engines) {
				return false
			}
			return len(c.replicaIDs(t, i)) == 3
		})
	}
	return c
}

func (c *cluster) base(i int) string { return "http://" + c.replicas[i].HTTPAddr }

// do sends one request to replica i with the admin key.
func (c *cluster) do(t *testing.T, i int, method, path, ifMatch, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, c.base(i)+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+clusterKey)
	req.Header.Set("Content-Type", "application/json")
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("replica %d %s %s: %v", i+1, method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// getJSON decodes field of a GET's JSON answer into dst and returns the status.
func (c *cluster) getJSON(t *testing.T, i int, path string, dst any, field string) int {
	t.Helper()
	resp, body := c.do(t, i, "GET", path, "", "")
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &obj); err != nil {
		t.Fatalf("%s: %v: %s", path, err, body)
	}
	if err := json.Unmarshal(obj[field], dst); err != nil && resp.StatusCode == 200 {
		t.Fatalf("%s.%s: %v", path, field, err)
	}
	return resp.StatusCode
}

func (c *cluster) replicaIDs(t *testing.T, i int) []string {
	t.Helper()
	var rows []struct {
		ID string `json:"id"`
	}
	if c.getJSON(t, i, "/admin/v1/replicas", &rows, "replicas") != 200 {
		return nil
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	return ids
}

func (c *cluster) etag(t *testing.T, i int) string {
	t.Helper()
	resp, body := c.do(t, i, "GET", "/admin/v1/routes", "", "")
	if resp.StatusCode != 200 {
		t.Fatalf("replica %d GET routes: %d %s", i+1, resp.StatusCode, body)
	}
	return resp.Header.Get("ETag")
}

// completeOnce sends one completion for model to the replica at base (safe off the test's
// goroutine: an error is a status of 0).
func completeOnce(base, model string) (int, string) {
	req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":2}`, model)))
	req.Header.Set("Authorization", "Bearer "+clusterKey)
	req.Header.Set("Content-Type", "application/json")
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return resp.StatusCode, string(b)
}

func (c *cluster) complete(t *testing.T, i int, model, prompt string) (*http.Response, string) {
	t.Helper()
	return c.do(t, i, "POST", "/v1/completions", "", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, model, prompt))
}

const twoRoutes = `{"routes":[{"model":"chat","backends":[{"model":"smol","weight":1}]},{"model":"chat2","backends":[{"model":"smol","weight":1}]}]}`

// TestClusterOfThreeReplicas is the R16 acceptance over processes: one embedded etcd, three
// replicas, four tlengines heartbeating to all three.
func TestClusterOfThreeReplicas(t *testing.T) {
	c := startCluster(t)

	t.Run("a PUT on one replica is served by the others within 1 s with the same ETag", func(t *testing.T) {
		etag := c.etag(t, 0)
		resp, body := c.do(t, 0, "PUT", "/admin/v1/routes", etag, twoRoutes)
		if resp.StatusCode != 200 {
			t.Fatalf("PUT: %d %s", resp.StatusCode, body)
		}
		next := resp.Header.Get("ETag")
		start := time.Now()
		for _, i := range []int{1, 2} {
			eventually(t, fmt.Sprintf("replica %d at ETag %s", i+1, next), time.Second, func() bool { return c.etag(t, i) == next })
			if r, b := c.complete(t, i, "chat2", "hello"); r.StatusCode != 200 {
				t.Fatalf("replica %d chat2: %d %s", i+1, r.StatusCode, b)
			}
		}
		t.Logf("replicas 2 and 3 served the new table %v after the PUT's answer", time.Since(start))
		// The heartbeat acks' epoch follows the revision.
		rev, _ := strconv.ParseUint(strings.Trim(next, `"`), 10, 64)
		for i, r := range c.replicas {
			ack := heartbeat(t, r.GRPCAddr, &controlv1.WorkerStatus{WorkerId: "probe", Model: "probe", HttpAddress: "127.0.0.1:9"})
			if ack.GetEpoch() != rev {
				t.Fatalf("replica %d acks epoch %d, want the revision %d", i+1, ack.GetEpoch(), rev)
			}
		}
	})

	t.Run("concurrent PUTs with one If-Match: exactly one 200, the others 412", func(t *testing.T) {
		for round := range 5 {
			etag := c.etag(t, 0)
			codes, etags := make([]int, 3), make([]string, 3)
			var wg sync.WaitGroup
			for i := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					table := fmt.Sprintf(`{"routes":[{"model":"chat","backends":[{"model":"smol","weight":1}]},{"model":"r%d-%d","backends":[{"model":"smol","weight":1}]}]}`, round, i)
					resp, _ := c.do(t, i, "PUT", "/admin/v1/routes", etag, table)
					codes[i], etags[i] = resp.StatusCode, resp.Header.Get("ETag")
				}()
			}
			wg.Wait()
			want := ""
			for i, code := range codes {
				if code == 200 {
					want = etags[i]
				}
			}
			slices.Sort(codes)
			if !slices.Equal(codes, []int{200, 412, 412}) {
				t.Fatalf("round %d: statuses %v", round, codes)
			}
			// The next round's If-Match is read from replica 1, so every replica first serves the
			// winner's table (the replicas that lost learn it from the store's watch).
			for i := range 3 {
				eventually(t, fmt.Sprintf("round %d: replica %d on the winner's table %s", round, i+1, want), time.Second,
					func() bool { return c.etag(t, i) == want })
			}
		}
	})

	t.Run("a drain on one replica stops routing to that model on all; an undrain routes it at once", func(t *testing.T) {
		if r, b := c.do(t, 1, "POST", "/admin/v1/models/big:drain", "", ""); r.StatusCode != 202 {
			t.Fatalf("drain: %d %s", r.StatusCode, b)
		}
		for i := range 3 {
			eventually(t, fmt.Sprintf("replica %d stops routing big", i+1), time.Second, func() bool {
				r, _ := c.complete(t, i, "big", "x")
				return r.StatusCode == 503
			})
		}
		// b1 echoes the drain: it reports draining to every replica, and will for a heartbeat
		// or two after the undrain.
		for i := range 3 {
			eventually(t, fmt.Sprintf("replica %d sees b1 report draining", i+1), 5*time.Second, func() bool {
				var rows []workerRow
				c.getJSON(t, i, "/admin/v1/workers", &rows, "workers")
				for _, w := range rows {
					if w.ID == "b1" {
						return w.Draining && w.Drained && !w.Routable
					}
				}
				return false
			})
		}
		if r, b := c.do(t, 2, "POST", "/admin/v1/models/big:undrain", "", ""); r.StatusCode != 202 {
			t.Fatalf("undrain: %d %s", r.StatusCode, b)
		}
		// R19: every replica answers a request for big within 100 ms of the undrain's answer
		// (heartbeats every 200 ms: the echo alone would hold it back for 200–400 ms).
		undrained := time.Now()
		var wg sync.WaitGroup
		first := make([]time.Duration, 3) // per replica: when it first answered 200 (0: never)
		last := make([]string, 3)         // per replica: its last answer that was not 200
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < 100 && time.Since(undrained) < 100*time.Millisecond; n++ {
					code, body := completeOnce(c.base(i), "big")
					if code == 200 {
						first[i] = time.Since(undrained)
						return
					}
					last[i] = fmt.Sprintf("%d %s", code, body)
				}
			}()
		}
		wg.Wait()
		for i, d := range first {
			if d == 0 {
				t.Errorf("replica %d did not answer 200 within 100 ms of the undrain; last answer %s", i+1, last[i])
			}
		}
		t.Logf("first 200 after the undrain: %v", first)
	})

	t.Run("the same prompt to the affinity route lands on the same worker through every replica", func(t *testing.T) {
		// A round asks every replica once. The ring is the same on every replica, but the
		// bounded-load cap sends a request past its owner whenever a replica momentarily sees
		// the owner's load at the cap (a heartbeat's queue depth, a release not yet reported;
		// seen once in a full -race run): a round that disagrees is asked again, at most five
		// times, so only a disagreement that persists fails.
		for p := range 20 {
			prompt := fmt.Sprintf("shared system prompt number %d: you are a careful assistant", p)
			var got [3]string
			for round := 0; ; round++ {
				for i := range 3 {
					r, b := c.complete(t, i, "chat", prompt)
					if r.StatusCode != 200 {
						t.Fatalf("replica %d: %d %s", i+1, r.StatusCode, b)
					}
					got[i] = r.Header.Get("X-TL-Route")
				}
				if got[0] == got[1] && got[1] == got[2] {
					break
				}
				if round == 4 {
					t.Fatalf("prompt %d: replicas sent it to %v, five rounds in a row", p, got)
				}
			}
		}
	})

	t.Run("a request id draws the same canary backend through every replica", func(t *testing.T) {
		// R20: the draw is keyed, and the replicas share the key through etcd, so an id
		// lands on one backend whichever replica serves it (smol on s1..s3, big on b1).
		etag := c.etag(t, 0)
		table := `{"routes":[{"model":"chat","backends":[{"model":"smol","weight":1}]},{"model":"split","backends":[{"model":"smol","weight":1},{"model":"big","weight":1}]}]}`
		if resp, body := c.do(t, 0, "PUT", "/admin/v1/routes", etag, table); resp.StatusCode != 200 {
			t.Fatalf("PUT: %d %s", resp.StatusCode, body)
		} else {
			next := resp.Header.Get("ETag")
			for _, i := range []int{1, 2} {
				eventually(t, fmt.Sprintf("replica %d has the split", i+1), time.Second, func() bool { return c.etag(t, i) == next })
			}
		}
		bigs := 0
		for n := range 40 {
			var got [3]bool
			for i := range 3 {
				req, _ := http.NewRequest("POST", c.base(i)+"/v1/completions", strings.NewReader(`{"model":"split","prompt":"x","max_tokens":1}`))
				req.Header.Set("Authorization", "Bearer "+clusterKey)
				req.Header.Set("X-Request-ID", fmt.Sprintf("same-id-%d", n))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("id %d on replica %d: %d", n, i+1, resp.StatusCode)
				}
				got[i] = strings.Contains(resp.Header.Get("X-TL-Route"), "b1")
			}
			if got[0] != got[1] || got[1] != got[2] {
				t.Fatalf("id same-id-%d went to big on replicas %v", n, got)
			}
			if got[0] {
				bigs++
			}
		}
		if bigs == 0 || bigs == 40 {
			t.Fatalf("%d of 40 ids drew big from a 50/50 split", bigs)
		}
	})

	t.Run("the static worker table is shared too", func(t *testing.T) {
		resp, body := c.do(t, 0, "GET", "/admin/v1/static-workers", "", "")
		if resp.StatusCode != 200 {
			t.Fatalf("GET static workers: %d %s", resp.StatusCode, body)
		}
		table := `{"static_workers":[{"id":"vllm-0","model":"llama","http_address":"127.0.0.1:9","metrics":"vllm"}]}`
		resp, body = c.do(t, 0, "PUT", "/admin/v1/static-workers", resp.Header.Get("ETag"), table)
		if resp.StatusCode != 200 {
			t.Fatalf("PUT static workers: %d %s", resp.StatusCode, body)
		}
		next := resp.Header.Get("ETag")
		for _, i := range []int{1, 2} {
			eventually(t, fmt.Sprintf("replica %d has the static table", i+1), time.Second, func() bool {
				r, b := c.do(t, i, "GET", "/admin/v1/static-workers", "", "")
				return r.Header.Get("ETag") == next && strings.Contains(b, `"vllm-0"`)
			})
		}
	})

	t.Run("rate limits are shared out over the live replicas", func(t *testing.T) {
		for i := range 3 {
			req, _ := http.NewRequest("POST", c.base(i)+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"x","max_tokens":1}`))
			req.Header.Set("Authorization", "Bearer sk-limited")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get("x-ratelimit-limit-requests"); got != "3" {
				t.Fatalf("replica %d: limit %q, want ⌈7/3⌉ = 3", i+1, got)
			}
		}
	})

	t.Run("a stream through one replica counts on the others (R23 load sharing)", func(t *testing.T) {
		var grpcs []string
		for _, r := range c.replicas {
			grpcs = append(grpcs, r.GRPCAddr)
		}
		proctest.StartEngine(t, tlengineBin, "--id", "slow1", "--model", "slowm", "--decode-per-token", "50ms", "--gateway", strings.Join(grpcs, ","))
		row := func(i int) (workerRow, bool) {
			var rows []workerRow
			c.getJSON(t, i, "/admin/v1/workers", &rows, "workers")
			for _, w := range rows {
				if w.ID == "slow1" {
					return w, true
				}
			}
			return workerRow{}, false
		}
		for i := range 3 {
			eventually(t, fmt.Sprintf("replica %d routes to slow1", i+1), 10*time.Second, func() bool { w, ok := row(i); return ok && w.Routable })
			eventually(t, fmt.Sprintf("replica %d hears both others", i+1), 10*time.Second, func() bool {
				return metricSum(t, c.base(i), "tlgw_replica_load_peers") == 2
			})
		}
		req, _ := http.NewRequest("POST", c.base(0)+"/v1/completions", strings.NewReader(`{"model":"slowm","prompt":"x","max_tokens":80,"stream":true}`))
		req.Header.Set("Authorization", "Bearer "+clusterKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		streamed := make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			streamed <- string(b)
		}()
		for _, i := range []int{1, 2} {
			eventually(t, fmt.Sprintf("replica %d counts replica 1's stream on slow1", i+1), 2*time.Second, func() bool {
				w, _ := row(i)
				return w.ReplicasInFlight == 1 && w.InFlight == 0
			})
		}
		if w, _ := row(0); w.InFlight != 1 || w.ReplicasInFlight != 0 {
			t.Fatalf("replica 1's own view of slow1: %+v", w)
		}
		select {
		case body := <-streamed:
			if resp.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") {
				t.Fatalf("the stream: %d, ends %q", resp.StatusCode, body[max(0, len(body)-60):])
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the stream did not end within 20 s")
		}
		for _, i := range []int{1, 2} {
			eventually(t, fmt.Sprintf("replica %d sees it end", i+1), 2*time.Second, func() bool {
				w, _ := row(i)
				return w.ReplicasInFlight == 0
			})
		}
	})

	t.Run("etcd stopped: requests flow, admin writes 503; restarted: a PUT goes through and all converge", func(t *testing.T) {
		etag := c.etag(t, 0)
		c.etcd.Stop()
		for i := range 3 {
			eventually(t, fmt.Sprintf("replica %d reports the store down", i+1), 5*time.Second, func() bool {
				return metricSum(t, c.base(i), "tlgw_config_store_up") == 0
			})
			if r, b := c.complete(t, i, "chat", "still serving"); r.StatusCode != 200 {
				t.Fatalf("replica %d during the outage: %d %s", i+1, r.StatusCode, b)
			}
			r, b := c.do(t, i, "PUT", "/admin/v1/routes", etag, twoRoutes)
			if r.StatusCode != 503 || !strings.Contains(b, "config_store_unavailable") || strings.Contains(b, c.etcd.Endpoint()) {
				t.Fatalf("replica %d PUT during the outage: %d %s", i+1, r.StatusCode, b)
			}
			if r, b := c.do(t, i, "POST", "/admin/v1/models/big:drain", "", ""); r.StatusCode != 503 {
				t.Fatalf("replica %d drain during the outage: %d %s", i+1, r.StatusCode, b)
			}
		}
		c.etcd.Restart()
		eventually(t, "replica 1 reconnects", 15*time.Second, func() bool {
			return metricSum(t, c.base(0), "tlgw_config_store_up") == 1
		})
		r, b := c.do(t, 0, "PUT", "/admin/v1/routes", etag, twoRoutes)
		if r.StatusCode != 200 {
			t.Fatalf("PUT after etcd returned: %d %s", r.StatusCode, b)
		}
		next := r.Header.Get("ETag")
		for i := range 3 {
			eventually(t, fmt.Sprintf("replica %d converges", i+1), 15*time.Second, func() bool { return c.etag(t, i) == next })
		}
	})

	t.Run("a killed replica leaves /admin/v1/replicas within the lease TTL", func(t *testing.T) {
		if err := c.replicas[2].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-c.replicas[2].Exited()
		killed := time.Now()
		for i := range 2 {
			eventually(t, fmt.Sprintf("replica %d drops gw-3", i+1), 4*time.Second, func() bool {
				return slices.Equal(c.replicaIDs(t, i), []string{"gw-1", "gw-2"})
			})
		}
		if d := time.Since(killed); d > 3*time.Second {
			t.Fatalf("gw-3 left after %v; lease TTL 2 s", d)
		}
		req, _ := http.NewRequest("POST", c.base(0)+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"x","max_tokens":1}`))
		req.Header.Set("Authorization", "Bearer sk-limited")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("x-ratelimit-limit-requests"); got != "4" {
			t.Fatalf("limit %q with two replicas, want ⌈7/2⌉ = 4", got)
		}
	})
}
