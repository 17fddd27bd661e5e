package httpapi

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/ratelimit"
)

// inference parses and checks a request, then hands it to a request actor (actors/request),
// which routes, attempts, fails over, runs cascades and disaggregation, and answers; the handler
// waits until it has.
func (s *Server) inference(w http.ResponseWriter, r *http.Request, kind oai.Kind, id string, km keyMatch) {
	start := time.Now()
	ew := errorsFor(kind)
	writeError := ew.Error // the API's own error shape (Anthropic's on /v1/messages)
	refuseRateLimited := func(w http.ResponseWriter, wait time.Duration, why string) int {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(wait.Seconds())), 10))
		return writeError(w, fmt.Errorf("%s: %w", why, errs.ErrRateLimited))
	}
	if s.draining.Load() {
		w.Header().Set("Connection", "close")
		s.metrics.reject(writeError(w, fmt.Errorf("the gateway is shutting down: %w", errs.ErrShuttingDown)))
		return
	}
	// The key's limits (R13.5, R20), this replica's share of them (R16: following the
	// replicas' traffic, ratelimit.Share). The window and the in-flight count are keyed by the
	// configured key's index, never by anything the client wrote.
	lim := s.limiter.Share(km.index, km.limits, int(s.replicas.Load()))
	limited := km.index >= 0 && lim.Any()
	if limited {
		if lim.RPM > 0 || lim.TPM > 0 {
			st, ok := s.limiter.Allow(km.index, lim)
			rateLimitHeaders(w.Header(), st)
			if !ok {
				s.metrics.reject(refuseRateLimited(w, st.RetryAfter, "the API key is over its rate limit"))
				return
			}
		}
		// max_in_flight is checked before the gateway's own limit: a key at its limit is
		// refused without taking one of the gateway's slots, and its request counts from here
		// (a slow body too) until its answer has ended.
		if !s.limiter.Enter(km.index, lim) {
			s.metrics.reject(refuseRateLimited(w, ratelimit.ReservedWait,
				fmt.Sprintf("the API key has its limit of %d requests in flight", lim.InFlight)))
			return
		}
		defer s.limiter.Leave(km.index)
	}
	release, err := s.enter()
	if err != nil {
		s.metrics.reject(writeError(w, err))
		return
	}
	defer release()
	body, err := s.readBody(w, r)
	if err != nil {
		s.metrics.reject(writeError(w, err))
		return
	}
	parseStart := time.Now()
	var req oai.Request
	var rendered []byte
	switch {
	case kind.Multipart():
		req, err = oai.ParseMultipart(kind, r.Header.Get("Content-Type"), body)
	case s.renderPrompts:
		req, rendered, err = oai.ParseRendered(kind, body, len(body))
	default:
		req, err = oai.Parse(kind, body)
	}
	if err != nil {
		s.metrics.reject(writeError(w, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest)))
		return
	}
	var served *request.Exchange // the request once handed over: its Tokens settle the reservation
	if limited && lim.TPM > 0 {
		// R20: the request's most tokens (every prompt of a batch, and n answers of
		// max_tokens each) are held from here, so a key's requests being served count against
		// its tpm before they end; the real usage replaces them when the request ends,
		// whatever way it ends.
		st, held, ok := s.limiter.Reserve(km.index, lim, req.Cost.Tokens())
		rateLimitHeaders(w.Header(), st)
		if !ok {
			s.metrics.reject(refuseRateLimited(w, st.RetryAfter,
				fmt.Sprintf("the API key's tokens per minute have no room for this request's %d", min(req.Cost.Tokens(), lim.TPM))))
			return
		}
		defer func() {
			var used int64 // a request refused below costs nothing
			if served != nil {
				used = served.Tokens()
			}
			s.limiter.Settle(km.index, held, used)
		}()
	}
	ctx, traced := s.requestContext(r)
	x := request.NewExchange(ctx, w, r.URL.Path, kind, id, km.scopes&scopeDebug != 0, body, req, start)
	x.Rendered, x.Owner, x.Response, x.Errors, x.Traced = rendered, km.index, req.Previous, ew, traced
	if kind.Multipart() {
		x.ContentType = r.Header.Get("Content-Type")
	}
	if v := r.Header["X-Tl-Slo-Ttft-Ms"]; len(v) > 0 { // X-TL-SLO-TTFT-Ms, canonical: no allocation
		if x.SLOTTFTMs, err = sloTTFT(v); err != nil {
			s.metrics.reject(writeError(w, err))
			return
		}
	}
	if s.admission.Enabled {
		class, err := s.admissionClass(km.class, r.Header.Get("X-TL-Class"))
		if err != nil {
			s.metrics.reject(writeError(w, err))
			return
		}
		final, err := sessionFinal(r.Header.Get("X-TL-Session-Final"))
		if err != nil {
			s.metrics.reject(writeError(w, err))
			return
		}
		sid, err := sessionID(r.Header.Get("X-Session-ID"), req.User)
		if err != nil {
			s.metrics.reject(writeError(w, err))
			return
		}
		x.Class, x.SessionID, x.SessionFinal, x.APIKey = class, sessionKey(km.index, sid), final, km.index
	}
	x.ParseTime = time.Since(parseStart) // R17.3's parse stage: a measurement
	if s.tokens != nil && x.Response == "" {
		x.TokenIDs = s.tokens.TokenIDs(r.Context(), kind, req.Model, id, body, rendered)
	}
	served = x
	s.serve(x)
	<-x.Done()
}

