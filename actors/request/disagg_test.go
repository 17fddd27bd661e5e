package request_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/engine"
	"github.com/tlgw/tlgw/sim/faults"
	"github.com/tlgw/tlgw/sim/sampler"
)

// pdRig is a gateway with a unified engine and a prefill/decode pair of smol (real tlengine
// engines in-process), a route "smol-pd" that is disaggregated and "smol" that is not.
type pdRig struct {
	*rig
	unified, prefill, decode *engine.Engine
}

func startEngine(t *testing.T, cfg engine.Config) *engine.Engine {
	t.Helper()
	e, err := engine.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func newPDRig(t *testing.T, decodeFault faults.Fault) *pdRig {
	t.Helper()
	clients := grpcapi.NewEngines(grpcapi.EnginesOptions{})
	t.Cleanup(clients.Close)
	r := newRig(t, rigOpt{engines: clients, routes: []config.Route{
		{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	}})
	p := &pdRig{rig: r,
		unified: startEngine(t, engine.Config{ID: "u", Model: "smol", Role: engine.RoleUnified}),
		prefill: startEngine(t, engine.Config{ID: "p", Model: "smol", Role: engine.RolePrefill}),
		decode:  startEngine(t, engine.Config{ID: "d", Model: "smol", Role: engine.RoleDecode, Fault: decodeFault}),
	}
	r.beatRole("u", "smol", router.RoleUnified, p.unified.HTTPAddr, p.unified.GRPCAddr, p.unified.KVAddr)
	r.beatRole("p", "smol", router.RolePrefill, p.prefill.HTTPAddr, p.prefill.GRPCAddr, p.prefill.KVAddr)
	r.beatRole("d", "smol", router.RoleDecode, p.decode.HTTPAddr, p.decode.GRPCAddr, p.decode.KVAddr)
	return p
}

// text pulls the generated text out of a completions JSON or SSE body.
func text(t *testing.T, body string) string {
	t.Helper()
	if !strings.HasPrefix(body, "data: ") {
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) == 0 {
			t.Fatalf("not a completion: %s", body)
		}
		return c.Choices[0].Text
	}
	var b strings.Builder
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 {
			b.WriteString(c.Choices[0].Text)
		}
	}
	return b.String()
}

// TestDisaggregatedEqualsUnified: the disaggregated answer equals the unified one for the same
// seed (streamed or not); Prefill gets the prompt's ids, every sampling field with the
// contract's defaults, and decode_target = D's KV address; a seed the gateway draws reaches D.
func TestDisaggregatedEqualsUnified(t *testing.T) {
	p := newPDRig(t, faults.Fault{})
	prompt := "The router sends the prompt to the prefill worker first"
	seeded := fmt.Sprintf(`{"model":"smol-pd","prompt":%q,"max_tokens":12,"seed":5,"temperature":0.8,"stop":["zzz"]}`, prompt)
	resp, pd := p.post(t, "/v1/completions", "", seeded)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, pd)
	}
	p.tr.add("client: %d, %d tokens of text", resp.StatusCode, len(sampler.Tokenize(text(t, pd))))
	p.tr.golden(t, "disaggregated_success")
	_, uni := p.post(t, "/v1/completions", "", strings.Replace(seeded, `"smol-pd"`, `"smol"`, 1))
	if text(t, pd) == "" || text(t, pd) != text(t, uni) {
		t.Fatalf("disaggregated %q, unified %q", text(t, pd), text(t, uni))
	}

	p.engines.mu.Lock()
	call := p.engines.prefills[0]
	p.engines.mu.Unlock()
	if !slices.Equal(call.PromptIDs, sampler.Tokenize(prompt)) {
		t.Fatalf("prompt ids %v, want %v", call.PromptIDs, sampler.Tokenize(prompt))
	}
	if call.DecodeTarget != p.decode.KVAddr || call.Model != "smol" || call.Sampling.Seed != 5 ||
		call.Sampling.MaxTokens != 12 || call.Sampling.Temperature != 0.8 || !slices.Equal(call.Sampling.Stop, []string{"zzz"}) {
		t.Fatalf("prefill call %+v (decode KV %s)", call, p.decode.KVAddr)
	}

	// Streamed, same seed: the same text.
	_, pds := p.post(t, "/v1/completions", "", strings.Replace(seeded, `"seed":5`, `"seed":5,"stream":true`, 1))
	if text(t, pds) != text(t, uni) || !strings.HasSuffix(pds, "data: [DONE]\n\n") {
		t.Fatalf("streamed disaggregated %q, unified %q", text(t, pds), text(t, uni))
	}

	// No seed and no sampling fields: the defaults go to Prefill, and the seed the gateway drew
	// reaches D (its answer equals the unified one for that seed).
	_, pd2 := p.post(t, "/v1/completions", "", fmt.Sprintf(`{"model":"smol-pd","prompt":%q}`, prompt))
	p.engines.mu.Lock()
	call = p.engines.prefills[len(p.engines.prefills)-1]
	p.engines.mu.Unlock()
	if s := call.Sampling; s.MaxTokens != 16 || s.Temperature != 1 || s.TopP != 1 || s.TopK != 0 || s.Logprobs || s.Stop != nil {
		t.Fatalf("defaults %+v", s)
	}
	_, uni2 := p.post(t, "/v1/completions", "", fmt.Sprintf(`{"model":"smol","prompt":%q,"seed":%d}`, prompt, call.Sampling.Seed))
	if text(t, pd2) != text(t, uni2) {
		t.Fatalf("unseeded: disaggregated %q, unified with the drawn seed %q", text(t, pd2), text(t, uni2))
	}
	for _, id := range []string{"u", "p", "d"} {
		p.InFlight(id, 0)
	}
	gwtest.Eventually(t, "no KV handle held on D", func() bool { return p.decode.Status().KVHandlesHeld == 0 })
}

