package request

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestSentNothingAndRefused: a dial error (refused, a DNS failure, a connect timeout) sent
// nothing to an engine; only a refused connection proves that nothing listens (R19), or that
// the address breaks the engine address rules (R20: the gateway will not reach it there). An
// error after the connection was made (a reset, EOF, a timeout on read) sent the request.
func TestSentNothingAndRefused(t *testing.T) {
	dnsErr := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x"}}
	connectTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ETIMEDOUT}}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	ruled := &net.OpError{Op: "dial", Net: "tcp", Err: engineaddr.Rules{RefuseLoopback: true}.Control("tcp4", "127.0.0.1:80", nil)}
	for _, c := range []struct {
		name              string
		err               error
		nothing, refusedT bool
	}{
		{"refused", errRefused, true, true},
		{"refused, wrapped by the client", fmt.Errorf("Post %q: %w", "http://x", errRefused), true, true},
		{"refused by the address rules", ruled, true, true},
		{"refused by the address rules, behind a gRPC error", fmt.Errorf("%w (rpc error: code = Unavailable)", ruled), true, true},
		{"a DNS failure", dnsErr, true, false},
		{"a connect timeout", connectTimeout, true, false},
		{"a reset", reset, false, false},
		{"EOF before the headers", io.EOF, false, false},
		{"the stream ended before its first event", errNoFirstEvent, false, false},
		{"a 503", statusError{what: "w", status: 503}, false, false},
		{"the first-byte timeout", errFirstByteTimeout, false, false},
	} {
		if got := sentNothing(c.err); got != c.nothing {
			t.Errorf("%s: sentNothing = %v, want %v", c.name, got, c.nothing)
		}
		if got := refused(c.err); got != c.refusedT {
			t.Errorf("%s: refused = %v, want %v", c.name, got, c.refusedT)
		}
	}
}

// TestRetryBudgetSlotAccounting (R19): a failover that sent nothing takes no slot; one that
// reached an engine takes one, and a second failure of the same retry keeps it rather than
// taking another; beyond the limit a failover is refused and holds nothing; giving back is
// idempotent.
func TestRetryBudgetSlotAccounting(t *testing.T) {
	b := NewRetryBudget(0) // a limit of 3
	var a, c, d, e bool
	if !b.failover(&a, true) || a || b.Retries() != 0 {
		t.Fatalf("a failover that sent nothing: allowed, held %v, %d slots", a, b.Retries())
	}
	if !b.failover(&a, false) || !a || b.Retries() != 1 {
		t.Fatalf("a failover that reached an engine: held %v, %d slots", a, b.Retries())
	}
	if !b.failover(&a, false) || !b.failover(&a, true) || b.Retries() != 1 {
		t.Fatalf("more failures of the same retry: %d slots, want 1", b.Retries())
	}
	if !b.failover(&c, false) || !b.failover(&d, false) || b.Retries() != 3 {
		t.Fatalf("three retries: %d slots", b.Retries())
	}
	if b.failover(&e, false) || e || b.Retries() != 3 {
		t.Fatalf("over the limit: allowed or held (%v, %d slots)", e, b.Retries())
	}
	if !b.failover(&e, true) || e {
		t.Fatal("over the limit, a failover that sent nothing was refused or took a slot")
	}
	b.giveBack(&a)
	b.giveBack(&a)
	if a || b.Retries() != 2 {
		t.Fatalf("after giving back twice: held %v, %d slots", a, b.Retries())
	}
	if !b.failover(&e, false) || b.Retries() != 3 {
		t.Fatalf("a freed slot not taken: %d", b.Retries())
	}
}

// TestRetryBudgetSlotsProperty (R14.3, R19): over any sequence of failovers, first bytes and
// ends of a few requests, with the in-flight count moving, the slots the budget counts are
// exactly the requests that hold one; a failover that reached an engine is refused only when
// the budget was at its limit; after every request has ended none is held.
func TestRetryBudgetSlotsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := NewRetryBudget(float64(rapid.IntRange(0, 100).Draw(t, "percent")))
		held := make([]bool, rapid.IntRange(1, 12).Draw(t, "requests"))
		count := func() (n int64) {
			for _, h := range held {
				if h {
					n++
				}
			}
			return n
		}
		for range rapid.IntRange(0, 200).Draw(t, "steps") {
			i := rapid.IntRange(0, len(held)-1).Draw(t, "request")
			switch rapid.IntRange(0, 4).Draw(t, "event") {
			case 0:
				b.inFlight.Store(int64(rapid.IntRange(0, 100).Draw(t, "in flight")))
			case 1:
				before, wasHeld := b.Retries(), held[i]
				ok := b.failover(&held[i], false)
				if !ok && (wasHeld || before < b.Limit()) {
					t.Fatalf("refused with %d of %d slots held (held by it: %v)", before, b.Limit(), wasHeld)
				}
				if ok != held[i] {
					t.Fatalf("allowed %v but holds %v", ok, held[i])
				}
			case 2:
				wasHeld := held[i]
				if !b.failover(&held[i], true) || held[i] != wasHeld {
					t.Fatal("a failover that sent nothing was refused or changed the slot")
				}
			case 3, 4: // the retried attempt's first byte, or the request's end
				b.giveBack(&held[i])
			}
			if b.Retries() != count() {
				t.Fatalf("%d slots counted, %d held", b.Retries(), count())
			}
		}
		for i := range held {
			b.giveBack(&held[i])
		}
		if b.Retries() != 0 {
			t.Fatalf("%d slots after every request ended", b.Retries())
		}
	})
}

