package sampler

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// DrawsPerToken is the number of PCG32 draws a Generator consumes for every
// token it samples, whatever the parameters (greedy decoding draws and
// discards). It is one Float64, which is two Uint32 draws.
const DrawsPerToken = 2

// Finish reasons returned by Generator.Next, with the OpenAI API's names.
const (
	FinishStop   = "stop"   // EOS was sampled or a stop string appeared
	FinishLength = "length" // MaxTokens tokens were sampled
)

// Confidence rule: the simulated model's distribution at every step is a
// Zipf law over probability ranks, p_k ∝ (k+1)^-s for k = 0 …
// GenerativeVocabSize-1. The exponent is fixed per (model, prompt):
//
//	s = base + spread·d,  d = top 53 bits of xxHash64(prompt ids) / 2^53 ∈ [0, 1)
//
// where d is the prompt's "difficulty draw" (it does not depend on the model,
// so a prompt that is easy for one model is easy for all), and
//
//	model name containing "big" (any case): base 2.2, spread 2.8 → s ∈ [2.2, 5.0)
//	any other model:                        base 1.5, spread 2.2 → s ∈ [1.5, 3.7)
//
// The expected logprob of a token sampled at temperature 1 is minus the
// entropy of that law: -2.83 at s = 1.5, -1.62 at s = 2, -1.0 at s ≈ 2.5,
// -0.41 at s = 3.7 and -0.17 at s = 5. The mean over a short completion
// scatters around that (over 16 tokens and 200 prompts, roughly -4.4 … -0.1
// for a small model and -2.6 … -0.05 for "big"). So a small model's mean
// logprob passes the usual cascade threshold of -1.0 for about half the
// prompts, and a "big" model's for most of them (about 85%).
const (
	smallBase, smallSpread = 1.5, 2.2
	bigBase, bigSpread     = 2.2, 2.8
)

// ZipfExponent returns the exponent s of the confidence rule for model and
// prompt (see the rule above). Larger means more confident.
func ZipfExponent(model string, prompt []uint32) float64 {
	_, difficulty := promptHashes(model, prompt)
	return zipfExponent(model, difficulty)
}

func zipfExponent(model string, difficulty uint64) float64 {
	d := float64(difficulty>>11) * 0x1p-53
	if strings.Contains(strings.ToLower(model), "big") {
		return bigBase + bigSpread*d
	}
	return smallBase + smallSpread*d
}

// lnRank[k] = ln(k+1), shared by every Generator.
var lnRank [GenerativeVocabSize]float64

func init() {
	for k := range lnRank {
		lnRank[k] = math.Log(float64(k + 1))
	}
}

// Token is one generated token. Logprob is the natural log of the MODEL
// distribution's probability of ID (temperature 1, before top-k/top-p), so it
// is finite and <= 0 whatever the sampling parameters. Text is TokenText(ID),
// except for the token during which a stop string starts, whose Text is cut
// just before the stop string.
type Token struct {
	ID      uint32
	Text    string
	Logprob float64
}

type heldToken struct {
	tok        Token
	start, end int // absolute byte offsets of tok.Text in the generated text
}

