package sampler

import (
	"fmt"
	"math"
)

// Params are the sampling parameters of one request, with the OpenAI API's
// meanings. The zero value is NOT the default (a zero Temperature is greedy
// decoding and a zero MaxTokens produces nothing); start from DefaultParams
// and overwrite the fields the request sets.
type Params struct {
	// MaxTokens caps the number of sampled tokens (OpenAI max_tokens).
	MaxTokens int
	// Temperature scales the model distribution: 0 is greedy, otherwise each
	// probability is raised to 1/Temperature and renormalised.
	Temperature float64
	// TopP is the nucleus: keep the smallest set of most likely tokens whose
	// tempered probability adds up to at least TopP. 1 keeps everything.
	TopP float64
	// TopK keeps only the K most likely tokens; 0 (or negative) is off.
	TopK int
	// Stop lists stop strings; the output ends just before the first of
	// them to appear (see Generator). Empty strings are ignored.
	Stop []string
	// Seed selects the random stream (OpenAI seed). The engine picks one at
	// random when the request has none.
	Seed uint64
}

// DefaultParams returns the defaults OpenAI documents, which are also the
// contract defaults of SamplingParams (SPEC R8.3): MaxTokens 16,
// Temperature 1, TopP 1, TopK 0 (off), no stop strings, Seed 0.
func DefaultParams() Params {
	return Params{MaxTokens: 16, Temperature: 1, TopP: 1}
}

// ParamError reports an out-of-range sampling parameter. Param is the
// OpenAI/wire field name (max_tokens, temperature, top_p, top_k), suitable
// for the "param" member of an OpenAI error body.
type ParamError struct {
	Param   string
	Message string
}

func (e *ParamError) Error() string { return e.Message }

// Validate checks p against the ranges the engine accepts and returns a
// *ParamError for the first violation: MaxTokens >= 1; Temperature finite in
// [0, 2]; TopP finite in [0, 1] (0 keeps only the most likely token); TopK >=
// 0. Stop strings are not limited. NewGenerator does not call Validate; it
// clamps out-of-range values instead (see NewGenerator) and never fails.
func (p Params) Validate() error {
	switch {
	case p.MaxTokens < 1:
		return &ParamError{"max_tokens", fmt.Sprintf("max_tokens must be at least 1, got %d", p.MaxTokens)}
	case math.IsNaN(p.Temperature) || p.Temperature < 0 || p.Temperature > 2:
		return &ParamError{"temperature", fmt.Sprintf("temperature must be between 0 and 2, got %v", p.Temperature)}
	case math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return &ParamError{"top_p", fmt.Sprintf("top_p must be between 0 and 1, got %v", p.TopP)}
	case p.TopK < 0:
		return &ParamError{"top_k", fmt.Sprintf("top_k must be 0 (off) or positive, got %d", p.TopK)}
	}
	return nil
}
