package oai

import (
	"math"
	"strconv"
)

// Cost is a request's size as the gateway counts it before any engine has seen it (R20): the
// admission queue orders and charges by it, and a key's tpm reserves it. It reads every prompt
// of a batch and what the request may generate, from the same single pass that parses the
// body, so a batch cannot hide behind its first prompt and a request asking for many long
// answers is not counted as a short one.
//
// The gateway has no tokenizer: text counts a token per 4 bytes as written in the body (an
// escape counts its bytes, so a text is never counted smaller than it decodes to), and a
// prompt given as token ids counts one token per id. Every count is bounded: values are
// clamped to MaxCount and Tokens saturates, so no body can overflow it.
type Cost struct {
	// PromptTokens is every prompt of the body: ⌈text bytes / 4⌉ + token ids. Chat counts
	// each message as its render does ("role\ncontent\n", text parts only).
	PromptTokens int64
	// Prompts is the prompts of a batch: 1, or the length of a completions prompt that is an
	// array of strings or of token-id arrays.
	Prompts int64
	// Choices is the answers generated per prompt: the larger of "n" and "best_of" (each 1
	// when absent), at least 1.
	Choices int64
	// MaxTokens is the most one answer may generate: "max_completion_tokens" for chat when
	// given, else "max_tokens"; when neither is given, DefaultMaxTokens for completions (the
	// API's default) and 0 for chat (bounded only by the model's context, which the gateway
	// does not know: the request pays its real usage when it ends).
	MaxTokens int64
}

// DefaultMaxTokens is a completions request's max_tokens when it gives none (OpenAI's and
// vLLM's default).
const DefaultMaxTokens = 16

// MaxCount bounds every count of a Cost (2^32: far past any model's context or batch), and
// Tokens saturates at MaxCost.
const (
	MaxCount = 1 << 32
	MaxCost  = math.MaxInt64
)

// Tokens is the most the request may cost: PromptTokens + Prompts × Choices × MaxTokens,
// saturating at MaxCost.
func (c Cost) Tokens() int64 {
	out := satMul(satMul(c.Prompts, c.Choices), c.MaxTokens)
	if out > MaxCost-c.PromptTokens {
		return MaxCost
	}
	return c.PromptTokens + out
}

// satMul is a × b for a, b ≥ 0, saturating at MaxCost.
func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > MaxCost/b {
		return MaxCost
	}
	return a * b
}

// promptSize is what reading the prompt counted (scan, prefix.prompt, prefix.message).
type promptSize struct {
	prompts int // prompts in the batch
	text    int // text bytes as written in the body
	ids     int // token ids
}

// cost builds the Cost of a body that parsed, from its prompt's size and its top-level
// fields.
func (f *fields) cost(kind Kind, body []byte, size promptSize) Cost {
	c := Cost{
		PromptTokens: (int64(size.text)+3)/4 + int64(size.ids),
		Prompts:      max(int64(size.prompts), 1),
		Choices:      max(count(body, f.n, 1), count(body, f.bestOf, 1), 1),
	}
	switch {
	case kind == Chat && !absent(body, f.maxCompletion):
		c.MaxTokens = count(body, f.maxCompletion, 0)
	case !absent(body, f.maxTokens):
		c.MaxTokens = count(body, f.maxTokens, 0)
	case kind == Completions:
		c.MaxTokens = DefaultMaxTokens
	}
	return c
}

// count reads a count the engine will parse as an integer: a JSON number, or a string holding
// one (the engines' request models coerce "8" to 8). A fraction counts as the next integer up,
// and the value is clamped to [0, MaxCount]; anything else (absent, null, another type, a
// negative or unreadable number) is def — the engine refuses such a body, and the request then
// costs what it cost.
func count(body []byte, v span, def int64) int64 {
	if absent(body, v) {
		return def
	}
	raw := body[v.start:v.end]
	if raw[0] == '"' {
		var esc bool
		if raw, esc = contents(body, v); esc {
			return def // no number is written with escapes
		}
	}
	x, err := strconv.ParseFloat(string(raw), 64)
	if err != nil && !math.IsInf(x, 1) || !(x >= 0) {
		// Unreadable, out of range but for a huge positive count (+Inf, which clamps below),
		// NaN or negative.
		return def
	}
	return int64(min(math.Ceil(x), MaxCount))
}
