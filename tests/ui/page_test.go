package ui

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tlgw/tlgw/internal/proctest"
)

// chromiumPath is Debian's chromium package; the test needs it and says so when it is missing.
const chromiumPath = "/usr/bin/chromium"

const adminKey = "sk-ui-admin"

// config: fast heartbeats (evicted after 3 × 200ms), a route, and an admission queue whose
// workers are full at one request each, so a burst waits in the queue.
const config = `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3

[[gateway.routes]]
model = "chat"
aliases = ["assistant"]
backends = [{ model = "smol", weight = 1 }]

[admission]
busy_threshold = 1
default_class = "interactive"
classes = [
  { name = "interactive", quantum = 3, queue_limit = 100, max_wait = "60s", priority = 1 },
  { name = "batch", quantum = 1, queue_limit = 20, max_wait = "60s" },
]

[[auth.keys]]
key = "` + adminKey + `"
scopes = ["admin"]

[[auth.keys]]
key = "sk-ui-interactive"
scopes = ["inference"]

[[auth.keys]]
key = "sk-ui-batch"
scopes = ["inference"]
class = "batch"
`

// hostileID is a worker id an engine may send: the page must show it as text.
const hostileID = `w3<img src=x onerror="window.pwned=1">`

// engineArgs: prefill costs 2ms per uncached prompt token, so a request with a prompt of
// ~1500 tokens holds its worker for about 3 s; a small KV pool makes its use visible.
var engineArgs = []string{"--model", "smol", "--prefill-per-token", "2ms", "--decode-per-token", "10ms", "--kv-blocks", "256"}

// TestOperatorPage (R17.1): the page asks for a key, lists every worker once the admin key is
// typed into it, drops a killed engine within its heartbeat deadline plus a margin, shows a
// burst waiting in its class's lane, and renders engine-supplied ids as text.
func TestOperatorPage(t *testing.T) {
	gw := proctest.StartTLGW(t, tlgwBin, config)
	base := "http://" + gw.HTTPAddr
	engines := map[string]*proctest.Proc{}
	ids := []string{"w1", "w2", hostileID}
	for _, id := range ids {
		args := append([]string{"--id", id, "--gateway", gw.GRPCAddr}, engineArgs...)
		engines[id] = proctest.StartEngine(t, tlengineBin, args...)
	}
	slices.Sort(ids)

	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui")); err != nil {
		t.Fatalf("opening %s/ui: %v", base, err)
	}
	// Without a key the admin API answers 401 and the page asks for one.
	waitPage(t, ctx, "the key prompt", 10*time.Second, `document.body.dataset.auth`, func(v string) bool { return v == "needed" })
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#key"), adminKey), chromedp.Click(chromedp.CSS("#usekey"))); err != nil {
		t.Fatalf("typing the admin key: %v", err)
	}
	const listed = `Array.from(document.querySelectorAll("#workers tbody tr[data-id]"), r => r.dataset.id).sort()`
	waitPage(t, ctx, fmt.Sprintf("workers %q listed", ids), 10*time.Second, listed, func(v []string) bool { return slices.Equal(v, ids) })

	// The key stays in the tab: sessionStorage only, no localStorage, no cookie.
	kept := run[string](t, ctx, `JSON.stringify([sessionStorage.getItem("tlgw.adminKey"), localStorage.length, document.cookie])`)
	if want := fmt.Sprintf(`[%q,0,""]`, adminKey); kept != want {
		t.Errorf("key storage [sessionStorage, localStorage.length, cookie] = %s, want %s", kept, want)
	}
	// The engine's id is text: its row shows it verbatim and no element came of it.
	hostile := fmt.Sprintf(`[%q,0,true]`, hostileID)
	waitPage(t, ctx, "the hostile worker id as text", 5*time.Second, `JSON.stringify([
		Array.from(document.querySelectorAll('#workers tr[data-id^="w3"] td.id > div:first-child'), d => d.textContent).join(),
		document.querySelectorAll("#workers img").length, window.pwned === undefined])`,
		func(v string) bool { return v == hostile })

	// Kill an engine: the page drops it once the gateway evicts it (3 × 200ms) plus a margin.
	victim := engines[hostileID]
	killed := time.Now()
	if err := victim.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.Exited()
	waitPage(t, ctx, "the killed worker gone", 3*200*time.Millisecond+5*time.Second, listed,
		func(v []string) bool { return slices.Equal(v, []string{"w1", "w2"}) })
	t.Logf("the page dropped the killed worker %v after SIGKILL", time.Since(killed).Round(10*time.Millisecond))

	// A burst larger than the two workers: the rest waits, and the page shows the lane heads.
	b := startBurst(t, base)
	for i := range 6 {
		b.send("sk-ui-interactive", fmt.Sprintf("ui-interactive-%d", i))
	}
	waitLane(t, ctx, "interactive", "ui-interactive-")
	for i := range 2 {
		b.send("sk-ui-batch", fmt.Sprintf("ui-batch-%d", i))
	}
	waitLane(t, ctx, "batch", "ui-batch-")

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.TempDir(), "ui.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot (%d bytes): %s", len(png), shot)
	if p := os.Getenv("TLGW_UI_SCREENSHOT"); p != "" {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatalf("TLGW_UI_SCREENSHOT: %v", err)
		}
		t.Logf("screenshot also written to %s", p)
	}
}

