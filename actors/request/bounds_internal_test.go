package request

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testErrors answers like adapters/http's ErrorWriter (which this package cannot import).
type testErrors struct{}

func (testErrors) Error(w http.ResponseWriter, err error) int {
	w.WriteHeader(http.StatusBadGateway)
	_, _ = io.WriteString(w, err.Error())
	return http.StatusBadGateway
}

func (testErrors) SSEError(w http.ResponseWriter, message string) {
	_, _ = io.WriteString(w, "event: error\ndata: "+message+"\n\n")
}

func testRelayer(w http.ResponseWriter, resp *http.Response) relayer {
	return relayer{w: w, ctx: context.Background(), resp: resp, body: resp.Body, errs: testErrors{}, out: &relayResult{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// stalledBody is an engine that sent its headers and stalls: it reports the buffer the relay
// offered to its first read, then waits for the test to let go.
type stalledBody struct {
	offered chan int
	release chan struct{}
}

func (b *stalledBody) Read(p []byte) (int, error) {
	b.offered <- cap(p)
	<-b.release
	return 0, io.ErrUnexpectedEOF
}

func (b *stalledBody) Close() error { return nil }

// TestContentLengthSizesNoBuffer (R14.4): an engine that claims Content-Length 64 MiB and then
// stalls holds what arrived, not what it claimed: the relay's buffer is at most 64 KiB before
// data arrives, for the client's answer and for a cascade step's; the cut answer is a 502.
func TestContentLengthSizesNoBuffer(t *testing.T) {
	for _, path := range []string{"relay", "cascade step"} {
		body := &stalledBody{offered: make(chan int, 1), release: make(chan struct{})}
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			ContentLength: maxUpstreamJSON, Body: body}
		rec := httptest.NewRecorder()
		done := make(chan int, 1)
		go func() {
			if path == "relay" {
				done <- testRelayer(rec, resp).run(1).code
				return
			}
			res := readAll(1, resp, nil)
			if res.err == nil || len(res.body) != 0 {
				t.Errorf("cascade step: a cut answer read as %d bytes, %v", len(res.body), res.err)
			}
			done <- 0
		}()
		select {
		case n := <-body.offered:
			if n > jsonHint {
				t.Errorf("%s: a buffer of %d bytes before any byte arrived (Content-Length %d)", path, n, maxUpstreamJSON)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the relay never read the body", path)
		}
		close(body.release)
		if code := <-done; path == "relay" && (code != http.StatusBadGateway || rec.Code != http.StatusBadGateway) {
			t.Fatalf("relay: a cut answer gave %d (client %d)", code, rec.Code)
		}
	}
}

var xs = []byte(strings.Repeat("x", 256<<10))

// endless is an answer of n bytes of 'x', made as it is read.
type endless struct{ left int }

func (e *endless) Read(p []byte) (int, error) {
	if e.left == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), e.left)], xs)
	e.left -= n
	return n, nil
}

func (e *endless) Close() error { return nil }

// TestJSONAnswerBound (R14.4): a JSON answer over 64 MiB ends the answer with 502; at the
// bound the buffer stops growing (one byte past it shows the answer is over), and an answer of
// exactly the bound is read whole.
func TestJSONAnswerBound(t *testing.T) {
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		ContentLength: -1, Body: &endless{left: maxUpstreamJSON + 1}}
	rec := httptest.NewRecorder()
	res := testRelayer(rec, resp).run(1)
	if res.code != http.StatusBadGateway || res.finished || !res.ended || !strings.Contains(rec.Body.String(), "larger than 64 MiB") {
		t.Fatalf("64 MiB + 1: code %d, finished %v, client got %.80q", res.code, res.finished, rec.Body.String())
	}
	const limit = 100 << 10
	b, err := readBounded(&endless{left: 10 * limit}, -1, limit, nil)
	if !errors.Is(err, errAnswerTooLarge) || len(b) != limit+1 || cap(b) != limit+1 {
		t.Fatalf("over the bound: read %d bytes (capacity %d), %v", len(b), cap(b), err)
	}
	b, err = readBounded(&endless{left: limit}, -1, limit, nil)
	if err != nil || len(b) != limit || cap(b) > limit+1 {
		t.Fatalf("at the bound: read %d bytes (capacity %d), %v", len(b), cap(b), err)
	}
	// A short answer with its length announced is read into one buffer of that length + 1.
	b, err = readBounded(&endless{left: 1000}, 1000, limit, nil)
	if err != nil || len(b) != 1000 || cap(b) != 1001 {
		t.Fatalf("announced: read %d bytes (capacity %d), %v", len(b), cap(b), err)
	}
}

// TestSSERelayEndsAnOversizedEvent (R14.4): the relay forwards the whole events before an event
// over 1 MiB, then the error event; it stops reading the engine, counts the cut, and never
// forwards a byte of the oversized event.
func TestSSERelayEndsAnOversizedEvent(t *testing.T) {
	first := "data: {\"text\":\"The\"}\n\n"
	body := io.MultiReader(strings.NewReader(first+"data: "), &endless{left: 8 * maxEventBytes})
	eng := &countingBody{r: body}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: eng}
	rec := httptest.NewRecorder()
	rl := testRelayer(rec, resp)
	rl.interrupts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cuts"}, []string{"route"})
	rl.route = "r"
	res := rl.run(1)
	cuts := int(testutil.ToFloat64(rl.interrupts.WithLabelValues("r")))
	got := rec.Body.String()
	if !strings.HasPrefix(got, first+"event: error\ndata: ") || strings.Contains(got, "xx") || !strings.HasSuffix(got, "\n\n") {
		t.Fatalf("client got %.200q", got)
	}
	if res.finished || !res.ended || cuts != 1 || res.events != 1 {
		t.Fatalf("result %+v, cuts %d", res, cuts)
	}
	if eng.n > maxEventBytes+64<<10 || !eng.closed {
		t.Fatalf("read %d bytes from the engine (closed %v)", eng.n, eng.closed)
	}
}

type countingBody struct {
	r      io.Reader
	n      int
	closed bool
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += n
	return n, err
}

func (b *countingBody) Close() error { b.closed = true; return nil }

// TestSizeClasses: the actor and its exchange, allocated per request, stay in the size classes
// they are in (896 bytes with the allocator's 8-byte header, 448): a field added past them
// costs every request a bigger allocation — pack it into padding, or behind a pointer.
func TestSizeClasses(t *testing.T) {
	if n := unsafe.Sizeof(requestActor{}); n > 888 {
		t.Errorf("requestActor is %d bytes: over 888, it moves to the 1024-byte size class", n)
	}
	if n := unsafe.Sizeof(Exchange{}); n > 448 {
		t.Errorf("Exchange is %d bytes: over 448, it moves to the 480-byte size class", n)
	}
}
