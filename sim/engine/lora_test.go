package engine

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// loraInfoSeries reads vllm:lora_requests_info's labels and value, and the swaps counter.
func loraInfoSeries(t *testing.T, e *Engine) (labels map[string]string, value, swaps float64) {
	t.Helper()
	fams := scrapeFamilies(t, e)
	ms := fams["vllm:lora_requests_info"].GetMetric()
	if len(ms) != 1 {
		t.Fatalf("vllm:lora_requests_info has %d series, want 1", len(ms))
	}
	labels = map[string]string{}
	for _, lp := range ms[0].GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	return labels, ms[0].GetGauge().GetValue(), fams["tlengine_lora_swaps_total"].GetMetric()[0].GetCounter().GetValue()
}

// TestLoRASlots: with one slot, a request for an adapter not in it waits the swap cost before
// its first token; another adapter's request waits while the slot's adapter runs, shown as
// waiting in vllm:lora_requests_info, then swaps in. The gateway reads these labels to prefer
// workers where an adapter runs.
func TestLoRASlots(t *testing.T) {
	fc := clock.NewFake(time.Unix(100, 0))
	e := start(t, Config{Clock: fc, LoRAs: []LoRA{{"a", "/a"}, {"b", "/b"}}, MaxLoRAs: 1, LoRASwap: 5 * time.Second,
		DecodePerToken: time.Second})
	done := make(chan int, 2)
	go func() {
		resp, _ := post(t, e, "/v1/completions", `{"model":"a","prompt":"x","max_tokens":1,"seed":1}`)
		done <- resp.StatusCode
	}()
	gwtest.Eventually(t, "a swapping in", func() bool { return fc.Pending() == 1 })
	if l, v, swaps := loraInfoSeries(t, e); l["running_lora_adapters"] != "a" || l["waiting_lora_adapters"] != "" ||
		l["max_lora"] != "1" || swaps != 1 || v != 100 {
		t.Fatalf("a swapping in: %v value %v swaps %v", l, v, swaps)
	}
	fc.Advance(4 * time.Second)
	if len(done) != 0 {
		t.Fatal("a answered before its swap cost passed")
	}
	go func() {
		resp, _ := post(t, e, "/v1/completions", `{"model":"b","prompt":"y","max_tokens":1,"seed":1}`)
		done <- resp.StatusCode
	}()
	gwtest.Eventually(t, "b waiting", func() bool {
		l, _, _ := loraInfoSeries(t, e)
		return l["waiting_lora_adapters"] == "b"
	})
	// a: the last second of its swap, its token's decode; then b swaps in and runs.
	for i := 0; i < 20 && len(done) < 2; i++ {
		gwtest.Eventually(t, "a timer armed", func() bool { return fc.Pending() >= 1 || len(done) == 2 })
		fc.Advance(time.Second)
	}
	if a, b := <-done, <-done; a != 200 || b != 200 {
		t.Fatalf("answers %d %d", a, b)
	}
	if l, v, swaps := loraInfoSeries(t, e); l["running_lora_adapters"] != "" || l["waiting_lora_adapters"] != "" || swaps != 2 || v <= 100 {
		t.Fatalf("after both: %v value %v swaps %v", l, v, swaps)
	}
}