// Generator produces the tokens of one completion. Each step it:
//
//  1. builds the rank→token permutation of this step from a context hash of
//     (model, prompt ids, every token sampled so far): an offset and a
//     stride in [1, N) (N = GenerativeVocabSize, a prime), token(rank) =
//     (offset + stride·rank) mod N. The seed plays no part, so greedy
//     decoding is the same for every seed;
//  2. draws u = Float64() from its PCG32 (DrawsPerToken draws, always);
//  3. picks a rank from the tempered, truncated Zipf law (greedy: rank 0),
//     and reports the model (temperature-1) logprob of that rank.
//
// Sampling applies temperature first (p^(1/T), renormalised; T = 0 is
// greedy), then top_k (keep the K best ranks), then top_p over the
// renormalised top-k set (keep the shortest prefix of ranks whose mass
// reaches TopP of it), as vLLM does. The kept ranks' CDF is computed once per
// Generator; Next does not allocate.
//
// Finishing: sampling EOS ends the run with "stop" (EOS itself is not
// returned); a stop string ends it with "stop"; having sampled MaxTokens
// tokens ends it with "length". Stop strings are checked after every sampled
// token, as engines do: the first token after which the generated text
// contains any stop string ends the run, and the text is cut just before the
// earliest occurrence present at that point (so with stops "w" and " way ",
// the text " way" stops at "w", even though " way " would have started
// earlier had generation gone on). To cut exactly, tokens whose text
// could be the start of a stop string are held back until they cannot be;
// Next may therefore sample several tokens before it returns one. When a
// stop string is found, tokens wholly before it are returned unchanged, the
// token in which it starts is returned with its Text cut before it (and its
// ID and Logprob unchanged) unless that leaves nothing, and later tokens are
// dropped. The concatenated Text of the returned tokens is the completion
// text. Usage should count the returned tokens.
//
// A Generator is not safe for concurrent use.
type Generator struct {
	rng       PCG32
	ctx       uint64 // context hash: model, prompt and all sampled tokens
	greedy    bool
	maxTokens int
	sampled   int    // tokens sampled, counted against maxTokens
	draws0    uint64 // RNG position of the first token not yet returned at construction
	returned  uint64 // tokens returned by Next
	finish    string // set once nothing more will be sampled

	cdf  []float64 // cumulative tempered weights of the kept ranks
	logp []float64 // model logprob of each rank (GenerativeVocabSize entries)

	// Stop-string state (unused when there are no stop strings).
	stops   [][]byte
	maxStop int
	win     []byte // generated text from the earliest possible stop start
	winBase int    // absolute offset of win[0]
	held    []heldToken
	head    int // held[:head] were returned already
	rel     int // held[head:rel] are released, held[rel:] are held back
}

// NewGenerator returns a Generator for a completion of prompt by model with
// parameters p. Its PCG32 is NewPCG32(p.Seed, seq) where seq is xxHash64 of
// (len(model) as 8 little-endian bytes, model, each prompt id as 4
// little-endian bytes), so the same seed, model and prompt always give the
// same tokens and different prompts give different ones.
//
// NewGenerator never fails; out-of-range parameters are clamped: NaN
// Temperature is 1 and a negative one 0 (greedy); NaN or > 1 TopP is 1 and a
// negative one 0 (only the most likely token); TopK <= 0 is off; MaxTokens
// <= 0 finishes at once with "length". Use Params.Validate to reject them.
func NewGenerator(model string, prompt []uint32, p Params) *Generator {
	seq, difficulty := promptHashes(model, prompt)
	g := &Generator{maxTokens: p.MaxTokens}
	g.rng.Seed(p.Seed, seq)
	g.ctx = mix64(seq ^ 0x5bd1e9955bd1e995)
	g.build(zipfExponent(model, difficulty), p)
	g.setStops(p.Stop)
	return g
}

// Resume returns a Generator that continues a run of NewGenerator(model,
// prompt, p) after it returned the token ids emitted, when draws is that
// generator's Draws() at that point (DrawsPerToken·len(emitted) for a run
// that started at the beginning). Its Next returns exactly the tokens the
// uninterrupted Generator would have returned next, with the same finish
// reason; this is how a decode worker continues a prefill worker's run from
// first_token and rng_draws_consumed.
//
// The PCG32 is positioned with Advance(draws); any tokens the original had
// sampled but held back (see stop strings above) are sampled again
// identically. A finished run is detected: an EOS in emitted or a stop
// string in the emitted text finishes the result with "stop" at once, and
// len(emitted) >= MaxTokens with "length". Resume trusts its inputs: ids and
// draws from a different run give a deterministic but unrelated stream.
func Resume(model string, prompt []uint32, p Params, emitted []uint32, draws uint64) *Generator {
	g := NewGenerator(model, prompt, p)
	g.rng.Advance(draws)
	g.draws0 = draws
	g.sampled = len(emitted)
	for _, id := range emitted {
		if id == EOS {
			g.finish = FinishStop
			return g
		}
		g.ctx = nextContext(g.ctx, id)
	}
	if len(g.stops) > 0 {
		text := make([]byte, 0, 5*len(emitted))
		for _, id := range emitted {
			text = AppendTokenText(text, id)
		}
		if g.firstMatch(text) >= 0 {
			g.finish = FinishStop
			return g
		}
		p := g.earliestPrefix(text)
		g.win = append(g.win, text[p:]...)
		g.winBase = p
	}
	return g
}

