package sampler

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

type run struct {
	toks   []Token
	finish string
	draws  uint64
}

func (r run) ids() []uint32 {
	out := make([]uint32, len(r.toks))
	for i, t := range r.toks {
		out[i] = t.ID
	}
	return out
}

func (r run) text() string {
	var b strings.Builder
	for _, t := range r.toks {
		b.WriteString(t.Text)
	}
	return b.String()
}

// fataler is what *testing.T, *testing.B and *rapid.T have in common here.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// drain calls Next until the generator finishes and checks that it keeps
// reporting the same finish afterwards.
func drain(t fataler, g *Generator) run {
	var r run
	for {
		tok, finish, ok := g.Next()
		if !ok {
			if finish != FinishStop && finish != FinishLength {
				t.Fatalf("finish = %q", finish)
			}
			if tok != (Token{}) {
				t.Fatalf("finished Next returned a token %+v", tok)
			}
			if _, f2, ok2 := g.Next(); ok2 || f2 != finish {
				t.Fatalf("Next after finish: ok=%v finish=%q, want false %q", ok2, f2, finish)
			}
			r.finish = finish
			r.draws = g.Draws()
			return r
		}
		if finish != "" {
			t.Fatalf("ok token with finish %q", finish)
		}
		r.toks = append(r.toks, tok)
		if len(r.toks) > 1_000_000 {
			t.Fatal("generator does not finish")
		}
	}
}

func params(seed uint64, maxTokens int) Params {
	p := DefaultParams()
	p.Seed = seed
	p.MaxTokens = maxTokens
	return p
}

var testPrompt = Tokenize("Write a short story about the sea.")

