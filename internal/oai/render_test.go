package oai

import (
	"bytes"
	"strings"
	"testing"
)

// TestRenderPromptExtendsThePrefixKey: the full render starts with the prefix key and is cut
// at max.
func TestRenderPromptExtendsThePrefixKey(t *testing.T) {
	long := strings.Repeat("abcdefgh", 40)
	for _, c := range []struct {
		kind Kind
		body string
	}{
		{Completions, `{"model":"m","prompt":"` + long + `"}`},
		{Completions, `{"model":"m","prompt":["` + long + `","x"]}`},
		{Chat, `{"model":"m","messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":[{"type":"text","text":"hi"}]}]}`},
	} {
		key, err := PrefixKey(c.kind, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		full := RenderPrompt(c.kind, []byte(c.body), 200)
		if len(full) != 200 || !bytes.HasPrefix(full, key) {
			t.Fatalf("render %q does not extend the key %q", full, key)
		}
	}
	if got := RenderPrompt(Chat, []byte(`{"messages":[{"role":"user","content":"hi"}]}`), 100); string(got) != "user\nhi\n" {
		t.Fatalf("chat render %q", got)
	}
}
