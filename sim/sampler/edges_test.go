package sampler

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"
)

// TestRankIDIsAPermutation: in every step each rank has its own generative id.
func TestRankIDIsAPermutation(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	hs := []uint64{0, math.MaxUint64, 0xffffffff, 0xffffffff00000000, 1 << 32, 0xff000000}
	for range 200 {
		hs = append(hs, r.Uint64())
	}
	seen := make([]int, GenerativeVocabSize)
	for n, h := range hs {
		for rank := range int(GenerativeVocabSize) {
			id := rankID(h, rank)
			if id >= GenerativeVocabSize {
				t.Fatalf("rankID(%#x, %d) = %d, outside the generative ids", h, rank, id)
			}
			if seen[id] == n+1 {
				t.Fatalf("rankID(%#x, ·): id %d at two ranks", h, id)
			}
			seen[id] = n + 1
		}
	}
}

// TestTopPKeepsTheSmallestNucleus: top_p keeps the fewest most likely ranks (after top_k and
// the temperature) whose weight reaches top_p of the total, at least one; every sampled token
// is among them.
func TestTopPKeepsTheSmallestNucleus(t *testing.T) {
	prompts := [][]uint32{testPrompt, Tokenize("Summarise the minutes of the last meeting."), nil}
	for _, model := range []string{"smol", "big"} {
		for _, prompt := range prompts {
			s := ZipfExponent(model, prompt)
			for _, temp := range []float64{0.2, 0.7, 1, 1.3, 2} {
				for _, topK := range []int{0, 5, 40} {
					for _, topP := range []float64{0, 0.1, 0.5, 0.9, 0.999, 1} {
						p := params(11, 300)
						p.Temperature, p.TopK, p.TopP = temp, topK, topP
						want := nucleus(s, p)
						g := NewGenerator(model, prompt, p)
						if len(g.cdf) != want {
							t.Fatalf("%s, T %v, top_k %d, top_p %v: %d ranks kept, want %d", model, temp, topK, topP, len(g.cdf), want)
						}
						floor := g.logp[want-1] // logprobs fall with the rank
						for _, tok := range drain(t, g).toks {
							if tok.Logprob < floor {
								t.Fatalf("%s, T %v, top_k %d, top_p %v: sampled a token of logprob %v, below the kept ranks' %v",
									model, temp, topK, topP, tok.Logprob, floor)
							}
						}
					}
				}
			}
		}
	}
}

// nucleus is the number of ranks kept for exponent s and p: the reference for
// TestTopPKeepsTheSmallestNucleus, summed in rank order as the generator does.
func nucleus(s float64, p Params) int {
	keep := int(GenerativeVocabSize)
	if p.TopK > 0 && p.TopK < keep {
		keep = p.TopK
	}
	cum := make([]float64, keep)
	sum := 0.0
	for k := range keep {
		sum += math.Exp(-s / p.Temperature * math.Log(float64(k+1)))
		cum[k] = sum
	}
	if p.TopP >= 1 {
		return keep
	}
	for c := 1; c <= keep; c++ {
		if cum[c-1] >= p.TopP*sum {
			return c
		}
	}
	return keep
}

// TestResumeAfterAStop: a decode that resumes after tokens holding a stop string, at their
// very start or later, finishes at once with "stop"; without one it goes on.
func TestResumeAfterAStop(t *testing.T) {
	the, sea := Tokenize(" the")[0], Tokenize(" sea")[0]
	if the >= GenerativeVocabSize || sea >= GenerativeVocabSize {
		t.Fatalf("test words are not generative ids: %d %d", the, sea)
	}
	for _, c := range []struct {
		stop   string
		finish string
	}{
		{" th", FinishStop}, // at offset 0 of the emitted text
		{"e s", FinishStop}, // across the two tokens
		{"sea", FinishStop}, // at the end
		{"zzz", ""},
	} {
		p := params(3, 50)
		p.Stop = []string{c.stop}
		g := Resume("smol", testPrompt, p, []uint32{the, sea}, 2*DrawsPerToken)
		tok, finish, ok := g.Next()
		if c.finish != "" {
			if ok || finish != c.finish {
				t.Errorf("stop %q: Next = %+v %q %v, want finished with %q", c.stop, tok, finish, ok, c.finish)
			}
			continue
		}
		if !ok {
			t.Errorf("stop %q, not in the emitted text: finished with %q", c.stop, finish)
		}
	}
}