func sameTokens(a, b []Token) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDefaultParams(t *testing.T) {
	p := DefaultParams()
	if p.MaxTokens != 16 || p.Temperature != 1 || p.TopP != 1 || p.TopK != 0 || p.Stop != nil || p.Seed != 0 {
		t.Fatalf("DefaultParams = %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidate(t *testing.T) {
	bad := map[string]func(*Params){
		"max_tokens":  func(p *Params) { p.MaxTokens = 0 },
		"temperature": func(p *Params) { p.Temperature = math.NaN() },
		"top_p":       func(p *Params) { p.TopP = 1.5 },
		"top_k":       func(p *Params) { p.TopK = -1 },
	}
	for field, mutate := range bad {
		p := DefaultParams()
		mutate(&p)
		var pe *ParamError
		if err := p.Validate(); !errors.As(err, &pe) || pe.Param != field {
			t.Errorf("%s: Validate = %v", field, err)
		}
	}
	p := DefaultParams()
	p.Temperature, p.TopP, p.TopK, p.Stop = 0, 0, 5, []string{""}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestDeterminism(t *testing.T) {
	a := drain(t, NewGenerator("smol", testPrompt, params(7, 64)))
	b := drain(t, NewGenerator("smol", testPrompt, params(7, 64)))
	if !sameTokens(a.toks, b.toks) || a.finish != b.finish || len(a.toks) == 0 {
		t.Fatalf("same inputs gave different runs:\n%q\n%q", a.text(), b.text())
	}
}

func TestDifferentInputsDiffer(t *testing.T) {
	base := drain(t, NewGenerator("smol", testPrompt, params(7, 32)))
	others := map[string]run{
		"seed":   drain(t, NewGenerator("smol", testPrompt, params(8, 32))),
		"prompt": drain(t, NewGenerator("smol", Tokenize("Write a long story about the sea."), params(7, 32))),
		"model":  drain(t, NewGenerator("smol-2", testPrompt, params(7, 32))),
	}
	for what, r := range others {
		if sameTokens(base.toks, r.toks) {
			t.Errorf("changing the %s did not change the tokens: %q", what, r.text())
		}
	}
}

func TestDrawsPerToken(t *testing.T) {
	g := NewGenerator("smol", testPrompt, params(3, 100))
	for n := uint64(1); ; n++ {
		if _, _, ok := g.Next(); !ok {
			break
		}
		if g.Draws() != DrawsPerToken*n {
			t.Fatalf("Draws = %d after %d tokens", g.Draws(), n)
		}
		if g.rng.Draws() != DrawsPerToken*n {
			t.Fatalf("PCG32 draws = %d after %d tokens", g.rng.Draws(), n)
		}
	}
}

func TestMaxTokens(t *testing.T) {
	for _, n := range []int{1, 2, 16, 200} {
		// Seeds whose runs reach the limit (EOS is rare: about 1/503 per token).
		for seed := range uint64(5) {
			r := drain(t, NewGenerator("smol", testPrompt, params(seed, n)))
			if len(r.toks) > n {
				t.Fatalf("max_tokens %d: %d tokens", n, len(r.toks))
			}
			if r.finish == FinishLength && len(r.toks) != n {
				t.Fatalf("length finish after %d of %d tokens", len(r.toks), n)
			}
			if r.finish == FinishStop && len(r.toks) == n {
				t.Fatalf("stop finish with a full %d tokens and no stop strings", n)
			}
		}
	}
	for _, n := range []int{0, -3} {
		if r := drain(t, NewGenerator("smol", testPrompt, params(1, n))); len(r.toks) != 0 || r.finish != FinishLength {
			t.Fatalf("max_tokens %d: %d tokens, finish %q", n, len(r.toks), r.finish)
		}
	}
}

func TestEOSFinishesWithStop(t *testing.T) {
	found := 0
	for seed := range uint64(40) {
		g := NewGenerator("smol", testPrompt, params(seed, 5000))
		r := drain(t, g)
		if r.finish != FinishStop {
			continue
		}
		found++
		for _, tok := range r.toks {
			if tok.ID == EOS || tok.ID >= GenerativeVocabSize {
				t.Fatalf("returned id %d", tok.ID)
			}
		}
		// The EOS was the next sampled token: the context after the returned
		// tokens leads to EOS with the next draw.
		re := Resume("smol", testPrompt, params(seed, 5000), r.ids(), r.draws)
		if rr := drain(t, re); len(rr.toks) != 0 || rr.finish != FinishStop {
			t.Fatalf("resume at EOS gave %d tokens, %q", len(rr.toks), rr.finish)
		}
	}
	if found == 0 {
		t.Fatal("no run of up to 5000 tokens ended with EOS")
	}
}

func TestLogprobsFiniteAndNonPositive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := drawParams(t)
		prompt := rapid.SliceOfN(rapid.Uint32Range(0, 2000), 0, 40).Draw(t, "prompt")
		model := rapid.SampledFrom([]string{"smol", "big", "Big-Model", ""}).Draw(t, "model")
		r := drain(t, NewGenerator(model, prompt, p))
		for i, tok := range r.toks {
			if math.IsNaN(tok.Logprob) || math.IsInf(tok.Logprob, 0) || tok.Logprob > 0 {
				t.Fatalf("token %d logprob %v", i, tok.Logprob)
			}
			if tok.ID >= GenerativeVocabSize || tok.ID == EOS {
				t.Fatalf("token %d id %d", i, tok.ID)
			}
		}
	})
}

func TestGreedyIgnoresSeed(t *testing.T) {
	p := params(1, 40)
	p.Temperature = 0
	want := drain(t, NewGenerator("smol", testPrompt, p))
	for seed := uint64(2); seed < 20; seed++ {
		p.Seed = seed
		p.TopP = float64(seed) / 20 // truncation cannot change greedy
		if got := drain(t, NewGenerator("smol", testPrompt, p)); !sameTokens(got.toks, want.toks) {
			t.Fatalf("seed %d: greedy run differs:\n%q\n%q", seed, got.text(), want.text())
		}
	}
	for _, tok := range want.toks {
		if tok.Logprob != want.toks[0].Logprob {
			t.Fatal("greedy tokens are all rank 0 and share one logprob")
		}
	}
}

