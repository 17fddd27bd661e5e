package scrape

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/actors/router"
	grpcadapter "github.com/tlgw/tlgw/adapters/grpc"
)

// loraLine is one vllm:lora_requests_info sample (as vLLM writes it: no model label).
func loraLine(running, maxLoRA string, ts float64) string {
	return fmt.Sprintf("vllm:lora_requests_info{max_lora=\"%s\",running_lora_adapters=\"%s\",waiting_lora_adapters=\"\"} %v\n",
		labelEscaper.Replace(maxLoRA), labelEscaper.Replace(running), ts)
}

// labelEscaper writes a label value in the text format.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// loadPage is a vLLM page's load families for llama, to which a test adds LoRA lines.
const loadPage = `vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2
vllm:kv_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
`

// seq is n distinct valid adapter names, "ad-00000", … in sorted order.
func seq(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("ad-%05d", i)
	}
	return out
}

// TestReadLoRAInfo pins how a page's vllm:lora_requests_info becomes RunningLoRAs and
// MaxLoRAs (R21): the current sample is the one with the greatest value (vLLM keeps every
// label set it has set, stamped with the time it was set), the names are held to a
// heartbeat's rule and bound, and nothing in the family — absent, malformed, oversized,
// hostile — fails the scrape or its load, since an engine without LoRA has no such series.
func TestReadLoRAInfo(t *testing.T) {
	long := strings.Repeat("x", MaxNameBytes)
	many := seq(5000)
	slices.Reverse(many) // the page's order is not the kept one
	huge := strings.Repeat("a,", MaxReadBytes/2)
	for _, c := range []struct {
		name    string
		kind    Kind
		lora    string // lines added to loadPage
		running []string
		max     int
		invalid int
		over    int
		reason  string // why the family was unreadable, "" if it was read
	}{
		{name: "no family", lora: "", running: nil},
		{name: "one sample", lora: loraLine("b,a", "4", 1.7e9), running: []string{"a", "b"}, max: 4},
		{name: "none running", lora: loraLine("", "4", 1.7e9), running: []string{}, max: 4},
		{name: "the greatest value wins, wherever it is", lora: loraLine("old", "1", 100) + loraLine("new", "2", 300) + loraLine("mid", "3", 200),
			running: []string{"new"}, max: 2},
		{name: "the first of equals", lora: loraLine("first", "1", 5) + loraLine("second", "2", 5), running: []string{"first"}, max: 1},
		{name: "a NaN sample is skipped", lora: "vllm:lora_requests_info{max_lora=\"9\",running_lora_adapters=\"nan\"} NaN\n" + loraLine("ok", "1", -5),
			running: []string{"ok"}, max: 1},
		{name: "an infinite sample is skipped", lora: loraLine("ok", "1", 5) + "vllm:lora_requests_info{max_lora=\"9\",running_lora_adapters=\"inf\"} +Inf\n",
			running: []string{"ok"}, max: 1},
		{name: "typed as a gauge with HELP", lora: "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n" + loraLine("a", "8", 1),
			running: []string{"a"}, max: 8},
		{name: "a counter's value counts", lora: "# TYPE vllm:lora_requests_info counter\n" + loraLine("a", "8", 1), running: []string{"a"}, max: 8},
		{name: "a histogram has no sample to take", lora: "# TYPE vllm:lora_requests_info histogram\nvllm:lora_requests_info_bucket{le=\"+Inf\"} 1\nvllm:lora_requests_info_count 1\nvllm:lora_requests_info_sum 1\n"},
		{name: "max_lora 0", lora: loraLine("", "0", 1), running: []string{}, max: 0},
		{name: "max_lora at the bound", lora: loraLine("", "1024", 1), running: []string{}, max: 1024},
		{name: "max_lora over the bound", lora: loraLine("", "1025", 1), running: []string{}, max: 0},
		{name: "max_lora negative", lora: loraLine("", "-1", 1), running: []string{}, max: 0},
		{name: "max_lora not a number", lora: loraLine("", "four", 1), running: []string{}, max: 0},
		{name: "max_lora fractional", lora: loraLine("", "4.0", 1), running: []string{}, max: 0},
		{name: "max_lora absent", lora: "vllm:lora_requests_info{running_lora_adapters=\"a\"} 1\n", running: []string{"a"}, max: 0},
		{name: "running absent", lora: "vllm:lora_requests_info{max_lora=\"2\"} 1\n", running: nil, max: 2},
		{name: "duplicates fold", lora: loraLine("b,a,b,a", "4", 1), running: []string{"a", "b"}, max: 4},
		{name: "bad names are dropped and counted",
			lora: loraLine("a,,b c,\u00e9t\u00e9,"+long+"y,"+long+",tab\there,del\x7f,~,"+llama+",", "4", 1),
			// "", "b c", "été", 257 bytes, a tab, DEL, the model, the trailing "": 8.
			running: []string{"a", long, "~"}, max: 4, invalid: 8},
		{name: "an escaped newline is no name", lora: `vllm:lora_requests_info{max_lora="1",running_lora_adapters="a\nb"} 1` + "\n", running: []string{}, max: 1, invalid: 1},
		{name: "thousands of names: the first 1024 in sorted order", lora: loraLine(strings.Join(many, ","), "4", 1),
			running: seq(router.MaxLoRAAdapters), max: 4, over: 5000 - router.MaxLoRAAdapters},
		{name: "another model's sample is ignored, however new", lora: `vllm:lora_requests_info{max_lora="9",model_name="other",running_lora_adapters="theirs"} 9` + "\n" + loraLine("ours", "1", 1),
			running: []string{"ours"}, max: 1},
		{name: "a line over MaxReadBytes is unreadable", lora: loraLine(huge, "4", 1), reason: ReasonTooLarge},
		{name: "a malformed family is unreadable", lora: loraLine("a", "4", 1) + "vllm:lora_requests_info{max_lora=\"4\" 2\n", reason: ReasonParse},
		{name: "a stale sample before a malformed one is not taken", lora: loraLine("a", "4", 1) + "vllm:lora_requests_info oops\n", reason: ReasonParse},
		{name: "sglang has none", kind: SGLang, lora: loraLine("a", "4", 1)},
		{name: "tlengine serves vLLM's", kind: TLEngine, lora: loraLine("a", "4", 1), running: []string{"a"}, max: 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			kind, pg := c.kind, loadPage+c.lora
			switch kind {
			case "":
				kind = VLLM
			case SGLang:
				pg = "sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n" + c.lora
			case TLEngine:
				pg = "tlengine_queue_depth 1\ntlengine_running 2\ntlengine_kv_blocks_free 3\n" + c.lora
			}
			st, lr, err := parse(kind, llama, []byte(pg), 100)
			if err != nil {
				t.Fatalf("the scrape failed: %v", err)
			}
			if st.QueueDepth != 1 || st.Running != 2 {
				t.Fatalf("the load was not read: %+v", st)
			}
			if diff := cmp.Diff(c.running, st.RunningLoRAs); diff != "" {
				t.Errorf("running -want +got:\n%s", diff)
			}
			if (c.running == nil) != (st.RunningLoRAs == nil) {
				t.Errorf("running %#v, want %#v (nil: not said; empty: none)", st.RunningLoRAs, c.running)
			}
			if st.MaxLoRAs != c.max {
				t.Errorf("max %d, want %d", st.MaxLoRAs, c.max)
			}
			if lr.invalid != c.invalid || lr.over != c.over {
				t.Errorf("dropped %d invalid, %d over; want %d, %d", lr.invalid, lr.over, c.invalid, c.over)
			}
			reason := ""
			if lr.err != nil {
				reason = reasonOf(lr.err)
			}
			if reason != c.reason {
				t.Errorf("unreadable for %q (%v), want %q", reason, lr.err, c.reason)
			}
		})
	}
}

