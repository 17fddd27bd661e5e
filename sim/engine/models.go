package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxModelLen is the engine's context: its whole KV pool.
func (e *Engine) maxModelLen() int { return e.cfg.KVBlocks * e.cfg.BlockSize }

// serveModels lists the base model and each served adapter as vLLM does: an adapter's entry has
// "parent" (the base model) and "root" (its path); every entry has max_model_len.
func (e *Engine) serveModels(w http.ResponseWriter, _ *http.Request) {
	data := []map[string]any{{"id": e.cfg.Model, "object": "model", "created": 0, "owned_by": "tlengine",
		"root": e.cfg.Model, "parent": nil, "max_model_len": e.maxModelLen()}}
	for _, l := range e.loras.list() {
		data = append(data, map[string]any{"id": l.Name, "object": "model", "created": 0, "owned_by": "tlengine",
			"root": l.Path, "parent": e.cfg.Model, "max_model_len": e.maxModelLen()})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// runOn holds a GPU slot for a request of adapter name until release is called; a request that
// loaded the adapter into its slot waits the swap cost first (its time to first token).
func (e *Engine) runOn(ctx context.Context, name string) (release func(), err error) {
	swapped, err := e.loras.acquire(ctx, name)
	if errors.Is(err, errLoRAUnknown) {
		return nil, modelNotFound(name) // unloaded since the model was checked
	}
	if err != nil {
		return nil, err
	}
	if swapped {
		if err := e.sleep(ctx, e.cfg.LoRASwap); err != nil {
			e.loras.release(name)
			return nil, err
		}
	}
	return func() { e.loras.release(name) }, nil
}

// forward runs prompts through the model as a pooling model does (embeddings, pooling, score,
// rerank): each, in turn, holds its adapter's slot, a running slot and its KV for its prefill on
// the engine's clock, then lets them go; nothing is generated.
func (e *Engine) forward(ctx context.Context, lora string, prompts [][]uint32) error {
	if lora != "" {
		release, err := e.runOn(ctx, lora)
		if err != nil {
			return err
		}
		defer release()
	}
	for _, p := range prompts {
		seq, cached, err := e.sched.admit(ctx, p, e.cfg.BlockSize)
		if errors.Is(err, errTooLong) {
			return invalid("%v (%d tokens)", err, len(p))
		}
		if err != nil {
			return err
		}
		err = e.sleep(ctx, time.Duration(len(p)-cached)*e.cfg.PrefillPerToken)
		e.sched.release(seq)
		if err != nil {
			return err
		}
	}
	return nil
}

// maxLoRABody bounds a load or unload body.
const maxLoRABody = 16 << 10

// loraRequest is the body of POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

// parseLoRARequest reads a load (withPath) or unload body.
func parseLoRARequest(body []byte, withPath bool, base string) (LoRA, error) {
	var req loraRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return LoRA{}, invalid("invalid JSON body: %v", err)
	}
	if !withPath && req.Path == "" {
		req.Path = "-" // not asked for
	}
	if withPath && req.Path == "" {
		return LoRA{}, invalid(`"lora_path" is required`)
	}
	l := LoRA{Name: req.Name, Path: req.Path}
	if err := checkLoRA(l, base); err != nil {
		return LoRA{}, invalid("%v", err)
	}
	return l, nil
}

// serveLoadLoRA adds an adapter at run time (--allow-runtime-lora): 200 with vLLM's text, 400
// for one already loaded or past the bound.
func (e *Engine) serveLoadLoRA(w http.ResponseWriter, r *http.Request) {
	body, err := readBodyLimit(r, maxLoRABody)
	var l LoRA
	if err == nil {
		l, err = parseLoRARequest(body, true, e.cfg.Model)
	}
	if err == nil {
		if err = e.loras.load(l); err != nil {
			err = invalid("The lora adapter '%s' could not be loaded: %v.", l.Name, err)
		}
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", l.Name)
}

// serveUnloadLoRA removes an adapter at run time: 404 for one not loaded.
func (e *Engine) serveUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	body, err := readBodyLimit(r, maxLoRABody)
	var l LoRA
	if err == nil {
		l, err = parseLoRARequest(body, false, e.cfg.Model)
	}
	if err == nil && e.loras.unload(l.Name) != nil {
		err = vllmError(404, "NotFoundError", "The lora adapter '%s' cannot be found.", l.Name)
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", l.Name)
}

// loraCollector serves vllm:lora_requests_info as vLLM does — one gauge whose labels name the
// adapters with running and with waiting requests and the slots, whose value is when that was
// last set (Unix seconds on the engine's clock) — plus tlengine_lora_swaps_total. Only the
// current label set is exported, so the series stay one however the adapters change.
type loraCollector struct {
	l           *loras
	info, swaps *prometheus.Desc
}

func newLoRACollector(l *loras) *loraCollector {
	return &loraCollector{l: l,
		info: prometheus.NewDesc("vllm:lora_requests_info",
			"Running and waiting LoRA adapters and the adapter slots; the value is when they were last set (Unix seconds).",
			[]string{"running_lora_adapters", "waiting_lora_adapters", "max_lora"}, nil),
		swaps: prometheus.NewDesc("tlengine_lora_swaps_total",
			"Adapters loaded into a GPU slot (each costs --lora-swap-ms of the request's time to first token).", nil, nil),
	}
}

func (c *loraCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.info; ch <- c.swaps }

func (c *loraCollector) Collect(ch chan<- prometheus.Metric) {
	in := c.l.info()
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, float64(in.changed.UnixNano())/1e9,
		in.running, in.waiting, fmt.Sprint(in.max))
	ch <- prometheus.MustNewConstMetric(c.swaps, prometheus.CounterValue, float64(in.swaps))
}