func TestTopK1EqualsGreedy(t *testing.T) {
	for seed := range uint64(10) {
		g := params(seed, 40)
		g.Temperature = 0
		k := params(seed+100, 40)
		k.TopK = 1
		k.Temperature = 1.7
		a, b := drain(t, NewGenerator("big", testPrompt, g)), drain(t, NewGenerator("big", testPrompt, k))
		if !sameTokens(a.toks, b.toks) {
			t.Fatalf("top_k=1 differs from greedy:\n%q\n%q", b.text(), a.text())
		}
		z := params(seed+200, 40)
		z.TopP = 0
		if c := drain(t, NewGenerator("big", testPrompt, z)); !sameTokens(a.toks, c.toks) {
			t.Fatalf("top_p=0 differs from greedy")
		}
	}
}

func TestTemperatureRaisesConfidence(t *testing.T) {
	mean := func(temp float64) float64 {
		var sum float64
		var n int
		for seed := range uint64(50) {
			p := params(seed, 32)
			p.Temperature = temp
			for _, tok := range drain(t, NewGenerator("smol", testPrompt, p)).toks {
				sum += tok.Logprob
				n++
			}
		}
		return sum / float64(n)
	}
	cold, warm, hot := mean(0.3), mean(1), mean(2)
	if !(cold > warm && warm > hot) {
		t.Fatalf("mean logprob at T=0.3/1/2: %.3f %.3f %.3f, want decreasing", cold, warm, hot)
	}
}

func TestMeanLogprobSpread(t *testing.T) {
	for _, model := range []string{"smol", "big"} {
		var above, below int
		var total float64
		for i := range 200 {
			prompt := Tokenize(fmt.Sprintf("Question %d: what is %d times %d?", i, i, i+7))
			r := drain(t, NewGenerator(model, prompt, params(uint64(i), 16)))
			if len(r.toks) == 0 {
				continue
			}
			var sum float64
			for _, tok := range r.toks {
				sum += tok.Logprob
			}
			m := sum / float64(len(r.toks))
			total += m
			if m > -1.0 {
				above++
			} else {
				below++
			}
			if m < -6 || m > 0 {
				t.Fatalf("%s prompt %d: mean logprob %.3f", model, i, m)
			}
		}
		t.Logf("%s: %d above -1.0, %d below, average %.3f", model, above, below, total/float64(above+below))
		if above < 20 || below < 20 {
			t.Fatalf("%s: %d above and %d below -1.0; cascades need both", model, above, below)
		}
	}
	for i := range 100 {
		prompt := Tokenize(fmt.Sprint("prompt ", i))
		if s, b := ZipfExponent("smol", prompt), ZipfExponent("my-BIG-model", prompt); !(b > s) ||
			s < smallBase || s >= smallBase+smallSpread || b < bigBase || b >= bigBase+bigSpread {
			t.Fatalf("exponents small %.3f big %.3f", s, b)
		}
	}
}

func TestStopStringAcrossTokens(t *testing.T) {
	full := drain(t, NewGenerator("smol", testPrompt, params(11, 40)))
	if len(full.toks) < 8 {
		t.Fatalf("run too short: %q", full.text())
	}
	// A stop string made of the last two bytes of token 4 and the first two
	// of token 5.
	t4, t5 := full.toks[4].Text, full.toks[5].Text
	stop := t4[len(t4)-2:] + t5[:2]
	p := params(11, 40)
	p.Stop = []string{"never appears here", stop}
	got := drain(t, NewGenerator("smol", testPrompt, p))
	want := full.text()[:strings.Index(full.text(), stop)]
	if got.text() != want || got.finish != FinishStop {
		t.Fatalf("with stop %q: %q (%s), want %q (stop)", stop, got.text(), got.finish, want)
	}
	if strings.Contains(got.text(), stop) {
		t.Fatal("stop string in output")
	}
	last := got.toks[len(got.toks)-1]
	if last.ID != full.toks[len(got.toks)-1].ID || last.Logprob != full.toks[len(got.toks)-1].Logprob {
		t.Fatal("truncated token lost its id or logprob")
	}
}

