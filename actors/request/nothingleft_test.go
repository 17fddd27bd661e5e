package request_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/actors/request"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestNothingLeftAfterRequests (R19): after n requests — JSON and streamed, each failing over
// from a worker that answers 503 and from one that refuses connections, and some whose client
// leaves while the engine works — every timer the request actors armed on their clock is
// stopped (pick, first byte, request, stream idle), no worker counts anything in flight, no
// request actor is left running and no goroutine a request started is left.
func TestNothingLeftAfterRequests(t *testing.T) {
	clk := requestClock()
	tr := httpapi.NewTransport() // its idle connections are closed at the end
	r := newRig(t, rigOpt{deps: func(d *request.Deps, _ *gwtest.Harness) { d.Clock, d.Transport = clk, tr }})
	ok := r.engine(t, "a-ok", func(w http.ResponseWriter, req *http.Request, body string) {
		if strings.Contains(body, `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"ok\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	})
	busy := r.engine(t, "b-503", func(w http.ResponseWriter, _ *http.Request, _ string) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	reachedSlow := reached()
	slow := r.engine(t, "d-slow", func(w http.ResponseWriter, req *http.Request, _ string) {
		reachedSlow <- struct{}{}
		<-req.Context().Done() // until the gateway gives up on it (its client left)
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := lis.Addr().String()
	lis.Close() // nothing listens there: connections are refused
	r.beat("a-ok", "smol", ok.URL, 0)
	r.beat("b-503", "smol", busy.URL, 0)
	r.beat("c-refused", "smol", refused, 0)
	r.beat("d-slow", "slow", slow.URL, 0)
	// The live processes now, and the request actors' guardian (made at the first spawn, one
	// for all of them); the goroutines now.
	base, goroutines := processes(r)+1, runtime.NumGoroutine()
	const n = 120
	for i := range n {
		stream := ""
		if i%2 == 1 {
			stream = `"stream":true,`
		}
		resp, body := r.post(t, "/v1/completions", "", `{"model":"smol",`+stream+`"prompt":"hi"}`)
		if resp.StatusCode != 200 || !strings.Contains(body, "ok") {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if i%20 == 0 {
			leave(t, r, reachedSlow)
		}

	}
	gwtest.Idle(t, r.GW)
	gwtest.Eventually(t, "every request timer stopped", func() bool { return clk.Pending() == 0 })
	gwtest.Eventually(t, "no request actor left", func() bool { return processes(r) == base })
	// Every goroutine a request started has returned, once the keep-alive connections (the
	// client's to the gateway, the gateway's to the engines) are closed.
	r.srv.Client().CloseIdleConnections()
	tr.CloseIdleConnections()
	gwtest.Eventually(t, "the requests' goroutines gone", func() bool { return runtime.NumGoroutine() <= goroutines })
}

// processes counts the actor system's live processes (actors and futures).
func processes(r *rig) int {
	n := 0
	for _, m := range r.GW.System.ProcessRegistry.LocalPIDs.LocalPIDs {
		n += m.Count()
	}
	return n
}

// leave sends a request to the slow engine and leaves once the engine has it.
func leave(t *testing.T, r *rig, reachedSlow chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/v1/completions",
		strings.NewReader(`{"model":"slow","prompt":"hi"}`))
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := r.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		done <- err
	}()
	waitReached(t, reachedSlow, "the slow engine")
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Fatalf("the leaving client: %v", err)
	}
}