// TestDisaggregatedReleaseOnAbort: D dies mid-stream; the client gets what was sent and an SSE
// error; Release is called with the prefill's handle and nothing stays held.
func TestDisaggregatedReleaseOnAbort(t *testing.T) {
	p := newPDRig(t, faults.Fault{Kind: faults.CutAfter, N: 2})
	resp, body := p.post(t, "/v1/completions", "", `{"model":"smol-pd","prompt":"a prompt for a decode worker that dies","max_tokens":10,"seed":9,"stream":true}`)
	p.tr.add("client: %d, %d token events, error event %v, [DONE] %v", resp.StatusCode,
		strings.Count(body, "data: {\"choices\""), strings.Contains(body, "event: error"), strings.Contains(body, "[DONE]"))
	if resp.StatusCode != 200 || !strings.Contains(body, "event: error") || strings.Contains(body, "[DONE]") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	p.tr.golden(t, "disaggregated_abort")
	p.engines.mu.Lock()
	handles, releases := slices.Clone(p.engines.handles), slices.Clone(p.engines.releases)
	p.engines.mu.Unlock()
	if len(handles) != 1 || !slices.Equal(releases, handles) {
		t.Fatalf("handles %v, releases %v", handles, releases)
	}
	gwtest.Eventually(t, "D holds nothing", func() bool {
		st := p.decode.Status()
		return st.KVHandlesHeld == 0 && st.KVFreeBlocks == st.KVTotalBlocks && st.Running == 0
	})
	for _, id := range []string{"p", "d"} {
		p.InFlight(id, 0)
	}
}

// TestDisaggregatedClientLeaves: a client that leaves mid-stream cancels the decode request
// at once; the handle is released and D holds nothing.
func TestDisaggregatedClientLeaves(t *testing.T) {
	clients := grpcapi.NewEngines(grpcapi.EnginesOptions{})
	t.Cleanup(clients.Close)
	r := newRig(t, rigOpt{engines: clients, routes: []config.Route{
		{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	}})
	pe := startEngine(t, engine.Config{ID: "p", Model: "smol", Role: engine.RolePrefill})
	de := startEngine(t, engine.Config{ID: "d", Model: "smol", Role: engine.RoleDecode, DecodePerToken: 20 * time.Millisecond})
	r.beatRole("p", "smol", router.RolePrefill, pe.HTTPAddr, pe.GRPCAddr, pe.KVAddr)
	r.beatRole("d", "smol", router.RoleDecode, de.HTTPAddr, de.GRPCAddr, de.KVAddr)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", r.srv.URL+"/v1/completions",
		strings.NewReader(`{"model":"smol-pd","prompt":"a long answer please","max_tokens":200,"stream":true}`))
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	gwtest.Eventually(t, "D holds nothing and runs nothing", func() bool {
		st := de.Status()
		return st.KVHandlesHeld == 0 && st.Running == 0 && st.KVFreeBlocks == st.KVTotalBlocks
	})
	r.InFlight("p", 0)
	r.InFlight("d", 0)
	// D frees what the cancelled decode held on its own; the gateway's Release of the handle
	// runs in the request's Releasing step, which may come after D's status above.
	released := func() bool {
		r.engines.mu.Lock()
		defer r.engines.mu.Unlock()
		return len(r.engines.releases) > 0
	}
	gwtest.Eventually(t, "the handle released", released)
	r.engines.mu.Lock()
	defer r.engines.mu.Unlock()
	if len(r.engines.handles) != 1 || !slices.Equal(r.engines.releases, r.engines.handles) {
		t.Fatalf("handles %v, releases %v", r.engines.handles, r.engines.releases)
	}
}
