package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/tlgw/tlgw/internal/errs"
)

// The HTTP trust boundary of R13.3: bounded in-flight work, bounded waits on slow clients, and
// an admin API that a browser on the operator's machine cannot be tricked into calling.

// deadlineWriter gives the client clientWriteTimeout to take every write: before each write
// and flush it makes sure the connection's write deadline is at least the timeout away, so a
// client that stops reading fails the write, the relay sees a gone client and cancels the
// engine request. When the deadline is nearer, it moves it to 1¼ × the timeout from now: a
// stream of many small events then moves it once per quarter timeout instead of at every
// write, and a stalled client is dropped between 1 and 1¼ × the timeout after its last write.
// Unwrap lets http.ResponseController reach the connection underneath.
type deadlineWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	deadline time.Time // the write deadline last set
}

func newDeadlineWriter(w http.ResponseWriter, timeout time.Duration) *deadlineWriter {
	return &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
}

func (d *deadlineWriter) arm() {
	now := time.Now()
	if d.deadline.Sub(now) >= d.timeout {
		return
	}
	d.deadline = now.Add(d.timeout + d.timeout/4)
	_ = d.rc.SetWriteDeadline(d.deadline)
}

func (d *deadlineWriter) WriteHeader(code int) {
	d.arm() // also bounds the final flush of an answer with no body
	d.ResponseWriter.WriteHeader(code)
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	d.arm()
	return d.ResponseWriter.Write(b)
}

// FlushError is what http.ResponseController.Flush calls.
func (d *deadlineWriter) FlushError() error {
	d.arm()
	return d.rc.Flush()
}

// Flush implements http.Flusher for callers that type-assert it.
func (d *deadlineWriter) Flush() { _ = d.FlushError() }

func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// enter admits one more inference request, or answers ErrOverloaded once maxInFlight are
// being served. The caller calls the returned release exactly once when it is admitted.
func (s *Server) enter() (release func(), err error) {
	if s.maxInFlight <= 0 {
		return func() {}, nil
	}
	if n := s.inFlight.Add(1); n > int64(s.maxInFlight) {
		s.inFlight.Add(-1)
		return nil, fmt.Errorf("the gateway is serving its limit of %d requests: %w", s.maxInFlight, errs.ErrOverloaded)
	}
	return func() { s.inFlight.Add(-1) }, nil
}

// checkLocalAdmin is the open mode's guard on /admin (no API keys, R13.3): the request must be
// addressed to a loopback Host, and an Origin, when a browser sends one, must be that same
// loopback origin. A page on another site (a cross-site POST of :drain) or a DNS-rebound name
// (Host: evil.example resolving to 127.0.0.1) gets 403 forbidden_origin.
func checkLocalAdmin(r *http.Request) error {
	if !loopbackPeer(r.RemoteAddr) {
		// The Host header is the client's to write: only the peer's address says that the
		// request came from this machine (R20).
		return fmt.Errorf("without API keys the admin API answers only clients on this machine (a loopback peer address): %w", errs.ErrForbiddenOrigin)
	}
	if !loopbackHost(r.Host) {
		return fmt.Errorf("without API keys the admin API answers only requests to a loopback host, not %s: %w", errs.Echo(r.Host), errs.ErrForbiddenOrigin)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) || !loopbackHost(u.Host) {
		return fmt.Errorf("without API keys the admin API answers no cross-origin request (Origin %s): %w", errs.Echo(origin), errs.ErrForbiddenOrigin)
	}
	return nil
}

// loopbackPeer reports whether a RemoteAddr (ip:port) is a loopback address.
func loopbackPeer(remoteAddr string) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// loopbackListener reports whether the connection r arrived on was accepted on a loopback
// address (false when unknown: a request not from a listener).
func loopbackListener(r *http.Request) bool {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// loopbackHost reports whether a Host value (host or host:port) names loopback: localhost,
// a name under .localhost, or a loopback IP.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
