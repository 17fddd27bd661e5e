package sampler

import "testing"

func TestRenderChat(t *testing.T) {
	cases := []struct {
		name string
		msgs []Message
		want string
	}{
		{"none", nil, "<|assistant|>\n"},
		{"one", []Message{{"user", "hi"}}, "<|user|>\nhi\n<|assistant|>\n"},
		{"order and roles", []Message{
			{"system", "be brief"},
			{"user", "what is the time?"},
			{"assistant", "noon"},
			{"user", "thanks"},
		}, "<|system|>\nbe brief\n<|user|>\nwhat is the time?\n<|assistant|>\nnoon\n<|user|>\nthanks\n<|assistant|>\n"},
		{"empty content", []Message{{"user", ""}}, "<|user|>\n\n<|assistant|>\n"},
		{"verbatim", []Message{{"tool", "a\nb <|x|>"}}, "<|tool|>\na\nb <|x|>\n<|assistant|>\n"},
	}
	for _, c := range cases {
		got := RenderChat(c.msgs)
		if got != c.want {
			t.Errorf("%s: RenderChat = %q, want %q", c.name, got, c.want)
		}
		if Detokenize(Tokenize(got)) != got {
			t.Errorf("%s: rendered chat does not round-trip through the tokenizer", c.name)
		}
	}
}

func TestRenderChatPrefixStable(t *testing.T) {
	// Appending a message never changes the text of the earlier ones, which
	// is what lets the prefix cache reuse a conversation's earlier turns.
	a := []Message{{"system", "s"}, {"user", "u"}}
	b := append(append([]Message(nil), a...), Message{"assistant", "x"}, Message{"user", "y"})
	ra, rb := RenderChat(a), RenderChat(b)
	head := ra[:len(ra)-len(assistantPrompt)]
	if rb[:len(head)] != head {
		t.Fatalf("%q is not a prefix of %q", head, rb)
	}
}
