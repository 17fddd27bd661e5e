package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/proctest"
)

// preciseConfig is a gateway routing by what the engines report they hold (R18.2, R18.3).
const preciseConfig = fastHeartbeats + `route_policy = "precise_prefix"
`

// engineMetric reads one unlabelled sample from an engine's /metrics.
func engineMetric(t *testing.T, p *proctest.Proc, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("%s not on %s/metrics", name, p.HTTPAddr)
	return 0
}

func complete(t *testing.T, base, prompt string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":1,"seed":1}`, prompt)
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", base, resp.StatusCode, b)
	}
}

// TestPrecisePrefixFollowsEngineCaches: with route_policy = "precise_prefix" the gateway
// subscribes to both engines' KvEvents. A long prompt warmed directly on engine pb (the larger
// id, so a tie or the least-loaded fallback would pick pa) is routed to pb when repeated
// through the gateway, which pb serves from its cache. After pb is killed and started again
// under the same id, its broken stream clears it from the index: the next repeat goes to pa.
func TestPrecisePrefixFollowsEngineCaches(t *testing.T) {
	const lookups, hits = "tlengine_prefix_cache_lookup_tokens_total", "tlengine_prefix_cache_hit_tokens_total"
	f := startFleet(t, preciseConfig, []string{"pa", "--model", "smol"}, []string{"pb", "--model", "smol"})
	prompt := strings.Repeat("A long shared system prompt that only one engine has cached so far. ", 60)

	complete(t, "http://"+f.engines["pb"].HTTPAddr, prompt) // warmed on pb, behind the gateway's back
	pbHits := engineMetric(t, f.engines["pb"], hits)
	// pb's STORED reaches the router (its stream, then an actor message).
	eventually(t, "the gateway's exact index holds pb's chunks", 5*time.Second, func() bool {
		return metricSum(t, f.base, "tlgw_kv_index_entries") > 0
	})

	complete(t, f.base, prompt)
	if got := engineMetric(t, f.engines["pa"], lookups); got != 0 {
		t.Fatalf("the repeat went to pa (%v prompt tokens looked up there), not to pb which holds it", got)
	}
	if got := engineMetric(t, f.engines["pb"], hits); got <= pbHits {
		t.Fatalf("pb served the repeat without a cache hit (%v hit tokens, %v before)", got, pbHits)
	}

	// pb restarts: killed, then started again under its id (new ports, an empty cache).
	old := f.engines["pb"]
	if err := old.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.Exited()
	f.engines["pb"] = proctest.StartEngine(t, tlengineBin, "--id", "pb", "--gateway", f.gw.GRPCAddr, "--model", "smol")
	// Its heartbeat names the new address, the subscription moves there, and the new process's
	// CLEARED and empty snapshot leave nothing of the old one in the index.
	newHTTP := f.engines["pb"].HTTPAddr
	eventually(t, "pb back at its new address, its old chunks gone from the index", 5*time.Second, func() bool {
		var out struct {
			Workers []struct {
				ID        string `json:"id"`
				Routable  bool   `json:"routable"`
				Addresses struct {
					HTTP string `json:"http"`
				} `json:"addresses"`
			} `json:"workers"`
		}
		gwtest.GetJSON(t, f.base+"/admin/v1/workers", &out)
		back := false
		for _, w := range out.Workers {
			back = back || (w.ID == "pb" && w.Routable && w.Addresses.HTTP == newHTTP)
		}
		return back && metricSum(t, f.base, "tlgw_kv_index_entries") == 0
	})

	complete(t, f.base, prompt)
	if got := engineMetric(t, f.engines["pa"], lookups); got == 0 {
		t.Fatal("after pb's restart the repeat still went to pb: the index kept what the old process held")
	}
}

// openStream starts a streamed completion through the gateway and returns once its first
// event has come (the request is in flight on its engine); closing the body ends it.
func openStream(t *testing.T, base, prompt string) io.ReadCloser {
	t.Helper()
	body := fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":400,"seed":1,"stream":true}`, prompt)
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		resp.Body.Close()
		t.Fatalf("stream: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp.Body
}

// TestPrefixWarmupCopiesAheadOfTheSpill: a 14 KB prompt is cached on pb only. Two streams of it
// through the gateway both go to pb, and the second leaves pb at the bounded-load cap
// (⌈1.25·3/2⌉ = 2) with no other holder: the router reserves pa for a warm-up, and the
// gateway sends pa a one-token completion of the prompt's first chunks. pa's engine reports
// them, so the third request, which pb at the cap cannot take, goes to pa for its prefix and
// is served from pa's cache.
func TestPrefixWarmupCopiesAheadOfTheSpill(t *testing.T) {
	const lookups, hits = "tlengine_prefix_cache_lookup_tokens_total", "tlengine_prefix_cache_hit_tokens_total"
	slow := []string{"--model", "smol", "--decode-per-token", "10ms"} // a 400-token stream runs 4 s
	f := startFleet(t, preciseConfig, append([]string{"pa"}, slow...), append([]string{"pb"}, slow...))
	prompt := strings.Repeat("A long shared system prompt that only one engine has cached so far. ", 200)

	complete(t, "http://"+f.engines["pb"].HTTPAddr, prompt)
	var pbChunks float64
	eventually(t, "the gateway's exact index holds pb's chunks", 5*time.Second, func() bool {
		pbChunks = metricSum(t, f.base, "tlgw_kv_index_entries")
		return pbChunks > 200
	})
	openStream(t, f.base, prompt)
	openStream(t, f.base, prompt)
	if got := engineMetric(t, f.engines["pa"], hits); got != 0 {
		t.Fatalf("pa served a stream (%v hit tokens): both should be on pb", got)
	}
	eventually(t, "the warm-up ran on pa and pa's engine reported its chunks", 5*time.Second, func() bool {
		return metricSum(t, f.base, "tlgw_prefix_warmups_sent_total", `result="ok"`) == 1 &&
			metricSum(t, f.base, "tlgw_kv_index_entries") >= 2*pbChunks-2 // pb's and (but its last two) pa's
	})
	if got := metricSum(t, f.base, "tlgw_prefix_warmups_total"); got != 1 {
		t.Fatalf("tlgw_prefix_warmups_total = %v, want 1", got)
	}
	paLookups, paHits := engineMetric(t, f.engines["pa"], lookups), engineMetric(t, f.engines["pa"], hits)
	complete(t, f.base, prompt) // pb is at the cap
	if got := engineMetric(t, f.engines["pa"], lookups); got <= paLookups {
		t.Fatal("the third request did not go to pa")
	}
	if got := engineMetric(t, f.engines["pa"], hits) - paHits; got < 0.9*paLookups {
		t.Fatalf("pa served the third request with %v tokens from its cache; its warm-up prefilled %v", got, paLookups)
	}
}
