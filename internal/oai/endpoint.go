package oai

import "strings"

// The serving endpoints beyond completions and chat (R21). Each is routed by the model its body
// (or, for audio, its form) names; Kind says which one a request was sent to.
const (
	// Embeddings is POST /v1/embeddings.
	Embeddings Kind = iota + Chat + 1
	// Responses is POST /v1/responses (and GET/DELETE /v1/responses/{id}, pinned to the worker
	// that stored the response).
	Responses
	// Messages is POST /v1/messages, Anthropic's Messages API.
	Messages
	// CompletionsRender is POST /v1/completions/render.
	CompletionsRender
	// ChatRender is POST /v1/chat/completions/render.
	ChatRender
	// Tokenize is POST /tokenize.
	Tokenize
	// Detokenize is POST /detokenize.
	Detokenize
	// Rerank is POST /v1/rerank.
	Rerank
	// Score is POST /v1/score.
	Score
	// Pooling is POST /pooling.
	Pooling
	// Transcriptions is POST /v1/audio/transcriptions (multipart/form-data).
	Transcriptions
	// Translations is POST /v1/audio/translations (multipart/form-data).
	Translations

	// MaxKind is the last endpoint kind: a table indexed by Kind has MaxKind+1 rows.
	MaxKind = Translations
)

// endpointInfo is one row of the endpoint catalogue.
type endpointInfo struct {
	name string // the endpoint label and the WorkerStatus.endpoints name
	path string // the path the gateway serves and the engine is called on
	// prompt is the top-level field whose raw JSON is the request's prompt for prefix
	// affinity ("" = none); completions and chat render theirs (prefix.go).
	prompt string
	// stream: the body's "stream" may ask for an SSE answer.
	stream bool
	// multipart: the body is multipart/form-data (audio); the model is a form field.
	multipart bool
}

// endpoints is indexed by Kind; the zero row is no endpoint.
var endpoints = [MaxKind + 1]endpointInfo{
	Completions:       {name: "completions", path: "/v1/completions", prompt: "prompt", stream: true},
	Chat:              {name: "chat", path: "/v1/chat/completions", prompt: "messages", stream: true},
	Embeddings:        {name: "embeddings", path: "/v1/embeddings", prompt: "input"},
	Responses:         {name: "responses", path: "/v1/responses", prompt: "input", stream: true},
	Messages:          {name: "messages", path: "/v1/messages", prompt: "messages", stream: true},
	CompletionsRender: {name: "completions_render", path: "/v1/completions/render", prompt: "prompt"},
	ChatRender:        {name: "chat_render", path: "/v1/chat/completions/render", prompt: "messages"},
	Tokenize:          {name: "tokenize", path: "/tokenize"},
	Detokenize:        {name: "detokenize", path: "/detokenize"},
	Rerank:            {name: "rerank", path: "/v1/rerank", prompt: "query"},
	Score:             {name: "score", path: "/v1/score"},
	Pooling:           {name: "pooling", path: "/pooling", prompt: "input"},
	Transcriptions:    {name: "transcriptions", path: "/v1/audio/transcriptions", stream: true, multipart: true},
	Translations:      {name: "translations", path: "/v1/audio/translations", stream: true, multipart: true},
}

// Kinds returns every endpoint kind in order.
func Kinds() []Kind {
	out := make([]Kind, 0, MaxKind)
	for k := Completions; k <= MaxKind; k++ {
		out = append(out, k)
	}
	return out
}

// Valid reports whether k is an endpoint kind.
func (k Kind) Valid() bool { return k >= Completions && k <= MaxKind }

// Endpoint is k's name: the `endpoint` label of the HTTP metrics and the name a worker lists
// in WorkerStatus.endpoints. "" for an invalid kind.
func (k Kind) Endpoint() string {
	if !k.Valid() {
		return ""
	}
	return endpoints[k].name
}

// Path is the path k is served on, by the gateway and by the engines.
func (k Kind) Path() string {
	if !k.Valid() {
		return ""
	}
	return endpoints[k].path
}

// Streams reports whether k's body may ask for a stream ("stream": true, or the form's stream
// field for audio).
func (k Kind) Streams() bool { return k.Valid() && endpoints[k].stream }

// Multipart reports whether k's body is multipart/form-data.
func (k Kind) Multipart() bool { return k.Valid() && endpoints[k].multipart }

// KindByEndpoint is the kind an endpoint name names.
func KindByEndpoint(name string) (Kind, bool) {
	for k := Completions; k <= MaxKind; k++ {
		if endpoints[k].name == name {
			return k, true
		}
	}
	return 0, false
}

// EndpointSet is a set of endpoint kinds. The zero set means "not said": a worker that names
// no endpoints is tried for every one (see Serves).
type EndpointSet uint32

// AllEndpoints is the set of every endpoint kind.
const AllEndpoints EndpointSet = (1<<(uint(MaxKind)+1) - 1) &^ 1

// Full reports whether a worker whose listed endpoints are s serves every endpoint: it lists
// none, or all.
func (s EndpointSet) Full() bool { return s == 0 || s&AllEndpoints == AllEndpoints }

// With is s plus k.
func (s EndpointSet) With(k Kind) EndpointSet {
	if !k.Valid() {
		return s
	}
	return s | 1<<uint(k)
}

// Has reports whether k is in s (an empty set has nothing).
func (s EndpointSet) Has(k Kind) bool { return k.Valid() && s&(1<<uint(k)) != 0 }

// Serves reports whether a worker whose listed endpoints are s serves k: the empty set (a
// worker that lists none) serves every endpoint.
func (s EndpointSet) Serves(k Kind) bool { return s == 0 || s.Has(k) }

// String lists s's endpoint names, comma-separated, in kind order ("" for the empty set).
func (s EndpointSet) String() string {
	var b strings.Builder
	for k := Completions; k <= MaxKind; k++ {
		if s.Has(k) {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(endpoints[k].name)
		}
	}
	return b.String()
}

// Names lists s's endpoint names in kind order (nil for the empty set).
func (s EndpointSet) Names() []string {
	var out []string
	for k := Completions; k <= MaxKind; k++ {
		if s.Has(k) {
			out = append(out, endpoints[k].name)
		}
	}
	return out
}

// MaxEndpointNames bounds the endpoint names one worker may list.
const MaxEndpointNames = 64

// ParseEndpoints reads a worker's list of endpoint names into a set. Names the gateway does not
// know (an engine newer than the gateway) are skipped and counted in unknown; the list must
// hold at most MaxEndpointNames names of at most 64 bytes each.
func ParseEndpoints(names []string) (set EndpointSet, unknown int, err error) {
	if len(names) > MaxEndpointNames {
		return 0, 0, &Error{Param: "endpoints", Msg: "more than 64 endpoint names"}
	}
	for _, n := range names {
		if len(n) == 0 || len(n) > 64 {
			return 0, 0, &Error{Param: "endpoints", Msg: "an endpoint name must be 1 to 64 bytes"}
		}
		k, ok := KindByEndpoint(n)
		if !ok {
			unknown++
			continue
		}
		set = set.With(k)
	}
	return set, unknown, nil
}
