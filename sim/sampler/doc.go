// Package sampler is tlengine's deterministic token source: a PCG32 random
// number generator, a toy tokenizer with a fixed vocabulary, a chat template,
// and a Generator that turns (model, prompt ids, sampling parameters) into a
// reproducible stream of tokens with per-token logprobs.
//
// Everything here is pure Go and deterministic: the same model name, prompt
// ids and Params (including Seed) always yield the same tokens, on every
// platform. Nothing reads the clock, the environment or global mutable state.
//
// # Determinism contract used by disaggregated serving
//
// A Generator consumes exactly DrawsPerToken PCG32 draws per sampled token,
// and the "model" part of a step (which token sits at which probability rank)
// depends only on the model name, the prompt ids and the tokens sampled so
// far, never on the seed. A prefill worker can therefore return the first
// token and Draws(), and a decode worker can call Resume with the emitted ids
// and that draw count to produce exactly the tokens an uninterrupted
// Generator would have produced next.
package sampler
