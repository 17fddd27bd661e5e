package request

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// closingEngine serves one answer on a keep-alive connection, then reads the next request on
// it and closes the connection without answering (with a reset), as an engine that dies, or
// closes an idle connection just as a request arrives, does. dies: the listener is closed
// first, so a new connection is refused; else one more connection is served an answer.
func closingEngine(t *testing.T, dies bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	answer := func(c net.Conn, br *bufio.Reader) bool {
		req, err := http.ReadRequest(br)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		return err == nil
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		br := bufio.NewReader(c)
		if !answer(c, br) {
			c.Close()
			return
		}
		// The second request on the same connection: read, then the connection goes.
		if req, err := http.ReadRequest(br); err == nil {
			_, _ = io.Copy(io.Discard, req.Body)
		}
		if dies {
			ln.Close()
		}
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
		if dies {
			return
		}
		c2, err := ln.Accept()
		if err != nil {
			return
		}
		defer c2.Close()
		answer(c2, bufio.NewReader(c2))
	}()
	return ln.Addr().String()
}

// TestRequestOnAClosedKeptConnectionIsResent (R19): an engine that closes a kept-alive
// connection without a byte of answer to the request just written on it (it died, or closed
// the idle connection as the request arrived) did not serve it: the request is sent again on
// a new connection. A live engine then answers it; a dead engine's address refuses it, which
// proves the engine down and takes no retry slot (rather than a reset, which would).
func TestRequestOnAClosedKeptConnectionIsResent(t *testing.T) {
	for _, dies := range []bool{false, true} {
		addr := closingEngine(t, dies)
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		send := func() (*http.Response, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			t.Cleanup(cancel)
			h := make(http.Header, 2)
			h["Content-Type"] = jsonContentType
			req, err := upstreamRequest(ctx, "", "http://"+addr+"/v1/completions", []byte(`{"prompt":"hi"}`), h)
			if err != nil {
				t.Fatal(err)
			}
			return tr.RoundTrip(req)
		}
		resp, err := send()
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		resp, err = send()
		if !dies {
			if err != nil {
				t.Fatalf("a live engine that closed the kept connection: %v; want the request sent again and answered", err)
			}
			resp.Body.Close()
			continue
		}
		if err == nil {
			resp.Body.Close()
			t.Fatal("a dead engine answered")
		}
		if !sentNothing(err) || !refused(err) {
			t.Fatalf("a dead engine's closed connection: %v; want the request sent again and refused", err)
		}
	}
}
