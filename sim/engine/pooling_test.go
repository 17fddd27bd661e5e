package engine

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"testing"
)

type embeddingList struct {
	Object string
	Model  string
	Data   []struct {
		Object    string
		Index     int
		Embedding json.RawMessage
	}
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
}

func embed(t *testing.T, e *Engine, body string) embeddingList {
	t.Helper()
	resp, b := post(t, e, "/v1/embeddings", body)
	var l embeddingList
	if resp.StatusCode != 200 || json.Unmarshal(b, &l) != nil {
		t.Fatalf("embeddings %s: %d %s", body, resp.StatusCode, b)
	}
	return l
}

func floats(t *testing.T, raw json.RawMessage) []float32 {
	t.Helper()
	var v []float32
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("embedding %s: %v", raw, err)
	}
	return v
}

// tokenCount is the engine's own /tokenize count of a prompt.
func tokenCount(t *testing.T, e *Engine, prompt string) int {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "smol", "prompt": prompt})
	_, out := post(t, e, "/tokenize", string(b))
	var v struct{ Count int }
	_ = json.Unmarshal(out, &v)
	return v.Count
}

// TestEmbeddings: one unit-length embedding per input, in order; the same input gives the same
// vector on another engine and a different input another; base64 carries the same float32s;
// dimensions sets the width; usage counts the tokens the engine's tokenizer counts. A gateway
// test can compare answers across workers.
func TestEmbeddings(t *testing.T) {
	e, other := start(t, Config{}), start(t, Config{ID: "e2"})
	l := embed(t, e, `{"model":"smol","input":["the cat sat","on the mat","the cat sat"]}`)
	if l.Object != "list" || l.Model != "smol" || len(l.Data) != 3 {
		t.Fatalf("shape %+v", l)
	}
	vs := make([][]float32, 3)
	for i, d := range l.Data {
		if d.Object != "embedding" || d.Index != i {
			t.Fatalf("data[%d] %+v", i, d)
		}
		vs[i] = floats(t, d.Embedding)
		var n float64
		for _, x := range vs[i] {
			n += float64(x) * float64(x)
		}
		if len(vs[i]) != defaultDims || math.Abs(n-1) > 1e-4 {
			t.Fatalf("data[%d]: %d values, norm² %v", i, len(vs[i]), n)
		}
	}
	if !slices.Equal(vs[0], vs[2]) || slices.Equal(vs[0], vs[1]) {
		t.Fatal("equal inputs must embed equally, different ones differently")
	}
	want := tokenCount(t, e, "the cat sat")*2 + tokenCount(t, e, "on the mat")
	if l.Usage.PromptTokens != want || l.Usage.TotalTokens != want {
		t.Fatalf("usage %+v, want %d tokens", l.Usage, want)
	}
	again := embed(t, other, `{"model":"smol","input":"the cat sat","encoding_format":"base64"}`)
	var s string
	if err := json.Unmarshal(again.Data[0].Embedding, &s); err != nil {
		t.Fatalf("base64 embedding %s", again.Data[0].Embedding)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 4*defaultDims {
		t.Fatalf("base64: %d bytes, %v", len(raw), err)
	}
	for i := range vs[0] {
		if math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])) != vs[0][i] {
			t.Fatalf("base64 value %d differs from the float answer on another engine", i)
		}
	}
	if l := embed(t, e, `{"model":"smol","input":[[5,6,7],[8]],"dimensions":8}`); len(floats(t, l.Data[1].Embedding)) != 8 || l.Usage.PromptTokens != 4 {
		t.Fatalf("token-id inputs with dimensions 8: %+v", l)
	}
	for _, bad := range []string{
		`{"model":"smol","input":""}`, `{"model":"smol","input":[]}`, `{"model":"smol","input":{"a":1}}`,
		`{"model":"smol","input":"x","encoding_format":"hex"}`, `{"model":"smol","input":"x","dimensions":0}`,
		`{"model":"smol","input":[4294967295]}`, `{"model":"smol"}`, `{"input":"x"}`,
	} {
		if resp, b := post(t, e, "/v1/embeddings", bad); resp.StatusCode != 400 || errCodeOf(t, b) != "400" {
			t.Errorf("%s: %d %s, want 400", bad, resp.StatusCode, b)
		}
	}
}

