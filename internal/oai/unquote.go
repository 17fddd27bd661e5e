package oai

import (
	"unicode/utf16"
	"unicode/utf8"
)

func hexVal(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// u4 decodes the \uXXXX escape at the start of b, or returns -1.
func u4(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range b[2:6] {
		v := hexVal(c)
		if v < 0 {
			return -1
		}
		r = r<<4 | rune(v)
	}
	return r
}

// escape decodes the escape sequence at the start of b (b[0] == '\\') of a
// string the scanner has validated. It returns the rune and the number of
// bytes consumed. Surrogates follow encoding/json: a valid pair is joined,
// anything else becomes U+FFFD and consumes only its own six bytes.
func escape(b []byte) (rune, int) {
	switch b[1] {
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r := u4(b)
		if utf16.IsSurrogate(r) {
			if dec := utf16.DecodeRune(r, u4(b[6:])); dec != utf8.RuneError {
				return dec, 12
			}
			return utf8.RuneError, 6
		}
		return r, 6
	default: // '"', '\\', '/'
		return rune(b[1]), 2
	}
}

// appendUnquoted appends the decoded form of raw, the validated contents of
// a JSON string without its quotes. The result is never longer than raw.
func appendUnquoted(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		j := i
		for j < len(raw) && raw[j] != '\\' {
			j++
		}
		dst = append(dst, raw[i:j]...)
		if j == len(raw) {
			break
		}
		r, n := escape(raw[j:])
		dst = utf8.AppendRune(dst, r)
		i = j + n
	}
	return dst
}

// decodeString returns the Go string for the validated string contents raw.
func decodeString(raw []byte, esc bool) string {
	if !esc {
		return string(raw)
	}
	var buf [64]byte
	return string(appendUnquoted(buf[:0], raw))
}

// maxKeyLen is the longest key this package looks up ("messages").
const maxKeyLen = 8

// name decodes validated string contents into buf when they are short
// enough to be one of the names this package looks up (keys such as
// "messages", part types such as "text"); otherwise it returns nil. An
// escaped rune takes at most six raw bytes for at least one decoded byte, so
// raw contents longer than 6*maxKeyLen decode to more than maxKeyLen bytes.
func name(raw []byte, esc bool, buf *[6 * maxKeyLen]byte) []byte {
	if !esc {
		return raw
	}
	if len(raw) > len(buf) {
		return nil
	}
	return appendUnquoted(buf[:0], raw)
}

// keyName is the decoded key k, as far as name decodes it.
func keyName(data []byte, k key, buf *[6 * maxKeyLen]byte) []byte {
	return name(data[k.start:k.end], k.esc, buf)
}

// quote appends model as a JSON string. Invalid UTF-8 becomes \ufffd, as
// encoding/json writes it, so the result is always valid JSON.
func quote(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}
