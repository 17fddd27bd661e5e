package scrape

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	llama   = "meta-llama/Llama-3.1-8B-Instruct"
	mistral = "mistralai/Mistral-7B-Instruct-v0.3"
	qwen    = "Qwen/Qwen2.5-7B-Instruct"
)

func page(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// without drops every line of the named metric families (samples, HELP and TYPE).
func without(pg string, names ...string) string {
	var keep []string
	for _, line := range strings.Split(pg, "\n") {
		drop := false
		for _, n := range names {
			if strings.HasPrefix(line, n+"{") || strings.HasPrefix(line, n+" ") ||
				strings.HasPrefix(line, "# HELP "+n+" ") || strings.HasPrefix(line, "# TYPE "+n+" ") {
				drop = true
			}
		}
		if !drop {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

func TestParseRecordedPages(t *testing.T) {
	for _, c := range []struct {
		name, file, model string
		kind              Kind
		kvTotal           int64
		want              Status
	}{
		// vLLM V1: kv_cache_usage_perc 0.25 of the reported 8000 blocks.
		{"vllm new generation", "vllm_v1.txt", llama, VLLM, 0, Status{QueueDepth: 3, Running: 7, KVFreeBlocks: 6000, KVTotalBlocks: 8000, BlockSize: 16}},
		{"vllm reported total beats configured", "vllm_v1.txt", llama, VLLM, 100, Status{QueueDepth: 3, Running: 7, KVFreeBlocks: 6000, KVTotalBlocks: 8000, BlockSize: 16}},
		// vLLM V0: gpu_cache_usage_perc 0.5 of the reported 2810 blocks.
		{"vllm older generation", "vllm_v0.txt", mistral, VLLM, 0, Status{QueueDepth: 2, Running: 4, KVFreeBlocks: 1405, KVTotalBlocks: 2810, BlockSize: 16, RunningLoRAs: []string{}}},
		// SGLang reports no block total: token_usage 0.4 of the configured 10000.
		{"sglang", "sglang.txt", qwen, SGLang, 10000, Status{QueueDepth: 5, Running: 12, KVFreeBlocks: 6000, KVTotalBlocks: 10000}},
		{"sglang without a total", "sglang.txt", qwen, SGLang, 0, Status{QueueDepth: 5, Running: 12}},
		// tlengine's own names, and the vLLM names it also serves: the same load.
		{"tlengine", "tlengine.txt", "smol", TLEngine, 0, Status{QueueDepth: 2, Running: 1, KVFreeBlocks: 253, KVTotalBlocks: 256, BlockSize: 16}},
		{"tlengine read as vllm", "tlengine.txt", "smol", VLLM, 0, Status{QueueDepth: 2, Running: 1, KVFreeBlocks: 253, KVTotalBlocks: 256, BlockSize: 16}},
		{"empty model reads every series", "vllm_v1.txt", "", VLLM, 0, Status{QueueDepth: 3, Running: 7, KVFreeBlocks: 6000, KVTotalBlocks: 8000, BlockSize: 16}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse(c.kind, c.model, []byte(page(t, c.file)), c.kvTotal)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Fatalf("-want +got:\n%s", diff)
			}
		})
	}
}

func TestParseFallsBackToConfiguredTotal(t *testing.T) {
	v0 := page(t, "vllm_v0.txt")
	for _, c := range []struct {
		name, page string
		blockSize  int64
	}{
		{"no cache_config_info", without(v0, "vllm:cache_config_info"), 0},
		// vLLM writes "None" before it has sized the cache; block_size is known already.
		{"num_gpu_blocks None", strings.Replace(v0, `num_gpu_blocks="2810"`, `num_gpu_blocks="None"`, 1), 16},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse(VLLM, mistral, []byte(c.page), 1000)
			if err != nil {
				t.Fatal(err)
			}
			// The fixture's lora_requests_info says no adapter runs.
			if want := (Status{QueueDepth: 2, Running: 4, KVFreeBlocks: 500, KVTotalBlocks: 1000, BlockSize: c.blockSize, RunningLoRAs: []string{}}); !cmp.Equal(got, want) {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
	// tlengine without its total gauge: the configured one.
	got, err := Parse(TLEngine, "smol", []byte(without(page(t, "tlengine.txt"), "tlengine_kv_blocks_total")), 300)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Status{QueueDepth: 2, Running: 1, KVFreeBlocks: 253, KVTotalBlocks: 300, BlockSize: 16}); !cmp.Equal(got, want) {
		t.Fatalf("tlengine: got %+v, want %+v", got, want)
	}
}

func TestParseLabelFiltering(t *testing.T) {
	vllm := `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 1
vllm:num_requests_waiting{model_name="b"} 10
vllm:num_requests_waiting 100
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 2
vllm:num_requests_running{model_name="b"} 20
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.1
vllm:kv_cache_usage_perc{model_name="b"} 0.9
`
	for _, c := range []struct {
		model string
		want  Status
	}{
		// Series without model_name count for every model.
		{"a", Status{QueueDepth: 101, Running: 2, KVFreeBlocks: 90, KVTotalBlocks: 100}},
		{"b", Status{QueueDepth: 110, Running: 20, KVFreeBlocks: 10, KVTotalBlocks: 100}},
		{"", Status{QueueDepth: 111, Running: 22, KVFreeBlocks: 50, KVTotalBlocks: 100}},
	} {
		got, err := Parse(VLLM, c.model, []byte(vllm), 100)
		if err != nil {
			t.Fatalf("model %q: %v", c.model, err)
		}
		if !cmp.Equal(got, c.want) {
			t.Errorf("model %q: got %+v, want %+v", c.model, got, c.want)
		}
	}

	// SGLang names the model in model_name or model.
	sglang := `sglang:num_queue_reqs{model="a"} 1
sglang:num_queue_reqs{model="b"} 5
sglang:num_running_reqs{model_name="a"} 3
sglang:num_running_reqs{model_name="b"} 7
sglang:token_usage{model_name="a",tp_rank="0"} 0.5
sglang:token_usage{model_name="b",tp_rank="0"} 0.0
`
	got, err := Parse(SGLang, "a", []byte(sglang), 64)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Status{QueueDepth: 1, Running: 3, KVFreeBlocks: 32, KVTotalBlocks: 64}); !cmp.Equal(got, want) {
		t.Fatalf("sglang: got %+v, want %+v", got, want)
	}
}

func TestParseSumsSeries(t *testing.T) {
	// Two data-parallel engines behind one endpoint, each with its own cache size.
	dp := `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2
vllm:num_requests_waiting{engine="1",model_name="m"} 3
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_running{engine="1",model_name="m"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="2000"} 1
`
	got, err := Parse(VLLM, "m", []byte(dp), 0)
	if err != nil {
		t.Fatal(err)
	}
	// Free: 1000·0.5 + 2000·0.75.
	if want := (Status{QueueDepth: 5, Running: 2, KVFreeBlocks: 2000, KVTotalBlocks: 3000, BlockSize: 16}); !cmp.Equal(got, want) {
		t.Fatalf("paired: got %+v, want %+v", got, want)
	}

	// Without reported totals the configured one covers the endpoint at the mean usage.
	got, err = Parse(VLLM, "m", []byte(without(dp, "vllm:cache_config_info")), 800)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Status{QueueDepth: 5, Running: 2, KVFreeBlocks: 500, KVTotalBlocks: 800}); !cmp.Equal(got, want) {
		t.Fatalf("configured: got %+v, want %+v", got, want)
	}

	// tlengine gauges sum too.
	tl := "tlengine_queue_depth 1\ntlengine_queue_depth{rank=\"1\"} 2\ntlengine_running 0\n" +
		"tlengine_kv_blocks_free 10\ntlengine_kv_blocks_free{rank=\"1\"} 20\n" +
		"tlengine_kv_blocks_total 64\ntlengine_kv_blocks_total{rank=\"1\"} 64\n"
	got, err = Parse(TLEngine, "smol", []byte(tl), 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Status{QueueDepth: 3, Running: 0, KVFreeBlocks: 30, KVTotalBlocks: 128}); !cmp.Equal(got, want) {
		t.Fatalf("tlengine: got %+v, want %+v", got, want)
	}
}

func TestParseMissingSeries(t *testing.T) {
	v1, v0, sg, tl := page(t, "vllm_v1.txt"), page(t, "vllm_v0.txt"), page(t, "sglang.txt"), page(t, "tlengine.txt")
	for _, c := range []struct {
		name, page, model string
		kind              Kind
		want              string
	}{
		{"vllm waiting", without(v1, "vllm:num_requests_waiting"), llama, VLLM, "missing series vllm:num_requests_waiting"},
		{"vllm running", without(v0, "vllm:num_requests_running"), mistral, VLLM, "missing series vllm:num_requests_running"},
		{"vllm usage, both generations", without(v1, "vllm:kv_cache_usage_perc"), llama, VLLM,
			"missing series vllm:kv_cache_usage_perc (or vllm:gpu_cache_usage_perc)"},
		{"vllm for another model", v1, "llama-70b", VLLM,
			`missing series vllm:num_requests_waiting for model "llama-70b" (the page has it for "meta-llama/Llama-3.1-8B-Instruct")`},
		{"vllm usage for another model", strings.Replace(v0, `vllm:gpu_cache_usage_perc{model_name="`+mistral, `vllm:gpu_cache_usage_perc{model_name="other`, 1), mistral, VLLM,
			`missing series vllm:kv_cache_usage_perc (or vllm:gpu_cache_usage_perc) for model "mistralai/Mistral-7B-Instruct-v0.3" (the page has it for "other")`},
		{"sglang queue", without(sg, "sglang:num_queue_reqs"), qwen, SGLang, "missing series sglang:num_queue_reqs"},
		{"sglang running", without(sg, "sglang:num_running_reqs"), qwen, SGLang, "missing series sglang:num_running_reqs"},
		{"sglang usage", without(sg, "sglang:token_usage"), qwen, SGLang, "missing series sglang:token_usage"},
		{"tlengine queue", without(tl, "tlengine_queue_depth"), "smol", TLEngine, "missing series tlengine_queue_depth"},
		{"tlengine running", without(tl, "tlengine_running"), "smol", TLEngine, "missing series tlengine_running"},
		{"tlengine free", without(tl, "tlengine_kv_blocks_free"), "smol", TLEngine, "missing series tlengine_kv_blocks_free"},
		{"empty page", "", "smol", VLLM, "missing series vllm:num_requests_waiting"},
		{"only comments", "# nothing to see\n", "smol", SGLang, "missing series sglang:num_queue_reqs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.kind, c.model, []byte(c.page), 100)
			if err == nil {
				t.Fatal("no error")
			}
			if err.Error() != c.want {
				t.Fatalf("error %q, want %q", err, c.want)
			}
			if r := reasonOf(err); r != ReasonMissingSeries {
				t.Fatalf("reason %q, want %q", r, ReasonMissingSeries)
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	garbage[0] = 0xff
	good := "vllm:num_requests_waiting 1\nvllm:num_requests_running 1\n"
	for _, c := range []struct {
		name, page, want string
	}{
		{"garbage bytes", string(garbage), "malformed metrics page: text format parsing error in line 1"},
		{"html", "<!doctype html><html><body>Not Found</body></html>\n", "malformed metrics page: text format parsing error in line 1"},
		{"json", `{"num_requests_waiting": 3}`, "malformed metrics page"},
		{"unterminated labels", good + `vllm:kv_cache_usage_perc{model_name="m" 0.5` + "\n", "malformed metrics page: text format parsing error in line 3"},
		{"value not a number", good + "vllm:kv_cache_usage_perc three\n", "malformed metrics page: text format parsing error in line 3"},
		{"two TYPE lines", "# TYPE vllm:num_requests_waiting gauge\n# TYPE vllm:num_requests_waiting counter\n" + good, "malformed metrics page: text format parsing error in line 2"},
		{"truncated", good + "vllm:kv_cache_usage_perc{model_na", "malformed metrics page"},
		{"NaN queue", "vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\n", "vllm:num_requests_waiting has the value NaN, want a finite number"},
		{"negative running", "vllm:num_requests_waiting 0\nvllm:num_requests_running -2\nvllm:kv_cache_usage_perc 0\n", "vllm:num_requests_running sums to -2, want a count from 0 up"},
		{"usage in percent", good + "vllm:kv_cache_usage_perc 45\n", "vllm:kv_cache_usage_perc is 45, want a fraction from 0 to 1"},
		{"histogram for a gauge", "# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 1\nvllm:num_requests_waiting_count 1\nvllm:num_requests_waiting_sum 1\n" +
			"vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\n", "vllm:num_requests_waiting is a histogram, want a gauge"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(VLLM, "m", []byte(c.page), 100)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("error %q, want it to start with %q", err, c.want)
			}
			if r := reasonOf(err); r != ReasonParse {
				t.Fatalf("reason %q, want %q", r, ReasonParse)
			}
		})
	}
}

func TestParseUnknownKind(t *testing.T) {
	_, err := Parse("triton", "m", []byte(""), 0)
	if err == nil || reasonOf(err) != ReasonInvalidTarget || !strings.Contains(err.Error(), `unknown metrics kind "triton"`) {
		t.Fatalf("got %v", err)
	}
}

// TestParseBlockSize (R15.1): the block size comes from cache_config_info's block_size label
// (vLLM, and tlengine by its own names too); without a usable one it is 0 (unknown), and
// SGLang never reports one.
func TestParseBlockSize(t *testing.T) {
	v1, tl := page(t, "vllm_v1.txt"), page(t, "tlengine.txt")
	dp := func(a, b string) string {
		return "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n" +
			`vllm:cache_config_info{block_size="` + a + `",engine="0",num_gpu_blocks="10"} 1` + "\n" +
			`vllm:cache_config_info{block_size="` + b + `",engine="1",num_gpu_blocks="10"} 1` + "\n"
	}
	for _, c := range []struct {
		name, page string
		kind       Kind
		want       int64
	}{
		{"vllm 32", strings.Replace(v1, `block_size="16"`, `block_size="32"`, 1), VLLM, 32},
		{"tlengine 8", strings.Replace(tl, `block_size="16"`, `block_size="8"`, 1), TLEngine, 8},
		{"vllm None", strings.Replace(v1, `block_size="16"`, `block_size="None"`, 1), VLLM, 0},
		{"vllm without the label", strings.Replace(v1, `block_size="16",`, ``, 1), VLLM, 0},
		{"over 1<<20", strings.Replace(v1, `block_size="16"`, `block_size="1048577"`, 1), VLLM, 0},
		{"at 1<<20", strings.Replace(v1, `block_size="16"`, `block_size="1048576"`, 1), VLLM, 1 << 20},
		{"engines agree", dp("16", "16"), VLLM, 16},
		{"engines disagree", dp("16", "32"), VLLM, 0},
		{"one engine unknown", dp("None", "32"), VLLM, 32},
		{"sglang", page(t, "sglang.txt"), SGLang, 0},
	} {
		got, err := Parse(c.kind, "", []byte(c.page), 100)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got.BlockSize != c.want {
			t.Errorf("%s: block size %d, want %d", c.name, got.BlockSize, c.want)
		}
	}
}

// TestParseBounds: the edges of what an engine's numbers may be. A count may reach 2^62 (so
// that adding two never overflows) and no further; a usage fraction may stray by usageEps
// past 0 or 1 (float noise) and no further; an engine's total of 0 blocks is no total.
func TestParseBounds(t *testing.T) {
	page := func(waiting, usage string, info string) string {
		return "vllm:num_requests_waiting " + waiting + "\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc " + usage + "\n" + info
	}
	exact := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	for _, c := range []struct {
		name, page string
		want       Status
		err        string
	}{
		{"count at 2^62", page("4611686018427387904", "0", ""), Status{QueueDepth: 1 << 62, KVFreeBlocks: 100, KVTotalBlocks: 100}, ""},
		{"count past 2^62", page("5e18", "0", ""), Status{}, "vllm:num_requests_waiting sums to 5e+18, want a count from 0 up"},
		{"usage at 1 + eps", page("0", exact(1+usageEps), ""), Status{KVFreeBlocks: 0, KVTotalBlocks: 100}, ""},
		{"usage past 1 + eps", page("0", "1.00001", ""), Status{}, "vllm:kv_cache_usage_perc is 1.00001, want a fraction from 0 to 1"},
		{"usage at -eps", page("0", exact(-usageEps), ""), Status{KVFreeBlocks: 100, KVTotalBlocks: 100}, ""},
		{"usage past -eps", page("0", "-0.00001", ""), Status{}, "vllm:kv_cache_usage_perc is -1e-05, want a fraction from 0 to 1"},
		{"total of 0 blocks", page("0", "0.5", `vllm:cache_config_info{block_size="16",num_gpu_blocks="0"} 1`+"\n"),
			Status{KVFreeBlocks: 50, KVTotalBlocks: 100, BlockSize: 16}, ""},
		{"total of 1 block", page("0", "0", `vllm:cache_config_info{block_size="16",num_gpu_blocks="1"} 1`+"\n"),
			Status{KVFreeBlocks: 1, KVTotalBlocks: 1, BlockSize: 16}, ""},
		{"block size at the bound", page("0", "0", `vllm:cache_config_info{block_size="1048576",num_gpu_blocks="1"} 1`+"\n"),
			Status{KVFreeBlocks: 1, KVTotalBlocks: 1, BlockSize: MaxBlockSize}, ""},
		{"block size past the bound", page("0", "0", `vllm:cache_config_info{block_size="1048577",num_gpu_blocks="1"} 1`+"\n"),
			Status{KVFreeBlocks: 1, KVTotalBlocks: 1}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse(VLLM, "m", []byte(c.page), 100)
			check(t, got, err, c.want, c.err)
		})
	}
	tl := func(free, total string) string {
		pg := "tlengine_queue_depth 0\ntlengine_running 0\ntlengine_kv_blocks_free " + free + "\n"
		if total != "" {
			pg += "tlengine_kv_blocks_total " + total + "\n"
		}
		return pg
	}
	for _, c := range []struct {
		name, page string
		want       Status
		err        string
	}{
		{"free at the total", tl("64", "64"), Status{KVFreeBlocks: 64, KVTotalBlocks: 64}, ""},
		{"free over the total", tl("65", "64"), Status{}, "tlengine_kv_blocks_free (65) exceeds the total of 64 blocks"},
		{"free over the configured total", tl("101", ""), Status{}, "tlengine_kv_blocks_free (101) exceeds the total of 100 blocks"},
		{"free with a total of 0", tl("5", "0"), Status{KVFreeBlocks: 5}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse(TLEngine, "smol", []byte(c.page), 100)
			check(t, got, err, c.want, c.err)
		})
	}
}