// refuseRateLimited answers 429 rate_limited with a Retry-After of wait (in whole seconds,
// rounded up) and returns the status.
func refuseRateLimited(w http.ResponseWriter, wait time.Duration, why string) int {
	w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(wait.Seconds())), 10))
	return writeError(w, fmt.Errorf("%s: %w", why, errs.ErrRateLimited))
}

// rateLimitHeaders sets OpenAI's rate-limit headers for a limited key (R13.5). The keys are
// written in their canonical form directly (h.Set would canonicalize, and allocate, per call),
// and the values are cut from one string and share one backing array: two allocations for
// the four headers.
func rateLimitHeaders(h http.Header, st ratelimit.Status) {
	var buf [4 * 20]byte
	var ends [4]int
	b := buf[:0]
	for i, v := range [4]int64{st.RPM, st.RemainingRequests, st.TPM, st.RemainingTokens} {
		b = strconv.AppendInt(b, v, 10)
		ends[i] = len(b)
	}
	all := string(b)
	vals := new([4]string)
	for i := range vals {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		vals[i] = all[start:ends[i]]
	}
	if st.RPM > 0 {
		h["X-Ratelimit-Limit-Requests"] = vals[0:1:1]
		h["X-Ratelimit-Remaining-Requests"] = vals[1:2:2]
	}
	if st.TPM > 0 {
		h["X-Ratelimit-Limit-Tokens"] = vals[2:3:3]
		h["X-Ratelimit-Remaining-Tokens"] = vals[3:4:4]
	}
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > s.maxBody {
		return nil, fmt.Errorf("the request body is %d bytes, the limit is %d: %w", r.ContentLength, s.maxBody, errs.ErrBodyTooLarge)
	}
	capHint := r.ContentLength
	if capHint < 0 || capHint > s.maxBody {
		capHint = 4096
	}
	// +1: the read that sees the end needs no new array (a bytes.Buffer would ask for 512
	// free bytes before each read and copy a small body twice).
	buf := make([]byte, 0, capHint+1)
	if s.bodyTimeout > 0 {
		// The deadline is lifted once the body is in: left armed, it would fail the server's
		// background read that watches for the client leaving, and cancel a long stream.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(s.bodyTimeout))
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	body := http.MaxBytesReader(w, r.Body, s.maxBody)
	var err error
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		var n int
		n, err = body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	if err == io.EOF {
		err = nil
	}
	if err != nil {
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			w.Header().Set("Connection", "close")
			return nil, fmt.Errorf("the request body did not arrive within %v: %w", s.bodyTimeout, errs.ErrBodyTimeout)
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, fmt.Errorf("the request body exceeds the limit of %d bytes: %w", s.maxBody, errs.ErrBodyTooLarge)
		}
		return nil, fmt.Errorf("reading the request body: %v: %w", err, errs.ErrInvalidRequest)
	}
	return buf, nil
}

// MaxSLOTTFTMs bounds X-TL-SLO-TTFT-Ms (R18.4): an hour.
const MaxSLOTTFTMs = 3_600_000

// sloTTFT parses X-TL-SLO-TTFT-Ms (R18.4): one decimal integer from 1 to MaxSLOTTFTMs.
func sloTTFT(values []string) (int64, error) {
	if len(values) == 1 {
		v := values[0]
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 1 && n <= MaxSLOTTFTMs && v[0] != '+' {
			return n, nil
		}
	}
	return 0, fmt.Errorf("X-TL-SLO-TTFT-Ms must be one integer from 1 to %d (milliseconds): %w",
		MaxSLOTTFTMs, errs.ErrInvalidRequest)
}