// TestLoRAEvictsTheLeastRecentlyUsedIdle: a full set of slots gives up the idle adapter released
// longest ago; an adapter already in a slot costs no swap; nothing is evicted while it runs.
func TestLoRAEvictsTheLeastRecentlyUsedIdle(t *testing.T) {
	l := newLoRAs(clock.NewFake(time.Unix(0, 0)), 2, 0, []LoRA{{"a", "/a"}, {"b", "/b"}, {"c", "/c"}})
	ctx := context.Background()
	acq := func(name string) bool {
		swapped, err := l.acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return swapped
	}
	if !acq("a") || !acq("b") || acq("a") {
		t.Fatal("first loads swap, an adapter in a slot does not")
	}
	l.release("a")
	l.release("b")
	l.release("a") // a is now the most recently used
	if !acq("c") || l.slots["b"] != nil || l.slots["a"] == nil {
		t.Fatalf("c must evict b, the least recently used: slots %v", l.slots)
	}
	if !acq("b") || l.slots["a"] != nil || l.info().swaps != 4 {
		t.Fatalf("b must take idle a's slot: slots %v swaps %d", l.slots, l.info().swaps)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.acquire(gone, "a"); err == nil || l.slots["a"] != nil || len(l.waiting) != 0 {
		t.Fatalf("with b and c running, a must wait (and leave with its caller): %v, slots %v", err, l.slots)
	}
}

// TestRuntimeLoRA: without --allow-runtime-lora the load and unload paths are unknown paths;
// with it, a loaded adapter is served, listed in /v1/models with its parent and root and in
// the heartbeat, and an unloaded one is a 404 model again.
func TestRuntimeLoRA(t *testing.T) {
	closed := start(t, Config{})
	if resp, b := post(t, closed, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`); resp.StatusCode != 404 || string(b) != `{"detail":"Not Found"}` {
		t.Fatalf("without the flag: %d %s", resp.StatusCode, b)
	}
	fr, addr := startRegistry(t)
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{ID: "e2", AllowRuntimeLoRA: true, Gateways: []string{addr}, Clock: fc, MaxLoRAs: 3, LoRASwap: -1})
	if resp, b := post(t, e, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/adapters/x"}`); resp.StatusCode != 200 {
		t.Fatalf("load: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, e, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/adapters/x"}`); resp.StatusCode != 400 {
		t.Fatalf("load again: %d %s", resp.StatusCode, b)
	}
	resp, b := send(t, e, "GET", "/v1/models", "", nil)
	var models struct {
		Data []struct {
			ID, Root    string
			Parent      *string
			MaxModelLen int `json:"max_model_len"`
		}
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &models) != nil || len(models.Data) != 2 || models.Data[0].Parent != nil ||
		models.Data[1].ID != "x" || models.Data[1].Root != "/adapters/x" || models.Data[1].Parent == nil ||
		*models.Data[1].Parent != "smol" || models.Data[1].MaxModelLen != e.maxModelLen() || models.Data[0].MaxModelLen != e.maxModelLen() {
		t.Fatalf("models: %s", b)
	}
	if resp, b := post(t, e, "/v1/completions", `{"model":"x","prompt":"hi","max_tokens":2}`); resp.StatusCode != 200 {
		t.Fatalf("the loaded adapter: %d %s", resp.StatusCode, b)
	}
	gwtest.Eventually(t, "a heartbeat", func() bool { return fr.count() >= 1 && fc.Pending() == 1 })
	fc.Advance(2 * time.Second)
	gwtest.Eventually(t, "the next heartbeat", func() bool { return fr.count() >= 2 })
	if st := fr.last(); !slices.Equal(st.GetLoraAdapters(), []string{"x"}) || st.GetMaxLoras() != 3 {
		t.Fatalf("heartbeat lora_adapters %v max_loras %d", st.GetLoraAdapters(), st.GetMaxLoras())
	}
	if resp, b := post(t, e, "/v1/unload_lora_adapter", `{"lora_name":"x"}`); resp.StatusCode != 200 {
		t.Fatalf("unload: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, e, "/v1/unload_lora_adapter", `{"lora_name":"x"}`); resp.StatusCode != 404 {
		t.Fatalf("unload again: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, e, "/v1/completions", `{"model":"x","prompt":"hi","max_tokens":2}`); resp.StatusCode != 404 {
		t.Fatalf("the unloaded adapter: %d %s", resp.StatusCode, b)
	}
	for _, bad := range []string{`{"lora_name":"","lora_path":"/p"}`, `{"lora_name":"smol","lora_path":"/p"}`,
		`{"lora_name":"a\u0001","lora_path":"/p"}`, `{"lora_name":"y"}`, `[`} {
		if resp, b := post(t, e, "/v1/load_lora_adapter", bad); resp.StatusCode != 400 {
			t.Errorf("load %s: %d %s", bad, resp.StatusCode, b)
		}
	}
}