// Draws returns the PCG32 position that follows the tokens Next has returned
// so far: the draws given to Resume (0 for NewGenerator) plus DrawsPerToken
// per returned token. Pass it, with the returned ids, to Resume. (The
// generator may internally have drawn further, for held-back tokens or the
// final EOS; those draws are replayed by Resume and are not counted.)
func (g *Generator) Draws() uint64 { return g.draws0 + DrawsPerToken*g.returned }

// Next returns the next token with ok = true and finish = "", or, once the
// run is over, a zero Token, the finish reason ("stop" or "length") and ok =
// false; every later call returns the same.
func (g *Generator) Next() (tok Token, finish string, ok bool) {
	for {
		if g.head < g.rel {
			tok = g.held[g.head].tok
			g.head++
			if g.head == len(g.held) {
				g.held, g.head, g.rel = g.held[:0], 0, 0
			}
			g.returned++
			return tok, "", true
		}
		if g.finish != "" {
			return Token{}, g.finish, false
		}
		if g.sampled >= g.maxTokens {
			g.rel = len(g.held)
			g.finish = FinishLength
			continue
		}
		id, lp := g.sample()
		g.sampled++
		if id == EOS {
			g.rel = len(g.held)
			g.finish = FinishStop
			continue
		}
		tok = Token{ID: id, Text: tokenText[id], Logprob: lp}
		if g.stops == nil {
			g.returned++
			return tok, "", true
		}
		g.hold(tok)
	}
}

