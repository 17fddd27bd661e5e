package e2e

import (
	"bufio"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSIGTERMReadyzFirstThenDrain is the Kubernetes termination contract (R23): on SIGTERM the
// gateway answers /readyz 503 at once — on a listener still open, not a refused connection —
// and a new inference request 503 shutting_down, while a stream already in flight runs to its
// end; then the process exits 0, well within shutdown_grace.
func TestSIGTERMReadyzFirstThenDrain(t *testing.T) {
	const grace = 20 * time.Second
	f := startFleet(t, fastHeartbeats+`shutdown_grace = "20s"
`, []string{"slow", "--model", "smol", "--decode-per-token", "50ms"})
	base := f.base

	// A stream of 40 greedy tokens at 50 ms each: about 2 s once it has started.
	type streamEnd struct {
		body string
		err  error
		at   time.Time
	}
	started := make(chan struct{})
	ended := make(chan streamEnd, 1) // one result, from the one reader goroutine
	hc := &http.Client{Timeout: 30 * time.Second}
	go func() {
		var sb strings.Builder
		resp, err := hc.Post(base+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"smol","prompt":"a long answer","max_tokens":40,"temperature":0,"stream":true}`))
		if err != nil {
			close(started)
			ended <- streamEnd{err: err, at: time.Now()}
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		first := true
		for sc.Scan() { // bounded by the stream, which max_tokens ends
			sb.WriteString(sc.Text() + "\n")
			if first && strings.HasPrefix(sc.Text(), "data: {") {
				first = false
				close(started)
			}
		}
		if first {
			close(started)
		}
		ended <- streamEnd{body: sb.String(), err: sc.Err(), at: time.Now()}
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not start")
	}

	sigAt := time.Now()
	if err := f.gw.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// /readyz turns 503 as soon as the signal is handled; until then it may still say 200,
	// but never may the connection be refused. Each probe is a new connection.
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var notReadyAt time.Time
	deadline := time.Now().Add(2 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for notReadyAt.IsZero() {
		resp, err := probe.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("/readyz during the drain: %v (the listener must stay open)", err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusServiceUnavailable:
			notReadyAt = time.Now()
		case http.StatusOK:
		default:
			t.Fatalf("/readyz during the drain: %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 2 s after SIGTERM")
		}
		<-tick.C
	}
	t.Logf("/readyz 503 %v after SIGTERM", notReadyAt.Sub(sigAt))

	// A new request is refused with 503 shutting_down, not a reset connection.
	resp, err := probe.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"smol","prompt":"late","max_tokens":1}`))
	if err != nil {
		t.Fatalf("a request during the drain: %v", err)
	}
	var late strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&late)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(late.String(), "shutting_down") {
		t.Fatalf("a request during the drain: %d %s", resp.StatusCode, late.String())
	}

	var end streamEnd
	select {
	case end = <-ended:
	case <-time.After(grace):
		t.Fatal("the in-flight stream did not end within the grace")
	}
	if end.err != nil || !strings.HasSuffix(end.body, "data: [DONE]\n\n") {
		t.Fatalf("the in-flight stream was cut: %v\n%s", end.err, end.body)
	}
	if !end.at.After(notReadyAt) {
		t.Fatalf("the stream ended (%v) before /readyz went 503 (%v): nothing was in flight", end.at, notReadyAt)
	}
	if n := strings.Count(end.body, "data: {"); n < 2 {
		t.Fatalf("the in-flight stream carried %d events", n)
	}

	select {
	case <-f.gw.Exited():
		if err := f.gw.Err(); err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, f.gw.Logs())
		}
	case <-time.After(grace):
		t.Fatalf("the gateway did not exit within shutdown_grace\n%s", f.gw.Logs())
	}
	exited := time.Now()
	if took := exited.Sub(sigAt); took >= grace {
		t.Fatalf("exit took %v, not within the grace of %v", took, grace)
	}
	t.Logf("stream ended %v after SIGTERM, process exited %v after SIGTERM", end.at.Sub(sigAt), exited.Sub(sigAt))
}
