package oai

import (
	"bytes"
	"fmt"
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

// TestParseRenderedInFull: the render of a chat whose content has more text parts than the
// prefix keeps in the struct (PrefixLen) holds all of them, in order, skipping empty and
// non-text parts; a completions prompt of token ids renders as the prefix key does; a smaller
// limit cuts the render, and the request read is Parse's.
func TestParseRenderedInFull(t *testing.T) {
	var parts, want strings.Builder
	want.WriteString("user\n")
	for i := 0; i < 3*PrefixLen; i++ {
		if i > 0 {
			parts.WriteString(",")
		}
		switch i % 3 {
		case 0:
			fmt.Fprintf(&parts, `{"type":"text","text":"p%d "}`, i)
			fmt.Fprintf(&want, "p%d ", i)
		case 1:
			parts.WriteString(`{"type":"image_url","image_url":{"url":"x"}}`)
		case 2:
			parts.WriteString(`{"type":"text","text":""}`)
		}
	}
	want.WriteString("\n")
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":[` + parts.String() + `]}]}`)
	req, rendered, err := ParseRendered(Chat, chat, len(chat))
	if err != nil {
		t.Fatal(err)
	}
	if string(rendered) != want.String() {
		t.Fatalf("rendered %q\nwant     %q", rendered, want.String())
	}
	parsed, _ := Parse(Chat, chat)
	if req.Model != "m" || !bytes.Equal(req.PrefixKey, parsed.PrefixKey) || !bytes.HasPrefix(rendered, req.PrefixKey) {
		t.Fatalf("request %+v, Parse's key %q", req, parsed.PrefixKey)
	}
	if _, cut, _ := ParseRendered(Chat, chat, 100); string(cut) != want.String()[:100] {
		t.Fatalf("a 100-byte render: %q", cut)
	}
	ids := []byte(`{"model":"m","prompt":[[1,22,333],[4]]}`)
	key, _ := PrefixKey(Completions, ids)
	if _, r, err := ParseRendered(Completions, ids, len(ids)); err != nil || string(r) != "1 22 333" || string(key) != "1 22 333" {
		t.Fatalf("token ids render %q (key %q), %v", r, key, err)
	}
	if _, r, err := ParseRendered(Completions, []byte(`{"model":"m","prompt":7}`), 64); err == nil || r != nil {
		t.Fatalf("a bad prompt rendered %q with %v", r, err)
	}
}
