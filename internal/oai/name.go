package oai

// MaxNameBytes bounds a model or adapter name the gateway takes from a client's form, an
// engine's report or the configuration.
const MaxNameBytes = 256

// ValidName reports whether s is 1 to MaxNameBytes printable ASCII bytes without spaces: a
// model or LoRA adapter name (never a metric label; see the callers for where each is used).
func ValidName(s string) bool {
	if s == "" || len(s) > MaxNameBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
