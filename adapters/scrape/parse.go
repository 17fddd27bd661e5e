// Package scrape reads the load of engines that do not heartbeat (issue 6): static workers whose
// liveness and load come from their Prometheus metrics page. Parse maps one page to a Status
// for a metric dialect (vLLM, SGLang, tlengine); Manager runs one scraper goroutine per target
// on the injected clock and hands every result to a Sink, which feeds the registry (R1 with the
// last successful scrape in place of the last heartbeat, R2 with the scraped queue depth).
//
// The exposition format is parsed with github.com/prometheus/common/expfmt, never by hand.
package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Kind names the metric dialect an engine speaks.
type Kind string

// The dialects Parse understands.
const (
	VLLM     Kind = "vllm"
	SGLang   Kind = "sglang"
	TLEngine Kind = "tlengine"
)

// Status is the load read from one metrics page, in the heartbeat's terms (SPEC B1). For the
// kinds that report KV use as a fraction (vLLM, SGLang), KVTotalBlocks and KVFreeBlocks are 0
// when neither the engine nor the target gives a total. BlockSize is the engine's tokens per
// KV block (the heartbeat's block_size, R15.1) from vLLM's cache_config_info block_size label
// (which tlengine serves too); 0 = unknown: SGLang exposes no block size in its metrics, and a
// vLLM page without the label, with "None", a value over MaxBlockSize or engines that disagree
// gives none.
//
// The LoRA fields and MaxModelLen (R21) are advisory: nothing about them fails a scrape.
// RunningLoRAs and MaxLoRAs come from the page's vllm:lora_requests_info (vLLM, and tlengine,
// which serves vLLM's names); LoRAAdapters and MaxModelLen from the engine's GET /v1/models,
// which Manager reads on its own schedule (ModelsInterval) and Parse never sees. Adapter
// names are valid as a heartbeat's (1 to MaxNameBytes printable ASCII bytes without spaces,
// never the model), sorted, without repeats and at most router.MaxLoRAAdapters; a Manager
// never changes a slice it has reported.
type Status struct {
	QueueDepth, Running, KVFreeBlocks, KVTotalBlocks int64
	BlockSize                                        int64
	// RunningLoRAs are the adapters the engine reports running: nil when the page does not
	// say, empty when it says none. MaxLoRAs is its max_lora (0 = unknown).
	RunningLoRAs []string
	MaxLoRAs     int
	// LoRAAdapters are the engine's adapters of the model (nil: none, or not read yet);
	// MaxModelLen is the model's context length (0 = unknown).
	LoRAAdapters []string
	MaxModelLen  int64
}

// MaxBlockSize is the largest block size read from a page, as for a heartbeat's block_size
// (adapters/grpc.MaxBlockSize); a larger one reads as unknown (0).
const MaxBlockSize = 1 << 20

// The reasons a scrape fails, as passed to Sink.Failed and counted in
// tlgw_scrape_errors_total{reason}.
const (
	ReasonConnect       = "connect"        // dial refused, reset, or the body broke off
	ReasonTimeout       = "timeout"        // no complete page within the scrape timeout
	ReasonStatus        = "status"         // an HTTP status other than 200
	ReasonRedirect      = "redirect"       // a 3xx answer (redirects are never followed)
	ReasonTooLarge      = "too_large"      // a page over the body limit
	ReasonParse         = "parse"          // not the text exposition format, or a bad value
	ReasonMissingSeries = "missing_series" // a required series is absent for the model
	ReasonInvalidTarget = "invalid_target" // an unknown kind or an unusable metrics URL
)

// scrapeError is an error with its reason.
type scrapeError struct {
	reason string
	err    error
}

func (e *scrapeError) Error() string { return e.err.Error() }
func (e *scrapeError) Unwrap() error { return e.err }

func failf(reason, format string, args ...any) error {
	return &scrapeError{reason: reason, err: fmt.Errorf(format, args...)}
}

// reasonOf is the reason carried by err; errors without one count as parse failures.
func reasonOf(err error) string {
	var se *scrapeError
	if errors.As(err, &se) {
		return se.reason
	}
	return ReasonParse
}

