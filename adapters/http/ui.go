package httpapi

import (
	"embed"
	"net/http"
	"strconv"
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

// uiAssets is the whole page, by mux pattern path ("/ui/{$}" is /ui/ alone); every other path
// under /ui/ is a 404.
var uiAssets = map[string]uiAsset{
	"/ui":             {"ui/index.html", "text/html; charset=utf-8"},
	"/ui/{$}":         {"ui/index.html", "text/html; charset=utf-8"},
	"/ui/app.js":      {"ui/app.js", "text/javascript; charset=utf-8"},
	"/ui/app.css":     {"ui/app.css", "text/css; charset=utf-8"},
	"/ui/favicon.svg": {"ui/favicon.svg", "image/svg+xml"},
}

// uiCSP allows the page's own files and fetches to its own origin, nothing inline, no
// framing: data that engines report (worker ids, model names) cannot become script.
const uiCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiRoutes serves GET and HEAD of /ui and its assets, without a key (the page holds no data,
// R17.1), and the security headers on every answer under /ui, 404 and 405 included.
func uiRoutes(m *http.ServeMux) {
	for path, a := range uiAssets {
		route(m, uiHeaders, path, on("GET", uiHeaders(func(w http.ResponseWriter, _ *http.Request) {
			body, err := uiFiles.ReadFile(a.file)
			if err != nil { // the table names only embedded files
				writeError(w, err)
				return
			}
			h := w.Header()
			h.Set("Content-Type", a.contentType)
			h.Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body) // a HEAD answer drops the body
		})))
	}
	m.HandleFunc("/ui/", uiHeaders(notFound))
}

// uiHeaders sets the page's security headers before h answers.
func uiHeaders(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", uiCSP)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h(w, r)
	}
}
