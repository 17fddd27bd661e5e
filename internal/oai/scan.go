package oai

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// maxDepth is the deepest nesting of objects and arrays accepted. It equals
// encoding/json's limit, so a body that the engines' JSON parsers and Go's
// json.Valid accept is never refused here for depth alone.
const maxDepth = 10000

// span is a half-open byte range [start, end) of the body. A zero span
// (end == 0) means "absent": no JSON value can end at offset 0.
type span struct{ start, end int }

func (s span) present() bool { return s.end > 0 }

// plain marks the bytes that need no attention inside a JSON string:
// printable ASCII other than '"' and '\\'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special8 has the high bit set in the byte lanes of w, eight string bytes
// loaded little-endian, that are not plain; lanes above the first such lane
// may be set spuriously by borrows, the lowest set lane is always exact. The
// terms find a zero byte of w^'"' and of w^'\\', a byte below 0x20, and a byte
// of 0x80 or more.
func special8(w uint64) uint64 {
	q := w ^ (lsb * '"')
	b := w ^ (lsb * '\\')
	return ((q-lsb)&^q | (b-lsb)&^b | (w-lsb*0x20)&^w | w) & msb
}

// scanner is a validating, allocation-free JSON scanner over one body.
// Offsets in errors are byte offsets into that body.
type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// fail builds a syntax error at offset off. Only error paths allocate.
func (s *scanner) fail(off int, what string) error {
	if off >= len(s.data) {
		return &Error{Msg: "invalid JSON: unexpected end of input"}
	}
	return &Error{Msg: "invalid JSON: " + what + " at offset " + strconv.Itoa(off)}
}

func (s *scanner) unexpected(off int) error {
	if off >= len(s.data) {
		return s.fail(off, "")
	}
	if c := s.data[off]; c < 0x20 || c >= 0x7f {
		return s.fail(off, "unexpected byte 0x"+strconv.FormatUint(uint64(c), 16))
	}
	return s.fail(off, "unexpected character "+strconv.QuoteRune(rune(s.data[off])))
}

// expect consumes byte c after optional whitespace.
func (s *scanner) expect(c byte) error {
	s.ws()
	if s.pos >= len(s.data) || s.data[s.pos] != c {
		return s.unexpected(s.pos)
	}
	s.pos++
	return nil
}