// dialect is the metric names of one Kind.
type dialect struct {
	queue, running string
	// usage are fraction-used gauges (0..1), the first present one wins (vLLM renamed its
	// gauge between generations).
	usage []string
	// free and total are absolute block gauges (tlengine); total is optional.
	free, total string
	// info is an info gauge whose infoLabel holds the engine's total blocks (vLLM).
	info, infoLabel string
	// blockInfo is an info gauge whose block_size label holds the engine's tokens per KV block
	// (vLLM's cache_config_info, which tlengine serves as well); "" = the dialect has none.
	blockInfo string
	// modelLabels are the labels that name the model a series belongs to.
	modelLabels []string
	// loraInfo is vLLM's lora_requests_info gauge (readLoRAInfo); "" = the dialect has none.
	// It is read apart from the families above, and never fails a scrape.
	loraInfo string
}

// names are the families above: the only ones read from a page (keepFamilies).
func (d dialect) names() []string {
	var out []string
	for _, n := range append([]string{d.queue, d.running, d.free, d.total, d.info, d.blockInfo}, d.usage...) {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

var dialects = map[Kind]dialect{
	VLLM: {
		queue:       "vllm:num_requests_waiting",
		running:     "vllm:num_requests_running",
		usage:       []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		info:        "vllm:cache_config_info",
		infoLabel:   "num_gpu_blocks",
		blockInfo:   "vllm:cache_config_info",
		modelLabels: []string{"model_name"},
		loraInfo:    "vllm:lora_requests_info",
	},
	// SGLang's metrics expose no block (page) size: its BlockSize stays 0 (unknown).
	SGLang: {
		queue:       "sglang:num_queue_reqs",
		running:     "sglang:num_running_reqs",
		usage:       []string{"sglang:token_usage"},
		modelLabels: []string{"model_name", "model"},
	},
	TLEngine: {
		queue:     "tlengine_queue_depth",
		running:   "tlengine_running",
		free:      "tlengine_kv_blocks_free",
		total:     "tlengine_kv_blocks_total",
		blockInfo: "vllm:cache_config_info",
		loraInfo:  "vllm:lora_requests_info",
	},
}

// engineLabel pairs a usage series with the info series of the same engine when several
// engines (data-parallel ranks) share one endpoint.
const engineLabel = "engine"

// Parse reads one metrics page in the text exposition format and maps kind's series to a
// Status. Series whose model label (model_name for vLLM; model_name or model for SGLang) names
// another model than model are ignored; series without the label count, and so does every
// series when model is empty. Several matching series of a gauge are summed. The KV total is
// the engine's own when it reports one (vLLM's cache_config_info num_gpu_blocks, tlengine's
// tlengine_kv_blocks_total), else kvTotal; free blocks are round(total × (1 − usage)) for the
// fraction gauges; when a fraction has no total to apply to, both KV fields are 0. BlockSize is
// read from the block_size label of vLLM's cache_config_info when the page has it (see Status).
//
// Errors name what is wrong: a malformed page or values no engine can have (a negative or
// non-finite count, a usage fraction outside 0–1, more free blocks than the total: reason
// parse), a required series absent for the model (missing_series), an unknown kind
// (invalid_target).
//
// RunningLoRAs and MaxLoRAs are read from vLLM's lora_requests_info (the vllm and tlengine
// kinds): the sample with the greatest value, which is the time its labels were set. Its
// running_lora_adapters label is a comma-separated list ("" = none); names that break the
// rule of Status are dropped. A page without the family, or whose family is malformed or has a
// line over MaxReadBytes, says nothing of LoRA and is no failure.
func Parse(kind Kind, model string, page []byte, kvTotal int64) (Status, error) {
	st, _, err := parse(kind, model, page, kvTotal)
	return st, err
}

// parse is Parse with what the LoRA info's reading dropped or could not read.
func parse(kind Kind, model string, page []byte, kvTotal int64) (Status, loraRead, error) {
	d, ok := dialects[kind]
	if !ok {
		return Status{}, loraRead{}, failf(ReasonInvalidTarget, "unknown metrics kind %q: want vllm, sglang or tlengine", kind)
	}
	names := d.names()
	read, err := keepFamilies(page, names)
	if err != nil {
		return Status{}, loraRead{}, err
	}
	st, err := parsePage(d, model, read, kvTotal)
	if pe := (expfmt.ParseError{}); errors.As(err, &pe) {
		pe.Line = pageLine(page, names, pe.Line)
		return Status{}, loraRead{}, failf(ReasonParse, "malformed metrics page: %v", pe)
	}
	if err != nil {
		return Status{}, loraRead{}, err
	}
	lr := readLoRAInfo(d, model, page)
	st.RunningLoRAs, st.MaxLoRAs = lr.running, lr.max
	return st, lr, nil
}

// parsePage is Parse on the lines expfmt is to read.
func parsePage(d dialect, model string, page []byte, kvTotal int64) (Status, error) {
	p := newTextParser()
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return Status{}, failf(ReasonParse, "malformed metrics page: %w", err)
	}
	pg := parsed{fams: fams, model: model, labels: d.modelLabels}

	st := Status{BlockSize: pg.blockSize(d)}
	if st.QueueDepth, err = pg.count(d.queue); err != nil {
		return Status{}, err
	}
	if st.Running, err = pg.count(d.running); err != nil {
		return Status{}, err
	}
	if d.free != "" {
		if st.KVFreeBlocks, err = pg.count(d.free); err != nil {
			return Status{}, err
		}
		st.KVTotalBlocks = max(kvTotal, 0)
		if pg.has(d.total) {
			if st.KVTotalBlocks, err = pg.count(d.total); err != nil {
				return Status{}, err
			}
		}
		// As a heartbeat's (adapters/grpc): free blocks beyond a known total are no state.
		if st.KVTotalBlocks > 0 && st.KVFreeBlocks > st.KVTotalBlocks {
			return Status{}, failf(ReasonParse, "%s (%d) exceeds the total of %d blocks", d.free, st.KVFreeBlocks, st.KVTotalBlocks)
		}
		return st, nil
	}
	st.KVFreeBlocks, st.KVTotalBlocks, err = pg.kvFromUsage(d, kvTotal)
	if err != nil {
		return Status{}, err
	}
	return st, nil
}

func newTextParser() expfmt.TextParser { return expfmt.NewTextParser(model.UTF8Validation) }

// parsed is a page's families with the model filter.
type parsed struct {
	fams   map[string]*dto.MetricFamily
	model  string
	labels []string
}

// series returns name's series that belong to the model.
func (p parsed) series(name string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range p.fams[name].GetMetric() {
		if p.matches(m) {
			out = append(out, m)
		}
	}
	return out
}

func (p parsed) has(name string) bool { return len(p.series(name)) > 0 }

func (p parsed) matches(m *dto.Metric) bool {
	if p.model == "" {
		return true
	}
	for _, lp := range m.GetLabel() {
		if slices.Contains(p.labels, lp.GetName()) && lp.GetValue() != p.model {
			return false
		}
	}
	return true
}

// missing is the error for a required series that is absent for the model: the first of names,
// or any of its alternatives. It names the models the page does have it for, if any.
func (p parsed) missing(names ...string) error {
	what := names[0]
	if len(names) > 1 {
		what = fmt.Sprintf("%s (or %s)", names[0], strings.Join(names[1:], ", "))
	}
	var others []string
	for _, name := range names {
		for _, m := range p.fams[name].GetMetric() {
			for _, lp := range m.GetLabel() {
				if slices.Contains(p.labels, lp.GetName()) {
					others = append(others, strconv.Quote(lp.GetValue()))
				}
			}
		}
	}
	if len(others) == 0 {
		return failf(ReasonMissingSeries, "missing series %s", what)
	}
	slices.Sort(others)
	return failf(ReasonMissingSeries, "missing series %s for model %q (the page has it for %s)",
		what, p.model, strings.Join(slices.Compact(others), ", "))
}

// values returns the value of each of name's series for the model; an absent series is a
// missing_series error, a histogram or summary a parse error.
func (p parsed) values(name string) ([]valued, error) {
	ms := p.series(name)
	if len(ms) == 0 {
		return nil, p.missing(name)
	}
	out := make([]valued, 0, len(ms))
	for _, m := range ms {
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		default:
			return nil, failf(ReasonParse, "%s is a %s, want a gauge", name,
				strings.ToLower(p.fams[name].GetType().String()))
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, failf(ReasonParse, "%s has the value %v, want a finite number", name, v)
		}
		out = append(out, valued{m: m, v: v})
	}
	return out, nil
}

