package httpapi

import (
	"embed"
	"fmt"
	"net/http"
	"strconv"

	"github.com/tlgw/tlgw/internal/errs"
)

// The operator page of R17.1: static files embedded in the binary, no build step. The page
// holds no data, so it is served without a key; its script reads the admin API with the key
// the operator types into it (or none in open mode), and the admin API checks that as usual.

//go:embed ui
var uiFiles embed.FS

// uiAsset is one file of the page: where it lives in uiFiles and how it is served.
type uiAsset struct {
	file        string
	contentType string
}

// uiAssets is the whole page, by URL path; every other path under /ui/ is a 404.
var uiAssets = map[string]uiAsset{
	"/ui":             {"ui/index.html", "text/html; charset=utf-8"},
	"/ui/":            {"ui/index.html", "text/html; charset=utf-8"},
	"/ui/app.js":      {"ui/app.js", "text/javascript; charset=utf-8"},
	"/ui/app.css":     {"ui/app.css", "text/css; charset=utf-8"},
	"/ui/favicon.svg": {"ui/favicon.svg", "image/svg+xml"},
}

// uiCSP allows the page's own files and fetches to its own origin, nothing inline, no
// framing: data that engines report (worker ids, model names) cannot become script.
const uiCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// serveUI serves GET and HEAD of /ui and its assets, with the security headers on every answer.
func (s *Server) serveUI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	a, ok := uiAssets[r.URL.Path]
	if !ok {
		writeError(w, fmt.Errorf("no route for %s: %w", r.URL.Path, errs.ErrNotFound))
		return
	}
	s.only(w, r, http.MethodGet, func(w http.ResponseWriter, _ *http.Request) {
		body, err := uiFiles.ReadFile(a.file)
		if err != nil { // the table names only embedded files
			writeError(w, err)
			return
		}
		h.Set("Content-Type", a.contentType)
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body) // a HEAD answer drops the body
	})
}
