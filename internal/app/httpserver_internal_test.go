package app

import (
	"net/http"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/config"
)

// TestHTTPServerTimeouts: the server closes idle keep-alives after idle_timeout, waits for
// headers no longer than body_read_timeout (nor 10 s), and has no ReadTimeout or WriteTimeout,
// which would cut long streams.
func TestHTTPServerTimeouts(t *testing.T) {
	g := config.Default().Gateway
	g.IdleTimeout, g.BodyReadTimeout = 7*time.Second, 3*time.Second
	s := newHTTPServer(http.NotFoundHandler(), g)
	if s.IdleTimeout != 7*time.Second || s.ReadHeaderTimeout != 3*time.Second || s.ReadTimeout != 0 || s.WriteTimeout != 0 {
		t.Fatalf("idle %v, read header %v, read %v, write %v", s.IdleTimeout, s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout)
	}
	if s := newHTTPServer(http.NotFoundHandler(), config.Default().Gateway); s.ReadHeaderTimeout != maxHeaderWait || s.IdleTimeout != 120*time.Second {
		t.Fatalf("defaults: read header %v, idle %v", s.ReadHeaderTimeout, s.IdleTimeout)
	}
}
