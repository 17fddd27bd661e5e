package request_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestCrashedTurnDoesNotBlockItsSession: with one turn per session, a request actor that
// panics on its admitted pick's answer still ends its turn, so the session's next turn runs.
func TestCrashedTurnDoesNotBlockItsSession(t *testing.T) {
	h := gwtest.New(t, gwtest.WithAdmission(&router.AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10, MaxWait: time.Minute}},
			DefaultClass: "default", Policy: admission.NewSessionSerial(), Recheck: time.Second,
		},
		PolicyName: "session_serial",
	}))
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer engine.Close()
	w := gwtest.Worker("w1", "smol", 0)
	w.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
	h.Beat(w)

	var crashes atomic.Int32
	crashFirst := func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			if _, ok := env.Message.(*router.Picked); ok && crashes.Add(1) == 1 {
				panic("injected: the first turn's actor dies on its pick")
			}
			next(c, env)
		}
	}
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), MaxAttempts: 3, Admission: true,
		Metrics: request.NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Errors: httpapi.ErrorWriter{},
	}
	api := httpapi.New(httpapi.Options{
		Core: h.GW, Logger: deps.Logger,
		Admission: httpapi.Admission{Enabled: true, DefaultClass: "default", AllowHeader: map[string]bool{"default": false}},
		Serve: func(x *request.Exchange) {
			request.Spawn(h.GW.System, deps, x, actor.WithReceiverMiddleware(crashFirst))
		},
	})
	srv := httptest.NewServer(api)
	defer srv.Close()
	turn := func() int {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"model":"smol","prompt":"hi"}`))
		req.Header.Set("X-Session-ID", "alice")
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("turn: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := turn(); code != 502 {
		t.Fatalf("the crashed turn answered %d, want 502", code)
	}
	if code := turn(); code != 200 {
		t.Fatalf("the next turn of the session answered %d, want 200", code)
	}
	h.InFlight("w1", 0)
}