// TestPromptHashesLayout: the hashes are xxHash64 over the documented bytes, for prompts
// shorter than, equal to and longer than the 256-id buffer they are written through.
func TestPromptHashesLayout(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 65, 255, 256, 257, 1000} {
		prompt := make([]uint32, n)
		for i := range prompt {
			prompt[i] = uint32(i)*2654435761 ^ 0xdeadbeef
		}
		const model = "some-model"
		ids := make([]byte, 4*n)
		for i, id := range prompt {
			binary.LittleEndian.PutUint32(ids[4*i:], id)
		}
		whole := binary.LittleEndian.AppendUint64(nil, uint64(len(model)))
		whole = append(append(whole, model...), ids...)
		seq, difficulty := promptHashes(model, prompt)
		if want := xxhash.Sum64(whole); seq != want {
			t.Errorf("%d ids: seq %#x, want %#x", n, seq, want)
		}
		if want := xxhash.Sum64(ids); difficulty != want {
			t.Errorf("%d ids: difficulty %#x, want %#x", n, difficulty, want)
		}
	}
}

// TestStopsHoldBackOnlyWhatCouldStartOne: while a run with stop strings streams, the tokens
// it holds back are exactly those overlapping the text that could still begin a stop string
// (a proper prefix of one); every token before that is released at once, so a stop string
// delays the stream by less than its own length.
func TestStopsHoldBackOnlyWhatCouldStartOne(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := drawParams(t)
		p.Stop = nil
		text := drain(t, NewGenerator("smol", testPrompt, p)).text()
		p.Stop = drawStops(t, text)
		g := NewGenerator("smol", testPrompt, p)
		for step := 0; ; step++ {
			if _, _, ok := g.Next(); !ok {
				return
			}
			// Tokens sampled and not yet returned: at most those overlapping the held text
			// (each token is at least a byte), the token that released them and an EOS.
			if ahead := g.sampled - int(g.returned); ahead > g.maxStop+2 {
				t.Fatalf("step %d: %d tokens sampled ahead of the stream with stops %q", step, ahead, p.Stop)
			}
			if g.finish != "" || g.stops == nil {
				continue
			}
			if len(g.win) > 0 && !slicesAny(g.stops, func(s []byte) bool { return len(g.win) < len(s) && bytes.HasPrefix(s, g.win) }) {
				t.Fatalf("step %d: held text %q begins no stop string of %q", step, g.win, p.Stop)
			}
			for i := g.head; i < len(g.held); i++ {
				h := g.held[i]
				if released := i < g.rel; released != (h.end <= g.winBase) {
					t.Fatalf("step %d: token %d (%q, bytes %d..%d) released %v with the held text from byte %d",
						step, i, h.tok.Text, h.start, h.end, released, g.winBase)
				}
			}
		}
	})
}

func slicesAny(ss [][]byte, f func([]byte) bool) bool {
	for _, s := range ss {
		if f(s) {
			return true
		}
	}
	return false
}

// TestTokenizeASCIIPieceEdges: a piece is at most 4 ASCII bytes, and 0x80, the first
// non-ASCII byte, is a piece of its own.
func TestTokenizeASCIIPieceEdges(t *testing.T) {
	for in, want := range map[string]string{
		"1234":        "1234",
		"12345678":    "1234|5678",
		"123456789":   "1234|5678|9",
		"12\x8034":    "12|\x80|34",
		"12\x7f34":    "12\x7f3|4",
		"\x80\x80":    "\x80|\x80",
		"99 \x80\xff": "99 |\x80|\xff",
	} {
		if got := strings.Join(texts(Tokenize(in)), "|"); got != want {
			t.Errorf("Tokenize(%q) = %q, want %q", in, got, want)
		}
	}
}
