package sampler

// The tokenizer is a toy: deterministic, table-free for unknown text, and
// exactly invertible. Tokenize splits its input into pre-tokens:
//
//   - a run of ASCII letters, together with one space right before it when
//     there is one (" hello" or "hello");
//   - a single punctuation character that has its own id (. , ! ? ; : ' " ( ) -
//     and "\n");
//   - any other run of bytes (digits, spaces, symbols, non-ASCII bytes), which
//     ends before a letter, a space followed by a letter, or a punctuation
//     token.
//
// A pre-token that is a vocabulary entry (" the", "the", ".") becomes its id.
// Anything else is cut, left to right, into pieces of at most 4 bytes: each
// maximal stretch of ASCII bytes is cut into 4-byte pieces plus a shorter
// remainder, and each byte >= 0x80 is a piece of its own. A 1-byte piece
// becomes a byte id, a 2–4-byte piece an ASCII piece id. Unknown text thus
// costs about one token per 4 bytes, and so does ordinary English (" the" is
// 4 bytes), which is what the gateway's prefix key (64 bytes ≈ 16 tokens)
// assumes.
//
// Detokenize(Tokenize(s)) == s for every string s, ASCII or not, valid UTF-8
// or not.

// tokenText holds the text of every named id (everything below firstPiece).
var tokenText [firstPiece]string

// vocabIndex maps the text of every word and punctuation token to its id.
var vocabIndex map[string]uint32

// punctID maps an ASCII byte to its punctuation token id, or 0 if it has none.
var punctID [128]uint32

func init() {
	vocabIndex = make(map[string]uint32, 2*NumWords+len(genPunct)+len(otherPunct))
	add := func(id uint32, s string) {
		if _, dup := vocabIndex[s]; dup {
			panic("sampler: duplicate vocabulary entry " + s)
		}
		tokenText[id] = s
		vocabIndex[s] = id
	}
	for i, w := range wordList {
		add(firstSpacedWord+uint32(i), " "+w)
		add(firstBareWord+uint32(i), w)
	}
	for i, p := range genPunct {
		add(firstGenPunct+uint32(i), p)
		punctID[p[0]] = firstGenPunct + uint32(i)
	}
	for i, p := range otherPunct {
		add(firstOtherPunct+uint32(i), p)
		punctID[p[0]] = firstOtherPunct + uint32(i)
	}
	for b := range uint32(256) {
		tokenText[firstByte+b] = string([]byte{byte(b)})
	}
}

func isLetter(c byte) bool { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }

func isPunct(c byte) bool { return c < 0x80 && punctID[c] != 0 }

// Tokenize returns the token ids of text (see the package's tokenizer rules
// above). It is deterministic, never returns EOS, and every id is <
// VocabSize. It allocates only the returned slice (capacity about len/3).
func Tokenize(text string) []uint32 {
	return AppendTokens(make([]uint32, 0, len(text)/3+2), text)
}

// AppendTokens appends the token ids of text to dst and returns the extended
// slice; it is Tokenize without the allocation.
func AppendTokens(dst []uint32, text string) []uint32 {
	n := len(text)
	for i := 0; i < n; {
		c := text[i]
		switch {
		case isLetter(c) || (c == ' ' && i+1 < n && isLetter(text[i+1])):
			j := i + 1
			for j < n && isLetter(text[j]) {
				j++
			}
			if id, ok := vocabIndex[text[i:j]]; ok {
				dst = append(dst, id)
			} else {
				dst = appendPieces(dst, text[i:j])
			}
			i = j
		case isPunct(c):
			dst = append(dst, punctID[c])
			i++
		default:
			j := i + 1
			for j < n {
				d := text[j]
				if isLetter(d) || isPunct(d) || (d == ' ' && j+1 < n && isLetter(text[j+1])) {
					break
				}
				j++
			}
			dst = appendPieces(dst, text[i:j])
			i = j
		}
	}
	return dst
}

// appendPieces cuts s into pieces of at most 4 bytes as described above.
func appendPieces(dst []uint32, s string) []uint32 {
	for k := 0; k < len(s); {
		if s[k] >= 0x80 {
			dst = append(dst, firstByte+uint32(s[k]))
			k++
			continue
		}
		m := k + 1
		for m < len(s) && m-k < 4 && s[m] < 0x80 {
			m++
		}
		dst = append(dst, pieceID(s[k:m]))
		k = m
	}
	return dst
}

// pieceID returns the id of an ASCII piece of 1 to 4 bytes.
func pieceID(p string) uint32 {
	if len(p) == 1 {
		return firstByte + uint32(p[0])
	}
	var v uint32
	for i := 0; i < len(p); i++ {
		v = v<<7 | uint32(p[i])
	}
	switch len(p) {
	case 2:
		return firstPiece + v
	case 3:
		return firstPiece + pieces2 + v
	default:
		return firstPiece + pieces2 + pieces3 + v
	}
}

// TokenText returns the text of one token id: the word (with its leading
// space, if any) or punctuation for named ids, the byte or 2–4-byte piece for
// byte and piece ids, and "" for EOS and for ids >= VocabSize. Named ids
// return a shared string without allocating; piece ids allocate.
func TokenText(id uint32) string {
	if id < firstPiece {
		return tokenText[id]
	}
	if id >= VocabSize {
		return ""
	}
	var buf [4]byte
	return string(appendPiece(buf[:0], id))
}

// appendPiece appends the bytes of piece id (firstPiece <= id < VocabSize).
func appendPiece(dst []byte, id uint32) []byte {
	r := id - firstPiece
	n := 2
	switch {
	case r < pieces2:
	case r < pieces2+pieces3:
		r -= pieces2
		n = 3
	default:
		r -= pieces2 + pieces3
		n = 4
	}
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, byte(r>>(7*uint(i))&0x7f))
	}
	return dst
}

// AppendTokenText appends TokenText(id) to dst without allocating.
func AppendTokenText(dst []byte, id uint32) []byte {
	switch {
	case id < firstPiece:
		return append(dst, tokenText[id]...)
	case id < VocabSize:
		return appendPiece(dst, id)
	default:
		return dst
	}
}

// Detokenize concatenates the texts of ids (see TokenText: EOS and ids >=
// VocabSize contribute nothing). Detokenize(Tokenize(s)) == s for every s.
func Detokenize(ids []uint32) string {
	buf := make([]byte, 0, 5*len(ids))
	for _, id := range ids {
		buf = AppendTokenText(buf, id)
	}
	return string(buf)
}