type valued struct {
	m *dto.Metric
	v float64
}

// count sums name's series as a non-negative count.
func (p parsed) count(name string) (int64, error) {
	vs, err := p.values(name)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, x := range vs {
		sum += x.v
	}
	if sum < 0 || sum > math.MaxInt64/2 {
		return 0, failf(ReasonParse, "%s sums to %v, want a count from 0 up", name, sum)
	}
	return int64(math.Round(sum)), nil
}

// usageEps absorbs float noise around the ends of a fraction.
const usageEps = 1e-6

// kvFromUsage turns fraction-used gauges into free and total blocks. When every usage series
// pairs with an engine-reported total (by the engine label), free = Σ round-free of each pair;
// otherwise total = the reported totals' sum, or kvTotal, and free = total × (1 − mean usage).
func (p parsed) kvFromUsage(d dialect, kvTotal int64) (free, total int64, err error) {
	var usage []valued
	var usageName string
	for _, name := range d.usage {
		if p.has(name) {
			usageName = name
			break
		}
	}
	if usageName == "" {
		return 0, 0, p.missing(d.usage...)
	}
	if usage, err = p.values(usageName); err != nil {
		return 0, 0, err
	}
	var mean float64
	for _, u := range usage {
		if u.v < -usageEps || u.v > 1+usageEps {
			return 0, 0, failf(ReasonParse, "%s is %v, want a fraction from 0 to 1", usageName, u.v)
		}
		mean += min(max(u.v, 0), 1)
	}
	mean /= float64(len(usage))

	reported := p.reportedTotals(d)
	if len(reported) > 0 {
		var sumFree, sumTotal float64
		paired := true
		for _, u := range usage {
			t, ok := reported[labelValue(u.m, engineLabel)]
			if !ok {
				paired = false
				break
			}
			sumTotal += float64(t)
			sumFree += float64(t) * (1 - min(max(u.v, 0), 1))
		}
		if paired {
			return int64(math.Round(sumFree)), int64(sumTotal), nil
		}
		total = 0
		for _, t := range reported {
			total += t
		}
	} else {
		total = kvTotal
	}
	if total <= 0 {
		return 0, 0, nil
	}
	return int64(math.Round(float64(total) * (1 - mean))), total, nil
}

