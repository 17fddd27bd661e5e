package bench

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/request"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/actormetrics"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/oai"
)

// BenchmarkRequestActorLifecycle is the cost of the request actor itself: spawn (with the
// mailbox metrics of production), a pick round trip to the router, an answer written, stop.
// The model is unknown, so no engine is involved.
func BenchmarkRequestActorLifecycle(b *testing.B) {
	h := gwtest.New(b)
	am := actormetrics.New(prometheus.NewRegistry())
	deps := &request.Deps{
		Router: h.GW.Router, Transport: httpapi.NewTransport(), MaxAttempts: 3,
		Metrics: request.NewMetrics(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Errors: httpapi.ErrorWriter{},
	}
	opts := am.Options("request")
	body := []byte(`{"model":"unknown","prompt":"x"}`)
	req, err := oai.Parse(oai.Completions, body)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		x := request.NewExchange(context.Background(), w, "/v1/completions", oai.Completions, "id", false, body, req, time.Now())
		request.Spawn(h.GW.System, deps, x, opts...)
		<-x.Done()
		if w.Code != 404 {
			b.Fatalf("status %d", w.Code)
		}
	}
}
