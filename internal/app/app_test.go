package app_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// protoactor's dead-letter throttle goroutine lives for one throttle interval (1 s)
		// after a dead letter; shutdown makes some (Terminated to an already stopped parent).
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}

// TestShutdownDrains: after shutdown begins, new requests get 503 shutting_down while an
// in-flight stream runs to its end; afterwards nothing is left running (goleak in TestMain).
func TestShutdownDrains(t *testing.T) {
	release := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			// A probe that reached the gateway before its shutdown began is served at once,
			// so the probing loop below polls again instead of waiting for the release.
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"text\":\"first\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: {\"text\":\"last\"}\n\ndata: [DONE]\n\n")
	}))
	defer engine.Close()

	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	w := gwtest.Worker("w1", "smol", 0)
	w.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
	if _, err := a.Gateway.Heartbeat(w); err != nil {
		t.Fatal(err)
	}
	gwtest.Eventually(t, "w1 routable", func() bool { n, _ := a.Gateway.Routable(); return n == 1 })

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	base := "http://" + a.HTTPAddr
	resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"smol","prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	if line, _ := rd.ReadString('\n'); line != "data: {\"text\":\"first\"}\n" {
		t.Fatalf("first line %q", line)
	}

	probe := &http.Client{Transport: &http.Transport{}, Timeout: 2 * time.Second}
	defer probe.CloseIdleConnections()
	// Before shutdown a second request is served beside the open stream.
	before, err := probe.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"smol","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, before.Body)
	before.Body.Close()
	if before.StatusCode != http.StatusOK {
		t.Fatalf("before shutdown: status %d", before.StatusCode)
	}

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- a.Shutdown(ctx)
	}()
	// New requests are refused while the stream is still open: 503 shutting_down on a fresh
	// request (the listener may also be closed already, which refuses the connection).
	gwtest.Eventually(t, "new requests refused", func() bool {
		r, err := probe.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"smol","prompt":"x"}`))
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("a new request hung during shutdown: %v", err)
			}
			return true
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode == 503 && strings.Contains(string(b), "shutting_down")
	})
	close(release)
	rest, _ := io.ReadAll(rd)
	resp.Body.Close()
	if string(rest) != "\ndata: {\"text\":\"last\"}\n\ndata: [DONE]\n\n" {
		t.Fatalf("the in-flight stream did not finish: %q", rest)
	}
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}