// TestOperatorPageOpenMode (R17.1, R13.3): with no keys configured the page needs none; its
// same-origin fetches to a loopback host pass the open mode's guard on the admin API. When the
// gateway dies, the status line shows the error.
func TestOperatorPageOpenMode(t *testing.T) {
	gw := proctest.StartTLGW(t, tlgwBin, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3
`)
	proctest.StartEngine(t, tlengineBin, "--id", "solo", "--model", "smol", "--gateway", gw.GRPCAddr)
	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+gw.HTTPAddr+"/ui")); err != nil {
		t.Fatal(err)
	}
	const state = `JSON.stringify([document.body.dataset.auth, document.body.dataset.health,
		Array.from(document.querySelectorAll("#workers tbody tr[data-id]"), r => r.dataset.id), document.getElementById("queue").textContent.includes("Admission is off")])`
	waitPage(t, ctx, "the worker listed in open mode", 10*time.Second, state, func(v string) bool {
		return v == `["open","ok",["solo"],true]`
	})
	// The gateway gone: the status line says so, and the page keeps polling.
	if err := gw.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-gw.Exited()
	waitPage(t, ctx, "the error in the status line", 5*time.Second,
		`JSON.stringify([document.body.dataset.health, document.getElementById("status").textContent])`,
		func(v string) bool {
			return strings.HasPrefix(v, `["error","error`) && strings.Contains(v, "all: gateway unreachable")
		})
}

// laneRow is one lane row of the page's queue section.
type laneRow struct {
	Class string   `json:"class"`
	State string   `json:"state"`
	Cells []string `json:"cells"` // kind, name, length, head request, tag, state, reason, waiting, until
}

// waitLane waits until the page shows a lane of class whose head is one of our requests.
func waitLane(t *testing.T, ctx context.Context, class, idPrefix string) {
	t.Helper()
	const lanes = `Array.from(document.querySelectorAll("#queue tr.lane"), r => ({
		class: r.closest(".qclass").dataset.name, state: r.dataset.state,
		cells: Array.from(r.cells, c => c.textContent)}))`
	rows := waitPage(t, ctx, fmt.Sprintf("a queued %s request in its lane", class), 15*time.Second, lanes, func(rows []laneRow) bool {
		for _, r := range rows {
			if r.Class == class && len(r.Cells) == 9 && strings.HasPrefix(r.Cells[3], idPrefix) && r.Cells[2] != "0" && r.State != "" {
				return true
			}
		}
		return false
	})
	t.Logf("queue lanes shown: %+v", rows)
}

// newBrowser starts headless Chromium for one test, bounded in time, and stops it on cleanup.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("this test drives headless Chromium at %s, which is missing (%v): install Debian's chromium package (apt-get install chromium)", chromiumPath, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1440, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return bctx
}

// run evaluates a script in the page, with a bounded wait.
func run[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := eval[T](ctx, js)
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

func eval[T any](ctx context.Context, js string) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](js))
}

