// Package errs holds the sentinel errors that cross tlgw's packages. Callers wrap them with %w
// to add detail; adapters/http maps each to an HTTP status and OpenAI error code in exactly one
// function, and adapters/grpc to a gRPC status.
package errs

import "errors"

var (
	// ErrModelNotFound: no route and no registered worker knows the model (404 model_not_found).
	ErrModelNotFound = errors.New("model not found")
	// ErrNoCapacity: the model is known but no routable worker can take the request
	// (503 no_capacity).
	ErrNoCapacity = errors.New("no capacity")
	// ErrEtagMismatch: a PUT's If-Match names a route table that is no longer current (412).
	ErrEtagMismatch = errors.New("etag mismatch")
	// ErrIfMatchRequired: a PUT came without If-Match (428).
	ErrIfMatchRequired = errors.New("if-match required")
	// ErrInvalidRoute: a route table failed validation (400 invalid_route).
	ErrInvalidRoute = errors.New("invalid route")
	// ErrInvalidStaticWorker: a static worker table failed validation (400).
	ErrInvalidStaticWorker = errors.New("invalid static worker")
	// ErrInvalidEnginePool: an engine pool table failed validation (400 invalid_engine_pool).
	ErrInvalidEnginePool = errors.New("invalid engine pool")
	// ErrInvalidRequest: a client request is malformed (400 invalid_request_error).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrBodyTooLarge: a request body exceeds the configured limit (413).
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrInvalidAPIKey: a missing or unknown API key (401).
	ErrInvalidAPIKey = errors.New("invalid api key")
	// ErrInsufficientScope: the key lacks the scope the path needs (403).
	ErrInsufficientScope = errors.New("insufficient scope")
	// ErrUpstream: the engine failed after the response had started (502 upstream_error).
	ErrUpstream = errors.New("upstream error")
	// ErrShuttingDown: the gateway is draining for shutdown and takes no new requests (503).
	ErrShuttingDown = errors.New("shutting down")
	// ErrNotFound: no such path (404).
	ErrNotFound = errors.New("not found")
	// ErrMethodNotAllowed: the path exists but not with this method (405).
	ErrMethodNotAllowed = errors.New("method not allowed")
	// ErrQueueFull: the request's class (or lane) is at its queue limit, or never queues and
	// nothing has room (429 queue_full).
	ErrQueueFull = errors.New("queue full")
	// ErrRateLimited: the API key is over its rpm or tpm (429 rate_limited, R13.5).
	ErrRateLimited = errors.New("rate limited")
	// ErrQueueTimeout: the request waited its class's max_wait (503 queue_timeout).
	ErrQueueTimeout = errors.New("queue timeout")
	// ErrInternal: an actor did not answer in time or an invariant broke (500).
	ErrInternal = errors.New("internal error")
	// ErrOverloaded: gateway.max_in_flight inference requests are being served (503
	// overloaded, R13.3).
	ErrOverloaded = errors.New("overloaded")
	// ErrForbiddenOrigin: with no API keys, an admin request whose Host is not loopback or
	// whose Origin is another site (403 forbidden_origin, R13.3).
	ErrForbiddenOrigin = errors.New("forbidden origin")
	// ErrBodyTimeout: the request body did not arrive within gateway.body_read_timeout (408
	// request_timeout, R13.3).
	ErrBodyTimeout = errors.New("request body timeout")
	// ErrUpstreamTimeout: a non-streamed request had no answer within gateway.request_timeout
	// (504 upstream_timeout, R14.1; not retried).
	ErrUpstreamTimeout = errors.New("upstream timeout")
	// ErrConfigStoreUnavailable: in a cluster, etcd cannot be reached, so an admin write
	// cannot be made (503 config_store_unavailable, R16).
	ErrConfigStoreUnavailable = errors.New("config store unavailable")
)