// TestReadLoRAInfoManyStaleSamples: a long-running vLLM's page may hold a sample for every
// label set it ever set; far more of them than MaxReadBytes are still read (in pieces), and
// the newest wins wherever it sits — at a piece's start, in its middle, at the page's end.
func TestReadLoRAInfoManyStaleSamples(t *testing.T) {
	const n = 20000 // about 1.5 MB of samples
	for _, at := range []int{0, 1, n / 2, n - 1} {
		var b strings.Builder
		b.WriteString(loadPage)
		b.WriteString("# TYPE vllm:lora_requests_info gauge\n")
		for i := range n {
			ts := float64(i)
			name := fmt.Sprintf("stale-%d", i)
			if i == at {
				ts, name = 1e10, "newest"
			}
			b.WriteString(loraLine(name, "8", ts))
		}
		if b.Len() < 4*MaxReadBytes {
			t.Fatalf("the page is %d bytes: too short to need pieces", b.Len())
		}
		st, lr, err := parse(VLLM, llama, []byte(b.String()), 100)
		if err != nil || lr.err != nil {
			t.Fatalf("newest at %d: %v, %v", at, err, lr.err)
		}
		if !slices.Equal(st.RunningLoRAs, []string{"newest"}) || st.MaxLoRAs != 8 {
			t.Fatalf("newest at %d: running %q, max %d", at, st.RunningLoRAs, st.MaxLoRAs)
		}
	}
}

