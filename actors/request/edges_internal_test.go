package request

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/clock"
)

// TestIdleBodySmallReads: an event end that arrives one byte at a time still restarts the
// idle timer (the bytes before it are kept across reads shorter than the tail).
func TestIdleBodySmallReads(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b := newIdleBody(&scriptedReader{reads: []string{"data: a", "\n", "\n"}}, &closeCount{}, clk, 5*time.Second, nil)
	buf := make([]byte, 64)
	for range 2 {
		if _, err := b.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(4 * time.Second)
	if _, err := b.Read(buf); err != nil { // "\n" after "\n": the event ends here
		t.Fatal(err)
	}
	clk.Advance(4 * time.Second)
	if b.idle.Load() {
		t.Fatal("an event end split over one-byte reads did not restart the idle timer")
	}
	clk.Advance(time.Second)
	if !b.idle.Load() {
		t.Fatal("not idle 5 s after the last event end")
	}
}

// blockedReader signals when a read starts and fails it once closed.
type blockedReader struct {
	reading chan struct{}
	closed  chan struct{}
}

func (b *blockedReader) Read([]byte) (int, error) {
	b.reading <- struct{}{}
	<-b.closed
	return 0, io.ErrClosedPipe
}

func (b *blockedReader) Close() error { close(b.closed); return nil }

// TestIdleBodyReadCutByTheTimer: a read under way when the idle timer closes the engine's body
// fails with errStreamIdle, not with the error closing caused.
func TestIdleBodyReadCutByTheTimer(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	eng := &blockedReader{reading: make(chan struct{}, 1), closed: make(chan struct{})}
	b := newIdleBody(eng, eng, clk, 5*time.Second, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 8))
		errc <- err
	}()
	<-eng.reading
	clk.Advance(5 * time.Second)
	select {
	case err := <-errc:
		if err != errStreamIdle {
			t.Fatalf("the read failed with %v, want errStreamIdle", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the idle timer did not end the read")
	}
}

// TestFramerEdges: a one-byte chunk, a chunk whose blank line is not at its end, and an event
// completed by a chunk that ends in a blank line after bytes held back.
func TestFramerEdges(t *testing.T) {
	var f eventFramer
	if out, err := f.feed([]byte("\n")); err != nil || string(out) != "\n" {
		t.Fatalf("a lone newline: %q %v", out, err)
	}
	f = eventFramer{}
	if out, _ := f.feed([]byte("data: a\n\nx")); string(out) != "data: a\n\n" || string(f.rest()) != "x" {
		t.Fatalf("out %q, held %q", out, f.rest())
	}
	f = eventFramer{}
	if out, _ := f.feed([]byte("data: a\n")); out != nil {
		t.Fatalf("half an event went out: %q", out)
	}
	if out, _ := f.feed([]byte("bc\n\n")); string(out) != "data: a\nbc\n\n" {
		t.Fatalf("the held bytes were lost: %q", out)
	}
}

// TestAppendCappedCapacity: appending within capacity reuses the array; growing stops at the
// limit.
func TestAppendCappedCapacity(t *testing.T) {
	dst := make([]byte, 3, 4)
	if out := appendCapped(dst, []byte("x"), 100); &out[0] != &dst[0] || len(out) != 4 {
		t.Fatal("an append that fits took a new array")
	}
	big := make([]byte, 600)
	if out := appendCapped(big, []byte("x"), 601); cap(out) != 601 || len(out) != 601 {
		t.Fatalf("capacity %d past the limit 601", cap(out))
	}
}

// TestReadBoundedEmptyAnnounced: an answer that announces 0 bytes gets the smallest buffer.
func TestReadBoundedEmptyAnnounced(t *testing.T) {
	b, err := readBounded(strings.NewReader(""), 0, 1<<20, nil)
	if err != nil || len(b) != 0 || cap(b) != 512 {
		t.Fatalf("%d bytes, capacity %d, %v", len(b), cap(b), err)
	}
}

// TestTokenCounter (R13.5): the last usage.total_tokens seen, wherever it is in the bytes, up
// to 19 digits; events are counted by their blank lines.
func TestTokenCounter(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{`"total_tokens":190`, 190},
		{`{"usage":{"prompt_tokens":3,"total_tokens": 109}}`, 109},
		{`"total_tokens":1234567890123456789`, 1234567890123456789},
		{`"total_tokens":12345678901234567890`, 1234567890123456789},
		{`"total_tokens":x`, -1},
	} {
		tc := tokenCounter{usage: -1}
		tc.observe([]byte(c.in))
		if tc.usage != c.want {
			t.Errorf("%s: usage %d, want %d", c.in, tc.usage, c.want)
		}
	}
	tc := tokenCounter{usage: -1}
	tc.observe([]byte("data: 1\n\ndata: 2\n\n"))
	if tc.events != 2 || tc.usage != -1 {
		t.Fatalf("%+v", tc)
	}
}

