package engine

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// scrapeFamilies reads the engine's /metrics page with the exposition-format parser.
func scrapeFamilies(t *testing.T, e *Engine) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + e.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// gaugeWith is the value of name's one series carrying the given labels.
func gaugeWith(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	if f.GetType() != dto.MetricType_GAUGE {
		t.Fatalf("%s is a %s, want a gauge", name, f.GetType())
	}
	var found []float64
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for k, v := range labels {
			ok = ok && have[k] == v
		}
		if ok {
			found = append(found, m.GetGauge().GetValue())
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, labels, len(found))
	}
	return found[0]
}

// TestVLLMMetricNames: tlengine serves its load under vLLM's names too (model_name label,
// kv_cache_usage_perc as a fraction, cache_config_info with num_gpu_blocks), read live, so a
// gateway scraping it as a vLLM engine sees the real values.
func TestVLLMMetricNames(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{Model: "smol", MaxRunning: 1, DecodePerToken: time.Second, KVBlocks: 64, Clock: fc})
	byModel := map[string]string{"model_name": "smol"}

	check := func(waiting, running int) {
		t.Helper()
		fams := scrapeFamilies(t, e)
		st := e.Status()
		if v := gaugeWith(t, fams, "vllm:num_requests_waiting", byModel); v != float64(waiting) {
			t.Errorf("vllm:num_requests_waiting = %v, want %d", v, waiting)
		}
		if v := gaugeWith(t, fams, "vllm:num_requests_running", byModel); v != float64(running) {
			t.Errorf("vllm:num_requests_running = %v, want %d", v, running)
		}
		if v, want := gaugeWith(t, fams, "vllm:kv_cache_usage_perc", byModel), 1-float64(st.KVFreeBlocks)/64; v != want {
			t.Errorf("vllm:kv_cache_usage_perc = %v, want %v (free %d of 64)", v, want, st.KVFreeBlocks)
		}
		if v := gaugeWith(t, fams, "vllm:cache_config_info", map[string]string{"num_gpu_blocks": "64"}); v != 1 {
			t.Errorf("vllm:cache_config_info = %v, want 1", v)
		}
		if v := gaugeWith(t, fams, "tlengine_kv_blocks_total", nil); v != 64 {
			t.Errorf("tlengine_kv_blocks_total = %v, want 64", v)
		}
		if v := gaugeWith(t, fams, "tlengine_kv_blocks_free", nil); v != float64(st.KVFreeBlocks) {
			t.Errorf("tlengine_kv_blocks_free = %v, want %d", v, st.KVFreeBlocks)
		}
	}
	check(0, 0)

	// One request runs and holds KV, one waits behind it.
	results := make(chan int, 2)
	for i := range 2 {
		go func() {
			resp, _ := post(t, e, "/v1/completions", fmt.Sprintf(`{"model":"smol","prompt":"request %d","max_tokens":2,"seed":1}`, i))
			results <- resp.StatusCode
		}()
	}
	gwtest.Eventually(t, "one running, one queued", func() bool {
		st := e.Status()
		return st.Running == 1 && st.QueueDepth == 1
	})
	if st := e.Status(); st.KVFreeBlocks >= st.KVTotalBlocks {
		t.Fatalf("a running request holds no KV: %+v", st)
	}
	check(1, 1)

	gwtest.Eventually(t, "both requests finish", func() bool {
		fc.Advance(time.Second)
		return len(results) == 2
	})
	for range 2 {
		if code := <-results; code != 200 {
			t.Fatalf("status %d", code)
		}
	}
	check(0, 0)
}
