package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"

	"github.com/tlgw/tlgw/sim/sampler"
)

// Audio form bounds: the whole form (OpenAI's and vLLM's file limit), its parts, a text field.
const (
	maxAudioBody  = 25 << 20
	maxAudioParts = 32
	maxFormField  = 16 << 10
)

// The audio stand-in: a file is heard as 16 kHz 16-bit mono (32,000 bytes a second) and as one
// prompt token per KiB, at most maxAudioTokens (Whisper's encoder frames for 30 s).
const (
	audioBytesPerSecond = 32000
	maxAudioTokens      = 1500
	maxAudioOutput      = 448 // Whisper's decoder context
)

// audioRequest is a parsed transcription or translation form.
type audioRequest struct {
	model, language, format string
	file                    []byte
	prompt                  string
	stream, includeUsage    bool
	temperature             *float64
}

// parseAudioForm reads a multipart/form-data body: file (required, non-empty), model
// (required), language, prompt, response_format (json, text or verbose_json), temperature,
// stream and stream_include_usage ("true" or "false"). At most maxAudioParts parts; a text
// field holds at most maxFormField bytes; a field given twice is refused.
func parseAudioForm(body []byte, contentType string) (*audioRequest, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, invalid("the body must be multipart/form-data with a boundary")
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	a := &audioRequest{format: "json"}
	seen := make(map[string]bool)
	hasFile := false
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, invalid("reading the form: %v", err)
		}
		if n >= maxAudioParts {
			return nil, invalid("the form has more than %d parts", maxAudioParts)
		}
		name := part.FormName()
		if seen[name] {
			return nil, invalid("the form field %q is given twice", name)
		}
		seen[name] = true
		if name == "file" {
			if a.file, err = io.ReadAll(part); err != nil {
				return nil, invalid("reading the file: %v", err)
			}
			hasFile = true
			continue
		}
		v, err := io.ReadAll(io.LimitReader(part, maxFormField+1))
		if err != nil {
			return nil, invalid("reading the form field %q: %v", name, err)
		}
		if len(v) > maxFormField {
			return nil, invalid("the form field %q is over %d bytes", name, maxFormField)
		}
		if err := a.set(name, string(v)); err != nil {
			return nil, err
		}
	}
	switch {
	case !hasFile || len(a.file) == 0:
		return nil, invalid(`the form field "file" is required and must not be empty`)
	case a.model == "":
		return nil, invalid(`the form field "model" is required`)
	case a.stream && a.format != "json":
		return nil, invalid(`"stream" answers only with response_format "json"`)
	}
	return a, nil
}

// set reads one text field; fields it does not know are ignored, as engines do.
func (a *audioRequest) set(name, v string) error {
	flag := func() (bool, error) {
		switch v {
		case "true", "True":
			return true, nil
		case "false", "False", "":
			return false, nil
		}
		return false, invalid("the form field %q must be true or false", name)
	}
	var err error
	switch name {
	case "model":
		a.model = v
	case "language":
		a.language = v
	case "prompt":
		a.prompt = v
	case "response_format":
		switch v {
		case "json", "text", "verbose_json":
			a.format = v
		default:
			return invalid(`"response_format" must be json, text or verbose_json`)
		}
	case "temperature":
		t, perr := strconv.ParseFloat(v, 64)
		if perr != nil || !(t >= 0 && t <= 1) {
			return invalid(`"temperature" must be a number between 0 and 1`)
		}
		a.temperature = &t
	case "stream":
		a.stream, err = flag()
	case "stream_include_usage":
		a.includeUsage, err = flag()
	}
	return err
}

// audioPrompt is what the engine runs an audio request on: the prompt field's tokens, then one
// token per KiB of the file drawn from a stream seeded by the file's SHA-256, and the seed of
// its sampling, the digest's first 8 bytes: the same file always reads the same text.
func audioPrompt(a *audioRequest) ([]uint32, uint64) {
	sum := sha256.Sum256(a.file)
	seed := binary.LittleEndian.Uint64(sum[:8]) >> 1
	n := min(max(len(a.file)/1024, 1), maxAudioTokens)
	ids := sampler.Tokenize(a.prompt)
	rng := sampler.NewPCG32(seed, binary.LittleEndian.Uint64(sum[8:16]))
	for range n {
		ids = append(ids, 1+rng.Uint32()%(sampler.GenerativeVocabSize-1))
	}
	return ids, seed
}