// With any stop strings, the output is the stop-free run's text cut at the
// first stop string to appear: after the first token whose text completes an
// occurrence of any stop string, cut before the earliest occurrence present.
func TestStopStringsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := drawParams(t)
		p.Stop = nil
		full := drain(t, NewGenerator("smol", testPrompt, p))
		text := full.text()
		p.Stop = drawStops(t, text)

		got := drain(t, NewGenerator("smol", testPrompt, p))
		cut, prefix := -1, ""
		for _, tok := range full.toks {
			prefix += tok.Text
			for _, s := range p.Stop {
				if i := strings.Index(prefix, s); s != "" && i >= 0 && (cut < 0 || i < cut) {
					cut = i
				}
			}
			if cut >= 0 {
				break
			}
		}
		wantText, wantFinish := text, full.finish
		if cut >= 0 {
			wantText, wantFinish = text[:cut], FinishStop
		}
		if got.text() != wantText || got.finish != wantFinish {
			t.Fatalf("stops %q on %q: got %q (%s), want %q (%s)", p.Stop, text, got.text(), got.finish, wantText, wantFinish)
		}
		for i, tok := range got.toks {
			f := full.toks[i]
			if tok.ID != f.ID || tok.Logprob != f.Logprob || !strings.HasPrefix(f.Text, tok.Text) || tok.Text == "" {
				t.Fatalf("token %d: %+v vs stop-free %+v", i, tok, f)
			}
			if tok.Text != f.Text && i != len(got.toks)-1 {
				t.Fatalf("token %d truncated but not last", i)
			}
		}
	})
}

// Resuming after any prefix of returned tokens, with the Draws() reported
// then, yields exactly the rest of the uninterrupted run.
func TestResumeProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := drawParams(t)
		model := rapid.SampledFrom([]string{"smol", "big"}).Draw(t, "model")
		prompt := rapid.SliceOfN(rapid.Uint32Range(0, VocabSize-1), 0, 30).Draw(t, "prompt")
		if rapid.Bool().Draw(t, "with stops") {
			probe := drain(t, NewGenerator(model, prompt, Params{MaxTokens: p.MaxTokens, Temperature: p.Temperature,
				TopP: p.TopP, TopK: p.TopK, Seed: p.Seed}))
			p.Stop = drawStops(t, probe.text())
		}
		full := drain(t, NewGenerator(model, prompt, p))
		k := rapid.IntRange(0, len(full.toks)).Draw(t, "k")

		// The "prefill" side: k tokens, then its Draws.
		pre := NewGenerator(model, prompt, p)
		var emitted []uint32
		for range k {
			tok, _, ok := pre.Next()
			if !ok {
				t.Fatal("prefill run ended early")
			}
			emitted = append(emitted, tok.ID)
		}
		if k > 0 && emitted[k-1] != full.toks[k-1].ID {
			t.Fatal("prefill run differs")
		}
		draws := pre.Draws()
		if draws != DrawsPerToken*uint64(k) {
			t.Fatalf("Draws after %d tokens = %d", k, draws)
		}

		rest := drain(t, Resume(model, prompt, p, emitted, draws))
		if !sameTokens(rest.toks, full.toks[k:]) || rest.finish != full.finish {
			t.Fatalf("resume after %d: %q (%s), want %q (%s)", k, rest.text(), rest.finish,
				run{toks: full.toks[k:]}.text(), full.finish)
		}
		if rest.draws != full.draws {
			t.Fatalf("resumed Draws %d, uninterrupted %d", rest.draws, full.draws)
		}
	})
}

func TestResumeFinishedRuns(t *testing.T) {
	p := params(5, 8)
	full := drain(t, NewGenerator("smol", testPrompt, p))
	if full.finish != FinishLength {
		t.Fatalf("the fixture run must end by length, it ended by %q: pick another seed", full.finish)
	}
	if r := drain(t, Resume("smol", testPrompt, p, full.ids(), full.draws)); len(r.toks) != 0 || r.finish != FinishLength {
		t.Fatalf("resume of a full run: %d tokens, %q", len(r.toks), r.finish)
	}
	p.Stop = []string{full.toks[2].Text}
	if r := drain(t, Resume("smol", testPrompt, p, full.ids()[:4], 8)); len(r.toks) != 0 || r.finish != FinishStop {
		t.Fatalf("resume past a stop string: %d tokens, %q", len(r.toks), r.finish)
	}
	if r := drain(t, Resume("smol", testPrompt, params(5, 8), []uint32{full.toks[0].ID, EOS}, 4)); len(r.toks) != 0 || r.finish != FinishStop {
		t.Fatalf("resume after EOS: %d tokens, %q", len(r.toks), r.finish)
	}
}

