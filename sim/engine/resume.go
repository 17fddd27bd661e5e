package engine

import (
	"math"
	"strconv"
	"strings"

	"github.com/tlgw/tlgw/sim/sampler"
)

// tokenSource yields a run's tokens the way sampler.Generator.Next does.
type tokenSource interface {
	Next() (tok sampler.Token, finish string, ok bool)
}

// resumed continues a disaggregated request on the decode engine: the first token comes from
// the prefill worker (first_token, first_logprob), the rest from sampler.Resume positioned
// after it, so the answer is the one an uninterrupted Generator gives for the same seed.
//
// One case needs care: a stop string that starts inside the first token. The uninterrupted
// Generator then returns the first token with its text cut before the stop string; the prefill
// worker sends only the token id. So the first token is held back until the resumed Generator
// returns a token (then no cut can fall inside the first one) or finishes. When it finishes
// with "stop" and no token, the cut point is found by replaying the few tokens it sampled.
type resumed struct {
	model   string
	prompt  []uint32
	params  sampler.Params
	draws   uint64
	first   sampler.Token
	pending bool // first not returned yet
	next    *sampler.Token
	gen     *sampler.Generator
}

// resume returns the token source for a request resuming from the handle's first token.
func resume(model string, prompt []uint32, params sampler.Params, h *kvHandle) tokenSource {
	emitted := []uint32{h.first}
	gen := sampler.Resume(model, prompt, params, emitted, h.draws)
	if h.first == sampler.EOS {
		return gen // the prefill run ended at once; gen finishes with "stop"
	}
	return &resumed{model: model, prompt: prompt, params: params, draws: h.draws, gen: gen, pending: true,
		first: sampler.Token{ID: h.first, Text: sampler.TokenText(h.first), Logprob: widen(h.firstLogprob)}}
}

// widen turns the wire's float32 logprob into the float64 nearest its shortest decimal form, so
// the JSON shows -1.2345679 rather than -1.2345678806304932.
func widen(f float32) float64 {
	v, err := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	if err != nil || math.IsNaN(v) {
		return float64(f)
	}
	return v
}

func (r *resumed) Next() (sampler.Token, string, bool) {
	if r.next != nil {
		tok := *r.next
		r.next = nil
		return tok, "", true
	}
	if !r.pending {
		return r.gen.Next()
	}
	r.pending = false
	first := r.first
	if c := stopIndex(first.Text, r.params.Stop); c >= 0 {
		first.Text = first.Text[:c] // the stop string lies within the first token; gen has finished
	} else {
		tok, finish, ok := r.gen.Next()
		switch {
		case ok:
			r.next = &tok
		case finish == sampler.FinishStop && len(r.params.Stop) > 0:
			first.Text = first.Text[:r.cut(len(first.Text))]
		}
	}
	if first.Text == "" {
		return r.gen.Next() // nothing of the first token survives the stop string
	}
	return first, "", true
}

// cut replays the run after the first token without stop strings (the same tokens: stop
// strings never change what is sampled, only where the text ends) up to the token after which a
// stop string appears, and returns where it starts, capped at n, the first token's length.
func (r *resumed) cut(n int) int {
	p := r.params
	p.Stop = nil
	raw := sampler.Resume(r.model, r.prompt, p, []uint32{r.first.ID}, r.draws)
	text := r.first.Text
	for {
		tok, _, ok := raw.Next()
		if !ok {
			return n
		}
		text += tok.Text
		if c := stopIndex(text, r.params.Stop); c >= 0 {
			return min(c, n)
		}
	}
}

// stopIndex is the earliest position in text where any non-empty stop string starts, or -1.
func stopIndex(text string, stops []string) int {
	m := -1
	for _, s := range stops {
		if s == "" {
			continue
		}
		if i := strings.Index(text, s); i >= 0 && (m < 0 || i < m) {
			m = i
		}
	}
	return m
}