// sample draws one token: DrawsPerToken PCG32 draws, no allocation.
func (g *Generator) sample() (uint32, float64) {
	h := g.ctx
	u := g.rng.Float64()
	rank := 0
	if !g.greedy && len(g.cdf) > 1 {
		x := u * g.cdf[len(g.cdf)-1]
		lo, hi := 0, len(g.cdf)-1
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if g.cdf[mid] > x {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		rank = lo
	}
	id := rankID(h, rank)
	g.ctx = nextContext(h, id)
	return id, g.logp[rank]
}

// rankID is the id at probability rank in the step whose context hash is h: an affine
// permutation of the generative ids (offset + stride·rank mod n, stride in [1, n−1]), a
// bijection because n is prime.
func rankID(h uint64, rank int) uint32 {
	const n = uint64(GenerativeVocabSize)
	offset := (h >> 32) * n >> 32
	stride := 1 + (h&0xffffffff)*(n-1)>>32
	return uint32((offset + stride*uint64(rank)) % n)
}

func nextContext(ctx uint64, id uint32) uint64 {
	return mix64(ctx ^ (uint64(id)+1)*0x9e3779b97f4a7c15)
}

// mix64 is the SplitMix64 finaliser, a bijective 64-bit mixer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// build precomputes the model logprob of every rank and the CDF of the kept
// ranks of the tempered, truncated distribution.
func (g *Generator) build(s float64, p Params) {
	const n = int(GenerativeVocabSize)
	buf := make([]float64, 2*n)
	g.logp = buf[:n:n]
	cum := buf[n:]
	var z float64
	for k := range n {
		z += math.Exp(-s * lnRank[k])
		cum[k] = z
	}
	lnZ := math.Log(z)
	for k := range n {
		g.logp[k] = -s*lnRank[k] - lnZ
	}

	t := p.Temperature
	switch {
	case math.IsNaN(t):
		t = 1
	case t <= 0:
		g.greedy = true
		return
	}
	keep := n
	if p.TopK > 0 && p.TopK < n {
		keep = p.TopK
	}
	cum = cum[:keep]
	if t != 1 {
		st := s / t // tempered exponent; +Inf temperature gives a uniform law
		var sum float64
		for k := range keep {
			sum += math.Exp(-st * lnRank[k])
			cum[k] = sum
		}
	}
	topP := p.TopP
	if math.IsNaN(topP) || topP > 1 {
		topP = 1
	}
	if topP < 1 {
		target := topP * cum[keep-1]
		c := 1
		for c < keep && cum[c-1] < target {
			c++
		}
		cum = cum[:c]
	}
	g.cdf = cum
}

// promptHashes returns seq = xxHash64(len(model) LE64, model, prompt ids
// LE32) and difficulty = xxHash64(prompt ids LE32).
func promptHashes(model string, prompt []uint32) (seq, difficulty uint64) {
	var dm, dp xxhash.Digest
	dm.Reset()
	dp.Reset()
	var buf [256]byte
	binary.LittleEndian.PutUint64(buf[:8], uint64(len(model)))
	_, _ = dm.Write(buf[:8])
	_, _ = dm.WriteString(model)
	for len(prompt) > 0 {
		k := min(len(prompt), len(buf)/4)
		for i, id := range prompt[:k] {
			binary.LittleEndian.PutUint32(buf[4*i:], id)
		}
		_, _ = dm.Write(buf[:4*k])
		_, _ = dp.Write(buf[:4*k])
		prompt = prompt[k:]
	}
	return dm.Sum64(), dp.Sum64()
}

func (g *Generator) setStops(stops []string) {
	for _, s := range stops {
		if s == "" {
			continue
		}
		g.stops = append(g.stops, []byte(s))
		g.maxStop = max(g.maxStop, len(s))
	}
}

// hold appends a sampled token to the held-back window, then either finishes
// the run at a stop string or releases every token that can no longer be
// part of one.
func (g *Generator) hold(tok Token) {
	start := g.winBase + len(g.win)
	g.win = append(g.win, tok.Text...)
	g.held = append(g.held, heldToken{tok: tok, start: start, end: start + len(tok.Text)})

	if m := g.firstMatch(g.win); m >= 0 {
		cut := g.winBase + m
		kept := g.rel
		for i := g.rel; i < len(g.held); i++ {
			h := g.held[i]
			if h.start >= cut {
				break
			}
			if h.end > cut {
				h.tok.Text = h.tok.Text[:cut-h.start]
			}
			g.held[kept] = h
			kept++
		}
		g.held = g.held[:kept]
		g.rel = kept
		g.finish = FinishStop
		g.win = g.win[:0]
		return
	}

	p := g.earliestPrefix(g.win)
	safe := g.winBase + p
	for g.rel < len(g.held) && g.held[g.rel].end <= safe {
		g.rel++
	}
	g.win = g.win[:copy(g.win, g.win[p:])]
	g.winBase = safe
}

// firstMatch returns the earliest index in text at which any stop string
// occurs, or -1.
func (g *Generator) firstMatch(text []byte) int {
	m := -1
	for _, s := range g.stops {
		if i := bytes.Index(text, s); i >= 0 && (m < 0 || i < m) {
			m = i
		}
	}
	return m
}

// earliestPrefix returns the smallest p such that text[p:] is a non-empty
// prefix of some stop string, or len(text) if there is none.
func (g *Generator) earliestPrefix(text []byte) int {
	for p := max(0, len(text)-g.maxStop+1); p < len(text); p++ {
		tail := text[p:]
		for _, s := range g.stops {
			if bytes.HasPrefix(s, tail) {
				return p
			}
		}
	}
	return len(text)
}