func TestNextDoesNotAllocate(t *testing.T) {
	for _, stops := range [][]string{nil, {"zzz", "e t", "\n\n"}} {
		p := params(1, math.MaxInt)
		p.Stop = stops
		p.TopK, p.TopP = 50, 0.95
		g := NewGenerator("smol", testPrompt, p)
		for range 100 { // let the held-token buffers reach their size
			g.Next()
		}
		if a := testing.AllocsPerRun(1000, func() { g.Next() }); a != 0 {
			t.Fatalf("stops %q: %v allocations per Next", stops, a)
		}
	}
}

func TestClampedParams(t *testing.T) {
	for _, p := range []Params{
		{MaxTokens: 20, Temperature: math.NaN(), TopP: math.NaN(), TopK: -5},
		{MaxTokens: 20, Temperature: math.Inf(1), TopP: 7},
		{MaxTokens: 20, Temperature: -1, TopP: -1},
		{MaxTokens: 20, Temperature: 1e-300, TopP: 1e-300, TopK: 1 << 30},
	} {
		r := drain(t, NewGenerator("smol", testPrompt, p))
		for _, tok := range r.toks {
			if math.IsNaN(tok.Logprob) || tok.Logprob > 0 || tok.ID >= GenerativeVocabSize {
				t.Fatalf("params %+v: token %+v", p, tok)
			}
		}
	}
}

func drawParams(t *rapid.T) Params {
	p := DefaultParams()
	p.Seed = rapid.Uint64().Draw(t, "seed")
	p.MaxTokens = rapid.IntRange(1, 60).Draw(t, "max_tokens")
	p.Temperature = rapid.SampledFrom([]float64{0, 0.2, 0.7, 1, 1.3, 2}).Draw(t, "temperature")
	p.TopP = rapid.SampledFrom([]float64{1, 0.9, 0.5, 0.1}).Draw(t, "top_p")
	p.TopK = rapid.SampledFrom([]int{0, 0, 1, 5, 40}).Draw(t, "top_k")
	return p
}

// drawStops draws up to three stop strings, mostly substrings of text (so
// that they hit, often across token boundaries), sometimes arbitrary.
func drawStops(t *rapid.T, text string) []string {
	n := rapid.IntRange(1, 3).Draw(t, "stops")
	stops := make([]string, n)
	for i := range stops {
		if len(text) > 0 && rapid.IntRange(0, 3).Draw(t, "kind") > 0 {
			a := rapid.IntRange(0, len(text)-1).Draw(t, "from")
			b := rapid.IntRange(a+1, min(len(text), a+12)).Draw(t, "to")
			stops[i] = text[a:b]
		} else {
			stops[i] = rapid.SampledFrom([]string{"", ".", "\n", " the", "zz", "e a"}).Draw(t, "fixed")
		}
	}
	return stops
}

func BenchmarkNext(b *testing.B) {
	for _, bc := range []struct {
		name string
		p    func(*Params)
	}{
		{"default", func(*Params) {}},
		{"greedy", func(p *Params) { p.Temperature = 0 }},
		{"topk40_topp0.9", func(p *Params) { p.TopK, p.TopP = 40, 0.9 }},
		{"stops", func(p *Params) { p.Stop = []string{"\n\n", "the end", "zzz"} }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := params(1, 1<<20)
			bc.p(&p)
			g := NewGenerator("smol", testPrompt, p)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if _, _, ok := g.Next(); !ok {
					p.Seed++
					g = NewGenerator("smol", testPrompt, p)
				}
				n++
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

func BenchmarkNewGenerator(b *testing.B) {
	prompt := Tokenize(strings.Repeat("the quick brown fox jumps over the lazy dog ", 50))
	p := DefaultParams()
	b.ReportAllocs()
	for b.Loop() {
		NewGenerator("smol", prompt, p)
	}
}
