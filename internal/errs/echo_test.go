package errs

import (
	"strings"
	"testing"
)

// TestEcho: a short string is quoted whole; a long one is cut at EchoMax bytes, never inside a
// character, and says how long it was.
func TestEcho(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", `""`},
		{"gpt-4o", `"gpt-4o"`},
		{"a\nb\x00", `"a\nb\x00"`},
		{strings.Repeat("m", EchoMax), `"` + strings.Repeat("m", EchoMax) + `"`},
		{strings.Repeat("m", EchoMax+1), `"` + strings.Repeat("m", EchoMax) + `"… (65 bytes)`},
		{strings.Repeat("m", 1<<20), `"` + strings.Repeat("m", EchoMax) + `"… (1048576 bytes)`},
		{strings.Repeat("m", EchoMax-1) + "é" + "x", `"` + strings.Repeat("m", EchoMax-1) + `"… (66 bytes)`},
		{strings.Repeat("é", 40), `"` + strings.Repeat("é", 32) + `"… (80 bytes)`},
	} {
		if got := Echo(c.in); got != c.want {
			t.Errorf("Echo(%d bytes) = %s, want %s", len(c.in), got, c.want)
		}
	}
}