// sessionFinal reads X-TL-Session-Final (R15.1): "true" marks the session's last turn,
// "false" or no header does not, and anything else is a client error. A final turn without a
// session id (no X-Session-ID, no body user) is accepted and means nothing: there is no
// session to end, and the policies ignore Final without one.
func sessionFinal(header string) (bool, error) {
	switch header {
	case "true":
		return true, nil
	case "", "false":
		return false, nil
	}
	return false, fmt.Errorf("X-TL-Session-Final must be \"true\" or \"false\", not %s: %w", errs.Echo(header), errs.ErrInvalidRequest)
}

// admissionClass resolves a request's class: its key's class (or the default), or the class
// X-TL-Class names when the key's class allows the header. A header naming no configured
// class is a client error.
func (s *Server) admissionClass(keyClass, header string) (string, error) {
	class := keyClass
	if class == "" {
		class = s.admission.DefaultClass
	}
	if header == "" || !s.admission.AllowHeader[class] {
		return class, nil
	}
	if _, ok := s.admission.AllowHeader[header]; !ok {
		return "", fmt.Errorf("X-TL-Class names no configured class %s: %w", errs.Echo(header), errs.ErrInvalidRequest)
	}
	return header, nil
}

// sessionID is the request's session (R10.3): X-Session-ID, which must be a valid id (1 to
// 128 printable ASCII bytes, as X-Request-ID) or is a 400 naming the header; else the body's
// user when it is one (a longer or unprintable user is no session: the ledgers that follow
// sessions are never keyed by an unbounded client string).
// sessionKey scopes a client's session id to its API key (index; -1 when keys are off): the
// admission queue's session lanes, session serialisation and agent programs are keyed by it, so
// a client of another key that sends the same id gets a session of its own instead of a place
// in this one's lane or the power to end its program. The key's index, a NUL (which no valid id
// holds) and the id: distinct (key, id) pairs never meet.
func sessionKey(index int, sid string) string {
	if sid == "" || index < 0 {
		return sid
	}
	return strconv.Itoa(index) + "\x00" + sid
}

func sessionID(header, user string) (string, error) {
	if header != "" {
		if !oai.ValidRequestID(header) {
			return "", fmt.Errorf("X-Session-ID must be 1 to %d printable ASCII characters: %w", oai.MaxRequestIDLen, errs.ErrInvalidRequest)
		}
		return header, nil
	}
	if oai.ValidRequestID(user) {
		return user, nil
	}
	return "", nil
}

// storedResponse serves GET and DELETE /v1/responses/{id} and POST /v1/responses/{id}/cancel
// (R21): the call goes to the worker that stored the response, with the key's limits and the
// gateway's in-flight bound like any request. The id must be one path segment of printable
// ASCII; the call carries no body and no query (a stream of a stored response is not offered).
func (s *Server) storedResponse(w http.ResponseWriter, r *http.Request, method, id string, km keyMatch) {
	start := time.Now()
	ew := ResponsesErrorWriter{}
	if s.draining.Load() {
		w.Header().Set("Connection", "close")
		s.metrics.reject(ew.Error(w, fmt.Errorf("the gateway is shutting down: %w", errs.ErrShuttingDown)))
		return
	}
	rid := r.PathValue("id")
	if !oai.ValidResponseID(rid) {
		s.metrics.reject(ew.Error(w, fmt.Errorf("a response id is 1 to %d printable ASCII characters: %w", oai.MaxResponseIDLen, errs.ErrInvalidRequest)))
		return
	}
	lim := s.limiter.Share(km.index, km.limits, int(s.replicas.Load()))
	if km.index >= 0 && lim.Any() {
		if lim.RPM > 0 {
			st, ok := s.limiter.Allow(km.index, lim)
			rateLimitHeaders(w.Header(), st)
			if !ok {
				s.metrics.reject(refuseRateLimited(w, st.RetryAfter, "the API key is over its rate limit"))
				return
			}
		}
		if !s.limiter.Enter(km.index, lim) {
			s.metrics.reject(refuseRateLimited(w, ratelimit.ReservedWait,
				fmt.Sprintf("the API key has its limit of %d requests in flight", lim.InFlight)))
			return
		}
		defer s.limiter.Leave(km.index)
	}
	release, err := s.enter()
	if err != nil {
		s.metrics.reject(ew.Error(w, err))
		return
	}
	defer release()
	ctx, traced := s.requestContext(r)
	x := request.NewExchange(ctx, w, r.URL.Path, oai.Responses, id, km.scopes&scopeDebug != 0, nil,
		oai.Request{PrefixKey: []byte{}}, start)
	x.Method, x.Response, x.Owner, x.Errors, x.Traced = method, rid, km.index, ew, traced
	s.serve(x)
	<-x.Done()
}
