package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// maxUpstreamJSON bounds a non-streamed engine answer the gateway buffers (it buffers so that
// a body cut mid-way becomes a clean 502 instead of a truncated 200).
const maxUpstreamJSON = 64 << 20

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// inference is the unified proxy path: parse, pick, attempt, relay (R5, R6).
func (s *Server) inference(w http.ResponseWriter, r *http.Request, kind oai.Kind, id string, sc scope) {
	start := time.Now()
	if s.draining.Load() {
		w.Header().Set("Connection", "close")
		s.metrics.reject(writeError(w, fmt.Errorf("the gateway is shutting down: %w", errs.ErrShuttingDown)))
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.metrics.reject(writeError(w, err))
		return
	}
	req, err := oai.Parse(kind, body)
	if err != nil {
		s.metrics.reject(writeError(w, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest)))
		return
	}
	a := attempt{s: s, w: w, r: r, kind: kind, id: id, debug: sc&scopeDebug != 0, body: body, req: req, start: start}
	a.run()
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > s.maxBody {
		return nil, fmt.Errorf("the request body is %d bytes, the limit is %d: %w", r.ContentLength, s.maxBody, errs.ErrBodyTooLarge)
	}
	capHint := r.ContentLength
	if capHint < 0 || capHint > s.maxBody {
		capHint = 4096
	}
	buf := bytes.NewBuffer(make([]byte, 0, capHint+1))
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, fmt.Errorf("the request body exceeds the limit of %d bytes: %w", s.maxBody, errs.ErrBodyTooLarge)
		}
		return nil, fmt.Errorf("reading the request body: %v: %w", err, errs.ErrInvalidRequest)
	}
	return buf.Bytes(), nil
}

// attempt carries one request through its attempts.
type attempt struct {
	s     *Server
	w     http.ResponseWriter
	r     *http.Request
	kind  oai.Kind
	id    string
	debug bool
	body  []byte
	req   oai.Request
	start time.Time

	rewritten      []byte
	rewrittenModel string
}

func (a *attempt) run() {
	s := a.s
	pick := &router.Pick{Model: a.req.Model, RequestID: a.id, PrefixHash: xxhash.Sum64(a.req.PrefixKey)}
	route, served := a.req.Model, a.req.Model
	var lastErr error
	for n := 0; n < s.maxAttempts; n++ {
		p, err := s.core.Pick(pick)
		if p != nil && p.Route != "" {
			route, served = p.Route, p.ServedModel
		}
		if err != nil {
			if n > 0 && errors.Is(err, errs.ErrNoCapacity) && lastErr != nil {
				err = fmt.Errorf("%v; last attempt: %v", err, lastErr)
			}
			s.metrics.done(route, served, writeError(a.w, err))
			return
		}
		s.core.Acquire(p.Worker)
		committed, err := a.try(p)
		s.core.Release(p.Worker)
		if committed {
			return
		}
		// Failed before the first byte: exclude the worker and route again (R6).
		s.metrics.failover(route)
		s.log.Info("attempt failed before the first byte", "request_id", a.id, "worker", p.WorkerID, "err", err)
		lastErr = err
		pick.Exclude = append(pick.Exclude, p.WorkerID)
		if a.r.Context().Err() != nil {
			s.metrics.done(route, served, 499)
			return
		}
	}
	s.metrics.done(route, served, writeError(a.w,
		fmt.Errorf("%d workers tried, none answered (last: %v): %w", s.maxAttempts, lastErr, errs.ErrNoCapacity)))
}

