package httpapi_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/config"
)

// uiSecurityHeaders are on every answer under /ui (R17.1).
var uiSecurityHeaders = map[string]string{
	"X-Content-Type-Options": "nosniff",
	"X-Frame-Options":        "DENY",
	"Referrer-Policy":        "no-referrer",
	"Cache-Control":          "no-store",
}

func checkUIHeaders(t *testing.T, what string, h map[string][]string) {
	t.Helper()
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	for k, want := range uiSecurityHeaders {
		if got := get(k); got != want {
			t.Errorf("%s: %s = %q, want %q", what, k, got, want)
		}
	}
	csp := get("Content-Security-Policy")
	for _, want := range []string{"default-src 'self'", "frame-ancestors 'none'", "form-action 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("%s: Content-Security-Policy %q lacks %q", what, csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("%s: Content-Security-Policy %q allows inline code", what, csp)
	}
}

// TestUIServedWithoutKey (R17.1): /ui and its assets need no key, even with keys configured,
// and carry the security headers; the admin API the page reads still needs an admin key.
func TestUIServedWithoutKey(t *testing.T) {
	s := newStack(t, stackOpt{keys: testKeys})
	for _, path := range []string{"/ui", "/ui/"} {
		resp, b := s.do(t, "GET", path, "", "")
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Fatalf("GET %s: Content-Type %q", path, ct)
		}
		if !strings.Contains(string(b), `<script src="/ui/app.js"`) {
			t.Fatalf("GET %s: not the page: %.200s", path, b)
		}
		checkUIHeaders(t, "GET "+path, resp.Header)
	}
	for _, key := range []string{"", "sk-inference"} {
		resp, b := s.do(t, "GET", "/admin/v1/workers", key, "")
		if resp.StatusCode == 200 {
			t.Fatalf("GET /admin/v1/workers with key %q: 200, want refused", key)
		}
		_ = errCode(t, b)
	}
	if resp, b := s.do(t, "GET", "/admin/v1/workers", "sk-admin", ""); resp.StatusCode != 200 {
		t.Fatalf("GET /admin/v1/workers with the admin key: %d %s", resp.StatusCode, b)
	}
}

// TestUIOpenMode: without keys the page is served to anyone; the admin API it reads answers
// the loopback origin the test server listens on.
func TestUIOpenMode(t *testing.T) {
	s := newStack(t, stackOpt{})
	if resp, b := s.do(t, "GET", "/ui", "", ""); resp.StatusCode != 200 {
		t.Fatalf("GET /ui: %d %s", resp.StatusCode, b)
	}
	if resp, b := s.do(t, "GET", "/admin/v1/queue", "", "", "Origin", s.srv.URL); resp.StatusCode != 200 {
		t.Fatalf("same-origin GET /admin/v1/queue: %d %s", resp.StatusCode, b)
	}
	if resp, b := s.do(t, "GET", "/admin/v1/queue", "", "", "Origin", "http://evil.example"); resp.StatusCode != 403 || errCode(t, b) != "forbidden_origin" {
		t.Fatalf("cross-origin GET /admin/v1/queue: %d %s, want 403 forbidden_origin", resp.StatusCode, b)
	}
}

// TestUIAssets: every file the page links is served with its content type and the security
// headers; HEAD answers the same headers without a body; other paths and methods are refused.
func TestUIAssets(t *testing.T) {
	s := newStack(t, stackOpt{keys: []config.Key{{Key: "sk-admin", Scopes: []string{"admin"}}}})
	_, page := s.do(t, "GET", "/ui", "", "")
	linked := regexp.MustCompile(`(?:src|href)="(/ui/[^"]+)"`).FindAllStringSubmatch(string(page), -1)
	if len(linked) < 3 {
		t.Fatalf("the page links %d assets, want the script, the style sheet and the icon", len(linked))
	}
	want := map[string]string{
		"/ui/app.js":      "text/javascript; charset=utf-8",
		"/ui/app.css":     "text/css; charset=utf-8",
		"/ui/favicon.svg": "image/svg+xml",
	}
	for _, m := range linked {
		if _, ok := want[m[1]]; !ok {
			t.Errorf("the page links %s, which this test does not know", m[1])
		}
	}
	for path, ct := range want {
		resp, b := s.do(t, "GET", path, "", "")
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ct || len(b) == 0 {
			t.Errorf("GET %s: %d %q (%d bytes), want 200 %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(b), ct)
		}
		checkUIHeaders(t, "GET "+path, resp.Header)

		head, hb := s.do(t, "HEAD", path, "", "")
		if head.StatusCode != 200 || head.Header.Get("Content-Type") != ct || len(hb) != 0 {
			t.Errorf("HEAD %s: %d %q with %d body bytes", path, head.StatusCode, head.Header.Get("Content-Type"), len(hb))
		}
		if head.ContentLength != int64(len(b)) {
			t.Errorf("HEAD %s: Content-Length %d, GET has %d bytes", path, head.ContentLength, len(b))
		}
	}
	for _, path := range []string{"/ui/x", "/ui/index.html", "/ui/ui/app.js", "/ui/../admin/v1/workers", "/uix"} {
		resp, b := s.do(t, "GET", path, "", "")
		if resp.StatusCode != 404 || errCode(t, b) != "not_found" {
			t.Errorf("GET %s: %d %s, want 404 not_found", path, resp.StatusCode, b)
		}
	}
	resp, b := s.do(t, "POST", "/ui", "", "")
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET" {
		t.Errorf("POST /ui: %d Allow %q %s, want 405 with Allow: GET", resp.StatusCode, resp.Header.Get("Allow"), b)
	}
	checkUIHeaders(t, "POST /ui", resp.Header)
}

// TestUINoInlineCodeNoHTMLFromData: the page keeps to what its Content-Security-Policy
// allows (no inline script or style), renders data as text only, and keeps the key out of
// persistent storage.
func TestUINoInlineCodeNoHTMLFromData(t *testing.T) {
	s := newStack(t, stackOpt{})
	_, page := s.do(t, "GET", "/ui", "", "")
	for _, tag := range regexp.MustCompile(`<script[^>]*>[^<]*`).FindAllString(string(page), -1) {
		if !strings.Contains(tag, ` src="/ui/`) || !strings.HasSuffix(tag, ">") {
			t.Errorf("index.html has an inline script: %q", tag)
		}
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`<style`),
		regexp.MustCompile(`\sstyle=`),
		regexp.MustCompile(`\son[a-z]+=`),
		regexp.MustCompile(`(?i)https?://`),
	} {
		if loc := bad.FindIndex(page); loc != nil {
			t.Errorf("index.html has %q, which the page must not use", page[loc[0]:loc[1]])
		}
	}
	_, js := s.do(t, "GET", "/ui/app.js", "", "")
	// The SVG namespace names the charts' elements (createElementNS); it fetches nothing. Any
	// other URL is refused.
	if n := strings.Count(string(js), `"http://www.w3.org/2000/svg"`); n != 1 {
		t.Errorf("app.js names the SVG namespace %d times, want once (the charts' constant)", n)
	}
	js = []byte(strings.Replace(string(js), `"http://www.w3.org/2000/svg"`, `""`, 1))
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage", "document.cookie", "setAttribute(\"style\"", "http://", "https://"} {
		if strings.Contains(string(js), bad) {
			t.Errorf("app.js uses %s", bad)
		}
	}
}
