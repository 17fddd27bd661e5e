package oai

// MaxRequestIDLen is the longest X-Request-ID a client may send (B2).
const MaxRequestIDLen = 128

// ValidRequestID reports whether s may be used as a client-sent request id
// (B2): 1 to MaxRequestIDLen bytes, each printable ASCII (0x20 to 0x7E).
// CR, LF and other control bytes would allow header injection when the id is
// echoed in X-Request-ID or logged; non-ASCII is refused too.
func ValidRequestID(s string) bool {
	if len(s) == 0 || len(s) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
