package app

import (
	"net/http"
	"time"

	"github.com/tlgw/tlgw/internal/config"
)

// maxHeaderWait bounds how long a client may take to send its request headers.
const maxHeaderWait = 10 * time.Second

// maxHeaderBytes bounds a request's line and headers (net/http's default is 1 MiB): what the
// gateway reads from them (a key, a session id, a request id, X-TL-* hints) is a few hundred
// bytes, and every connection may hold this much while its headers arrive.
const maxHeaderBytes = 64 << 10

// newHTTPServer is the gateway's http.Server with the waits of R13.3. There is deliberately no
// ReadTimeout or WriteTimeout: ReadTimeout would also fail the server's background read and
// cancel every stream that outlives it, and a stream may run for minutes. The body's deadline
// (body_read_timeout) and the per-write deadline (client_write_timeout) are set by the handler
// instead; idle_timeout closes idle keep-alive connections.
func newHTTPServer(h http.Handler, g config.Gateway) *http.Server {
	headerWait := maxHeaderWait
	if g.BodyReadTimeout > 0 {
		headerWait = min(headerWait, g.BodyReadTimeout)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: headerWait,
		MaxHeaderBytes:    maxHeaderBytes,
		IdleTimeout:       g.IdleTimeout,
	}
}