// TestRefusedAttemptTellsTheWorker (R19): the Release of an attempt whose connection was
// refused says the worker is unreachable; a DNS failure, a reset and a 503 do not. Each
// failure's verdict names the worker's address the attempt went to.
func TestRefusedAttemptTellsTheWorker(t *testing.T) {
	m := newMRig(t)
	m.d.MaxAttempts = 5
	m.pool = []string{"a", "b", "c", "d", "e"}
	m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
		switch worker {
		case "a":
			return nil, errRefused
		case "b":
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "b"}}
		case "c":
			return nil, io.EOF
		case "d":
			return reply(503, "text/plain", "full"), nil
		}
		return reply(200, "application/json", okJSON), nil
	}
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	for range 5 {
		select {
		case r := <-m.releases:
			if r.unreachable != (r.worker == "a") {
				t.Fatalf("worker %s released with unreachable = %v", r.worker, r.unreachable)
			}
			// A failed attempt's verdict names the address it went to (the worker ignores
			// it once it is elsewhere).
			if r.outcome.Failed() && r.addr != r.worker+".http" {
				t.Fatalf("worker %s's verdict %v names the address %q, want %q", r.worker, r.outcome, r.addr, r.worker+".http")
			}
		case <-time.After(waitFor):
			t.Fatal("a Release is missing")
		}
	}
}

// TestRetryBudgetSpentStillFailsOverWhatSentNothing (R19): with every slot of the budget held,
// a request whose first worker refuses the connection still fails over (and answers 200),
// taking no slot; one whose first worker answered 503 is answered 503 no_capacity.
func TestRetryBudgetSpentStillFailsOverWhatSentNothing(t *testing.T) {
	m := newMRig(t)
	b := NewRetryBudget(0)
	b.retries.Store(3) // three retries running elsewhere: the budget is spent
	m.d.RetryBudget = b
	m.pool = []string{"a", "b"}
	first := "refuse"
	m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
		if worker == "a" {
			if first == "refuse" {
				return nil, errRefused
			}
			return reply(503, "text/plain", "full"), nil
		}
		return reply(200, "application/json", okJSON), nil
	}
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 200 {
		t.Fatalf("a refused first attempt with the budget spent: %d %q", w.Code, w.Body.String())
	}
	m.expectReleases(2)
	if b.Retries() != 3 || b.InFlight() != 0 {
		t.Fatalf("after it: %d slots, %d in flight; want 3 and 0", b.Retries(), b.InFlight())
	}
	first = "503"
	if w := m.do(`{"model":"m","prompt":"hi"}`); w.Code != 503 || !strings.Contains(w.Body.String(), "retry budget") {
		t.Fatalf("a 503 first attempt with the budget spent: %d %q", w.Code, w.Body.String())
	}
	m.expectReleases(1)
	if b.Retries() != 3 {
		t.Fatalf("%d slots, want 3", b.Retries())
	}
}

// TestRetrySlotEndsAtTheFirstByte (R19): a request that failed over (503) holds a slot while
// its retry runs, and gives it back when the retry's first event arrives, not when its stream
// ends.
func TestRetrySlotEndsAtTheFirstByte(t *testing.T) {
	m := newMRig(t)
	b := NewRetryBudget(0)
	m.d.RetryBudget = b
	m.pool = []string{"a", "b"}
	headers := make(chan struct{})
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	m.upstream = func(worker string, _ *http.Request, _ string) (*http.Response, error) {
		if worker == "a" {
			return reply(503, "text/plain", "full"), nil
		}
		<-headers
		resp := reply(200, "text/event-stream", "")
		resp.Body, resp.ContentLength = pr, -1
		return resp, nil
	}
	run := m.start(`{"model":"m","prompt":"hi","stream":true}`)
	gwtest.Eventually(t, "the failover's slot taken", func() bool { return b.Retries() == 1 })
	close(headers)
	if _, err := pw.Write([]byte("data: {\"t\":1}\n\n")); err != nil {
		t.Fatal(err)
	}
	gwtest.Eventually(t, "the slot given back at the first event", func() bool { return b.Retries() == 0 })
	select {
	case <-run.x.Done():
		t.Fatal("the stream ended before its end")
	default:
	}
	if _, err := pw.Write([]byte("data: [DONE]\n\n")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if w := run.wait(t); w.Code != 200 || !strings.HasSuffix(w.Body.String(), "data: [DONE]\n\n") {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	if b.Retries() != 0 || b.InFlight() != 0 {
		t.Fatalf("after the end: %d slots, %d in flight", b.Retries(), b.InFlight())
	}
}