// TestNameRuleIsTheHeartbeats: a scraped adapter name is held to exactly the rule a
// heartbeat's lora_adapters are (adapters/grpc.ValidateLoRAAdapters), so an engine cannot
// advertise by its metrics or /v1/models a name its heartbeat could not carry.
func TestNameRuleIsTheHeartbeats(t *testing.T) {
	if MaxNameBytes != grpcadapter.MaxField {
		t.Fatalf("MaxNameBytes %d, a heartbeat's %d", MaxNameBytes, grpcadapter.MaxField)
	}
	cands := []string{"", strings.Repeat("a", MaxNameBytes), strings.Repeat("a", MaxNameBytes+1), "base", "base/x", "a b"}
	for c := range 256 {
		cands = append(cands, string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	for _, n := range cands {
		ns := names{model: "base"}
		ns.add(n)
		kept := len(ns.list()) == 1
		_, err := grpcadapter.ValidateLoRAAdapters([]string{n}, "base")
		if kept != (err == nil) {
			t.Errorf("%q: kept %v, a heartbeat's rule says %v", n, kept, err)
		}
	}
}

// FuzzReadLoRAInfo: whatever a page holds, the LoRA info read from it is within bounds (names
// valid, sorted, unique, at most MaxLoRAAdapters, never the model; max_lora within 0..1024),
// an unreadable family says nothing, and reading the family in pieces gives what reading the
// whole page at once gives whenever expfmt reads the whole page.
func FuzzReadLoRAInfo(f *testing.F) {
	f.Add([]byte(loraLine("a,b", "4", 1.7e9)), llama)
	f.Add([]byte(loraLine("old", "1", 1)+loraLine("new", "2", 2)), llama)
	f.Add([]byte(page(f, "vllm_v0.txt")), mistral)
	f.Add([]byte("# TYPE vllm:lora_requests_info gauge\n"+`vllm:lora_requests_info{max_lora="x",running_lora_adapters=",,a,a,\n"} NaN`), "a")
	f.Add([]byte(`{"vllm:lora_requests_info",max_lora="3",running_lora_adapters="q"} 1`+"\n"), "")
	f.Fuzz(func(t *testing.T, pg []byte, model string) {
		lr := readLoRAInfo(dialects[VLLM], model, pg)
		if lr.err != nil {
			if r := reasonOf(lr.err); r != ReasonParse && r != ReasonTooLarge {
				t.Fatalf("unreadable for %q: %v", r, lr.err)
			}
			if lr.running != nil || lr.max != 0 || lr.invalid != 0 || lr.over != 0 {
				t.Fatalf("an unreadable family said %+v", lr)
			}
			return
		}
		checkNames(t, lr.running, model)
		if lr.max < 0 || lr.max > MaxLoRAs {
			t.Fatalf("max_lora %d", lr.max)
		}
		// The whole page through expfmt, when it reads it: the same sample wins.
		tp := newTextParser()
		fams, err := tp.TextToMetricFamilies(strings.NewReader(string(pg)))
		if err != nil {
			return
		}
		whole := loraRead{}
		pgd := parsed{fams: fams, model: model, labels: dialects[VLLM].modelLabels}
		bestV := math.Inf(-1)
		found := false
		for _, m := range pgd.series("vllm:lora_requests_info") {
			v := m.GetGauge().GetValue() + m.GetUntyped().GetValue() + m.GetCounter().GetValue() // the one it has
			if !math.IsNaN(v) && !math.IsInf(v, 0) && (!found || v > bestV) {
				found, bestV = true, v
				whole = loraRead{max: maxLoRA(labelValue(m, maxLoRALabel))}
				if running, ok := label(m, runningLabel); ok {
					ns := names{model: model}
					if running != "" {
						for _, n := range strings.Split(running, ",") {
							ns.add(n)
						}
					}
					whole.running = ns.list()
					if whole.running == nil {
						whole.running = []string{}
					}
				}
			}
		}
		if fams["vllm:lora_requests_info"].GetType().String() == "HISTOGRAM" || fams["vllm:lora_requests_info"].GetType().String() == "SUMMARY" {
			return // read in pieces its samples have no TYPE: not comparable
		}
		if !cmp.Equal(whole.running, lr.running) || whole.max != lr.max {
			t.Fatalf("in pieces: %q %d; whole: %q %d", lr.running, lr.max, whole.running, whole.max)
		}
	})
}

// checkNames fails unless ns is a list of adapter names a heartbeat could carry for model:
// valid, sorted, unique, at most router.MaxLoRAAdapters, never the model.
func checkNames(t *testing.T, ns []string, model string) {
	t.Helper()
	if len(ns) > router.MaxLoRAAdapters {
		t.Fatalf("%d names", len(ns))
	}
	if _, err := grpcadapter.ValidateLoRAAdapters(ns, model); err != nil {
		t.Fatalf("%q: %v", ns, err)
	}
	if !slices.IsSorted(ns) {
		t.Fatalf("%q is not sorted", ns)
	}
}