// FuzzLastTotalTokens: the anchored search finds what bytes.LastIndex finds.
func FuzzLastTotalTokens(f *testing.F) {
	for _, s := range []string{`"total_tokens":1`, `k"total_tokens":"total_tokens":2`, `"total_tokens`, `kkkkkkkkkk`,
		`{"usage":{"prompt_tokens":3,"total_tokens": 109}}"total_tokens":`, `"total_"total_tokens":`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := lastTotalTokens(b), bytes.LastIndex(b, totalTokensKey); got != want {
			t.Fatalf("%q: %d, want %d", b, got, want)
		}
	})
}

// TestCost (R13.5): the usage the engine reported, else prompt bytes / 4 plus the events.
func TestCost(t *testing.T) {
	var none *relayResult
	for _, c := range []struct {
		res  *relayResult
		want int64
	}{
		{none, 10},
		{&relayResult{usage: -1, events: 3}, 13},
		{&relayResult{usage: 0, events: 3}, 13},
		{&relayResult{usage: 7, events: 3}, 7},
	} {
		if got := c.res.cost(40); got != c.want {
			t.Errorf("%+v: cost %d, want %d", c.res, got, c.want)
		}
	}
}

// TestWhatReachesTheEngineAndTheClient: a stream's attempt asks for an event stream and a
// JSON one asks for nothing; the client gets only the allowed engine headers, and a debug key
// gets X-TL-Route but no cascade step on a route without a cascade; a stream without usage
// costs its prompt estimate plus its events.
func TestWhatReachesTheEngineAndTheClient(t *testing.T) {
	m := newMRig(t)
	m.pool = []string{"a"}
	accepts := make(chan string, 2)
	m.upstream = func(_ string, req *http.Request, body string) (*http.Response, error) {
		accepts <- req.Header.Get("Accept")
		if strings.Contains(body, `"stream":true`) {
			r := reply(200, "text/event-stream", "data: {}\n\ndata: [DONE]\n\n")
			r.Header.Set("Set-Cookie", "engine=1")
			return r, nil
		}
		r := reply(200, "application/json", okJSON)
		r.Header.Set("Cache-Control", "no-store")
		r.Header.Set("X-TL-Route", "spoofed")
		return r, nil
	}
	debug := func(x *Exchange) { x.Debug = true }
	w := m.start(`{"model":"m","prompt":"hi"}`, debug).wait(t)
	h := w.Header()
	if h.Get("Content-Type") != "application/json" || h.Get("Cache-Control") != "no-store" || h.Get("X-TL-Route") != "a" {
		t.Fatalf("client headers %v", h)
	}
	if _, ok := h["Retry-After"]; ok {
		t.Fatalf("a header the engine did not send: %v", h)
	}
	if _, ok := h["X-Tl-Cascade-Step"]; ok {
		t.Fatalf("a cascade step on a plain route: %v", h)
	}
	if a := <-accepts; a != "" {
		t.Fatalf("a JSON attempt asked for %q", a)
	}
	body := `{"model":"m","prompt":"hi there","stream":true}`
	run := m.start(body)
	w = run.wait(t)
	if w.Header().Get("Set-Cookie") != "" || w.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream headers %v", w.Header())
	}
	if a := <-accepts; a != "text/event-stream" {
		t.Fatalf("a stream's attempt asked for %q", a)
	}
	if got, want := run.x.Tokens(), int64(len(body)/4+2); got != want {
		t.Fatalf("the stream cost %d tokens, want %d", got, want)
	}
}

