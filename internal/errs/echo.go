package errs

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// EchoMax is the most of a sender's string that an error message repeats.
const EchoMax = 64

// Echo is s as an error message may show it back to whoever sent it: Go-quoted, and past
// EchoMax bytes cut (at a character's start) with its whole length said, so an answer never
// grows with what a client sent (a 1 MB model id was answered with 1 MB).
func Echo(s string) string {
	if len(s) <= EchoMax {
		return strconv.Quote(s)
	}
	cut := EchoMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
