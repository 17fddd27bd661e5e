package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The serving endpoints' names, as heartbeats list them in WorkerStatus.endpoints and --endpoints
// takes them. They are the gateway's endpoint catalogue's names (internal/oai), kept here so
// the simulator depends on the wire contract, not on the gateway's code; a test holds the two
// lists equal.
const (
	EndpointCompletions       = "completions"        // POST /v1/completions
	EndpointChat              = "chat"               // POST /v1/chat/completions
	EndpointEmbeddings        = "embeddings"         // POST /v1/embeddings
	EndpointResponses         = "responses"          // POST /v1/responses, GET and DELETE /v1/responses/{id}
	EndpointMessages          = "messages"           // POST /v1/messages (Anthropic)
	EndpointCompletionsRender = "completions_render" // POST /v1/completions/render
	EndpointChatRender        = "chat_render"        // POST /v1/chat/completions/render
	EndpointTokenize          = "tokenize"           // POST /tokenize (and /v1/tokenize)
	EndpointDetokenize        = "detokenize"         // POST /detokenize
	EndpointRerank            = "rerank"             // POST /v1/rerank
	EndpointScore             = "score"              // POST /v1/score
	EndpointPooling           = "pooling"            // POST /pooling
	EndpointTranscriptions    = "transcriptions"     // POST /v1/audio/transcriptions
	EndpointTranslations      = "translations"       // POST /v1/audio/translations
)

// AllEndpoints is every serving endpoint, in the catalogue's order: what an engine serves
// unless --endpoints says otherwise.
var AllEndpoints = []string{
	EndpointCompletions, EndpointChat, EndpointEmbeddings, EndpointResponses, EndpointMessages,
	EndpointCompletionsRender, EndpointChatRender, EndpointTokenize, EndpointDetokenize,
	EndpointRerank, EndpointScore, EndpointPooling, EndpointTranscriptions, EndpointTranslations,
}

// ParseEndpointList reads --endpoints: comma-separated names; empty is every endpoint. An
// unknown name is an error naming it; a name given twice counts once. The result is in the
// catalogue's order.
func ParseEndpointList(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	want := make(map[string]bool)
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if !isEndpoint(n) {
			return nil, fmt.Errorf("--endpoints: unknown endpoint %q (want some of %s)", n, strings.Join(AllEndpoints, ","))
		}
		want[n] = true
	}
	var out []string
	for _, n := range AllEndpoints {
		if want[n] {
			out = append(out, n)
		}
	}
	return out, nil
}

func isEndpoint(n string) bool {
	for _, a := range AllEndpoints {
		if a == n {
			return true
		}
	}
	return false
}

// route is one pattern of the HTTP surface: endpoint "" is always served.
type route struct {
	endpoint string
	pattern  string // "METHOD /path"
	h        http.HandlerFunc
}

func (e *Engine) table() []route {
	inference := func(chat bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { e.serveInference(w, r, chat) }
	}
	rs := []route{
		{EndpointCompletions, "POST /v1/completions", inference(false)},
		{EndpointChat, "POST /v1/chat/completions", inference(true)},
		{EndpointEmbeddings, "POST /v1/embeddings", e.serveEmbeddings},
		{EndpointResponses, "POST /v1/responses", e.serveResponses},
		{EndpointResponses, "GET /v1/responses/{id}", e.serveStoredResponse},
		{EndpointResponses, "DELETE /v1/responses/{id}", e.deleteStoredResponse},
		{EndpointMessages, "POST /v1/messages", e.serveMessages},
		{EndpointCompletionsRender, "POST /v1/completions/render", e.serveCompletionsRender},
		{EndpointChatRender, "POST /v1/chat/completions/render", e.serveChatRender},
		{EndpointTokenize, "POST /tokenize", e.serveTokenize},
		{EndpointTokenize, "POST /v1/tokenize", e.serveTokenize},
		{EndpointDetokenize, "POST /detokenize", e.serveDetokenize},
		{EndpointRerank, "POST /v1/rerank", e.serveRerank},
		{EndpointScore, "POST /v1/score", e.serveScore},
		{EndpointPooling, "POST /pooling", e.servePooling},
		{EndpointTranscriptions, "POST /v1/audio/transcriptions", func(w http.ResponseWriter, r *http.Request) { e.serveAudio(w, r, false) }},
		{EndpointTranslations, "POST /v1/audio/translations", func(w http.ResponseWriter, r *http.Request) { e.serveAudio(w, r, true) }},
		{"", "GET /v1/models", e.serveModels},
		{"", "GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }},
		{"", "GET /metrics", e.met.handler().ServeHTTP},
		{"", "GET " + TraceparentsPath, e.serveTraceparents},
	}
	if e.cfg.KVEvents.Addr != "" {
		rs = append(rs, route{"", "POST " + GapPath, e.serveKVGap})
	}
	if e.cfg.AllowRuntimeLoRA {
		rs = append(rs,
			route{"", "POST /v1/load_lora_adapter", e.serveLoadLoRA},
			route{"", "POST /v1/unload_lora_adapter", e.serveUnloadLoRA})
	}
	return rs
}

// routes serves the table's routes of the served endpoints. Anything else answers as FastAPI
// does: 405 {"detail":"Method Not Allowed"} for a path served with another method, else 404
// {"detail":"Not Found"}.
func (e *Engine) routes() http.Handler {
	mux, paths := http.NewServeMux(), http.NewServeMux()
	seen := make(map[string]bool)
	for _, rt := range e.table() {
		if rt.endpoint != "" && !e.serves[rt.endpoint] {
			continue
		}
		_, path, _ := strings.Cut(rt.pattern, " ")
		h := rt.h
		if path != TraceparentsPath {
			h = e.observed(path, h) // R24: the traceparent recorded, the span exported
		}
		mux.HandleFunc(rt.pattern, h)
		if !seen[path] {
			seen[path] = true
			paths.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
				writeDetail(w, http.StatusMethodNotAllowed, "Method Not Allowed")
			})
		}
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := paths.Handler(r); pattern != "" {
			paths.ServeHTTP(w, r)
			return
		}
		writeDetail(w, http.StatusNotFound, "Not Found")
	})
	return mux
}

// writeDetail writes FastAPI's error body for a path or method it has no route for.
func writeDetail(w http.ResponseWriter, status int, detail string) {
	b, _ := json.Marshal(map[string]string{"detail": detail})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
