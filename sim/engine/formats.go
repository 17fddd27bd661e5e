package engine

import (
	"encoding/json"

	"github.com/tlgw/tlgw/sim/sampler"
)

// format is how one API writes a run's answer: the generation (admission, the sampler, the
// faults) is the same for every generating endpoint, only the wire shape differs.
type format interface {
	// open writes a streamed answer's events before the first token (the headers are sent).
	open(x *run) error
	// token writes one streamed token.
	token(x *run, tok sampler.Token) error
	// close writes a streamed answer's events after the last token.
	close(x *run) error
	// whole is a non-streamed answer and its content type.
	whole(x *run) ([]byte, string, error)
}

var (
	_ format = completionsFormat{}
	_ format = chatFormat{}
)

// completionsFormat is OpenAI's legacy completions API.
type completionsFormat struct{}

func (completionsFormat) chunk(x *run, text string, lp any, finish any) map[string]any {
	return map[string]any{"id": x.id, "object": "text_completion", "created": x.created, "model": x.req.model,
		"choices": []map[string]any{{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}}}
}

func (completionsFormat) open(*run) error { return nil }

func (f completionsFormat) token(x *run, tok sampler.Token) error {
	var lp any
	if x.req.logprobs {
		lp = completionLogprobs([]sampler.Token{tok}, 0)
	}
	return x.event(f.chunk(x, tok.Text, lp, nil))
}

func (f completionsFormat) close(x *run) error {
	return closeOpenAIStream(x, f.chunk(x, "", nil, x.finish))
}

func (f completionsFormat) whole(x *run) ([]byte, string, error) {
	var lp any
	if x.req.logprobs {
		lp = completionLogprobs(x.tokens, 0)
	}
	b, err := json.Marshal(map[string]any{"id": x.id, "object": "text_completion", "created": x.created, "model": x.req.model,
		"choices": []map[string]any{{"index": 0, "text": x.text(), "logprobs": lp, "finish_reason": x.finish}},
		"usage":   x.usage()})
	return b, "application/json", err
}

// closeOpenAIStream writes the last chunk, the usage chunk when asked for, and [DONE].
func closeOpenAIStream(x *run, last map[string]any) error {
	if err := x.event(last); err != nil {
		return err
	}
	if x.req.includeUsage {
		u := map[string]any{"id": x.id, "object": last["object"], "created": x.created, "model": x.req.model,
			"choices": []any{}, "usage": x.usage()}
		if err := x.event(u); err != nil {
			return err
		}
	}
	return x.done()
}

// chatFormat is OpenAI's chat completions API.
type chatFormat struct{}

func (chatFormat) chunk(x *run, delta map[string]any, lp any, finish any) map[string]any {
	return map[string]any{"id": x.id, "object": "chat.completion.chunk", "created": x.created, "model": x.req.model,
		"choices": []map[string]any{{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}}}
}

func (f chatFormat) open(x *run) error {
	return x.event(f.chunk(x, map[string]any{"role": "assistant", "content": ""}, nil, nil))
}

func (f chatFormat) token(x *run, tok sampler.Token) error {
	var lp any
	if x.req.logprobs {
		lp = map[string]any{"content": []any{chatLogprob(tok)}}
	}
	return x.event(f.chunk(x, map[string]any{"content": tok.Text}, lp, nil))
}

func (f chatFormat) close(x *run) error {
	return closeOpenAIStream(x, f.chunk(x, map[string]any{}, nil, x.finish))
}

func (chatFormat) whole(x *run) ([]byte, string, error) {
	var lp any
	if x.req.logprobs {
		content := make([]any, len(x.tokens))
		for i, t := range x.tokens {
			content[i] = chatLogprob(t)
		}
		lp = map[string]any{"content": content}
	}
	b, err := json.Marshal(map[string]any{"id": x.id, "object": "chat.completion", "created": x.created, "model": x.req.model,
		"choices": []map[string]any{{"index": 0, "message": map[string]any{"role": "assistant", "content": x.text()},
			"logprobs": lp, "finish_reason": x.finish}},
		"usage": x.usage()})
	return b, "application/json", err
}
