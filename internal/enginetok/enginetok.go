// Package enginetok reads a request's token ids from an engine (SPEC R22: gateway.tokenizer =
// "engine"): the render endpoints answer the token ids the engine would compute for the same
// body (POST /v1/chat/completions/render → {"token_ids":[…]}, POST /v1/completions/render →
// [{"token_ids":[…]}, …], one per prompt), and POST /tokenize → {"tokens":[…],"count",
// "max_model_len"}. It is pure: the caller does the HTTP call with its own deadline, under the
// gateway's tokenizer_timeout.
package enginetok

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Endpoint is where token ids are read.
type Endpoint uint8

// The endpoints.
const (
	ChatRender        Endpoint = iota // POST /v1/chat/completions/render
	CompletionsRender                 // POST /v1/completions/render
	Tokenize                          // POST /tokenize
)

// Path is e's HTTP path.
func (e Endpoint) Path() string {
	switch e {
	case ChatRender:
		return "/v1/chat/completions/render"
	case CompletionsRender:
		return "/v1/completions/render"
	default:
		return "/tokenize"
	}
}

// MaxAnswerBytes bounds an answer read: 262,144 token ids of up to 10 digits and a comma each.
const MaxAnswerBytes = 3 << 20

// MaxTokens bounds the token ids of one answer.
const MaxTokens = 1 << 18

// ErrAnswer wraps every refusal of an answer.
var ErrAnswer = errors.New("enginetok: not a token-id answer")

// Parse reads the token ids of an answer from e (the first prompt's, for a completions render
// of several). Ids are integers 0 to 2^32−1; at most MaxTokens; the answer at most
// MaxAnswerBytes. Anything else is refused.
func Parse(e Endpoint, body []byte) ([]uint32, error) {
	if len(body) > MaxAnswerBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrAnswer, len(body), MaxAnswerBytes)
	}
	body = bytes.TrimSpace(body)
	var ids []int64
	var err error
	switch {
	case e == Tokenize:
		var a struct {
			Tokens []int64 `json:"tokens"`
		}
		err = decode(body, &a)
		ids = a.Tokens
		if err == nil && a.Tokens == nil {
			err = errors.New("no tokens")
		}
	case e == CompletionsRender && len(body) > 0 && body[0] == '[':
		var a []struct {
			TokenIDs []int64 `json:"token_ids"`
		}
		err = decode(body, &a)
		if err == nil && (len(a) == 0 || a[0].TokenIDs == nil) {
			err = errors.New("no prompt's token_ids")
		}
		if err == nil {
			ids = a[0].TokenIDs
		}
	default:
		var a struct {
			TokenIDs []int64 `json:"token_ids"`
		}
		err = decode(body, &a)
		ids = a.TokenIDs
		if err == nil && a.TokenIDs == nil {
			err = errors.New("no token_ids")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAnswer, err)
	}
	if len(ids) > MaxTokens {
		return nil, fmt.Errorf("%w: %d token ids, more than %d", ErrAnswer, len(ids), MaxTokens)
	}
	out := make([]uint32, len(ids))
	for i, v := range ids {
		if v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("%w: token id %d is not 0 to %d", ErrAnswer, v, uint32(math.MaxUint32))
		}
		out[i] = uint32(v)
	}
	return out, nil
}

func decode(body []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}