// TestCutJSONAnswerDropsEngineHeaders: a JSON answer cut mid-way is a 502 that keeps the
// gateway's X-Request-ID and none of the engine's headers.
func TestCutJSONAnswerDropsEngineHeaders(t *testing.T) {
	m := newMRig(t)
	m.pool = []string{"a"}
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		r := reply(200, "application/x-engine", "")
		r.Body, r.ContentLength = io.NopCloser(io.MultiReader(strings.NewReader(`{"cho`), errReader{io.ErrUnexpectedEOF})), -1
		return r, nil
	}
	w := m.start(`{"model":"m","prompt":"hi"}`, func(x *Exchange) { x.W.Header().Set("X-Request-ID", "req") }).wait(t)
	if w.Code != 502 || w.Header().Get("X-Request-ID") != "req" || w.Header().Get("Content-Type") == "application/x-engine" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
}

// TestThreeStepCascade (R7): an unsure first step escalates to the second, not the last.
func TestThreeStepCascade(t *testing.T) {
	m := newMRig(t)
	m.steps = []string{"s0", "s1", "s2"}
	acc, err := cascade.ParseAcceptIf("mean_logprob > -1")
	if err != nil {
		t.Fatal(err)
	}
	m.accept = &acc
	m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
		if worker == "s0" {
			return reply(200, "application/json", cascadeAnswer(-4)), nil
		}
		return reply(200, "application/json", cascadeAnswer(-0.1)), nil
	}
	w := m.do(`{"model":"m","prompt":"hi"}`)
	if w.Code != 200 || len(m.bodiesOf("s1")) != 1 || len(m.bodiesOf("s2")) != 0 {
		t.Fatalf("%d; s1 asked %d times, s2 %d", w.Code, len(m.bodiesOf("s1")), len(m.bodiesOf("s2")))
	}
	if got := m.expectReleases(2); !equalOutcomes(got, map[string][]router.Outcome{"s0": {router.OutcomeSuccess}, "s1": {router.OutcomeSuccess}}) {
		t.Fatalf("releases %v", got)
	}
	if !bytes.Contains(w.Body.Bytes(), []byte(`"logprobs":null`)) {
		t.Fatalf("the client, who did not ask, got logprobs: %s", w.Body.String())
	}
}

// countWarnings counts the records logged with a message.
type countWarnings struct {
	msg string
	n   *atomic.Int32
}

func (h countWarnings) Enabled(context.Context, slog.Level) bool { return true }
func (h countWarnings) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countWarnings) WithGroup(string) slog.Handler            { return h }
func (h countWarnings) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}

// TestFailedReleaseIsLogged: a Release the decode worker refuses is logged (its lease frees
// the blocks); one it answers is not.
func TestFailedReleaseIsLogged(t *testing.T) {
	for _, fail := range []error{nil, errors.New("unavailable")} {
		m := newMRig(t)
		var n atomic.Int32
		m.d.Logger = slog.New(countWarnings{msg: "KV release failed; the engine's lease will free it", n: &n})
		m.engines.fail = fail
		m.pool, m.prefill = []string{"d"}, "p"
		m.upstream = func(worker string, req *http.Request, body string) (*http.Response, error) {
			if worker == "d" {
				return reply(200, "text/event-stream", "data: {}\n\n"), nil // cut: the handle is released
			}
			return tokenizer(worker, req, body)
		}
		m.do(`{"model":"m","prompt":"hi","stream":true}`)
		if want := int32(map[bool]int{true: 1}[fail != nil]); n.Load() != want {
			t.Fatalf("Release answered %v: %d warnings, want %d", fail, n.Load(), want)
		}
	}
}

// TestIdleBodyCloseStopsTheTimer: a body closed before the idle timeout never counts one.
func TestIdleBodyCloseStopsTheTimer(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	var idles atomic.Int32
	b := newIdleBody(strings.NewReader(""), &closeCount{}, clk, 5*time.Second, func() { idles.Add(1) })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if idles.Load() != 0 || b.idle.Load() || clk.Pending() != 0 {
		t.Fatalf("a closed body went idle (%d counted, %d timers)", idles.Load(), clk.Pending())
	}
}

