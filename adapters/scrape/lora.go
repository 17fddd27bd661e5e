package scrape

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/oai"
)

// MaxNameBytes bounds an adapter name, as a heartbeat's (oai.ValidName).
const MaxNameBytes = oai.MaxNameBytes

// MaxLoRAs is the largest max_lora read from vllm:lora_requests_info; a larger one reads as
// unknown (0), as does one that is not an integer.
const MaxLoRAs = router.MaxLoRAAdapters

// names collects the adapter names an engine reports for one model: the valid ones other
// than the model, sorted and without repeats, at most router.MaxLoRAAdapters.
type names struct {
	model string
	kept  []string
	// invalid counts the names dropped for breaking the rule (or naming the model);
	// over those past the first router.MaxLoRAAdapters in sorted order.
	invalid, over int
}

func (ns *names) add(n string) {
	if !oai.ValidName(n) || n == ns.model {
		ns.invalid++
		return
	}
	ns.kept = append(ns.kept, n)
}

// list is the names kept, sorted, unique and bounded, copied out of the page or body they
// were read from (a long page is not kept alive by a short name). nil for none.
func (ns *names) list() []string {
	if len(ns.kept) == 0 {
		return nil
	}
	slices.Sort(ns.kept)
	out := slices.Compact(ns.kept)
	if len(out) > router.MaxLoRAAdapters {
		ns.over = len(out) - router.MaxLoRAAdapters
		out = out[:router.MaxLoRAAdapters]
	}
	for i, n := range out {
		out[i] = strings.Clone(n)
	}
	return slices.Clip(out)
}

// loraRead is what a page's vllm:lora_requests_info says (R21, docs ENGINES.md §4).
type loraRead struct {
	// running are the adapters the engine runs: nil when the page does not say (no series,
	// or no running_lora_adapters label), empty when it says none.
	running []string
	// max is the max_lora label, 0 when absent or not an integer from 0 to MaxLoRAs.
	max int
	// invalid and over count the running names dropped (see names).
	invalid, over int
	// err is why the family could not be read (reason too_large or parse); nothing was
	// taken from it then.
	err error
}

// The labels of vllm:lora_requests_info read.
const (
	runningLabel = "running_lora_adapters"
	maxLoRALabel = "max_lora"
)

// readLoRAInfo reads d's LoRA info gauge from page for model. The gauge's value is the time
// its labels were set; vLLM keeps each label set it has ever set, so the page may hold many
// samples, and the one with the greatest value (the first of equals) is the current one. A
// sample whose value is not a finite number is skipped.
//
// The family is optional: an engine without LoRA has none, and nothing in it fails a scrape.
// It is parsed apart from the load's families, in pieces of at most MaxReadBytes, so its
// size, however many stale samples it holds, costs time bounded by the page and memory
// bounded by a piece; a single line over MaxReadBytes makes it unreadable (too_large).
func readLoRAInfo(d dialect, model string, page []byte) loraRead {
	if d.loraInfo == "" {
		return loraRead{}
	}
	var (
		best  *dto.Metric
		bestV float64
	)
	err := familyPieces(page, d.loraInfo, MaxReadBytes, func(piece []byte) error {
		p := newTextParser()
		fams, err := p.TextToMetricFamilies(bytes.NewReader(piece))
		if err != nil {
			return failf(ReasonParse, "%s: %v", d.loraInfo, err)
		}
		pg := parsed{fams: fams, model: model, labels: d.modelLabels}
		for _, m := range pg.series(d.loraInfo) {
			// A piece has no TYPE line: every sample is untyped.
			v := m.GetUntyped().GetValue()
			if !math.IsNaN(v) && !math.IsInf(v, 0) && (best == nil || v > bestV) {
				best, bestV = m, v
			}
		}
		return nil
	})
	if err != nil {
		return loraRead{err: err}
	}
	if best == nil {
		return loraRead{}
	}
	out := loraRead{max: maxLoRA(labelValue(best, maxLoRALabel))}
	if running, ok := label(best, runningLabel); ok {
		ns := names{model: model}
		if running != "" {
			for n := range strings.SplitSeq(running, ",") {
				ns.add(n)
			}
		}
		out.running = ns.list()
		if out.running == nil {
			out.running = []string{}
		}
		out.invalid, out.over = ns.invalid, ns.over
	}
	return out
}

// maxLoRA reads a max_lora label: an integer from 0 to MaxLoRAs, else 0 (unknown).
func maxLoRA(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > MaxLoRAs {
		return 0
	}
	return n
}

// label is m's value of the label name, and whether m has it.
func label(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}
