package e2e

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/proctest"
	"github.com/tlgw/tlgw/sim/engine"
)

// injectGap asks an engine to withhold its next KV event batch from its live subscribers.
func injectGap(t *testing.T, p *proctest.Proc) {
	t.Helper()
	resp, err := http.Post("http://"+p.HTTPAddr+engine.GapPath, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("%s: %d", engine.GapPath, resp.StatusCode)
	}
}

// TestEngineKVEventsOverZMQ (R22): a precise_prefix gateway ingests tlengine's vLLM-format KV
// events from an engine that connects to its [gateway.kv_events] listen address (za, no
// replay) and from one that binds and is dialled through its heartbeat's kv_events_endpoint
// (zb, with a replay endpoint answering in vLLM's shape). A gap on zb is filled by replay, one
// on za keeps its entries; zb killed and started again (same addresses) is forgotten: its seq going
// back (a restart resync) or, when it was evicted meanwhile, its first batch AllBlocksCleared.
func TestEngineKVEventsOverZMQ(t *testing.T) {
	listen := freeAddr(t)
	cfg := preciseConfig + `
[gateway.kv_events]
listen = "` + listen + `"
`
	zbArgs := []string{"zb", "--model", "smol", "--http-listen", freeAddr(t),
		"--kv-events", "zmq://" + freeAddr(t), "--kv-replay", freeAddr(t), "--kv-replay-topic=false", "--kv-events-format", "map"}
	f := startFleet(t, cfg,
		[]string{"za", "--model", "smol", "--kv-events", "zmq://" + listen, "--kv-events-bind=false"}, zbArgs)
	za, zb := f.engines["za"], f.engines["zb"]
	if za.KVEventsMode != "connect" || za.KVEventsAddr != listen || za.KVReplayAddr != "" ||
		zb.KVEventsMode != "bind" || !strings.HasPrefix(zb.KVEventsAddr, "127.0.0.1:") || zb.KVReplayAddr == "" {
		t.Fatalf("kv-events lines: za %s %s %q, zb %s %s %q", za.KVEventsMode, za.KVEventsAddr, za.KVReplayAddr,
			zb.KVEventsMode, zb.KVEventsAddr, zb.KVReplayAddr)
	}
	subscribed := func(p *proctest.Proc) func() bool {
		return func() bool { return engineMetric(t, p, "tlengine_kv_events_subscribers") == 1 }
	}
	eventually(t, "za connected to the gateway's listen address", 10*time.Second, subscribed(za))
	eventually(t, "the gateway subscribed to zb's endpoint", 10*time.Second, subscribed(zb))

	const events, resyncs = "tlgw_kv_zmq_events_total", "tlgw_kv_zmq_resyncs_total"
	storedEvents := func() float64 { return metricSum(t, f.base, events, `kind="BlockStored"`) }
	prompt := func(s string) string { return strings.Repeat(s+" fills several KV blocks of sixteen tokens. ", 6) }
	for i, p := range []*proctest.Proc{za, zb} {
		before := storedEvents()
		complete(t, "http://"+p.HTTPAddr, prompt("a first prompt on "+p.HTTPAddr))
		eventually(t, []string{"za's", "zb's"}[i]+" BlockStored events at the gateway", 10*time.Second, func() bool {
			return storedEvents() > before
		})
	}
	if n := metricSum(t, f.base, "tlgw_kv_zmq_decode_errors_total") + metricSum(t, f.base, "tlgw_kv_zmq_unknown_topic_total"); n != 0 {
		t.Fatalf("%v batches refused", n)
	}

	// A gap on zb, which has a replay endpoint: filled by replay.
	injectGap(t, zb)
	complete(t, "http://"+zb.HTTPAddr, prompt("withheld from zb's live stream"))
	complete(t, "http://"+zb.HTTPAddr, prompt("after zb's gap"))
	eventually(t, "zb's gap filled by replay", 10*time.Second, func() bool {
		return metricSum(t, f.base, resyncs, `how="replay"`) >= 1
	})
	// A gap on za, which has none: its entries are kept; the withheld batch's blocks are
	// unknown, the next batch's are indexed.
	kept, clears := metricSum(t, f.base, resyncs, `how="kept"`), metricSum(t, f.base, resyncs, `how="clear"`)
	entries := metricSum(t, f.base, "tlgw_kv_index_entries")
	injectGap(t, za)
	complete(t, "http://"+za.HTTPAddr, prompt("withheld from za's live stream"))
	complete(t, "http://"+za.HTTPAddr, prompt("after za's gap"))
	eventually(t, "za's gap kept", 10*time.Second, func() bool {
		return metricSum(t, f.base, resyncs, `how="kept"`) > kept && metricSum(t, f.base, "tlgw_kv_index_entries") > entries
	})
	if got := metricSum(t, f.base, resyncs, `how="clear"`); got != clears {
		t.Fatalf("za's gap cleared it (%v clears, %v before)", got, clears)
	}
	if got := metricSum(t, f.base, "tlgw_kv_zmq_gaps_total"); got < 2 {
		t.Fatalf("%v gaps counted, want both", got)
	}

	// zb restarts on the same addresses with an empty cache and its seq back at 0.
	forgotten := func() float64 {
		return metricSum(t, f.base, resyncs, `how="restart"`) + metricSum(t, f.base, events, `kind="AllBlocksCleared"`)
	}
	before := forgotten()
	if err := zb.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-zb.Exited()
	zb = proctest.StartEngine(t, tlengineBin, append([]string{"--id", "zb", "--gateway", f.gw.GRPCAddr}, zbArgs[1:]...)...)
	eventually(t, "the gateway subscribed to the restarted zb", 10*time.Second, subscribed(zb))
	complete(t, "http://"+zb.HTTPAddr, prompt("the restarted zb's first prompt"))
	eventually(t, "the restarted zb's state forgotten (a restart resync or its AllBlocksCleared)", 10*time.Second, func() bool {
		return forgotten() > before
	})
}

