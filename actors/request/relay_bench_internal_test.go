package request

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
)

// eventsBody hands out one SSE event per Read, as an engine that flushes every token does.
type eventsBody struct {
	events [][]byte
	i      int
}

func (e *eventsBody) Read(p []byte) (int, error) {
	if e.i == len(e.events) {
		return 0, io.EOF
	}
	n := copy(p, e.events[e.i])
	e.i++
	return n, nil
}

func (e *eventsBody) Close() error { return nil }

// flushDiscard is a client connection that takes every write and flush.
type flushDiscard struct{ h http.Header }

func (w *flushDiscard) Header() http.Header         { return w.h }
func (w *flushDiscard) WriteHeader(int)             {}
func (w *flushDiscard) Write(p []byte) (int, error) { return len(p), nil }
func (w *flushDiscard) Flush()                      {}

func benchEvents() [][]byte {
	var events [][]byte
	for i := 0; i < 63; i++ {
		events = append(events, fmt.Appendf(nil, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"smol\",\"choices\":[{\"index\":0,\"text\":\" tok%d\",\"logprobs\":null,\"finish_reason\":null}]}\n\n", i))
	}
	events = append(events, []byte("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"smol\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":64,\"total_tokens\":164}}\n\n"),
		[]byte("data: [DONE]\n\n"))
	return events
}

// BenchmarkRelaySSE is the relay's own cost per event (one event per read, as tlengine sends
// them), beside the bare loop a reverse proxy runs (read, write, flush): the difference is
// what the relay adds per event.
func BenchmarkRelaySSE(b *testing.B) {
	events := benchEvents()
	b.Run("relay", func(b *testing.B) {
		b.ReportAllocs()
		w := &flushDiscard{h: http.Header{}}
		for i := 0; i < b.N; i++ {
			body := &eventsBody{events: events}
			idle := newIdleBody(body, body, clock.Real{}, time.Minute, nil)
			resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: idle}
			if res := testRelayer(w, resp).run(0); !res.finished {
				b.Fatalf("%+v", res)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
	})
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		w := &flushDiscard{h: http.Header{}}
		buf := make([]byte, 32<<10)
		for i := 0; i < b.N; i++ {
			body := &eventsBody{events: events}
			rc := http.NewResponseController(w)
			for {
				n, err := body.Read(buf)
				if n > 0 {
					_, _ = w.Write(buf[:n])
					_ = rc.Flush()
				}
				if err != nil {
					break
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
	})
}
