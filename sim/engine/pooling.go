package engine

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/tlgw/tlgw/sim/sampler"
)

// The pooling endpoints (embeddings, pooling, score, rerank) run their inputs through the model
// (forward: a running slot and KV for each prefill, on the engine's clock) and answer vectors
// and scores drawn from the engine's PCG32 stream, seeded by the model and the input's token
// ids: the same model and input always give the same numbers.

// Vector bounds: the default and largest width, and the most numbers one answer carries.
const (
	defaultDims   = 256
	maxDims       = 4096
	maxVectorVals = 1 << 20
)

// Stream tags keep the vector kinds' PCG32 streams apart.
const (
	tagEmbedding uint64 = 1 + iota
	tagPooling
	tagScore
)

// streamFor is a PCG32 stream for model, tag and the token id lists.
func streamFor(model string, tag uint64, ids ...[]uint32) *sampler.PCG32 {
	h := fnv.New64a()
	h.Write([]byte(model))
	var b [4]byte
	for _, list := range ids {
		binary.LittleEndian.PutUint32(b[:], uint32(len(list)))
		h.Write(b[:])
		for _, id := range list {
			binary.LittleEndian.PutUint32(b[:], id)
			h.Write(b[:])
		}
	}
	return sampler.NewPCG32(h.Sum64(), tag)
}

// vector is dims values in [-1, 1) from the stream of model, tag and ids; normalized, it has
// unit length (embeddings are, as vLLM normalizes them by default).
func vector(model string, tag uint64, ids []uint32, dims int, normalized bool) []float32 {
	rng := streamFor(model, tag, ids)
	v := make([]float32, dims)
	var sum float64
	for i := range v {
		x := rng.Float64()*2 - 1
		v[i] = float32(x)
		sum += x * x
	}
	if normalized && sum > 0 {
		n := math.Sqrt(sum)
		for i := range v {
			v[i] = float32(float64(v[i]) / n)
		}
	}
	return v
}

// relevance is a query–document score in [0, 1): three quarters the Jaccard overlap of their
// token sets, a quarter drawn from the stream of model and both — the more words they share, the
// higher, and deterministic.
func relevance(model string, q, d []uint32) float64 {
	set := make(map[uint32]bool, len(q))
	for _, id := range q {
		set[id] = true
	}
	inter, union := 0, len(set)
	seen := make(map[uint32]bool, len(d))
	for _, id := range d {
		if seen[id] {
			continue
		}
		seen[id] = true
		if set[id] {
			inter++
		} else {
			union++
		}
	}
	j := 0.0
	if union > 0 {
		j = float64(inter) / float64(union)
	}
	return 0.75*j + 0.25*streamFor(model, tagScore, q, d).Float64()*(1-1e-9)
}

func sumTokens(in []input) int {
	n := 0
	for _, x := range in {
		n += len(x.ids)
	}
	return n
}

func idsOf(in []input) [][]uint32 {
	out := make([][]uint32, len(in))
	for i, x := range in {
		out[i] = x.ids
	}
	return out
}

// embeddingsRequest is a parsed /v1/embeddings or /pooling body.
type embeddingsRequest struct {
	model  string
	inputs []input
	dims   int
	base64 bool
}