// try sends one attempt to p's engine. It returns committed = true once anything reached the
// client (or the client left); an uncommitted failure may be retried on another worker.
func (a *attempt) try(p *router.Picked) (committed bool, err error) {
	s := a.s
	body := a.body
	if p.ServedModel != a.req.Model {
		if a.rewrittenModel != p.ServedModel {
			b, err := oai.RewriteModel(a.body, p.ServedModel)
			if err != nil {
				s.metrics.done(p.Route, p.ServedModel, writeError(a.w, fmt.Errorf("%v: %w", err, errs.ErrInvalidRequest)))
				return true, err
			}
			a.rewritten, a.rewrittenModel = b, p.ServedModel
		}
		body = a.rewritten
	}
	ctx := a.r.Context()
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.HTTPAddress+a.r.URL.Path, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	out.ContentLength = int64(len(body))
	out.Header.Set("Content-Type", "application/json")
	if acc := a.r.Header.Get("Accept"); acc != "" {
		out.Header.Set("Accept", acc)
	}
	out.Header.Set("X-Request-ID", a.id)
	resp, err := s.transport.RoundTrip(out)
	if err != nil {
		if ctx.Err() != nil {
			s.metrics.done(p.Route, p.ServedModel, 499)
			return true, ctx.Err() // the client left: nothing to retry for
		}
		return false, fmt.Errorf("worker %s: %w", p.WorkerID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return false, fmt.Errorf("worker %s answered 503", p.WorkerID)
	}
	s.metrics.ttfb(p.Route, time.Since(a.start))
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		a.relaySSE(p, resp)
	} else {
		a.relayJSON(p, resp)
	}
	return true, nil
}

// hop-by-hop and framing headers are not copied from the engine's response.
var skipHeader = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
	"X-Request-Id": true,
}

func (a *attempt) copyHeaders(p *router.Picked, resp *http.Response) {
	h := a.w.Header()
	for k, vs := range resp.Header {
		if !skipHeader[k] {
			h[k] = vs
		}
	}
	if a.debug {
		h.Set("X-TL-Route", p.WorkerID)
	}
}

// relayJSON buffers a non-streamed answer, so a body cut mid-way is a 502, never a truncated
// 200 (R6).
func (a *attempt) relayJSON(p *router.Picked, resp *http.Response) {
	var buf bytes.Buffer
	if resp.ContentLength > 0 && resp.ContentLength <= maxUpstreamJSON {
		buf.Grow(int(resp.ContentLength))
	}
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, maxUpstreamJSON+1))
	if err == nil && buf.Len() > maxUpstreamJSON {
		err = fmt.Errorf("answer larger than %d bytes", maxUpstreamJSON)
	}
	if err != nil {
		if a.r.Context().Err() != nil {
			a.s.metrics.done(p.Route, p.ServedModel, 499)
			return
		}
		a.s.metrics.done(p.Route, p.ServedModel, writeError(a.w,
			fmt.Errorf("worker %s broke off its answer: %v: %w", p.WorkerID, err, errs.ErrUpstream)))
		return
	}
	a.copyHeaders(p, resp)
	a.w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	a.w.WriteHeader(resp.StatusCode)
	_, _ = a.w.Write(buf.Bytes())
	a.s.metrics.done(p.Route, p.ServedModel, resp.StatusCode)
}

// relaySSE forwards the stream as it arrives: every read from the engine is written and
// flushed at once, so each event reaches the client when the engine sent it. If the engine
// breaks off, the client keeps what it got and then an SSE error event, with no [DONE] (R6).
func (a *attempt) relaySSE(p *router.Picked, resp *http.Response) {
	a.copyHeaders(p, resp)
	rc := http.NewResponseController(a.w)
	a.w.WriteHeader(resp.StatusCode)
	_ = rc.Flush()
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	ctx := a.r.Context()
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := a.w.Write(buf[:n]); werr != nil {
				a.s.metrics.done(p.Route, p.ServedModel, 499)
				return
			}
			if ferr := rc.Flush(); ferr != nil {
				a.s.metrics.done(p.Route, p.ServedModel, 499)
				return
			}
		}
		if err == io.EOF {
			a.s.metrics.done(p.Route, p.ServedModel, resp.StatusCode)
			return
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				a.s.metrics.done(p.Route, p.ServedModel, 499)
				return
			}
			a.s.log.Warn("stream interrupted after the first byte", "request_id", a.id, "worker", p.WorkerID, "err", err)
			_, _ = a.w.Write(sseError(fmt.Sprintf("worker %s broke off the stream: %v", p.WorkerID, err)))
			_ = rc.Flush()
			a.s.metrics.interrupted(p.Route)
			a.s.metrics.done(p.Route, p.ServedModel, resp.StatusCode)
			return
		}
	}
}