// check compares a Parse result with the wanted status, or its error with the wanted message.
func check(t *testing.T, got Status, err error, want Status, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || err.Error() != wantErr {
			t.Fatalf("error %v, want %q", err, wantErr)
		}
		if r := reasonOf(err); r != ReasonParse {
			t.Fatalf("reason %q, want %q", r, ReasonParse)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("-want +got:\n%s", diff)
	}
}

// FuzzParse: whatever page an engine serves, Parse returns an error or a status an engine can
// have — counts from 0 up, free blocks within a known total, a block size within bounds — and
// a status for one model never exceeds the status of every model summed.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm_v1.txt", "vllm_v0.txt", "sglang.txt", "tlengine.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, int64(1000))
	}
	f.Add([]byte("tlengine_queue_depth 1\ntlengine_running 2\ntlengine_kv_blocks_free 3\n"), int64(0))
	f.Add([]byte("vllm:num_requests_waiting 1e300\nvllm:num_requests_running -0\nvllm:kv_cache_usage_perc 1\n"), int64(-5))
	f.Fuzz(func(t *testing.T, page []byte, kvTotal int64) {
		for _, kind := range []Kind{VLLM, SGLang, TLEngine} {
			st, err := Parse(kind, "", page, kvTotal)
			if err != nil {
				if reasonOf(err) == "" {
					t.Fatalf("%s: an error without a reason: %v", kind, err)
				}
				continue
			}
			if st.QueueDepth < 0 || st.Running < 0 || st.KVFreeBlocks < 0 || st.KVTotalBlocks < 0 {
				t.Fatalf("%s: a negative count: %+v", kind, st)
			}
			if st.KVTotalBlocks > 0 && st.KVFreeBlocks > st.KVTotalBlocks {
				t.Fatalf("%s: free over total: %+v", kind, st)
			}
			if st.BlockSize < 0 || st.BlockSize > MaxBlockSize {
				t.Fatalf("%s: block size %d", kind, st.BlockSize)
			}
			one, err := Parse(kind, llama, page, kvTotal)
			if err == nil && (one.QueueDepth > st.QueueDepth || one.Running > st.Running) {
				t.Fatalf("%s: one model's status %+v over every model's %+v", kind, one, st)
			}
		}
	})
}