// parseEmbeddings reads an embeddings (or, pooling, a pooling) body: input, and for embeddings
// encoding_format (float or base64) and dimensions.
func parseEmbeddings(body []byte, check modelCheck, pooling bool) (*embeddingsRequest, error) {
	var w struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat *string         `json:"encoding_format"`
		Dimensions     *int            `json:"dimensions"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, invalid("invalid JSON body: %v", err)
	}
	if w.Model == "" {
		return nil, invalid(`"model" is required`)
	}
	if err := check(w.Model); err != nil {
		return nil, err
	}
	r := &embeddingsRequest{model: w.Model, dims: defaultDims}
	if !pooling && w.EncodingFormat != nil {
		switch *w.EncodingFormat {
		case "float":
		case "base64":
			r.base64 = true
		default:
			return nil, invalid(`"encoding_format" must be "float" or "base64"`)
		}
	}
	if !pooling && w.Dimensions != nil {
		if *w.Dimensions < 1 || *w.Dimensions > maxDims {
			return nil, invalid(`"dimensions" must be between 1 and %d`, maxDims)
		}
		r.dims = *w.Dimensions
	}
	in, err := parseInputs(w.Input, "input")
	if err != nil {
		return nil, err
	}
	if len(in)*r.dims > maxVectorVals {
		return nil, invalid("%d inputs of %d dimensions is over %d numbers", len(in), r.dims, maxVectorVals)
	}
	r.inputs = in
	return r, nil
}

// encode is an embedding as the request asked: numbers, or base64 of little-endian float32s.
func (r *embeddingsRequest) encode(v []float32) any {
	if !r.base64 {
		return v
	}
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// servePooled is the shared flow of the pooling endpoints: front, parse, stall, forward, answer.
func (e *Engine) servePooled(w http.ResponseWriter, r *http.Request, endpoint string,
	parse func([]byte) (prompts [][]uint32, model string, answer func() any, err error)) {
	body, ok := e.front(w, r, endpoint, maxBody, writeAPIError)
	if !ok {
		return
	}
	prompts, model, answer, err := parse(body)
	if err != nil {
		e.fail(w, endpoint, err, writeAPIError)
		return
	}
	if e.stalled(r, endpoint) {
		return
	}
	if err := e.forward(r.Context(), e.adapter(model), prompts); err != nil {
		if r.Context().Err() != nil {
			e.met.request(endpoint, r.Context().Err())
			return
		}
		e.fail(w, endpoint, err, writeAPIError)
		return
	}
	e.answer(w, endpoint, answer(), nil)
}

// serveEmbeddings answers POST /v1/embeddings in OpenAI's list shape, one embedding per input.
func (e *Engine) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	e.servePooled(w, r, EndpointEmbeddings, func(body []byte) ([][]uint32, string, func() any, error) {
		req, err := parseEmbeddings(body, e.checkModel, false)
		if err != nil {
			return nil, "", nil, err
		}
		return idsOf(req.inputs), req.model, func() any {
			data := make([]map[string]any, len(req.inputs))
			for i, x := range req.inputs {
				data[i] = map[string]any{"object": "embedding", "index": i,
					"embedding": req.encode(vector(req.model, tagEmbedding, x.ids, req.dims, true))}
			}
			n := sumTokens(req.inputs)
			return map[string]any{"object": "list", "data": data, "model": req.model,
				"id": fmt.Sprintf("embd-%s-%d", e.cfg.ID, reqSeq.Add(1)), "created": time.Now().Unix(),
				"usage": map[string]int{"prompt_tokens": n, "total_tokens": n}}
		}, nil
	})
}

// servePooling answers POST /pooling: vLLM's raw pooled vectors (not normalized), one per input.
func (e *Engine) servePooling(w http.ResponseWriter, r *http.Request) {
	e.servePooled(w, r, EndpointPooling, func(body []byte) ([][]uint32, string, func() any, error) {
		req, err := parseEmbeddings(body, e.checkModel, true)
		if err != nil {
			return nil, "", nil, err
		}
		return idsOf(req.inputs), req.model, func() any {
			data := make([]map[string]any, len(req.inputs))
			for i, x := range req.inputs {
				data[i] = map[string]any{"index": i, "object": "pooling",
					"data": vector(req.model, tagPooling, x.ids, req.dims, false)}
			}
			n := sumTokens(req.inputs)
			return map[string]any{"id": fmt.Sprintf("pool-%s-%d", e.cfg.ID, reqSeq.Add(1)), "object": "list",
				"created": time.Now().Unix(), "model": req.model, "data": data,
				"usage": map[string]int{"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}
		}, nil
	})
}

// textList reads a string or an array of strings (score's text_1 and text_2, rerank's
// documents), each non-empty, at most maxInputs.
func textList(raw json.RawMessage, field string, allowOne bool) ([]input, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid("%q is required", field)
	}
	var texts []string
	var one string
	if err := json.Unmarshal(raw, &one); allowOne && err == nil {
		texts = []string{one}
	} else if err := json.Unmarshal(raw, &texts); err != nil {
		return nil, invalid("%q must be a string or an array of strings", field)
	}
	if len(texts) > maxInputs {
		return nil, invalid("%q has %d entries, at most %d", field, len(texts), maxInputs)
	}
	out := make([]input, len(texts))
	for i, t := range texts {
		out[i] = input{text: t, ids: sampler.Tokenize(t)}
	}
	return checkInputs(out, field)
}

// scoreRequest is a parsed /v1/score or /v1/rerank body: the pairs to score.
type scoreRequest struct {
	model string
	left  []input // one (broadcast) or as many as right
	right []input
	topN  int // rerank: results kept, 0 = all
}

func (s *scoreRequest) pair(i int) (q, d []uint32) {
	if len(s.left) == 1 {
		return s.left[0].ids, s.right[i].ids
	}
	return s.left[i].ids, s.right[i].ids
}

// prompts are the cross-encoder's inputs: each pair's tokens, one after the other.
func (s *scoreRequest) prompts() [][]uint32 {
	out := make([][]uint32, len(s.right))
	for i := range s.right {
		q, d := s.pair(i)
		out[i] = append(slices.Clip(q), d...)
	}
	return out
}

func (s *scoreRequest) tokens() int {
	n := 0
	for i := range s.right {
		q, d := s.pair(i)
		n += len(q) + len(d)
	}
	return n
}

// parseScore reads a score body: text_1 and text_2, each a string or an array; one text_1 is
// scored against every text_2, else they pair up and must be as many.
func parseScore(body []byte, check modelCheck) (*scoreRequest, error) {
	var w struct {
		Model string          `json:"model"`
		Text1 json.RawMessage `json:"text_1"`
		Text2 json.RawMessage `json:"text_2"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, invalid("invalid JSON body: %v", err)
	}
	if w.Model == "" {
		return nil, invalid(`"model" is required`)
	}
	if err := check(w.Model); err != nil {
		return nil, err
	}
	left, err := textList(w.Text1, "text_1", true)
	if err != nil {
		return nil, err
	}
	right, err := textList(w.Text2, "text_2", true)
	if err != nil {
		return nil, err
	}
	if len(left) != 1 && len(left) != len(right) {
		return nil, invalid(`"text_1" has %d texts and "text_2" %d: give one text_1 or as many as text_2`, len(left), len(right))
	}
	return &scoreRequest{model: w.Model, left: left, right: right}, nil
}

