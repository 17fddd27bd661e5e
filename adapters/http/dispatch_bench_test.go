package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
)

// benchCore answers the admin and model reads from fixed values.
type benchCore struct{}

func (benchCore) Workers() (*router.WorkerList, error) { return &router.WorkerList{}, nil }
func (benchCore) Routes() (*router.RouteTable, error)  { return &router.RouteTable{}, nil }
func (benchCore) PutRoutes(uint64, []config.Route) (*router.RouteTable, error) {
	return &router.RouteTable{}, nil
}
func (benchCore) Models() (*router.ModelList, error) {
	return &router.ModelList{IDs: []string{"smol", "big"}}, nil
}
func (benchCore) Routable() (int, error) { return 1, nil }
func (benchCore) Drain(string, bool) (*registry.DrainResult, error) {
	return &registry.DrainResult{}, nil
}
func (benchCore) Queue() (*router.QueueView, error)       { return &router.QueueView{}, nil }
func (benchCore) Programs() (*router.ProgramList, error)  { return &router.ProgramList{}, nil }
func (benchCore) Rollouts() (*router.RolloutsView, error) { return &router.RolloutsView{}, nil }
func (benchCore) RolloutAction(string, string, *uint64) (*router.RolloutView, error) {
	return nil, errs.ErrNotFound
}

// discard is a ResponseWriter that keeps nothing but its header map, reset per request.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkDispatch: the HTTP surface's own cost from a request to its handler's answer, with
// keys configured (every /v1 and /admin request checks its key), for a health check, a model
// read and an unknown path under /v1 (refused after the key check).
func BenchmarkDispatch(b *testing.B) {
	api := httpapi.New(httpapi.Options{Core: benchCore{}, Logger: quietLogger(),
		Keys: []config.Key{{Key: "sk-bench", Scopes: []string{"inference", "admin"}}}})
	for _, c := range []struct{ name, method, path string }{
		{"healthz", "GET", "/healthz"},
		{"model", "GET", "/v1/models/smol"},
		{"unknown", "POST", "/v1/images/generations"},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := httptest.NewRequest(c.method, c.path, nil)
			r.Header.Set("Authorization", "Bearer sk-bench")
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				api.ServeHTTP(w, r)
			}
		})
	}
}
