package httpapi_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSSERelayFlushesEachEvent: every event reaches the client before the engine writes the
// next one (the engine waits for the client to confirm each).
func TestSSERelayFlushesEachEvent(t *testing.T) {
	s := newStack(t, stackOpt{})
	ack := make(chan struct{})
	e := newEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 5; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-ack:
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Second):
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	s.beat("w1", "smol", e)
	resp, err := s.srv.Client().Post(s.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"smol","prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	for i := 0; i < 5; i++ {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if want := fmt.Sprintf("data: {\"choices\":[{\"text\":\"t%d\"}]}\n", i); line != want {
			t.Fatalf("event %d: %q, want %q", i, line, want)
		}
		if _, err := rd.ReadString('\n'); err != nil { // the blank line
			t.Fatal(err)
		}
		ack <- struct{}{} // only now may the engine write the next event
	}
	rest, _ := io.ReadAll(rd)
	if string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("tail %q", rest)
	}
	s.InFlight("w1", 0)
}

// cutEngine writes head on a raw connection and closes it: a stream broken off mid-way.
func cutEngine(t *testing.T, head string) *engine {
	return newEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString(head)
		buf.Flush()
		conn.Close()
	})
}

// TestNoSpliceAfterFirstByte: a worker that dies after one token; the client gets that token
// and an SSE error event, no [DONE]; no other worker is called.
func TestNoSpliceAfterFirstByte(t *testing.T) {
	s := newStack(t, stackOpt{})
	dying := cutEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"1a\r\ndata: {\"text\":\"The cat\"}\n\n\r\n")
	healthy := jsonEngine(t, "other")
	s.beat("a-dying", "smol", dying)
	s.beat("b-healthy", "smol", healthy)
	resp, body := s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x","stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := sseEvents(t, body)
	if len(events) != 2 || events[0] != `data: {"text":"The cat"}` ||
		!strings.HasPrefix(events[1], "event: error\ndata: ") ||
		!strings.Contains(events[1], `"type":"upstream_error","code":"stream_interrupted"`) {
		t.Fatalf("events %q", events)
	}
	if strings.Contains(string(body), "[DONE]") {
		t.Fatal("an interrupted stream must not end with [DONE]")
	}
	if n := len(healthy.calls()); n != 0 {
		t.Fatalf("the other worker was called %d times: spliced", n)
	}
	s.InFlight("a-dying", 0)
}

// TestJSONCutMidBodyIs502: a non-streamed answer broken off mid-way is 502, not a short 200.
func TestJSONCutMidBodyIs502(t *testing.T) {
	s := newStack(t, stackOpt{})
	s.beat("w1", "smol", cutEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"choices\":"))
	resp, body := s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x"}`)
	if resp.StatusCode != 502 || errCode(t, body) != "upstream_error" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	s.InFlight("w1", 0)
}

// TestFailoverBeforeFirstByte: a refused worker and a 503 worker are each tried once and the
// request completes on the next.
func TestFailoverBeforeFirstByte(t *testing.T) {
	s := newStack(t, stackOpt{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := lis.Addr().String()
	lis.Close() // nobody listens there now
	busy := newEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		http.Error(w, `{"error":"full"}`, http.StatusServiceUnavailable)
	})
	good := jsonEngine(t, "good")
	w := func(id string, addr string, q int64) {
		info := gwWorker(id, addr, q)
		s.Beat(info)
	}
	// Loads make the order deterministic: refused (0), busy (1), good (2).
	w("a-refused", refused, 0)
	w("b-busy", busy.addr(), 1)
	w("c-good", good.addr(), 2)
	resp, body := s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x"}`)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "hello from good") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if len(busy.calls()) != 1 || len(good.calls()) != 1 {
		t.Fatalf("busy called %d, good %d; want 1 and 1", len(busy.calls()), len(good.calls()))
	}
	for _, id := range []string{"a-refused", "b-busy", "c-good"} {
		s.InFlight(id, 0)
	}
	// All three failing: 503 no_capacity after max_attempts, never the engine's own 503 body.
	s.Beat(gwWorker("c-good", refused, 2))
	resp, body = s.do(t, "POST", "/v1/completions", "", `{"model":"smol","prompt":"x"}`)
	if resp.StatusCode != 503 || errCode(t, body) != "no_capacity" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestClientDisconnectReleases: a client that leaves mid-stream cancels the upstream request
// at once and the in-flight count returns to 0.
func TestClientDisconnectReleases(t *testing.T) {
	s := newStack(t, stackOpt{})
	upstreamGone := make(chan struct{})
	e := newEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"text\":\"a\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(upstreamGone)
		case <-time.After(10 * time.Second):
		}
	})
	s.beat("w1", "smol", e)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.srv.URL+"/v1/completions", strings.NewReader(`{"model":"smol","prompt":"x","stream":true}`))
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	s.InFlight("w1", 1)
	cancel()
	resp.Body.Close()
	select {
	case <-upstreamGone:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	s.InFlight("w1", 0)
}
