package httpapi_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	tlengine "github.com/tlgw/tlgw/sim/engine"
)

// failAfter is how long a test waits for something that must happen before it fails; it is a
// bound on failure, never a wait on success.
const failAfter = 10 * time.Second

// TestMaxInFlight (R13.3): with max_in_flight = 1, a second inference request while one is
// served is 503 overloaded; once the first ends, requests are served again.
func TestMaxInFlight(t *testing.T) {
	s := newStack(t, stackOpt{maxInFlight: 1})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	e := newEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	})
	s.beat("w1", "smol", e)
	first := make(chan int, 1)
	go func() {
		resp, err := s.srv.Client().Post(s.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"smol","prompt":"x"}`))
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	select {
	case <-entered:
	case <-time.After(failAfter):
		t.Fatal("the first request never reached the engine")
	}
	resp, body := s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x"}`)
	if resp.StatusCode != 503 || errCode(t, body) != "overloaded" {
		t.Fatalf("second request: %d %s", resp.StatusCode, body)
	}
	close(release)
	if code := <-first; code != 200 {
		t.Fatalf("first request: %d", code)
	}
	if resp, body := s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x"}`); resp.StatusCode != 200 {
		t.Fatalf("after the first ended: %d %s", resp.StatusCode, body)
	}
}

// rawConn dials the gateway. (A tiny receive buffer would make the drop come sooner, but a
// window below one loopback MSS stalls the transfer of what is left once reading resumes.)
func (s *stack) rawConn(t *testing.T) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(s.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	tc := c.(*net.TCPConn)
	t.Cleanup(func() { tc.Close() })
	return tc
}

// TestClientWriteTimeoutDropsStalledReader (R13.3): a client that stops reading an SSE stream
// is dropped once a write has waited client_write_timeout, and its engine request is cancelled
// (the engine sees its request end; the worker's in-flight count returns to 0).
func TestClientWriteTimeoutDropsStalledReader(t *testing.T) {
	s := newStack(t, stackOpt{writeTimeout: 100 * time.Millisecond})
	cancelled := make(chan struct{})
	event := "data: {\"choices\":[{\"text\":\"" + strings.Repeat("x", 8<<10) + "\"}]}\n\n"
	e := newEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		defer close(cancelled)
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil { // an endless stream, until the gateway lets go of it
			if _, err := io.WriteString(w, event); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	s.beat("w1", "smol", e)
	c := s.rawConn(t)
	body := `{"model":"smol","prompt":"x","stream":true}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	rd := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(failAfter))
	for { // read until the stream has begun, then stop reading
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("before the first event: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			break
		}
	}
	select {
	case <-cancelled:
	case <-time.After(failAfter):
		t.Fatal("the engine request was not cancelled after the client stopped reading")
	}
	s.InFlight("w1", 0)
	// The gateway closed the connection: reading what is buffered ends in EOF or a reset, not
	// in this test's own deadline.
	_, err := io.Copy(io.Discard, rd)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		t.Fatal("the gateway kept the stalled client's connection open")
	}
}

// TestBodyReadTimeout (R13.3): a body that does not arrive within body_read_timeout is 408
// request_timeout, and no engine is asked.
func TestBodyReadTimeout(t *testing.T) {
	s := newStack(t, stackOpt{bodyTimeout: 100 * time.Millisecond})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	c := s.rawConn(t)
	fmt.Fprint(c, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	_ = c.SetReadDeadline(time.Now().Add(failAfter))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 408 || errCode(t, b) != "request_timeout" {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if n := len(e.calls()); n != 0 {
		t.Fatalf("the engine was asked %d times", n)
	}
}

// adminAs sends GET /admin/v1/workers with the given Host and Origin.
func (s *stack) adminAs(t *testing.T, key, host, origin string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", s.srv.URL+"/admin/v1/workers", nil)
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return resp.StatusCode, errCode(t, b)
	}
	return resp.StatusCode, ""
}

// TestOpenAdminLoopbackOnly (R13.3): without keys, /admin answers only a loopback Host and,
// when an Origin is sent, only that same loopback origin (DNS rebinding and cross-site POSTs
// get 403 forbidden_origin). With keys the key decides.
func TestOpenAdminLoopbackOnly(t *testing.T) {
	s := newStack(t, stackOpt{})
	port := s.srv.URL[strings.LastIndex(s.srv.URL, ":")+1:]
	for _, tc := range []struct {
		host, origin string
		status       int
	}{
		{"", "", 200},
		{"localhost:" + port, "", 200},
		{"[::1]:" + port, "", 200},
		{"127.0.0.1:" + port, "http://127.0.0.1:" + port, 200},
		{"localhost:" + port, "http://localhost:" + port, 200},
		{"evil.example:" + port, "", 403},
		{"10.0.0.5:" + port, "", 403},
		{"127.0.0.1:" + port, "http://evil.example", 403},
		{"127.0.0.1:" + port, "http://localhost:" + port, 403}, // another origin, though loopback
		{"127.0.0.1:" + port, "null", 403},
	} {
		status, code := s.adminAs(t, "", tc.host, tc.origin)
		if status != tc.status || (status == 403 && code != "forbidden_origin") {
			t.Errorf("Host %q Origin %q: %d %s, want %d", tc.host, tc.origin, status, code, tc.status)
		}
	}
	// Inference is not an admin path: the rule does not touch it.
	resp, _ := s.do(t, "GET", "/v1/models", "", "", "Origin", "http://evil.example")
	if resp.StatusCode != 200 {
		t.Errorf("/v1/models with a foreign Origin: %d", resp.StatusCode)
	}

	keyed := newStack(t, stackOpt{keys: testKeys})
	if status, code := keyed.adminAs(t, "sk-admin", "gw.example.com", "https://ops.example.com"); status != 200 {
		t.Errorf("with keys, an admin key from anywhere: %d %s", status, code)
	}
}

// TestStalledReaderFreesTheEngineSlot (R13.3, issue 10): through the gateway to a real
// tlengine, a client that stops reading a long stream is dropped, and the engine's running
// count returns to 0 (today it would decode for nobody until max_tokens).
func TestStalledReaderFreesTheEngineSlot(t *testing.T) {
	s := newStack(t, stackOpt{writeTimeout: 100 * time.Millisecond})
	e, err := tlengine.Start(tlengine.Config{ID: "e1", Model: "smol", KVBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	s.Beat(gwWorker("w1", e.HTTPAddr, 0))
	c := s.rawConn(t)
	body := `{"model":"smol","prompt":"tell me everything","max_tokens":1000000,"seed":7,"stream":true}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	rd := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(failAfter))
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("before the first event: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			break
		}
	}
	// The first event came from a running sequence; with the client stalled, the gateway lets
	// go of it (on a slow machine it may already have).
	s.Eventually("the engine's running count back to 0", func() bool { return e.Status().Running == 0 })
	s.InFlight("w1", 0)
}
