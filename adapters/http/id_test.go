package httpapi

import (
	"regexp"
	"testing"
)

// TestGeneratedRequestIDsAreUnpredictable: a generated id carries 26 base32 characters of
// crypto/rand (130 bits ≥ 96, SPEC R13.4), so ids neither repeat nor follow each other.
func TestGeneratedRequestIDsAreUnpredictable(t *testing.T) {
	shape := regexp.MustCompile(`^req-[A-Z2-7]{26}$`)
	seen := make(map[string]bool)
	for i := 0; i < 10000; i++ {
		id := newRequestID()
		if !shape.MatchString(id) {
			t.Fatalf("generated id %q is not req- and 26 base32 characters", id)
		}
		if seen[id] {
			t.Fatalf("generated id %q twice", id)
		}
		seen[id] = true
	}
	// Two ids in a row share no long common prefix (a counter's ids would).
	a, b := newRequestID(), newRequestID()
	common := 0
	for common < len(a) && a[common] == b[common] {
		common++
	}
	if common > len("req-")+6 {
		t.Fatalf("consecutive ids %q and %q share %d characters", a, b, common)
	}
}
