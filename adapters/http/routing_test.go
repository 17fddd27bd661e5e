package httpapi_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/config"
)

// TestRoutingTable: the whole HTTP table by method and path. Known paths answer their methods
// (GET also HEAD), other methods get the OpenAI-shaped 405 naming the allowed ones; under /v1/
// and /admin/ the key is checked before either answer or a 404 (a caller without a key learns
// no path); a path that is not clean is a 404, never the mux's redirect; every answer that is
// not a 2xx has the OpenAI error shape.
func TestRoutingTable(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	for _, c := range []struct {
		method, path, key string
		status            int
		code, allow       string
	}{
		{"GET", "/healthz", "", 200, "", ""},
		{"HEAD", "/healthz", "", 200, "", ""},
		{"POST", "/healthz", "", 405, "method_not_allowed", "GET"},
		{"DELETE", "/metrics", "", 405, "method_not_allowed", "GET"},
		{"GET", "/readyz", "", 503, "", ""}, // no routable worker; a JSON status, not an error
		{"GET", "/nope", "", 404, "not_found", ""},
		{"GET", "/", "", 404, "not_found", ""},
		{"GET", "/v1", "", 404, "not_found", ""},
		{"GET", "/admin", "", 404, "not_found", ""},
		{"GET", "/healthz/", "", 404, "not_found", ""},

		{"GET", "/v1/models", "sk-inference", 200, "", ""},
		{"HEAD", "/v1/models", "sk-inference", 200, "", ""},
		{"POST", "/v1/models", "sk-inference", 405, "method_not_allowed", "GET"},
		{"GET", "/v1/models/nope", "sk-inference", 404, "model_not_found", ""},
		{"GET", "/v1/models/org/nope", "sk-inference", 404, "model_not_found", ""},
		{"GET", "/v1/completions", "sk-inference", 405, "method_not_allowed", "POST"},
		{"PUT", "/v1/chat/completions", "sk-inference", 405, "method_not_allowed", "POST"},
		{"GET", "/v1/completions", "", 401, "invalid_api_key", ""},
		{"GET", "/v1/images/generations", "", 401, "invalid_api_key", ""},
		{"GET", "/v1/images/generations", "sk-inference", 404, "not_found", ""},
		{"GET", "/v1/models", "sk-admin", 403, "insufficient_scope", ""},

		{"GET", "/admin/v1/routes", "sk-admin", 200, "", ""},
		{"DELETE", "/admin/v1/routes", "sk-admin", 405, "method_not_allowed", "GET, PUT"},
		{"DELETE", "/admin/v1/routes", "sk-inference", 403, "insufficient_scope", ""},
		{"POST", "/admin/v1/workers", "sk-admin", 405, "method_not_allowed", "GET"},
		{"GET", "/admin/v1/models/smol:drain", "sk-admin", 405, "method_not_allowed", "POST"},
		{"POST", "/admin/v1/models/smol:stop", "sk-admin", 404, "not_found", ""},
		{"GET", "/admin/v1/static-workers", "sk-admin", 404, "not_found", ""}, // no static table
		{"GET", "/admin/v1/engine-pools", "sk-admin", 404, "not_found", ""},   // no pool table
		{"GET", "/admin/v1/nope", "", 401, "invalid_api_key", ""},
		{"GET", "/admin/v1/nope", "sk-admin", 404, "not_found", ""},

		{"GET", "/ui", "", 200, "", ""},
		{"GET", "/ui/", "", 200, "", ""},
		{"POST", "/ui/app.js", "", 405, "method_not_allowed", "GET"},
		{"GET", "/ui/nope.js", "", 404, "not_found", ""},

		// Not clean: 404 whatever follows, no redirect that would echo a cleaned path.
		{"POST", "//v1/completions", "sk-inference", 404, "not_found", ""},
		{"GET", "/v1/../admin/v1/routes", "sk-admin", 404, "not_found", ""},
		{"GET", "/admin/v1/./routes", "sk-admin", 404, "not_found", ""},
		{"GET", "/ui/..", "", 404, "not_found", ""},
	} {
		r := httptest.NewRequest(c.method, "http://127.0.0.1"+c.path, nil)
		r.URL.Path = c.path // as sent, not as a URL parser would normalise it
		if c.key != "" {
			r.Header.Set("Authorization", "Bearer "+c.key)
		}
		w := httptest.NewRecorder()
		s.api.ServeHTTP(w, r)
		name := c.method + " " + c.path
		if w.Code != c.status {
			t.Errorf("%s with %q: %d %s, want %d", name, c.key, w.Code, w.Body.Bytes(), c.status)
			continue
		}
		if c.code != "" && c.method != "HEAD" {
			if got := errCode(t, w.Body.Bytes()); got != c.code {
				t.Errorf("%s: code %q, want %q", name, got, c.code)
			}
		}
		if got := w.Header().Get("Allow"); got != c.allow {
			t.Errorf("%s: Allow %q, want %q", name, got, c.allow)
		}
		if w.Header().Get("Location") != "" {
			t.Errorf("%s: redirected to %q", name, w.Header().Get("Location"))
		}
		if strings.HasPrefix(c.path, "/ui") && !strings.Contains(c.path, "..") && w.Header().Get("Content-Security-Policy") == "" {
			t.Errorf("%s: no security headers", name)
		}
		if w.Header().Get("X-Request-Id") == "" {
			t.Errorf("%s: no X-Request-ID", name)
		}
	}
}

// staticTable is a static-workers table that never changes.
type staticTable struct{}

func (staticTable) StaticWorkers() (uint64, []config.StaticWorker) { return 3, nil }
func (staticTable) PutStaticWorkers(uint64, []config.StaticWorker) (uint64, error) {
	return 4, nil
}

// TestRoutingStaticWorkers: with a static table the path answers GET and PUT behind the admin
// key (a PUT without If-Match is 428), and other methods get 405 naming both.
func TestRoutingStaticWorkers(t *testing.T) {
	api := httpapi.New(httpapi.Options{Core: benchCore{}, Static: staticTable{}, Keys: testKeys, Logger: quietLogger()})
	for _, c := range []struct {
		method, key string
		status      int
		allow       string
	}{
		{"GET", "sk-admin", 200, ""},
		{"HEAD", "sk-admin", 200, ""},
		{"PUT", "sk-admin", 428, ""},
		{"DELETE", "sk-admin", 405, "GET, PUT"},
		{"DELETE", "", 401, ""},
		{"GET", "sk-inference", 403, ""},
	} {
		r := httptest.NewRequest(c.method, "/admin/v1/static-workers", strings.NewReader("{}"))
		if c.key != "" {
			r.Header.Set("Authorization", "Bearer "+c.key)
		}
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		if w.Code != c.status || w.Header().Get("Allow") != c.allow {
			t.Errorf("%s with %q: %d (Allow %q) %s, want %d (Allow %q)", c.method, c.key, w.Code, w.Header().Get("Allow"), w.Body.Bytes(), c.status, c.allow)
		}
	}
}
