package sampler

import (
	"strings"
	"testing"
	"unicode"

	"pgregory.net/rapid"
)

func TestVocabularyLayout(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range wordList {
		if w == "" || seen[w] {
			t.Fatalf("word %q empty or duplicated", w)
		}
		seen[w] = true
		for i := 0; i < len(w); i++ {
			if w[i] < 'a' || w[i] > 'z' {
				t.Fatalf("word %q is not lower-case letters", w)
			}
		}
	}
	if NumWords < 256 || NumWords > 512 {
		t.Fatalf("NumWords = %d", NumWords)
	}
	n := GenerativeVocabSize
	for d := uint32(2); d*d <= n; d++ {
		if n%d == 0 {
			t.Fatalf("GenerativeVocabSize %d is not prime (divisible by %d)", n, d)
		}
	}
	if TokenText(EOS) != "" {
		t.Fatalf("EOS text = %q", TokenText(EOS))
	}
	// Every generative id other than EOS has non-empty text; every named id
	// has distinct text, except the byte ids of the punctuation characters,
	// which duplicate the punctuation tokens by design (they are never produced
	// by Tokenize for those characters).
	for id := uint32(1); id < GenerativeVocabSize; id++ {
		if TokenText(id) == "" {
			t.Fatalf("generative id %d has no text", id)
		}
	}
	texts := map[string]uint32{}
	for id := uint32(1); id < firstByte; id++ {
		s := TokenText(id)
		if prev, dup := texts[s]; dup {
			t.Fatalf("ids %d and %d share text %q", prev, id, s)
		}
		texts[s] = id
	}
	if TokenText(firstSpacedWord) != " the" || TokenText(firstBareWord) != "the" {
		t.Fatalf("first words: %q %q", TokenText(firstSpacedWord), TokenText(firstBareWord))
	}
	if got := TokenText(VocabSize - 1); got != "\x7f\x7f\x7f\x7f" {
		t.Fatalf("last id text = %q", got)
	}
	if got := TokenText(firstPiece); got != "\x00\x00" {
		t.Fatalf("first piece text = %q", got)
	}
	if TokenText(VocabSize) != "" || TokenText(^uint32(0)) != "" {
		t.Fatal("ids >= VocabSize must render as empty")
	}
}

func TestTokenizeKnownWords(t *testing.T) {
	got := Tokenize("the water is cold.\nyes (big) 'one'")
	want := []string{"the", " water", " is", " cold", ".", "\n", "yes", " ", "(", "big", ")", " ", "'", "one", "'"}
	if len(got) != len(want) {
		t.Fatalf("Tokenize gave %d ids %v, want %d", len(got), texts(got), len(want))
	}
	for i, id := range got {
		if TokenText(id) != want[i] {
			t.Fatalf("token %d = %q, want %q (all: %q)", i, TokenText(id), want[i], texts(got))
		}
		if id >= firstByte && want[i] != " " {
			t.Fatalf("known token %q got a byte/piece id %d", want[i], id)
		}
	}
	if id := Tokenize(" the")[0]; id != firstSpacedWord {
		t.Fatalf(`" the" = %d, want %d`, id, firstSpacedWord)
	}
}

func TestTokenizeUnknownText(t *testing.T) {
	cases := map[string][]string{
		"xyzzy":        {"xyzz", "y"},
		" xyzzy":       {" xyz", "zy"},
		"The end":      {"The", " end"},
		"12345 and 67": {"1234", "5", " and", " 67"},
		"a  b":         {"a", " ", " b"},
		"héllo":        {"h", "\xc3", "\xa9", "llo"},
		"x=1, y=22.":   {"x", "=1", ",", " y", "=22", "."},
		"":             {},
	}
	for in, want := range cases {
		got := texts(Tokenize(in))
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("Tokenize(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTokenizeAbout4BytesPerToken(t *testing.T) {
	text := "It is a truth universally acknowledged, that a single man in possession of a good " +
		"fortune, must be in want of a wife. However little known the feelings or views of such a " +
		"man may be on his first entering a neighbourhood, this truth is so well fixed in the minds " +
		"of the surrounding families, that he is considered the rightful property of some one or " +
		"other of their daughters. GET /v1/models HTTP/1.1 0123456789abcdef"
	ids := Tokenize(text)
	bpt := float64(len(text)) / float64(len(ids))
	if bpt < 3 || bpt > 5 {
		t.Fatalf("%.2f bytes per token (%d bytes, %d tokens)", bpt, len(text), len(ids))
	}
}

func TestDetokenizeSkipsEOSAndUnknownIDs(t *testing.T) {
	ids := append(Tokenize("the end"), EOS, VocabSize, ^uint32(0))
	if got := Detokenize(ids); got != "the end" {
		t.Fatalf("Detokenize = %q", got)
	}
}

// asciiText draws strings that mix vocabulary words (with and without a
// leading space), punctuation and arbitrary ASCII bytes.
func asciiText() *rapid.Generator[string] {
	var named []string
	for id := uint32(1); id < firstByte; id++ {
		named = append(named, TokenText(id))
	}
	fragment := rapid.OneOf(
		rapid.SampledFrom(named),
		rapid.SampledFrom([]string{" ", "  ", "\n", "\t", "0", "42", "The", " Hello", "<|user|>"}),
		rapid.StringOf(rapid.RuneFrom(nil, &asciiTable)),
	)
	return rapid.Map(rapid.SliceOf(fragment), func(fs []string) string { return strings.Join(fs, "") })
}

var asciiTable = unicodeRange(0, 0x7f)

func TestTokenizeRoundTripASCII(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := asciiText().Draw(t, "s")
		checkRoundTrip(t, s)
	})
}

func TestTokenizeRoundTripAnyBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := rapid.SliceOf(rapid.Byte()).Draw(t, "b")
		checkRoundTrip(t, string(b))
		checkRoundTrip(t, rapid.String().Draw(t, "s"))
	})
}

func checkRoundTrip(t *rapid.T, s string) {
	ids := Tokenize(s)
	for _, id := range ids {
		if id == EOS || id >= VocabSize {
			t.Fatalf("Tokenize(%q) produced id %d", s, id)
		}
		if n := len(TokenText(id)); n == 0 || n > 4 && id >= firstByte {
			t.Fatalf("Tokenize(%q): piece id %d has %d bytes", s, id, n)
		}
	}
	if got := Detokenize(ids); got != s {
		t.Fatalf("Detokenize(Tokenize(%q)) = %q (ids %v)", s, got, ids)
	}
	if again := Tokenize(s); len(again) != len(ids) {
		t.Fatalf("Tokenize(%q) not deterministic", s)
	}
}

func texts(ids []uint32) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = TokenText(id)
	}
	return out
}

func BenchmarkTokenize(b *testing.B) {
	text := strings.Repeat("the quick brown fox jumps over the lazy dog, and then some 12345 more. ", 20)
	buf := make([]uint32, 0, len(text))
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendTokens(buf[:0], text)
	}
}

func unicodeRange(lo, hi rune) unicode.RangeTable {
	return unicode.RangeTable{R16: []unicode.Range16{{Lo: uint16(lo), Hi: uint16(hi), Stride: 1}}}
}
