package engine

import (
	"bytes"
	"errors"
	"mime/multipart"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/sim/sampler"
)

// clientError fails unless err is a 4xx apiError: a hostile body is refused, never a 500.
func clientError(t *testing.T, err error) {
	t.Helper()
	var ae *apiError
	if !errors.As(err, &ae) || ae.status < 400 || ae.status > 499 || ae.msg == "" {
		t.Fatalf("error %v (%T) is not a 4xx answer", err, err)
	}
}

// FuzzParseEmbeddings: any body is refused with a 4xx or parsed into 1..maxInputs non-empty
// inputs of in-vocabulary ids, within the answer's bound of numbers.
func FuzzParseEmbeddings(f *testing.F) {
	for _, s := range []string{`{"model":"smol","input":"x"}`, `{"model":"smol","input":[[1,2],[3]],"dimensions":4}`,
		`{"model":"smol","input":["a",""],"encoding_format":"base64"}`, `{"model":"smol","input":[99999999999]}`} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, pooling bool) {
		r, err := parseEmbeddings(body, only("smol"), pooling)
		if err != nil {
			clientError(t, err)
			return
		}
		if len(r.inputs) == 0 || len(r.inputs) > maxInputs || r.dims < 1 || r.dims > maxDims || len(r.inputs)*r.dims > maxVectorVals {
			t.Fatalf("parsed out of bounds: %d inputs, %d dims", len(r.inputs), r.dims)
		}
		for _, in := range r.inputs {
			if len(in.ids) == 0 || maxID(in.ids) >= sampler.VocabSize {
				t.Fatalf("input %+v", in)
			}
		}
	})
}

func maxID(ids []uint32) uint32 {
	m := uint32(0)
	for _, id := range ids {
		m = max(m, id)
	}
	return m
}

// FuzzParseScoreAndRerank: any body is refused with a 4xx or gives pairs that line up.
func FuzzParseScoreAndRerank(f *testing.F) {
	for _, s := range []string{`{"model":"smol","text_1":"a","text_2":["b","c"]}`, `{"model":"smol","text_1":["a","b"],"text_2":["c","d"]}`,
		`{"model":"smol","query":"q","documents":["a",{"text":"b"}],"top_n":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte, modelCheck) (*scoreRequest, error){parseScore, parseRerank} {
			s, err := parse(body, only("smol"))
			if err != nil {
				clientError(t, err)
				continue
			}
			if len(s.right) == 0 || len(s.right) > maxInputs || len(s.left) != 1 && len(s.left) != len(s.right) || s.topN < 0 {
				t.Fatalf("pairs %d × %d, top_n %d", len(s.left), len(s.right), s.topN)
			}
			if len(s.prompts()) != len(s.right) {
				t.Fatal("one prompt per pair")
			}
		}
	})
}

// FuzzParseResponses: any body is refused with a 4xx or parsed into a request whose prompt is
// the chat template over its conversation.
func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{`{"model":"smol","input":"x"}`, `{"model":"smol","instructions":"i","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}],"max_output_tokens":3}`,
		`{"model":"smol","input":"x","previous_response_id":"resp_1"}`, `{"model":"smol","input":[{"type":"function_call"}]}`} {
		f.Add([]byte(s))
	}
	stored := func(id string) (*storedResponse, bool) {
		if id == "resp_1" {
			return &storedResponse{history: []sampler.Message{{Role: "user", Content: "h"}}}, true
		}
		return nil, false
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseResponses(body, only("smol"), stored)
		if err != nil {
			clientError(t, err)
			return
		}
		if r.req.prompt != sampler.RenderChat(r.req.msgs) || r.req.params.MaxTokens < 1 || len(r.input) == 0 {
			t.Fatalf("parsed %+v", r.req)
		}
	})
}

// FuzzParseMessagesAPI: any body is refused with a 4xx or parsed with max_tokens ≥ 1, at most
// maxStopSequences stops and the chat template over its conversation.
func FuzzParseMessagesAPI(f *testing.F) {
	for _, s := range []string{`{"model":"smol","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"smol","max_tokens":3,"system":[{"type":"text","text":"s"}],"stop_sequences":["a"],"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseMessagesAPI(body, only("smol"))
		if err != nil {
			clientError(t, err)
			return
		}
		if r.params.MaxTokens < 1 || len(r.params.Stop) > maxStopSequences || r.prompt != sampler.RenderChat(r.msgs) {
			t.Fatalf("parsed %+v", r)
		}
	})
}

// FuzzParseAudioForm: any body (as multipart with a fixed boundary) is refused with a 4xx or
// parsed with a non-empty file, a model and a known format.
func FuzzParseAudioForm(f *testing.F) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	_ = mw.SetBoundary("fuzzboundary")
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write([]byte("audio"))
	_ = mw.WriteField("model", "smol")
	_ = mw.WriteField("response_format", "verbose_json")
	_ = mw.Close()
	f.Add(b.Bytes())
	f.Add([]byte("--fuzzboundary\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n--fuzzboundary--\r\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		a, err := parseAudioForm(body, "multipart/form-data; boundary=fuzzboundary")
		if err != nil {
			clientError(t, err)
			return
		}
		if len(a.file) == 0 || a.model == "" || a.format != "json" && a.format != "text" && a.format != "verbose_json" ||
			a.stream && a.format != "json" {
			t.Fatalf("parsed %+v", a)
		}
		if ids, _ := audioPrompt(a); len(ids) == 0 {
			t.Fatal("an audio prompt without tokens")
		}
	})
}

// FuzzParseLoRARequest: any load or unload body is refused with a 4xx or names an adapter within
// the bounds, never the base model.
func FuzzParseLoRARequest(f *testing.F) {
	f.Add([]byte(`{"lora_name":"x","lora_path":"/x"}`), true)
	f.Add([]byte(`{"lora_name":"x"}`), false)
	f.Fuzz(func(t *testing.T, body []byte, withPath bool) {
		l, err := parseLoRARequest(body, withPath, "smol")
		if err != nil {
			clientError(t, err)
			return
		}
		if checkLoRA(l, "smol") != nil {
			t.Fatalf("accepted %+v", l)
		}
	})
}

// FuzzParseDetokenize: any body is refused with a 4xx or detokenized.
func FuzzParseDetokenize(f *testing.F) {
	f.Add([]byte(`{"model":"smol","tokens":[1,2,3]}`))
	f.Add([]byte(`{"model":"smol","prompt":[[1],[2]]}`))
	e := &Engine{cfg: Config{Model: "smol"}, loras: newLoRAs(clock.NewFake(time.Unix(0, 0)), 1, 0, nil)}
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, err := e.parseDetokenize(body); err != nil {
			clientError(t, err)
		}
		if _, err := e.renderCompletions(body); err != nil {
			clientError(t, err)
		}
	})
}
