package oai

import (
	"testing"
)

// chatBody is a typical ~1 KB chat request.
const chatBody = `{
  "model": "smol",
  "messages": [
    {"role": "system", "content": "You are a careful assistant for an operations team. Answer concisely, cite the runbook section when you use it, and say when you do not know. Never invent command-line flags; prefer the documented ones."},
    {"role": "user", "content": "Our gateway started returning 503 no_capacity for the model \"smol\" after a deploy. The workers look healthy in the dashboard and their heartbeats arrive every two seconds."},
    {"role": "assistant", "content": "A 503 no_capacity means no routable worker was found. Check whether the model was drained through the admin API, and whether the workers report draining in their heartbeats."},
    {"role": "user", "content": [{"type": "text", "text": "They do not report draining. Here is the admin output: "}, {"type": "text", "text": "{\"epoch\":12,\"workers\":[{\"id\":\"w1\",\"routable\":false}]}"}]}
  ],
  "temperature": 0.2,
  "max_tokens": 256,
  "stream": true,
  "user": "ops-team-7",
  "seed": 42
}`

// completionsBody is a typical ~200 B completions request.
const completionsBody = `{"model":"smol","prompt":"Translate to French: The quick brown fox jumps over the lazy dog.","max_tokens":64,"temperature":0.7,"top_p":0.95,"stream":false,"logprobs":1,"seed":7,"user":"u-1"}`

func benchParse(b *testing.B, kind Kind, body string) {
	in := []byte(body)
	b.Run("scanner", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if _, err := Parse(kind, in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stdlib", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if _, err := stdlibParse(kind, in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkParseChat(b *testing.B) { benchParse(b, Chat, chatBody) }

func BenchmarkParseCompletions(b *testing.B) { benchParse(b, Completions, completionsBody) }

func BenchmarkRewriteModel(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"chat", chatBody},
		{"completions", completionsBody},
	} {
		in := []byte(bc.body)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				if _, err := RewriteModel(in, "smol-v3"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkValidRequestID(b *testing.B) {
	id := "0f8fad5b-d9cb-469f-a165-70867728950e"
	b.ReportAllocs()
	for b.Loop() {
		if !ValidRequestID(id) {
			b.Fatal("invalid")
		}
	}
}