// TestRequestTimeoutDropsEngineHeaders (R14.1): a JSON answer that stalls after its headers is
// answered 504 with the gateway's X-Request-ID and none of the engine's headers.
func TestRequestTimeoutDropsEngineHeaders(t *testing.T) {
	m := newMRig(t)
	m.d.RequestTimeout = time.Minute
	m.pool = []string{"a"}
	pr, pw := io.Pipe()
	m.upstream = func(_ string, req *http.Request, _ string) (*http.Response, error) {
		go func() { // the body fails once the attempt is cancelled, as a transport's does
			<-req.Context().Done()
			pw.CloseWithError(req.Context().Err())
		}()
		r := reply(200, "application/x-engine", "")
		r.Body, r.ContentLength = pr, -1
		return r, nil
	}
	run := m.start(`{"model":"m","prompt":"hi"}`, func(x *Exchange) { x.W.Header().Set("X-Request-ID", "req") })
	gwait(t, "the answer relayed", func() bool { return m.transitions(Attempting, Relaying) == 1 })
	m.clk.Advance(time.Minute)
	w := run.wait(t)
	if w.Code != 504 || w.Header().Get("X-Request-ID") != "req" || w.Header().Get("Content-Type") == "application/x-engine" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	if got := m.expectReleases(1); !equalOutcomes(got, map[string][]router.Outcome{"a": {router.OutcomeTimeout}}) {
		t.Fatalf("releases %v", got)
	}
}

// TestFinishedRequestUnwatchesItsWorkers: a request that finishes with its holds released
// drops its worker from its watchers, so the worker gets no Terminated when it stops (every
// other watcher still does).
func TestFinishedRequestUnwatchesItsWorkers(t *testing.T) {
	m := newMRig(t)
	m.pool = []string{"w1"}
	type watchCmd struct{ who *actor.PID }
	type ping struct{}
	workerTerm, observerTerm := make(chan *actor.PID, 4), make(chan *actor.PID, 4)
	watching := make(chan struct{}, 2)
	watcher := func(term chan *actor.PID, worker string) *actor.PID {
		return m.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch msg := c.Message().(type) {
			case watchCmd:
				c.Watch(msg.who)
				watching <- struct{}{}
			case *actor.Terminated:
				term <- msg.Who
			case *router.Release:
				m.releases <- released{worker: worker, ticket: msg.Ticket, outcome: msg.Outcome}
			case ping:
				c.Respond(true)
			}
		}))
	}
	worker := watcher(workerTerm, "w1")
	m.workers["w1"] = worker
	observer := watcher(observerTerm, "")
	gate := make(chan struct{})
	m.upstream = func(string, *http.Request, string) (*http.Response, error) {
		<-gate
		return reply(200, "application/json", okJSON), nil
	}
	r := m.start(`{"model":"m","prompt":"hi"}`)
	var p *router.Pick
	select {
	case p = <-m.picks:
	case <-time.After(waitFor):
		t.Fatal("no pick")
	}
	// Watched as the worker watches from the pick's Acquire on, while the attempt is out.
	m.sys.Root.Send(worker, watchCmd{p.Requester})
	m.sys.Root.Send(observer, watchCmd{p.Requester})
	for range 2 {
		<-watching
	}
	close(gate)
	if w := r.wait(t); w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	m.expectReleases(1)
	select {
	case who := <-observerTerm:
		if !who.Equal(p.Requester) {
			t.Fatalf("the observer was told of %v", who)
		}
	case <-time.After(waitFor):
		t.Fatal("the request actor never stopped")
	}
	// Both Terminated were sent at the stop, before the ping: the worker handles system
	// messages first, so by its answer it would have seen one.
	if _, err := m.sys.Root.RequestFuture(worker, ping{}, waitFor).Result(); err != nil {
		t.Fatal(err)
	}
	select {
	case who := <-workerTerm:
		t.Fatalf("the worker was told %v stopped, though it held nothing on it", who)
	default:
	}
}

// TestAnswered: a request counts as answered (router.Finished with Aborted false) only when the
// relay reached the answer's end and the status was 2xx.
func TestAnswered(t *testing.T) {
	for _, c := range []struct {
		res  *relayResult
		code int
		want bool
	}{
		{nil, 200, false},
		{&relayResult{finished: false}, 200, false},
		{&relayResult{finished: true}, 200, true},
		{&relayResult{finished: true}, 204, true},
		{&relayResult{finished: true}, 299, true},
		{&relayResult{finished: true}, 199, false},
		{&relayResult{finished: true}, 300, false},
		{&relayResult{finished: true}, 404, false},
		{&relayResult{finished: true}, 502, false},
	} {
		r := &requestActor{relayOut: c.res}
		if got := r.answered(c.code); got != c.want {
			t.Errorf("%+v, code %d: answered %v, want %v", c.res, c.code, got, c.want)
		}
	}
}
