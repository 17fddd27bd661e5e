package accesslog

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends r as one JSON object (no newline) to b, with the keys in this order:
//
//	{"time":"2025-01-02T03:04:05.678Z","request_id":"req-1","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736",
//	 "key":"ops","route":"smol","model":"smol-v3","endpoint":"chat","worker":"w1","status":200,
//	 "attempts":1,"ttft_ms":12.5,"duration_ms":48.25,"prompt_tokens":100,"completion_tokens":8,
//	 "stream":true,"outcome":"ok"}
//
// ttft_ms is left out when there was no first byte, prompt_tokens and completion_tokens when
// not known. Durations are milliseconds to the microsecond. Strings are escaped exactly as
// encoding/json escapes them with HTML escaping off (invalid UTF-8 becomes U+FFFD): the fuzz
// test holds it to that. It allocates nothing when b has room.
func AppendJSON(b []byte, r *Record) []byte {
	b = append(b, `{"time":"`...)
	b = r.Time.UTC().AppendFormat(b, timeLayout)
	b = append(b, `","request_id":`...)
	b = appendString(b, r.RequestID)
	b = append(b, `,"trace_id":`...)
	b = appendString(b, r.TraceID)
	b = append(b, `,"key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"route":`...)
	b = appendString(b, r.Route)
	b = append(b, `,"model":`...)
	b = appendString(b, r.Model)
	b = append(b, `,"endpoint":`...)
	b = appendString(b, r.Endpoint)
	b = append(b, `,"worker":`...)
	b = appendString(b, r.Worker)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(r.Attempts), 10)
	if r.TTFT != 0 {
		b = append(b, `,"ttft_ms":`...)
		b = strconv.AppendFloat(b, Millis(r.TTFT), 'f', -1, 64)
	}
	b = append(b, `,"duration_ms":`...)
	b = strconv.AppendFloat(b, Millis(r.Duration), 'f', -1, 64)
	if r.PromptTokens >= 0 {
		b = append(b, `,"prompt_tokens":`...)
		b = strconv.AppendInt(b, r.PromptTokens, 10)
	}
	if r.CompletionTokens >= 0 {
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, r.CompletionTokens, 10)
	}
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, r.Stream)
	b = append(b, `,"outcome":`...)
	b = appendString(b, r.Outcome)
	return append(b, '}')
}

// timeLayout is RFC 3339 with milliseconds; in UTC its zone is "Z".
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// Millis is d in milliseconds to the microsecond (a negative d is 0): the value of ttft_ms and
// duration_ms. Its magnitude is never below 1e-3 unless 0, nor above 1e16, so 'f' formatting
// is the one encoding/json would choose.
func Millis(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return float64(d/time.Microsecond) / 1000
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, escaped as encoding/json escapes it with HTML
// escaping off: `"` and `\` backslashed, \b \f \n \r \t by name, other control characters as
// \u00XX, U+2028 and U+2029 as \u2028 and \u2029, each invalid UTF-8 byte as \ufffd.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