// TestVLLMEventsRouteToTheHolder (R22 acceptance): with gateway.tokenizer = "engine", a prompt
// warmed directly on engine vb (never through the gateway; the larger id, so a pick by load
// would take va) is routed to vb three times in a row, matched block by block on vb's own
// vLLM-format events (vb binds and publishes maps; va connects to the gateway and publishes
// arrays); the gateway rendered it once and answered the repeats from its cache. vb killed
// and started again is forgotten at its first batch (seq back at 0): the next repeat goes to va.
func TestVLLMEventsRouteToTheHolder(t *testing.T) {
	const lookups, hits = "tlengine_prefix_cache_lookup_tokens_total", "tlengine_prefix_cache_hit_tokens_total"
	listen := freeAddr(t)
	cfg := preciseConfig + `tokenizer = "engine"

[gateway.kv_events]
listen = "` + listen + `"
`
	vbArgs := []string{"vb", "--model", "smol", "--http-listen", freeAddr(t),
		"--kv-events", "zmq://" + freeAddr(t), "--kv-events-format", "map"}
	f := startFleet(t, cfg, []string{"va", "--model", "smol", "--kv-events", "zmq://" + listen, "--kv-events-bind=false"}, vbArgs)
	va, vb := f.engines["va"], f.engines["vb"]
	subscribed := func(p *proctest.Proc) func() bool {
		return func() bool { return engineMetric(t, p, "tlengine_kv_events_subscribers") == 1 }
	}
	eventually(t, "va connected", 10*time.Second, subscribed(va))
	eventually(t, "vb dialled", 10*time.Second, subscribed(vb))

	prompt := strings.Repeat("A long system prompt that only engine vb has seen, in its own KV blocks. ", 30)
	stored := func() float64 { return metricSum(t, f.base, "tlgw_kv_zmq_events_total", `kind="BlockStored"`) }
	before := stored()
	complete(t, "http://"+vb.HTTPAddr, prompt) // behind the gateway's back
	eventually(t, "vb's BlockStored at the gateway", 10*time.Second, func() bool { return stored() > before })

	for i := range 3 {
		vbHits := engineMetric(t, vb, hits)
		complete(t, f.base, prompt)
		if got := engineMetric(t, va, lookups); got != 0 {
			t.Fatalf("repeat %d went to va (%v tokens looked up there)", i, got)
		}
		if got := engineMetric(t, vb, hits); got <= vbHits {
			t.Fatalf("repeat %d: vb served it without a cache hit (%v hit tokens, %v before)", i, got, vbHits)
		}
	}
	tok := func(o string) float64 {
		return metricSum(t, f.base, "tlgw_tokenizer_requests_total", `outcome="`+o+`"`)
	}
	if tok("render") != 1 || tok("cache") != 2 || tok("fallback") != 0 {
		t.Fatalf("tokenizer outcomes: render %v cache %v partial %v fallback %v", tok("render"), tok("cache"), tok("partial"), tok("fallback"))
	}

	// vb restarts on the same addresses: its seq goes back to 0 with AllBlocksCleared.
	held := metricSum(t, f.base, "tlgw_kv_index_entries")
	if held == 0 {
		t.Fatal("the index held nothing of vb before its restart")
	}
	if err := vb.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-vb.Exited()
	vb = proctest.StartEngine(t, tlengineBin, append([]string{"--id", "vb", "--gateway", f.gw.GRPCAddr}, vbArgs[1:]...)...)
	eventually(t, "vb re-dialled", 10*time.Second, subscribed(vb))
	// Its AllBlocksCleared went out before the gateway re-dialled (a PUB drops what no
	// subscriber hears); its first batch since (numbered back from 0, or a first contact when
	// its new registration replaced the subscription) tells the gateway, which then holds only
	// that batch's few blocks.
	batches := metricSum(t, f.base, "tlgw_kv_zmq_batches_total")
	complete(t, "http://"+vb.HTTPAddr, "another prompt, of three blocks or so: one two three four five six seven")
	eventually(t, "the index forgot vb's blocks", 10*time.Second, func() bool {
		n := metricSum(t, f.base, "tlgw_kv_index_entries")
		return metricSum(t, f.base, "tlgw_kv_zmq_batches_total") > batches && n > 0 && n < held/4
	})
	complete(t, f.base, prompt)
	if got := engineMetric(t, va, lookups); got == 0 {
		t.Fatal("after vb's restart the repeat still went to vb")
	}
}