// str scans the string whose opening quote is at s.pos and returns the span
// of its contents (without quotes) and whether it contains escapes. It
// rejects control characters, bad escapes and invalid UTF-8 (RFC 8259 §8.1).
func (s *scanner) str() (content span, esc bool, err error) {
	d := s.data
	i := s.pos + 1
	start := i
	for {
		// Eight bytes at a time while they are plain, then to the exact
		// byte that is not.
		for i+8 <= len(d) {
			if m := special8(binary.LittleEndian.Uint64(d[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(d) && plain[d[i]] {
			i++
		}
		if i >= len(d) {
			return span{}, false, s.fail(i, "")
		}
		switch c := d[i]; {
		case c == '"':
			s.pos = i + 1
			return span{start, i}, esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(d) {
				return span{}, false, s.fail(i+1, "")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(d) {
					return span{}, false, s.fail(len(d), "")
				}
				for k := i + 2; k < i+6; k++ {
					if hexVal(d[k]) < 0 {
						return span{}, false, s.fail(k, "invalid \\u escape")
					}
				}
				i += 6
			default:
				return span{}, false, s.fail(i+1, "invalid escape character "+strconv.QuoteRune(rune(d[i+1])))
			}
		case c < 0x20:
			return span{}, false, s.fail(i, "control character in string")
		default:
			r, n := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && n == 1 {
				return span{}, false, s.fail(i, "invalid UTF-8 in string")
			}
			i += n
		}
	}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// num scans a number per the RFC 8259 grammar starting at s.pos.
func (s *scanner) num() error {
	d := s.data
	i := s.pos
	if d[i] == '-' {
		i++
	}
	switch {
	case i >= len(d):
		return s.fail(i, "")
	case d[i] == '0':
		i++
	case isDigit(d[i]):
		for i++; i < len(d) && isDigit(d[i]); i++ {
		}
	default:
		return s.fail(i, "invalid number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return s.fail(i, "invalid number")
		}
		for i++; i < len(d) && isDigit(d[i]); i++ {
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return s.fail(i, "invalid number")
		}
		for i++; i < len(d) && isDigit(d[i]); i++ {
		}
	}
	s.pos = i
	return nil
}

func (s *scanner) lit(word string) error {
	for k := 0; k < len(word); k++ {
		if s.pos+k >= len(s.data) || s.data[s.pos+k] != word[k] {
			return s.unexpected(s.pos + k)
		}
	}
	s.pos += len(word)
	return nil
}

// value scans one value starting at s.pos (whitespace already skipped);
// depth is the number of containers already open around it.
func (s *scanner) value(depth int) error {
	if s.pos >= len(s.data) {
		return s.fail(s.pos, "")
	}
	switch c := s.data[s.pos]; c {
	case '{':
		return s.object(depth + 1)
	case '[':
		return s.array(depth + 1)
	case '"':
		_, _, err := s.str()
		return err
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	default:
		if c == '-' || isDigit(c) {
			return s.num()
		}
		return s.unexpected(s.pos)
	}
}

func (s *scanner) object(depth int) error {
	it, err := openObj(s, depth)
	if err != nil {
		return err
	}
	for {
		_, ok, err := it.next()
		if err != nil || !ok {
			return err
		}
		if err := s.value(depth); err != nil {
			return err
		}
	}
}

func (s *scanner) array(depth int) error {
	it, err := openArr(s, depth)
	if err != nil {
		return err
	}
	for {
		ok, err := it.next()
		if err != nil || !ok {
			return err
		}
		if err := s.value(depth); err != nil {
			return err
		}
	}
}

// key is an object member's key: the span of its contents without quotes,
// and whether they hold escapes.
type key struct {
	span
	esc bool
}

// objIter walks the members of an object in step with its scanner: next
// reads a key and its colon and leaves the scanner at the member's value,
// which the caller consumes (s.value to skip it) before calling next again.
type objIter struct {
	s     *scanner
	depth int
	begun bool
}

// openObj opens the object whose '{' is at s.pos, a container at depth.
func openObj(s *scanner, depth int) (objIter, error) {
	if depth > maxDepth {
		return objIter{}, s.fail(s.pos, "nesting too deep")
	}
	s.pos++
	return objIter{s: s, depth: depth}, nil
}

// next returns the next key, or ok == false once the closing brace is read.
func (it *objIter) next() (k key, ok bool, err error) {
	s := it.s
	s.ws()
	if s.pos >= len(s.data) {
		return key{}, false, s.fail(s.pos, "")
	}
	switch c := s.data[s.pos]; {
	case c == '}':
		s.pos++
		return key{}, false, nil
	case !it.begun:
		it.begun = true
	case c == ',':
		s.pos++
		s.ws()
	default:
		return key{}, false, s.unexpected(s.pos)
	}
	if s.pos >= len(s.data) || s.data[s.pos] != '"' {
		return key{}, false, s.unexpected(s.pos)
	}
	if k.span, k.esc, err = s.str(); err != nil {
		return key{}, false, err
	}
	if err := s.expect(':'); err != nil {
		return key{}, false, err
	}
	s.ws()
	if s.pos >= len(s.data) {
		return key{}, false, s.fail(s.pos, "")
	}
	return k, true, nil
}

// arrIter walks the elements of an array in step with its scanner, like
// objIter: next leaves the scanner at an element for the caller to consume.
type arrIter struct {
	s     *scanner
	begun bool
}

// openArr opens the array whose '[' is at s.pos, a container at depth.
func openArr(s *scanner, depth int) (arrIter, error) {
	if depth > maxDepth {
		return arrIter{}, s.fail(s.pos, "nesting too deep")
	}
	s.pos++
	return arrIter{s: s}, nil
}

// next reports whether an element follows; false once the ']' is read.
func (it *arrIter) next() (bool, error) {
	s := it.s
	s.ws()
	if s.pos >= len(s.data) {
		return false, s.fail(s.pos, "")
	}
	switch c := s.data[s.pos]; {
	case c == ']':
		s.pos++
		return false, nil
	case !it.begun:
		it.begun = true
	case c == ',':
		s.pos++
		s.ws()
		if s.pos >= len(s.data) {
			return false, s.fail(s.pos, "")
		}
	default:
		return false, s.unexpected(s.pos)
	}
	return true, nil
}

// openTop opens the single top-level object of body. A valid body that is
// not an object gets its own error; malformed JSON gets a syntax error.
// After the iterator ends, the caller must call finish to reject trailing
// bytes.
func openTop(s *scanner) (objIter, error) {
	s.ws()
	if s.pos >= len(s.data) {
		return objIter{}, &Error{Msg: "invalid JSON: empty body"}
	}
	if s.data[s.pos] == '{' {
		return openObj(s, 1)
	}
	if err := s.value(0); err != nil {
		return objIter{}, err
	}
	if err := finish(s); err != nil {
		return objIter{}, err
	}
	return objIter{}, &Error{Msg: "request body must be a JSON object"}
}

// finish rejects anything but whitespace after the top-level value.
func finish(s *scanner) error {
	s.ws()
	if s.pos != len(s.data) {
		return s.fail(s.pos, "unexpected data after the top-level value")
	}
	return nil
}
