package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// TestWorkersListTTFTModel: a worker whose TTFT model has learnt lists it under ttft_model
// (observations and weights by name); one that has not has no ttft_model key.
func TestWorkersListTTFTModel(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	s.beat("w2", "smol", e)
	for i := range 40 {
		x := ttftmodel.Features(int64(i%5), 500*(i%7))
		ttft := time.Duration((30 + 4*x[ttftmodel.Load] + 80*x[ttftmodel.KTokens]) * float64(time.Millisecond))
		// w1 is the gateway's first registration (router.WorkerInfo.Reg 1).
		s.GW.System.Root.Send(s.GW.Router, &router.ObservedTTFT{WorkerID: "w1", Reg: 1, Features: x, TTFT: ttft})
	}
	type model struct {
		Observations uint64  `json:"observations"`
		BiasMs       float64 `json:"bias_ms"`
		MsPerLoad    float64 `json:"ms_per_load"`
		MsPer1k      float64 `json:"ms_per_1k_uncached_tokens"`
	}
	var rows []struct {
		ID    string `json:"id"`
		Model *model `json:"ttft_model"`
	}
	var body []byte
	gwtest.Eventually(t, "w1's model learnt from 40 observations", func() bool {
		resp, b := s.do(t, "GET", "/admin/v1/workers", "sk-admin", "")
		var out struct {
			Workers []struct {
				ID    string `json:"id"`
				Model *model `json:"ttft_model"`
			} `json:"workers"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Workers) != 2 {
			t.Fatalf("workers: %d %s", resp.StatusCode, b)
		}
		rows, body = out.Workers, b
		return rows[0].Model != nil && rows[0].Model.Observations == 40
	})
	near := func(got, want float64) bool { return got > want-0.5 && got < want+0.5 }
	if m := rows[0].Model; !near(m.BiasMs, 30) || !near(m.MsPerLoad, 4) || !near(m.MsPer1k, 80) {
		t.Fatalf("w1's model %+v, want 30 ms + 4 ms per load + 80 ms per 1,000 uncached tokens", *m)
	}
	if rows[1].ID != "w2" || rows[1].Model != nil || strings.Count(string(body), `"ttft_model"`) != 1 {
		t.Fatalf("w2, never observed, lists a model: %s", body)
	}
}
