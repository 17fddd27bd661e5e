package request

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router"
)

// TestPDFailoverDecisions (R22): a vLLM decode's first failure before its first byte keeps the
// params and asks for a decode worker alone; its second redoes the prefill; a prefill's
// failure redoes it too; each is counted by protocol and phase, fixed label values only.
func TestPDFailoverDecisions(t *testing.T) {
	m := NewMetrics(nil)
	pre, dec := actor.NewPID("local", "p"), actor.NewPID("local", "d")
	r := &requestActor{d: &Deps{Metrics: m}, kvParams: []byte(`{"remote_block_ids":[1]}`),
		picked: &router.Picked{Worker: dec, PDProtocol: "vllm", Prefill: &router.PickedWorker{Worker: pre}}}
	r.pdFailover(dec)
	if !r.decodeOnly || !r.decodeRetried || r.kvParams == nil {
		t.Fatalf("after the first decode failure: only %v retried %v params %s", r.decodeOnly, r.decodeRetried, r.kvParams)
	}
	r.decodeOnly = false // the decode-only pick was answered
	r.picked = &router.Picked{Worker: dec, PDProtocol: "vllm"}
	r.pdFailover(dec)
	if r.decodeOnly || r.decodeRetried || r.kvParams != nil {
		t.Fatalf("after the second: only %v retried %v params %s", r.decodeOnly, r.decodeRetried, r.kvParams)
	}
	r.picked = &router.Picked{Worker: dec, PDProtocol: "sglang", Prefill: &router.PickedWorker{Worker: pre}}
	r.pdFailover(pre)
	r.picked = &router.Picked{Worker: dec} // unified: nothing counted
	r.pdFailover(dec)
	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.pdFailures.WithLabelValues("vllm", "decode")), 2, "vllm decode failures"},
		{testutil.ToFloat64(m.pdFailures.WithLabelValues("sglang", "prefill")), 1, "sglang prefill failures"},
		{testutil.ToFloat64(m.pdRetries.WithLabelValues("vllm", "same_params")), 1, "vllm same-params retries"},
		{testutil.ToFloat64(m.pdRetries.WithLabelValues("vllm", "new_prefill")), 1, "vllm new prefills"},
		{testutil.ToFloat64(m.pdRetries.WithLabelValues("sglang", "new_prefill")), 1, "sglang new rooms"},
		{float64(testutil.CollectAndCount(m.pdFailures)), 2, "failure series"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if pdLabel("client-said") != UnknownLabel {
		t.Error("a protocol label outside the configuration's names")
	}
}
