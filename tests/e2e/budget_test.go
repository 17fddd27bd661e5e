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

	"github.com/tlgw/tlgw/internal/gwtest"
)

// budgetAnswer is what a client of the retry-budget test got.
type budgetAnswer struct {
	status int
	code   string // the error code of an error answer
	route  string // X-TL-Route
	err    error
}

// TestRetryBudgetCapsFailovers (R14.3): a tlgw process with retry_budget_percent = 4 and
// outlier ejection off, an always-503 engine (a-503) and a healthy one (b-ok) for smol, and a
// healthy engine (c-big) for big. Under least_outstanding an idle fleet picks a-503 first (the
// smallest id), so every failure is an a-503 answer and every failover goes on to b-ok.
//
// Without pressure, requests one at a time and a burst of 3 (the budget's floor) all fail
// over and get b-ok's 200: as many failovers as a-503 answers, no budget spent.
//
// Under a burst, b-ok is SIGSTOPped first, so every request that fails over stays parked on it
// holding its failover slot until the test SIGCONTs it: the failovers granted are then all
// running at once, and the count the metrics give (tlgw_failovers_total minus
// tlgw_retry_budget_exhausted_total) is the peak number of concurrent failovers. A burst of 48
// smol requests (budget max(3, 4% of ≤ 48 in flight) = 3) gets exactly 3 failovers; every
// other failure is answered 503 no_capacity and counted as budget spent. With 100 big requests
// parked on a SIGSTOPped c-big, a burst of 20 (budget max(3, 4% of 101..120) = 4) gets exactly
// 4. (100 parked, not more: a stopped engine accepts no connection, so every parked request
// sits in its listener's accept queue, which a host may cap at 128.) A request can only avoid
// a-503 when the router sees more load on a-503 than on b-ok (its failures count as load, R19,
// as b-ok's parked requests do), which takes as many requests sent to a-503, so at least half
// of each burst fails: always more failures than the budget. After SIGCONT the parked requests
// get b-ok's 200, and every in-flight count returns to 0.
func TestRetryBudgetCapsFailovers(t *testing.T) {
	f := startFleetWithKey(t, "sk-ops", `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
# A SIGSTOPped engine stays registered for the whole test (50 s without heartbeats).
heartbeat_interval = "500ms"
heartbeat_miss_limit = 100
retry_budget_percent = 4

[gateway.outlier]
consecutive_failures = 0

[[auth.keys]]
key = "sk-ops"
scopes = ["inference", "admin", "debug"]
`,
		[]string{"a-503", "--model", "smol", "--fault", "503", "--log-level", "error"},
		[]string{"b-ok", "--model", "smol", "--log-level", "error"},
		[]string{"c-big", "--model", "big", "--log-level", "error"})
	a503 := "http://" + f.engines["a-503"].HTTPAddr
	for _, id := range []string{"b-ok", "c-big"} {
		p := f.engines[id]
		// Cleanups run last-registered first: a stopped engine is continued before it is stopped.
		t.Cleanup(func() { _ = p.Cmd.Process.Signal(syscall.SIGCONT) })
	}
	// stop and cont return once every thread of the engine is stopped, or running again: a
	// SIGSTOP takes effect a little after kill returns, time enough for a few answers.
	stop := func(id string) { t.Helper(); f.engines[id].Stop(t) }
	cont := func(id string) { t.Helper(); f.engines[id].Cont(t) }

	// The clients' timeout is far above everything the test waits for.
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	send := func(model string, i int) budgetAnswer {
		body := fmt.Sprintf(`{"model":%q,"prompt":"retry budget %s %d","max_tokens":4}`, model, model, i)
		req, _ := http.NewRequest("POST", f.base+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk-ops") // the debug scope: X-TL-Route
		resp, err := hc.Do(req)
		if err != nil {
			return budgetAnswer{err: err}
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		a := budgetAnswer{status: resp.StatusCode, route: resp.Header.Get("X-TL-Route"), err: err}
		if resp.StatusCode != 200 {
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			a.code = e.Error.Code
		}
		return a
	}
	burst := func(model string, from, n int) <-chan budgetAnswer {
		out := make(chan budgetAnswer, n)
		for i := 0; i < n; i++ {
			go func(i int) { out <- send(model, i) }(from + i)
		}
		return out
	}
	// receive takes n answers off c, failing the test if they do not all come within d.
	receive := func(c <-chan budgetAnswer, n int, d time.Duration) []budgetAnswer {
		t.Helper()
		timeout := time.After(d)
		var out []budgetAnswer
		for len(out) < n {
			select {
			case a := <-c:
				out = append(out, a)
			case <-timeout:
				t.Fatalf("%d of %d answers within %v", len(out), n, d)
			}
		}
		return out
	}
	admin := &http.Client{Timeout: 10 * time.Second}
	// loads returns each worker's in-flight count and failure load (R19).
	loads := func() (map[string]int64, map[string]int64) {
		req, _ := http.NewRequest("GET", f.base+"/admin/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer sk-ops")
		var out struct {
			Workers []struct {
				ID          string `json:"id"`
				InFlight    int64  `json:"in_flight"`
				FailureLoad int64  `json:"failure_load"`
			} `json:"workers"`
		}
		gwtest.DoJSON(t, admin, req, &out)
		m, fails := map[string]int64{}, map[string]int64{}
		for _, w := range out.Workers {
			m[w.ID], fails[w.ID] = w.InFlight, w.FailureLoad
		}
		return m, fails
	}
	inFlight := func() map[string]int64 { m, _ := loads(); return m }
	// idle waits for the router's view (which GET /admin/v1/workers shows) to have nothing in
	// flight and no failure load (R19: a-503's failures count as load for a few seconds, and
	// the test wants an idle fleet to pick a-503 first). A request gives its failover slot
	// back before its in-flight counts, so then no slot is held either.
	idle := func() {
		t.Helper()
		eventually(t, "every in-flight count and failure load back to 0", 15*time.Second, func() bool {
			m, fails := loads()
			for id, n := range m {
				if n != 0 || fails[id] != 0 {
					return false
				}
			}
			return true
		})
	}
	type counters struct{ failovers, spent, a503, answered503 float64 }
	read := func() counters {
		return counters{
			failovers:   metricSum(t, f.base, "tlgw_failovers_total"),
			spent:       metricSum(t, f.base, "tlgw_retry_budget_exhausted_total"),
			a503:        metricSum(t, a503, "tlengine_requests_total", `code="503"`),
			answered503: metricSum(t, f.base, "tlgw_requests_total", `code="503"`),
		}
	}
	delta := func(before counters) counters {
		now := read()
		return counters{now.failovers - before.failovers, now.spent - before.spent, now.a503 - before.a503,
			now.answered503 - before.answered503}
	}
	served := func(what string, answers []budgetAnswer) {
		t.Helper()
		for i, a := range answers {
			if a.err != nil || a.status != 200 || a.route != "b-ok" {
				t.Fatalf("%s, answer %d: %d %q from %q (%v), want 200 from b-ok", what, i, a.status, a.code, a.route, a.err)
			}
		}
	}

	// No pressure, one at a time: each request fails on a-503 and fails over to b-ok. The
	// router learns of released counts asynchronously, so each request waits for an idle view.
	const sequential = 4
	before := read()
	for i := 0; i < sequential; i++ {
		idle()
		served(fmt.Sprintf("request %d alone", i), []budgetAnswer{send("smol", i)})
	}
	if d := delta(before); d.failovers != sequential || d.a503 != sequential || d.spent != 0 || d.answered503 != 0 {
		t.Fatalf("%d requests one at a time: %+v, want %d failovers (one per a-503 answer) and no budget spent", sequential, d, sequential)
	}
	// No pressure, a burst of 3 (the floor): every failure fails over.
	idle()
	before = read()
	served("a burst of 3", receive(burst("smol", 100, 3), 3, 20*time.Second))
	if d := delta(before); d.failovers < 1 || d.failovers != d.a503 || d.spent != 0 || d.answered503 != 0 {
		t.Fatalf("a burst of 3: %+v, want ≥ 1 failover, one per a-503 answer, and no budget spent", d)
	}

	// pressure runs a burst of n smol requests (none in flight before) with b-ok stopped and
	// checks that exactly budget failovers were granted and every other failure was answered
	// 503 no_capacity.
	pressure := func(what string, from, n, budget int) {
		t.Helper()
		before := read()
		stop("b-ok")
		answers := burst("smol", from, n)
		// Wait until every request is answered (and counted: the gateway counts an answer in
		// tlgw_requests_total just after writing it) or parked on b-ok: then no failover is
		// running except the parked ones. The router's view may briefly count a pick it is
		// given back, so the state must hold for 20 polls in a row.
		var early []budgetAnswer
		stable := 0
		deadline := time.Now().Add(20 * time.Second)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for stable < 20 {
			for len(answers) > 0 && len(early) < n {
				early = append(early, <-answers)
			}
			m, d := inFlight(), delta(before)
			if m["a-503"] == 0 && int64(len(early))+m["b-ok"] == int64(n) && d.answered503 == float64(len(early)) {
				stable++
			} else {
				stable = 0
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not settled after 20s: %d answered %+v, in flight %v, counters %+v", what, len(early), early, m, d)
			}
			<-tick.C
		}
		d := delta(before)
		parked := inFlight()["b-ok"]
		granted := d.failovers - d.spent
		t.Logf("%s: %d requests, %v failures, %v failovers granted (budget %d), %v answered 503 (budget spent), %d parked on b-ok",
			what, n, d.failovers, granted, budget, d.spent, parked)
		for i, a := range early {
			if a.err != nil || a.status != 503 || a.code != "no_capacity" {
				t.Fatalf("%s: early answer %d: %d %q (%v), want 503 no_capacity", what, i, a.status, a.code, a.err)
			}
		}
		if d.failovers != d.a503 {
			t.Fatalf("%s: %v failures counted for %v a-503 answers", what, d.failovers, d.a503)
		}
		if granted != float64(budget) {
			t.Fatalf("%s: %v failovers ran at once, want exactly the budget %d", what, granted, budget)
		}
		if d.spent < 1 || d.spent != float64(len(early)) || d.answered503 != d.spent {
			t.Fatalf("%s: %v budget spent, %d early answers, %v answered 503: want them equal and ≥ 1", what, d.spent, len(early), d.answered503)
		}
		if parked < int64(budget) || parked+int64(len(early)) != int64(n) {
			t.Fatalf("%s: %d parked and %d answered of %d", what, parked, len(early), n)
		}
		if 2*d.failovers < float64(n) {
			t.Fatalf("%s: %v failures of %d requests, want at least half", what, d.failovers, n)
		}
		cont("b-ok")
		served(what+", parked requests", receive(answers, n-len(early), 20*time.Second))
	}

	idle()
	pressure("a burst of 48", 200, 48, 3)
	idle()

	// 100 big requests parked on a stopped c-big raise the in-flight count: 4% of 101..120
	// is 4 failovers at once.
	const bigParked = 100
	stop("c-big")
	big := burst("big", 0, bigParked)
	parkedBig := func() bool { return inFlight()["c-big"] == bigParked }
	for deadline := time.Now().Add(20 * time.Second); !parkedBig(); {
		if time.Now().After(deadline) {
			// Say where the requests went: answered early (how) or never counted.
			var early []budgetAnswer
			for len(big) > 0 {
				early = append(early, <-big)
			}
			t.Fatalf("%d big requests not parked on c-big after 20s: in flight %v, %d answered early %+v, budget counters %+v",
				bigParked, inFlight(), len(early), early, read())
		}
		<-time.After(10 * time.Millisecond)
	}
	pressure("a burst of 20 over 100 parked", 300, 20, 4)
	cont("c-big")
	bigAnswers := receive(big, bigParked, 30*time.Second)
	for i, a := range bigAnswers {
		if a.err != nil || a.status != 200 || a.route != "c-big" {
			t.Fatalf("parked big request %d: %d %q from %q (%v)", i, a.status, a.code, a.route, a.err)
		}
	}
	idle()
}