// waitPage evaluates js in the page until ok accepts its value, for at most within (and a
// bounded number of polls), and fails with the last value and the page's status line.
func waitPage[T any](t *testing.T, ctx context.Context, what string, within time.Duration, js string, ok func(T) bool) T {
	t.Helper()
	const every = 50 * time.Millisecond
	deadline := time.Now().Add(within)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last T
	var lastErr error
	for polls := 0; ; polls++ {
		v, err := eval[T](ctx, js)
		if err == nil && ok(v) {
			return v
		}
		last, lastErr = v, err
		if time.Now().After(deadline) || polls > int(within/every)*2 {
			status, _ := eval[string](ctx, `document.getElementById("status").textContent`)
			t.Fatalf("the page did not show %s within %v: last %v (%v); status line %q", what, within, last, lastErr, status)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// burst sends completions that each hold a worker for a few seconds; cleanup cancels those
// still running and waits for them.
type burst struct {
	base string
	ctx  context.Context
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  map[string]int
}

func startBurst(t *testing.T, base string) *burst {
	ctx, cancel := context.WithCancel(context.Background())
	b := &burst{base: base, ctx: ctx, got: map[string]int{}}
	t.Cleanup(func() {
		cancel()
		b.wg.Wait()
		t.Logf("burst outcomes: %v", b.got)
	})
	return b
}

func (b *burst) send(key, id string) {
	// A distinct first word keeps the prefix cache from sharing the prompt.
	body := fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":8}`, id+strings.Repeat(" lorem", 1500))
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		outcome := "canceled"
		defer func() {
			b.mu.Lock()
			b.got[outcome]++
			b.mu.Unlock()
		}()
		req, err := http.NewRequestWithContext(b.ctx, "POST", b.base+"/v1/completions", strings.NewReader(body))
		if err != nil {
			outcome = err.Error()
			return
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Request-ID", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if b.ctx.Err() == nil {
				outcome = err.Error()
			}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		outcome = resp.Status
	}()
}

// chartPoints is what the page's history charts drew: per route, each chart's lines and their
// points (the figure's data-points).
type chartPoints struct {
	Route  string           `json:"route"`
	Charts []map[string]int `json:"charts"`
}

// TestHistoryCharts (R24): after a burst of requests the page draws the route's requests/s,
// TTFT and in-flight charts from GET /admin/v1/history with points on their lines (two samples, 5 s apart,
// give the first rate), as SVG built through the DOM under the page's unchanged CSP. With
// TLGW_UI_CHARTS_SCREENSHOT set, the page's screenshot is written there (docs/ui-charts.png).
func TestHistoryCharts(t *testing.T) {
	gw := proctest.StartTLGW(t, tlgwBin, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3

[[gateway.routes]]
model = "chat"
backends = [{ model = "smol", weight = 1 }]
`)
	base := "http://" + gw.HTTPAddr
	for _, id := range []string{"c1", "c2"} {
		proctest.StartEngine(t, tlengineBin, "--id", id, "--model", "smol", "--gateway", gw.GRPCAddr, "--decode-per-token", "2ms")
	}
	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "the page collecting history", 10*time.Second, `document.querySelector("#history .meta").textContent`,
		func(v string) bool { return strings.Contains(v, "every 5 s") })
	// Requests every 50 ms until the charts show them (at most 30 s: two or three samples).
	stop := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if n >= 1200 {
				continue
			}
			resp, err := http.Post(base+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"model":"chat","prompt":"chart %d","max_tokens":4}`, n)))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			n++
		}
	}()
	const drawn = `Array.from(document.querySelectorAll("#history .chartrow[data-route]"), r => ({
		route: r.dataset.route,
		charts: Array.from(r.querySelectorAll("figure"), f => JSON.parse(f.dataset.points))}))`
	rows := waitPage(t, ctx, "the chat route's charts with points", 30*time.Second, drawn, func(rows []chartPoints) bool {
		for _, r := range rows {
			if r.Route == "chat" && len(r.Charts) == 3 && r.Charts[0]["req"] > 0 && r.Charts[1]["p50"] > 0 && r.Charts[1]["p99"] > 0 &&
				r.Charts[2]["inflight"] > 0 {
				return true
			}
		}
		return false
	})
	shot := os.Getenv("TLGW_UI_CHARTS_SCREENSHOT")
	if shot != "" {
		// For the picture, the burst goes on until the charts hold a minute of samples.
		waitPage(t, ctx, "twelve samples", 90*time.Second, `parseInt(document.querySelector("#history .meta").textContent)`,
			func(n int) bool { return n >= 12 })
	}
	close(stop)
	t.Logf("charts drawn: %+v after %d requests", rows, <-sent)
	// Drawn as SVG elements built through the DOM.
	if n := run[int](t, ctx, `document.querySelectorAll("#history svg.chart polyline, #history svg.chart circle").length`); n == 0 {
		t.Fatal("no line drawn")
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if shot != "" {
		if err := os.WriteFile(shot, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s", shot)
	}
}

// rolloutRow is one row of the page's rollouts panel.
type rolloutRow struct {
	Route, Share, Status, Last string
}

// TestRolloutsPanel (R25): the page lists each rollout with its share, status and last
// decision, following the gateway (a 1 s window with no traffic holds at its first step).
func TestRolloutsPanel(t *testing.T) {
	gw := proctest.StartTLGW(t, tlgwBin, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"

[[gateway.routes]]
model = "chat"
rollout = { canary = "chat-v2", baseline = "chat-v1", steps = [10, 100], step_interval = "1s" }
`)
	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+gw.HTTPAddr+"/ui")); err != nil {
		t.Fatal(err)
	}
	const rows = `Array.from(document.querySelectorAll("#rollouts tbody tr[data-route]"), r => ({
		Route: r.dataset.route, Share: r.cells[2].textContent, Status: r.cells[4].textContent, Last: r.cells[5].textContent}))`
	got := waitPage(t, ctx, "the chat rollout held at 10%", 15*time.Second, rows, func(rs []rolloutRow) bool {
		return len(rs) == 1 && rs[0].Route == "chat" && rs[0].Share == "10%" && rs[0].Status == "running" && strings.HasPrefix(rs[0].Last, "hold")
	})
	t.Logf("rollouts shown: %+v", got)
}
