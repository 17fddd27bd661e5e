package sampler

import "strings"

// Message is one chat message as the OpenAI chat API carries it: a role
// ("system", "user", "assistant", "tool", …) and its text content.
type Message struct {
	Role    string
	Content string
}

// RenderChat renders messages into the prompt text the engine tokenizes for
// a chat completion. The template is, for each message in order,
//
//	<|ROLE|>\nCONTENT\n
//
// followed by the generation prompt "<|assistant|>\n". Roles and contents
// are copied verbatim (no escaping, no validation, empty content allowed:
// "<|user|>\n\n"). RenderChat(nil) is "<|assistant|>\n".
//
// Note this is the engine's template; the gateway's prefix key (SPEC R4)
// writes messages as "role\ncontent\n" and does not depend on it.
func RenderChat(msgs []Message) string {
	n := len(assistantPrompt)
	for _, m := range msgs {
		n += len("<||>\n\n") + len(m.Role) + len(m.Content)
	}
	var b strings.Builder
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	b.WriteString(assistantPrompt)
	return b.String()
}

const assistantPrompt = "<|assistant|>\n"
