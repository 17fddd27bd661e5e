package scrape

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
)

// Bounds of an engine's GET /v1/models answer (R21). An engine serves its base model and at
// most router.MaxLoRAAdapters adapters of it that tlgw keeps; 4096 entries leave room for
// other models' entries, and 1 MiB for 4096 entries with 256-byte names and paths.
const (
	MaxModelsBytes   = 1 << 20
	MaxModelsEntries = 4096
	// MaxModelLen is the largest context length read; a larger one reads as unknown (0).
	MaxModelLen = 1 << 24
)

// modelsRead is what an engine's /v1/models says of one model.
type modelsRead struct {
	// adapters are the entries whose parent is the model (see names).
	adapters []string
	// maxModelLen is the max_model_len of the model's own entry (the first whose id is the
	// model): a positive integer up to MaxModelLen, else 0 (unknown).
	maxModelLen int64
	// invalid and over count the adapter names dropped (see names).
	invalid, over int
}

// modelEntry is the part of an OpenAI model object read. vLLM adds parent (the base model of
// an adapter, null for a base model), root (an adapter's path) and max_model_len.
type modelEntry struct {
	ID          string          `json:"id"`
	Parent      *string         `json:"parent"`
	MaxModelLen json.RawMessage `json:"max_model_len"`
}

// readModels reads an OpenAI model list ({"object":"list","data":[…]}) for model. The list is
// decoded one entry at a time: more than MaxModelsEntries entries is too_large; a body that is
// not a JSON object with a "data" array of model objects (id a string, parent a string or
// null) is a parse error. Fields other than data and other than the entry fields read are
// skipped.
func readModels(model string, body []byte) (modelsRead, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := expectDelim(dec, '{'); err != nil {
		return modelsRead{}, err
	}
	var (
		out     modelsRead
		ns      = names{model: model}
		sawData bool
		sawBase bool
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return modelsRead{}, failf(ReasonParse, "/v1/models: %v", err)
		}
		if key, _ := tok.(string); key != "data" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return modelsRead{}, failf(ReasonParse, "/v1/models: %v", err)
			}
			continue
		}
		if sawData {
			return modelsRead{}, failf(ReasonParse, `/v1/models: "data" given twice`)
		}
		sawData = true
		if err := expectDelim(dec, '['); err != nil {
			return modelsRead{}, err
		}
		for n := 0; dec.More(); n++ {
			if n == MaxModelsEntries {
				return modelsRead{}, failf(ReasonTooLarge, "/v1/models: more than %d entries", MaxModelsEntries)
			}
			var e modelEntry
			if err := dec.Decode(&e); err != nil {
				return modelsRead{}, failf(ReasonParse, "/v1/models: entry %d: %v", n, err)
			}
			if e.ID == model && !sawBase {
				sawBase = true
				out.maxModelLen = modelLen(e.MaxModelLen)
			} else if e.Parent != nil && *e.Parent == model {
				ns.add(e.ID)
			}
		}
		if err := expectDelim(dec, ']'); err != nil {
			return modelsRead{}, err
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return modelsRead{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return modelsRead{}, failf(ReasonParse, "/v1/models: data after the list")
	}
	if !sawData {
		return modelsRead{}, failf(ReasonParse, `/v1/models: no "data" list`)
	}
	out.adapters = ns.list()
	out.invalid, out.over = ns.invalid, ns.over
	return out, nil
}

// expectDelim reads the next token, which must be the delimiter want.
func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return failf(ReasonParse, "/v1/models: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return failf(ReasonParse, "/v1/models: %v where %q was expected", tok, want)
	}
	return nil
}

// modelLen reads max_model_len: a positive integer up to MaxModelLen, else 0 (unknown).
func modelLen(raw json.RawMessage) int64 {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n <= 0 || n > MaxModelLen {
		return 0
	}
	return n
}