// reportedTotals reads the engine's total blocks per engine label from the info gauge. An info
// series whose label is not a positive integer (vLLM writes "None" before it has profiled the
// GPU) reports nothing.
func (p parsed) reportedTotals(d dialect) map[string]int64 {
	if d.info == "" {
		return nil
	}
	out := make(map[string]int64)
	for _, m := range p.series(d.info) {
		n, err := strconv.ParseInt(labelValue(m, d.infoLabel), 10, 64)
		if err != nil || n <= 0 {
			continue
		}
		out[labelValue(m, engineLabel)] = n
	}
	return out
}

// blockSize reads the engine's tokens per KV block from the block_size label of the dialect's
// info gauge: the value every series with a usable label agrees on, else 0 (unknown). A label
// that is not an integer from 1 to MaxBlockSize ("None", say) is ignored.
func (p parsed) blockSize(d dialect) int64 {
	if d.blockInfo == "" {
		return 0
	}
	var bs int64
	for _, m := range p.series(d.blockInfo) {
		n, err := strconv.ParseInt(labelValue(m, "block_size"), 10, 64)
		if err != nil || n <= 0 || n > MaxBlockSize {
			continue
		}
		if bs != 0 && n != bs {
			return 0 // engines behind one endpoint disagree: no one block size
		}
		bs = n
	}
	return bs
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}
