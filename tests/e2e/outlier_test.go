package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// ejections is the worker listing by id.
func (f *fleet) ejections(t *testing.T) map[string]workerRow {
	t.Helper()
	rows := make(map[string]workerRow)
	for _, w := range f.workers(t) {
		rows[w.ID] = w
	}
	return rows
}

// complete sends one non-streamed completion and returns its status and the worker that served
// it (X-TL-Route: the fleet's key has the debug scope).
func (f *fleet) complete(t *testing.T, prompt string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", f.base+"/v1/completions", strings.NewReader(
		fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":4}`, prompt)))
	req.Header.Set("Authorization", "Bearer "+f.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-TL-Route")
}

const outlierConfig = fastHeartbeats + `
route_policy = "affinity"

[gateway.outlier]
consecutive_failures = 3
base_ejection = "2s"
max_ejection = "8s"
max_ejected_percent = 50

[[auth.keys]]
key = "sk-ops"
scopes = ["inference", "admin", "debug"]
`

// TestOutlierEjectsAnAlways503Engine (R14.2): an engine that answers 503 to everything next to a
// healthy one. Every request is answered 200 by the healthy one (failover); once the broken
// engine has failed consecutive_failures = 3 times it is ejected (listed with ejected_until and
// ejection_reason 5xx, counted in tlgw_outlier_ejections_total) and gets no request until its
// ejection ends; then it is tried again.
func TestOutlierEjectsAnAlways503Engine(t *testing.T) {
	f := startFleetWithKey(t, "sk-ops", outlierConfig,
		[]string{"f-503", "--model", "smol", "--fault", "503"},
		[]string{"f-ok", "--model", "smol"})
	badBase := "http://" + f.engines["f-503"].HTTPAddr
	failures := func() float64 { return metricSum(t, badBase, "tlengine_requests_total", `code="503"`) }
	const bound = 60
	i := 0
	for ; i < bound && failures() < 3; i++ {
		// R19: each failure counts as load on f-503 for a second, over the bounded-load cap of
		// an idle pool: wait for it to decay, so f-503 gets the requests it owns again.
		eventually(t, "f-503's failure load decayed", 5*time.Second, func() bool { return f.ejections(t)["f-503"].FailureLoad == 0 })
		if code, w := f.complete(t, fmt.Sprintf("outlier %d", i)); code != 200 || w != "f-ok" {
			t.Fatalf("request %d: %d from %q, want 200 from f-ok", i, code, w)
		}
	}
	if n := failures(); n != 3 {
		t.Fatalf("after %d requests the broken engine failed %v times, want exactly 3", i, n)
	}
	start := time.Now()
	row := f.ejections(t)["f-503"]
	if row.Routable || row.EjectionReason != "5xx" || row.EjectedUntil == nil ||
		row.EjectedUntil.Before(start.Add(time.Second)) || row.EjectedUntil.After(start.Add(2500*time.Millisecond)) {
		t.Fatalf("after 3 failures: %+v, want ejected for ~2s with reason 5xx", row)
	}
	if ok := f.ejections(t)["f-ok"]; !ok.Routable || ok.EjectedUntil != nil || ok.EjectionReason != "" {
		t.Fatalf("the healthy worker: %+v", ok)
	}
	if n := metricSum(t, f.base, "tlgw_outlier_ejections_total", `reason="5xx"`); n != 1 {
		t.Fatalf("tlgw_outlier_ejections_total{reason=\"5xx\"} = %v, want 1", n)
	}
	failoversBefore := metricSum(t, f.base, "tlgw_failovers_total")
	for j := range 20 {
		if time.Since(start) > 1500*time.Millisecond {
			break // keep clear of the ejection's end
		}
		if code, w := f.complete(t, fmt.Sprintf("while ejected %d", j)); code != 200 || w != "f-ok" {
			t.Fatalf("request %d while ejected: %d from %q", j, code, w)
		}
	}
	if n := failures(); n != 3 {
		t.Fatalf("the ejected engine got requests: %v failures, want still 3", n)
	}
	if n := metricSum(t, f.base, "tlgw_failovers_total") - failoversBefore; n != 0 {
		t.Fatalf("%v failovers while the broken engine was ejected, want 0", n)
	}
	eventually(t, "the ejection ends", 5*time.Second, func() bool { return f.ejections(t)["f-503"].Routable })
	if took := time.Since(start); took < time.Second {
		t.Fatalf("the ejection ended after %v, want about base_ejection (2s)", took)
	}
	for j := 0; j < bound && failures() == 3; j++ {
		if code, _ := f.complete(t, fmt.Sprintf("after %d", j)); code != 200 {
			t.Fatalf("request %d after the ejection: %d", j, code)
		}
	}
	if n := failures(); n <= 3 {
		t.Fatalf("the engine was not tried again after its ejection (%v failures)", n)
	}
}

// TestOutlierKeepsOneOfTwoFailingWorkers (R14.2): with 2 of 2 workers failing and
// max_ejected_percent = 50, only one is ever ejected at a time; clients get 503 no_capacity.
func TestOutlierKeepsOneOfTwoFailingWorkers(t *testing.T) {
	// Ejections long enough that none ends during the test.
	f := startFleetWithKey(t, "sk-ops", strings.Replace(strings.Replace(outlierConfig, `"2s"`, `"30s"`, 1), `"8s"`, `"60s"`, 1),
		[]string{"f-bad1", "--model", "smol", "--fault", "503"},
		[]string{"f-bad2", "--model", "smol", "--fault", "503"})
	failed := func(id string) float64 {
		return metricSum(t, "http://"+f.engines[id].HTTPAddr, "tlengine_requests_total", `code="503"`)
	}
	// Both streaks reach 3 on the first three requests (each tries both workers): one worker is
	// ejected, the other's request is refused by the cap. The other then fails alone, and its
	// second streak (6 failures) is refused too.
	most := func() float64 { return max(failed("f-bad1"), failed("f-bad2")) }
	for i := 0; i < 40 && most() < 6; i++ {
		if code, _ := f.complete(t, fmt.Sprintf("both bad %d", i)); code != 503 {
			t.Fatalf("request %d: %d, want 503", i, code)
		}
		ejected := 0
		for _, r := range f.ejections(t) {
			if r.EjectedUntil != nil {
				ejected++
			}
		}
		if ejected > 1 {
			t.Fatalf("after request %d: %d of 2 workers ejected, want at most 1", i, ejected)
		}
	}
	if min(failed("f-bad1"), failed("f-bad2")) != 3 || most() != 6 {
		t.Fatalf("failures: f-bad1 %v, f-bad2 %v; want 3 (then ejected) and 6 (two refused streaks)", failed("f-bad1"), failed("f-bad2"))
	}
	ejected := 0
	for _, r := range f.ejections(t) {
		if r.EjectedUntil != nil && r.EjectionReason == "5xx" {
			ejected++
		}
	}
	if ejected != 1 {
		t.Fatalf("%d workers ejected, want exactly 1", ejected)
	}
	if n := metricSum(t, f.base, "tlgw_outlier_ejections_total"); n != 1 {
		t.Fatalf("tlgw_outlier_ejections_total = %v, want 1 (the other worker's streak was refused)", n)
	}
}