// TestRerankAndScore: rerank orders documents by relevance, highest first, keeps top_n, and
// gives each the same score /v1/score gives the pair; a document sharing the query's words
// ranks above one sharing none. Score pairs one text_1 with every text_2, or pairwise.
func TestRerankAndScore(t *testing.T) {
	e := start(t, Config{})
	docs := []string{"dogs bark loudly", "a cat sat on the mat", "the cat sat"}
	b, _ := json.Marshal(map[string]any{"model": "smol", "query": "the cat sat", "documents": docs})
	resp, out := post(t, e, "/v1/rerank", string(b))
	var rr struct {
		Model string
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		}
		Results []struct {
			Index    int
			Document struct{ Text string }
			Score    float64 `json:"relevance_score"`
		}
	}
	if resp.StatusCode != 200 || json.Unmarshal(out, &rr) != nil || len(rr.Results) != 3 {
		t.Fatalf("rerank: %d %s", resp.StatusCode, out)
	}
	order := []int{rr.Results[0].Index, rr.Results[1].Index, rr.Results[2].Index}
	if !slices.Equal(order, []int{2, 1, 0}) || rr.Results[0].Document.Text != "the cat sat" {
		t.Fatalf("rerank order %v, want the exact match, the overlap, then the stranger: %s", order, out)
	}
	q := tokenCount(t, e, "the cat sat")
	if want := 3*q + tokenCount(t, e, docs[0]) + tokenCount(t, e, docs[1]) + tokenCount(t, e, docs[2]); rr.Usage.TotalTokens != want {
		t.Fatalf("rerank usage %d, want %d", rr.Usage.TotalTokens, want)
	}
	b, _ = json.Marshal(map[string]any{"model": "smol", "text_1": "the cat sat", "text_2": docs})
	resp, out = post(t, e, "/v1/score", string(b))
	var sc struct {
		Object string
		Data   []struct {
			Index  int
			Object string
			Score  float64
		}
	}
	if resp.StatusCode != 200 || json.Unmarshal(out, &sc) != nil || sc.Object != "list" || len(sc.Data) != 3 {
		t.Fatalf("score: %d %s", resp.StatusCode, out)
	}
	for _, r := range rr.Results {
		if d := sc.Data[r.Index]; d.Object != "score" || d.Index != r.Index || d.Score != r.Score {
			t.Fatalf("score of pair %d %+v, rerank gave %v", r.Index, d, r.Score)
		}
	}
	b, _ = json.Marshal(map[string]any{"model": "smol", "query": "the cat sat", "documents": docs, "top_n": 1})
	if _, out = post(t, e, "/v1/rerank", string(b)); json.Unmarshal(out, &rr) != nil || len(rr.Results) != 1 || rr.Results[0].Index != 2 {
		t.Fatalf("top_n 1: %s", out)
	}
	resp, out = post(t, e, "/v1/score", `{"model":"smol","text_1":["a cat","dogs"],"text_2":["dogs","a cat"]}`)
	var alone struct{ Data []struct{ Score float64 } }
	_, one := post(t, e, "/v1/score", `{"model":"smol","text_1":"dogs","text_2":"a cat"}`)
	if json.Unmarshal(out, &sc) != nil || len(sc.Data) != 2 || json.Unmarshal(one, &alone) != nil ||
		len(alone.Data) != 1 || sc.Data[1].Score != alone.Data[0].Score {
		t.Fatalf("pairwise score: %d %s; the pair alone: %s", resp.StatusCode, out, one)
	}
	for _, bad := range []struct{ path, body string }{
		{"/v1/score", `{"model":"smol","text_1":["a","b"],"text_2":["a","b","c"]}`},
		{"/v1/score", `{"model":"smol","text_1":"a"}`},
		{"/v1/rerank", `{"model":"smol","query":"","documents":["a"]}`},
		{"/v1/rerank", `{"model":"smol","query":"q","documents":[7]}`},
		{"/v1/rerank", `{"model":"smol","query":"q","documents":["a"],"top_n":-1}`},
	} {
		if resp, b := post(t, e, bad.path, bad.body); resp.StatusCode != 400 {
			t.Errorf("%s %s: %d %s, want 400", bad.path, bad.body, resp.StatusCode, b)
		}
	}
}

// TestPooling: /pooling answers one raw (not normalized) vector per input in vLLM's shape,
// deterministic per input.
func TestPooling(t *testing.T) {
	e := start(t, Config{})
	get := func() []float32 {
		resp, out := post(t, e, "/pooling", `{"model":"smol","input":["x y z","x y z"]}`)
		var p struct {
			Object string
			Data   []struct {
				Index  int
				Object string
				Data   []float32
			}
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal(out, &p) != nil || p.Object != "list" || len(p.Data) != 2 ||
			p.Data[1].Object != "pooling" || p.Data[1].Index != 1 || !slices.Equal(p.Data[0].Data, p.Data[1].Data) {
			t.Fatalf("pooling: %d %s", resp.StatusCode, out)
		}
		var n float64
		for _, x := range p.Data[0].Data {
			n += float64(x) * float64(x)
		}
		if math.Abs(n-1) < 1e-3 {
			t.Fatalf("pooled vector has unit norm; vLLM's pooling output is raw")
		}
		return p.Data[0].Data
	}
	if !slices.Equal(get(), get()) {
		t.Fatal("pooling is not deterministic")
	}
}
