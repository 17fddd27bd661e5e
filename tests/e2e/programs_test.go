package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestThunderagentPausesUnderKVPressure (R15.1): two tlengine workers whose KV holds 1,024
// tokens each (64 blocks of 16), the thunderagent classifier, four agent sessions of about 345
// tokens each (two per worker). One session's next turn grows to about 800 tokens: it goes on
// on its worker (a continuing program is never held for room) and the program acting beside it
// is paused (tlgw_program_pauses_total, a paused program in GET /admin/v1/programs). That
// program's next turn still completes — resumed when room comes back (the grown program's
// acting tokens decay), or forced after resume_timeout — and every turn is answered 200.
func TestThunderagentPausesUnderKVPressure(t *testing.T) {
	f := startFleetWithKey(t, "sk-ops", fastHeartbeats+`
[admission]
recheck = "200ms"
classifier = { type = "thunderagent", buffer_per_program = 16, resume_timeout = "5s", session_retention = "1m" }

[[auth.keys]]
key = "sk-ops"
scopes = ["inference", "admin", "debug"]
`,
		[]string{"e1", "--model", "smol", "--kv-blocks", "64", "--block-size", "16", "--log-level", "error"},
		[]string{"e2", "--model", "smol", "--kv-blocks", "64", "--block-size", "16", "--log-level", "error"})
	hc := &http.Client{Timeout: 60 * time.Second}
	turn := func(session string, promptBytes int) (int, string) {
		prompt := strings.Repeat("plan the next tool call. ", promptBytes/25)
		req, _ := http.NewRequest("POST", f.base+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":8}`, prompt)))
		req.Header.Set("Authorization", "Bearer sk-ops")
		req.Header.Set("X-Session-ID", session)
		resp, err := hc.Do(req)
		if err != nil {
			t.Errorf("%s: %v", session, err)
			return 0, ""
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", session, resp.StatusCode, b)
		}
		return resp.StatusCode, resp.Header.Get("X-TL-Route")
	}
	type programs struct {
		Classifier string `json:"classifier"`
		Programs   []struct {
			State  string `json:"state"`
			Worker string `json:"worker"`
			Tokens int    `json:"tokens"`
		} `json:"programs"`
	}
	list := func() programs {
		req, _ := http.NewRequest("GET", f.base+"/admin/v1/programs", nil)
		req.Header.Set("Authorization", "Bearer sk-ops")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p programs
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, s := range []string{"s1", "s2", "s3", "s4"} {
		turn(s, 1200)
	}
	p := list()
	perWorker := map[string]int{}
	for _, pr := range p.Programs {
		if pr.State != "acting" || pr.Tokens < 300 {
			t.Fatalf("after the first turns: %+v", p)
		}
		perWorker[pr.Worker]++
	}
	if p.Classifier != "thunderagent" || len(p.Programs) != 4 || perWorker["e1"] != 2 || perWorker["e2"] != 2 {
		t.Fatalf("programs %+v: want four acting, two per worker", p)
	}
	big := make(chan int, 1)
	go func() { code, _ := turn("s1", 2800); big <- code }()
	sawPaused := false
	eventually(t, "a program paused by the grown one", 20*time.Second, func() bool {
		for _, pr := range list().Programs {
			sawPaused = sawPaused || pr.State == "paused"
		}
		return sawPaused && metricSum(t, f.base, "tlgw_program_pauses_total") >= 1
	})
	// Every session's next turn completes, the paused one's too.
	done := make(chan int, 3)
	for _, s := range []string{"s2", "s3", "s4"} {
		go func(s string) { code, _ := turn(s, 1300); done <- code }(s)
	}
	timeout := time.After(30 * time.Second)
	for i := 0; i < 4; i++ {
		var code int
		select {
		case code = <-big:
		case code = <-done:
		case <-timeout:
			req, _ := http.NewRequest("GET", f.base+"/admin/v1/queue", nil)
			req.Header.Set("Authorization", "Bearer sk-ops")
			resp, err := hc.Do(req)
			var q []byte
			if err == nil {
				q, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			t.Logf("gateway stderr:\n%s", f.gw.Logs())
			t.Fatalf("%d of 4 turns answered within 30 s; programs %+v; queue %s", i, list(), q)
		}
		if code != 200 {
			t.Fatalf("a turn answered %d", code)
		}
	}
	t.Logf("pauses %v, forced resumes %v", metricSum(t, f.base, "tlgw_program_pauses_total"),
		metricSum(t, f.base, "tlgw_program_forced_resumes_total"))
}
