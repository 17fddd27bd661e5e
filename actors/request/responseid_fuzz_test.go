package request

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tlgw/tlgw/internal/oai"
)

// FuzzResponseIDs holds the readers of an engine's Responses answer (R21) to their contract on
// hostile bytes: they never panic, return only an id that can name a stored response, and
// find the id of a well-formed answer and of a stream's response.created event.
func FuzzResponseIDs(f *testing.F) {
	f.Add([]byte(`{"id":"resp_1","object":"response"}`), "resp_1")
	f.Add([]byte("event: response.created\ndata: {\"response\":{\"id\":\"r\"}}\n\n"), "r")
	f.Add([]byte(`{"id":"a/b"}`), "x y")
	f.Fuzz(func(t *testing.T, b []byte, id string) {
		for _, got := range []string{responseID(b), streamResponseID(b)} {
			if got != "" && !oai.ValidResponseID(got) {
				t.Fatalf("read id %q from %q", got, b)
			}
		}
		if !oai.ValidResponseID(id) {
			return
		}
		q, _ := json.Marshal(id)
		if got := responseID([]byte(fmt.Sprintf(`{"object":"response","id":%s}`, q))); got != id {
			t.Fatalf("JSON answer: %q, want %q", got, id)
		}
		ev := fmt.Sprintf("event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%s}}\r\n\r\n", q)
		if got := streamResponseID([]byte(ev)); got != id {
			t.Fatalf("stream event: %q, want %q", got, id)
		}
	})
}