// parseRerank reads a rerank body: query, documents (strings, or objects with "text") and top_n.
func parseRerank(body []byte, check modelCheck) (*scoreRequest, error) {
	var w struct {
		Model     string            `json:"model"`
		Query     *string           `json:"query"`
		Documents []json.RawMessage `json:"documents"`
		TopN      *int              `json:"top_n"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, invalid("invalid JSON body: %v", err)
	}
	if w.Model == "" {
		return nil, invalid(`"model" is required`)
	}
	if err := check(w.Model); err != nil {
		return nil, err
	}
	if w.Query == nil || *w.Query == "" {
		return nil, invalid(`"query" is required`)
	}
	if len(w.Documents) > maxInputs {
		return nil, invalid(`"documents" has %d entries, at most %d`, len(w.Documents), maxInputs)
	}
	docs := make([]input, len(w.Documents))
	for i, raw := range w.Documents {
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			var obj struct {
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(raw, &obj); err != nil || obj.Text == nil {
				return nil, invalid(`documents[%d] must be a string or {"text": string}`, i)
			}
			text = *obj.Text
		}
		docs[i] = input{text: text, ids: sampler.Tokenize(text)}
	}
	docs, err := checkInputs(docs, "documents")
	if err != nil {
		return nil, err
	}
	s := &scoreRequest{model: w.Model, left: []input{{text: *w.Query, ids: sampler.Tokenize(*w.Query)}}, right: docs}
	if w.TopN != nil {
		if *w.TopN < 0 {
			return nil, invalid(`"top_n" must not be negative`)
		}
		s.topN = *w.TopN
	}
	return s, nil
}

// serveScore answers POST /v1/score: one score per pair, in order.
func (e *Engine) serveScore(w http.ResponseWriter, r *http.Request) {
	e.servePooled(w, r, EndpointScore, func(body []byte) ([][]uint32, string, func() any, error) {
		req, err := parseScore(body, e.checkModel)
		if err != nil {
			return nil, "", nil, err
		}
		return req.prompts(), req.model, func() any {
			data := make([]map[string]any, len(req.right))
			for i := range req.right {
				q, d := req.pair(i)
				data[i] = map[string]any{"index": i, "object": "score", "score": relevance(req.model, q, d)}
			}
			n := req.tokens()
			return map[string]any{"id": fmt.Sprintf("score-%s-%d", e.cfg.ID, reqSeq.Add(1)), "object": "list",
				"created": time.Now().Unix(), "model": req.model, "data": data,
				"usage": map[string]int{"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}
		}, nil
	})
}

// serveRerank answers POST /v1/rerank: the documents by relevance to the query, highest first
// (ties in document order), the first top_n of them.
func (e *Engine) serveRerank(w http.ResponseWriter, r *http.Request) {
	e.servePooled(w, r, EndpointRerank, func(body []byte) ([][]uint32, string, func() any, error) {
		req, err := parseRerank(body, e.checkModel)
		if err != nil {
			return nil, "", nil, err
		}
		return req.prompts(), req.model, func() any {
			type result struct {
				Index    int               `json:"index"`
				Document map[string]string `json:"document"`
				Score    float64           `json:"relevance_score"`
			}
			results := make([]result, len(req.right))
			for i, d := range req.right {
				results[i] = result{Index: i, Document: map[string]string{"text": d.text},
					Score: relevance(req.model, req.left[0].ids, d.ids)}
			}
			slices.SortStableFunc(results, func(a, b result) int {
				switch {
				case a.Score > b.Score:
					return -1
				case a.Score < b.Score:
					return 1
				}
				return 0
			})
			if req.topN > 0 && req.topN < len(results) {
				results = results[:req.topN]
			}
			return map[string]any{"id": fmt.Sprintf("rerank-%s-%d", e.cfg.ID, reqSeq.Add(1)), "model": req.model,
				"usage": map[string]int{"total_tokens": req.tokens()}, "results": results}
		}, nil
	})
}
