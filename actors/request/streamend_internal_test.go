package request

import (
	"testing"

	"github.com/tlgw/tlgw/internal/oai"
)

// TestStreamEnd: a Responses or Messages stream ends on its own last event, named by an
// "event:" line at a line's start or by its data's type; the same words in a delta's text, an
// event of another type or another endpoint's stream are no end.
func TestStreamEnd(t *testing.T) {
	for _, c := range []struct {
		name string
		k    oai.Kind
		in   string
		want bool
	}{
		{"messages event line", oai.Messages, "event: message_stop\ndata: {}\n\n", true},
		{"messages event line crlf", oai.Messages, "event: message_stop\r\ndata: {}\r\n\r\n", true},
		{"messages event line, no space", oai.Messages, "event:message_stop\n\n", true},
		{"messages data type only", oai.Messages, `data: {"type":"message_stop"}` + "\n\n", true},
		{"messages after another event", oai.Messages, "event: content_block_stop\ndata: {}\n\nevent: message_stop\ndata: {}\n\n", true},
		{"messages text naming the end", oai.Messages,
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x\\nevent: message_stop\"}}\n\n", false},
		{"messages raw text naming the end", oai.Messages, "event: content_block_delta\ndata: say event: message_stop\n\n", false},
		{"messages quoted type in text", oai.Messages, `data: {"delta":{"text":"\"type\":\"message_stop\""}}` + "\n\n", false},
		{"messages a longer type", oai.Messages, "event: message_stop_soon\n\n", false},
		{"messages delta", oai.Messages, "event: message_delta\ndata: {\"type\":\"message_delta\"}\n\n", false},
		{"responses completed", oai.Responses, "event: response.completed\ndata: {}\n\n", true},
		{"responses incomplete", oai.Responses, "event: response.incomplete\ndata: {}\n\n", true},
		{"responses failed", oai.Responses, "event: response.failed\ndata: {}\n\n", true},
		{"responses data type", oai.Responses, `data: {"type":"response.completed","response":{}}` + "\n\n", true},
		{"responses text naming the end", oai.Responses,
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"event: response.completed\"}\n\n", false},
		{"responses message_stop", oai.Responses, "event: message_stop\n\n", false},
		{"chat never", oai.Chat, "event: message_stop\nevent: response.completed\n\n", false},
		{"empty", oai.Messages, "", false},
	} {
		var e streamEnd
		e.observe(c.k, []byte(c.in))
		if e.seen != c.want {
			t.Errorf("%s: seen %v, want %v", c.name, e.seen, c.want)
		}
	}
	// Once seen, it stays seen.
	var e streamEnd
	e.observe(oai.Messages, []byte("event: message_stop\n\n"))
	e.observe(oai.Messages, []byte("event: ping\n\n"))
	if !e.seen {
		t.Fatal("an end forgotten by a later event")
	}
}