// TestTokenWarmupOnVLLMEvents (R22): two engines that publish vLLM-format KV events (no tl.kv
// stream), a gateway that tokenizes through them. A 14 KB prompt is cached on vb only; two
// streams of it through the gateway both go to vb, and the second leaves vb at the
// bounded-load cap (⌈1.25·3/2⌉ = 2) with no other holder: the router reserves va for a warm-up
// cut in vb's matched blocks, and the gateway sends va a one-token completions request of
// those blocks' token ids. va's engine stores the blocks and publishes them, so the third
// request, which vb at the cap cannot take, goes to va for its prefix and is served from va's
// cache.
func TestTokenWarmupOnVLLMEvents(t *testing.T) {
	const lookups, hits = "tlengine_prefix_cache_lookup_tokens_total", "tlengine_prefix_cache_hit_tokens_total"
	listen := freeAddr(t)
	cfg := preciseConfig + `tokenizer = "engine"
tokenizer_timeout = "5s"

[gateway.kv_events]
listen = "` + listen + `"
`
	engineArgs := func(id string) []string {
		return []string{id, "--model", "smol", "--decode-per-token", "10ms", // a 400-token stream runs 4 s
			"--kv-events", "zmq://" + listen, "--kv-events-bind=false"}
	}
	f := startFleet(t, cfg, engineArgs("va"), engineArgs("vb"))
	va, vb := f.engines["va"], f.engines["vb"]
	for _, p := range []*proctest.Proc{va, vb} {
		eventually(t, p.HTTPAddr+" connected", 10*time.Second, func() bool {
			return engineMetric(t, p, "tlengine_kv_events_subscribers") == 1
		})
	}
	prompt := strings.Repeat("A long shared system prompt that only one engine has cached so far. ", 200)
	complete(t, "http://"+vb.HTTPAddr, prompt) // behind the gateway's back
	eventually(t, "the gateway's index holds vb's blocks", 10*time.Second, func() bool {
		return metricSum(t, f.base, "tlgw_kv_index_entries") > 100
	})
	entries := metricSum(t, f.base, "tlgw_kv_index_entries")
	openStream(t, f.base, prompt)
	openStream(t, f.base, prompt)
	if got := engineMetric(t, va, hits); got != 0 {
		t.Fatalf("va served a stream (%v hit tokens): both should be on vb", got)
	}
	// The warm-up is the matched blocks' tokens: va's engine looks them all up and publishes
	// a block per 16 (vb's streams add their own blocks as they decode: a lower bound).
	eventually(t, "the warm-up ran on va and va's engine published its blocks", 10*time.Second, func() bool {
		warmed := engineMetric(t, va, lookups)
		return metricSum(t, f.base, "tlgw_prefix_warmups_sent_total", `result="ok"`) == 1 && warmed >= 16*100 &&
			metricSum(t, f.base, "tlgw_kv_index_entries") >= entries+warmed/16-1
	})
	if got := metricSum(t, f.base, "tlgw_prefix_warmups_total"); got != 1 {
		t.Fatalf("tlgw_prefix_warmups_total = %v, want 1", got)
	}
	vaLookups, vaHits := engineMetric(t, va, lookups), engineMetric(t, va, hits)
	if vaLookups != 16*float64(int(vaLookups)/16) {
		t.Fatalf("va's warm-up looked up %v tokens, not a whole number of blocks of 16", vaLookups)
	}
	complete(t, f.base, prompt) // vb is at the cap
	if got := engineMetric(t, va, lookups); got <= vaLookups {
		t.Fatal("the third request did not go to va")
	}
	if got := engineMetric(t, va, hits) - vaHits; got < 0.9*vaLookups {
		t.Fatalf("va served the third request with %v tokens from its cache; its warm-up prefilled %v", got, vaLookups)
	}
}