// serveAudio answers POST /v1/audio/transcriptions and /v1/audio/translations as vLLM does.
func (e *Engine) serveAudio(w http.ResponseWriter, r *http.Request, translate bool) {
	endpoint := EndpointTranscriptions
	if translate {
		endpoint = EndpointTranslations
	}
	body, ok := e.front(w, r, endpoint, maxAudioBody, writeAPIError)
	if !ok {
		return
	}
	a, err := parseAudioForm(body, r.Header.Get("Content-Type"))
	if err == nil {
		err = e.checkModel(a.model)
	}
	if err != nil {
		e.fail(w, endpoint, err, writeAPIError)
		return
	}
	if e.stalled(r, endpoint) {
		return
	}
	prompt, seed := audioPrompt(a)
	p := sampler.DefaultParams()
	p.Seed, p.MaxTokens = seed, min(maxAudioOutput, 8+len(prompt)/4)
	if a.temperature != nil {
		p.Temperature = *a.temperature
	}
	req := &request{model: a.model, params: p, seeded: true, stream: a.stream, includeUsage: a.includeUsage}
	prefix := "trsc-"
	if translate {
		prefix = "trsl-"
	}
	x := &run{e: e, w: w, r: r, req: req, prompt: prompt, id: newID(prefix),
		out: audioFormat{a: a, translate: translate}, errw: writeAPIError}
	e.generate(endpoint, x)
}

// audioFormat is vLLM's transcription and translation answers.
type audioFormat struct {
	a         *audioRequest
	translate bool
}

var _ format = audioFormat{}

func (f audioFormat) object() string {
	if f.translate {
		return "translation.chunk"
	}
	return "transcription.chunk"
}

func (f audioFormat) chunk(x *run, delta map[string]any, finish any) map[string]any {
	return map[string]any{"id": x.id, "object": f.object(), "created": x.created, "model": x.req.model,
		"choices": []map[string]any{{"delta": delta, "finish_reason": finish, "stop_reason": nil}}}
}

func (audioFormat) open(*run) error { return nil }

func (f audioFormat) token(x *run, tok sampler.Token) error {
	return x.event(f.chunk(x, map[string]any{"content": tok.Text}, nil))
}

func (f audioFormat) close(x *run) error {
	if err := x.event(f.chunk(x, map[string]any{}, x.finish)); err != nil {
		return err
	}
	if x.req.includeUsage {
		u := map[string]any{"id": x.id, "object": f.object(), "created": x.created, "model": x.req.model,
			"choices": []any{}, "usage": x.usage()}
		if err := x.event(u); err != nil {
			return err
		}
	}
	return x.done()
}

// seconds is the file's length as audio.
func (f audioFormat) seconds() float64 {
	return float64(len(f.a.file)) / audioBytesPerSecond
}

func (f audioFormat) whole(x *run) ([]byte, string, error) {
	text := x.text()
	var v any
	switch f.a.format {
	case "text":
		return []byte(text), "text/plain; charset=utf-8", nil
	case "verbose_json":
		task, lang := "transcribe", f.a.language
		if f.translate {
			task, lang = "translate", "english"
		}
		if lang == "" {
			lang = "english"
		}
		ids := make([]uint32, len(x.tokens))
		for i, t := range x.tokens {
			ids[i] = t.ID
		}
		v = map[string]any{"task": task, "language": lang, "duration": f.seconds(), "text": text,
			"segments": []map[string]any{{"id": 0, "seek": 0, "start": 0.0, "end": f.seconds(), "text": text,
				"tokens": ids, "temperature": x.req.params.Temperature, "avg_logprob": avgLogprob(x.tokens),
				"compression_ratio": 1.0, "no_speech_prob": 0.0}}}
	default:
		v = map[string]any{"text": text, "usage": map[string]any{"type": "duration", "seconds": int(math.Ceil(f.seconds()))}}
	}
	b, err := json.Marshal(v)
	return b, "application/json", err
}

func avgLogprob(toks []sampler.Token) float64 {
	if len(toks) == 0 {
		return 0
	}
	s := 0.0
	for _, t := range toks {
		s += t.Logprob
	}
	return s / float64(len(toks))
}
