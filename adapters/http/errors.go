package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// apiError is the OpenAI error shape: {"error":{"message":…,"type":…,"code":…}}.
type apiError struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// mapError is the one place where an error becomes an HTTP status, an OpenAI error type and a
// code. Every handler answers errors through writeError, which calls it.
func mapError(err error) (status int, typ, code string) {
	switch {
	case errors.Is(err, errs.ErrModelNotFound):
		return http.StatusNotFound, "invalid_request_error", "model_not_found"
	case errors.Is(err, errs.ErrNoCapacity):
		return http.StatusServiceUnavailable, "service_unavailable", "no_capacity"
	case errors.Is(err, errs.ErrQueueFull):
		return http.StatusTooManyRequests, "rate_limit_exceeded", "queue_full"
	case errors.Is(err, errs.ErrRateLimited):
		return http.StatusTooManyRequests, "rate_limit_exceeded", "rate_limited"
	case errors.Is(err, errs.ErrQueueTimeout):
		return http.StatusServiceUnavailable, "service_unavailable", "queue_timeout"
	case errors.Is(err, errs.ErrShuttingDown):
		return http.StatusServiceUnavailable, "service_unavailable", "shutting_down"
	case errors.Is(err, errs.ErrOverloaded):
		return http.StatusServiceUnavailable, "service_unavailable", "overloaded"
	case errors.Is(err, errs.ErrConfigStoreUnavailable):
		return http.StatusServiceUnavailable, "service_unavailable", "config_store_unavailable"
	case errors.Is(err, errs.ErrForbiddenOrigin):
		return http.StatusForbidden, "permission_error", "forbidden_origin"
	case errors.Is(err, errs.ErrBodyTimeout):
		return http.StatusRequestTimeout, "invalid_request_error", "request_timeout"
	case errors.Is(err, errs.ErrInvalidRequest):
		return http.StatusBadRequest, "invalid_request_error", "invalid_request"
	case errors.Is(err, errs.ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large"
	case errors.Is(err, errs.ErrInvalidAPIKey):
		return http.StatusUnauthorized, "authentication_error", "invalid_api_key"
	case errors.Is(err, errs.ErrInsufficientScope):
		return http.StatusForbidden, "permission_error", "insufficient_scope"
	case errors.Is(err, errs.ErrIfMatchRequired):
		return http.StatusPreconditionRequired, "invalid_request_error", "if_match_required"
	case errors.Is(err, errs.ErrEtagMismatch):
		return http.StatusPreconditionFailed, "invalid_request_error", "etag_mismatch"
	case errors.Is(err, errs.ErrInvalidRoute):
		return http.StatusBadRequest, "invalid_request_error", "invalid_route"
	case errors.Is(err, errs.ErrInvalidStaticWorker):
		return http.StatusBadRequest, "invalid_request_error", "invalid_static_worker"
	case errors.Is(err, errs.ErrInvalidEnginePool):
		return http.StatusBadRequest, "invalid_request_error", "invalid_engine_pool"
	case errors.Is(err, errs.ErrUpstreamTimeout):
		return http.StatusGatewayTimeout, "upstream_error", "upstream_timeout"
	case errors.Is(err, errs.ErrUpstream):
		return http.StatusBadGateway, "upstream_error", "upstream_error"
	case errors.Is(err, errs.ErrNotFound):
		return http.StatusNotFound, "invalid_request_error", "not_found"
	case errors.Is(err, errs.ErrMethodNotAllowed):
		return http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed"
	}
	return http.StatusInternalServerError, "server_error", "internal_error"
}

// writeError answers err in the OpenAI shape and returns the status it wrote.
func writeError(w http.ResponseWriter, err error) int {
	status, typ, code := mapError(err)
	body, _ := json.Marshal(apiError{Error: errorBody{Message: err.Error(), Type: typ, Code: code}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="tlgw"`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return status
}

// sseError is the event that ends an interrupted stream (R6): no [DONE] follows it.
func sseError(message string) []byte {
	body, _ := json.Marshal(apiError{Error: errorBody{
		Message: message, Type: "upstream_error", Code: "stream_interrupted",
	}})
	out := make([]byte, 0, len(body)+32)
	out = append(out, "event: error\ndata: "...)
	out = append(out, body...)
	return append(out, "\n\n"...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// ErrorWriter answers errors through the one mapping above; request actors use it.
type ErrorWriter struct{}

var _ request.ErrorWriter = ErrorWriter{}

// Error implements request.ErrorWriter.
func (ErrorWriter) Error(w http.ResponseWriter, err error) int { return writeError(w, err) }

// SSEError implements request.ErrorWriter.
func (ErrorWriter) SSEError(w http.ResponseWriter, message string) { _, _ = w.Write(sseError(message)) }

// The APIs' error shapes (R21). Every endpoint answers in OpenAI's shape but Anthropic's
// Messages API, whose clients read {"type":"error","error":{"type","message"}} and, in a
// stream, an "error" event of that shape; a Responses stream ends in OpenAI's Responses error
// event ({"type":"error","code","message"}).

// errorsFor is the error writer of an endpoint.
func errorsFor(k oai.Kind) request.ErrorWriter {
	switch k {
	case oai.Messages:
		return AnthropicErrorWriter{}
	case oai.Responses:
		return ResponsesErrorWriter{}
	}
	return ErrorWriter{}
}

// anthropicPath reports whether path is Anthropic's API (its errors take its shape).
func anthropicPath(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
}

// writeErrorFor answers err in the shape of r's API.
func writeErrorFor(w http.ResponseWriter, r *http.Request, err error) int {
	if anthropicPath(r.URL.Path) {
		return writeAnthropicError(w, err)
	}
	return writeError(w, err)
}

type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicType is Anthropic's error type for an HTTP status.
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusRequestTimeout,
		http.StatusPreconditionFailed, http.StatusPreconditionRequired:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	}
	return "api_error"
}

// writeAnthropicError answers err in Anthropic's shape, with the status the one mapping gives.
func writeAnthropicError(w http.ResponseWriter, err error) int {
	status, _, _ := mapError(err)
	body, _ := json.Marshal(anthropicError{Type: "error", Error: anthropicErrorBody{Type: anthropicType(status), Message: err.Error()}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="tlgw"`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return status
}

// AnthropicErrorWriter answers the errors of Anthropic's Messages API.
type AnthropicErrorWriter struct{}

// Error implements request.ErrorWriter.
func (AnthropicErrorWriter) Error(w http.ResponseWriter, err error) int {
	return writeAnthropicError(w, err)
}

// SSEError implements request.ErrorWriter: Anthropic's error event.
func (AnthropicErrorWriter) SSEError(w http.ResponseWriter, message string) {
	body, _ := json.Marshal(anthropicError{Type: "error", Error: anthropicErrorBody{Type: "api_error", Message: message}})
	_, _ = w.Write(sseEvent(body))
}

// ResponsesErrorWriter answers the errors of the Responses API: OpenAI's shape, and its
// stream's error event.
type ResponsesErrorWriter struct{}

// Error implements request.ErrorWriter.
func (ResponsesErrorWriter) Error(w http.ResponseWriter, err error) int { return writeError(w, err) }

// SSEError implements request.ErrorWriter: the Responses API's error event.
func (ResponsesErrorWriter) SSEError(w http.ResponseWriter, message string) {
	body, _ := json.Marshal(struct {
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Message string  `json:"message"`
		Param   *string `json:"param"`
	}{Type: "error", Code: "stream_interrupted", Message: message})
	_, _ = w.Write(sseEvent(body))
}

// sseEvent is an "error" event carrying data.
func sseEvent(data []byte) []byte {
	out := make([]byte, 0, len(data)+32)
	out = append(out, "event: error\ndata: "...)
	out = append(out, data...)
	return append(out, "\n\n"...)
}
