package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router"
	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/oai"
)

// renderEngine answers the render endpoints and /tokenize with ids 0..n-1 for a body of n
// bytes/8 (deterministic, so a cached answer can be told from a fresh one), and counts calls.
type renderEngine struct {
	*pathEngine
	models atomic.Value // the last body's model
}

func newRenderEngine(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, body []byte)) *renderEngine {
	re := &renderEngine{}
	re.pathEngine = newPathEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if i := strings.Index(string(body), `"model":"`); i >= 0 {
			re.models.Store(strings.SplitN(string(body[i+9:]), `"`, 2)[0])
		}
		if answer != nil {
			answer(w, r, body)
			return
		}
		n := len(body) / 8
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprint(i)
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/chat/completions/render":
			fmt.Fprintf(w, `{"request_id":"x","token_ids":[%s]}`, strings.Join(ids, ","))
		case "/v1/completions/render":
			fmt.Fprintf(w, `[{"token_ids":[%s]}]`, strings.Join(ids, ","))
		case "/tokenize":
			fmt.Fprintf(w, `{"count":%d,"max_model_len":4096,"tokens":[%s]}`, n, strings.Join(ids, ","))
		default:
			w.WriteHeader(404)
		}
	})
	return re
}

func chatBody(user string) []byte {
	return []byte(`{"model":"public","messages":[{"role":"system","content":"` + strings.Repeat("You answer briefly and well. ", 20) +
		`"},{"role":"user","content":"` + user + `"}]}`)
}

func newTokens(t *testing.T, addr string, endpoint string, timeout time.Duration, clk clock.Clock) (*httpapi.EngineTokens, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	cfg := config.Gateway{TokenizerEndpoint: endpoint, TokenizerTimeout: timeout}
	tk := httpapi.NewEngineTokens(func(m *router.RenderTarget) (*router.RenderTargetReply, error) {
		if m.Model != "public" {
			return &router.RenderTargetReply{}, nil
		}
		return &router.RenderTargetReply{Address: addr, ServedModel: "served"}, nil
	}, httpapi.NewTransport(), cfg, clk, reg)
	t.Cleanup(tk.Close)
	return tk, reg
}

func outcome(reg *prometheus.Registry, o string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "tlgw_tokenizer_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == o {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// TestEngineTokensRenderAndCache (R22): a prompt is rendered once on the worker the router
// names (the render endpoint of its kind, the served model in the body), then answered from
// the cache; a prompt extending it gets the shared part's ids at once and is rendered in the
// background for the next time; another model's pool that needs no ids costs no call.
func TestEngineTokensRenderAndCache(t *testing.T) {
	eng := newRenderEngine(t, nil)
	tk, reg := newTokens(t, eng.addr(), config.TokenizerRender, time.Second, nil)
	ctx := context.Background()
	body := chatBody("hello")
	ids := tk.TokenIDs(ctx, oai.Chat, "public", "r1", body, nil)
	if want := (len(body) + len("served") - len("public")) / 8; len(ids) != want {
		t.Fatalf("%d ids rendered, want %d", len(ids), want)
	}
	if got := eng.calls(); len(got) != 1 || got[0] != "POST /v1/chat/completions/render" {
		t.Fatalf("calls %v", got)
	}
	if m := eng.models.Load(); m != "served" {
		t.Fatalf("rendered for model %v, want the served one", m)
	}
	again := tk.TokenIDs(ctx, oai.Chat, "public", "r2", body, nil)
	if len(again) != len(ids) || len(eng.calls()) != 1 || outcome(reg, "cache") != 1 || outcome(reg, "render") != 1 {
		t.Fatalf("second time: %d ids, %d calls, cache %v render %v", len(again), len(eng.calls()), outcome(reg, "cache"), outcome(reg, "render"))
	}
	// The next turn: the shared part at once, then the whole after a background render.
	next := append(append([]byte{}, body[:len(body)-2]...), []byte(`,{"role":"assistant","content":"hi"},{"role":"user","content":"more"}]}`)...)
	part := tk.TokenIDs(ctx, oai.Chat, "public", "r3", next, nil)
	if len(part) == 0 || len(part) >= len(ids) || outcome(reg, "partial") != 1 {
		t.Fatalf("next turn: %d ids of %d, partial %v", len(part), len(ids), outcome(reg, "partial"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for tk.CacheStats().Entries < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the background render was not cached")
		}
		runtime.Gosched()
	}
	if full := tk.TokenIDs(ctx, oai.Chat, "public", "r4", next, nil); len(full) <= len(ids) || outcome(reg, "cache") != 2 {
		t.Fatalf("after the background render: %d ids", len(full))
	}
	if got := tk.TokenIDs(ctx, oai.Chat, "other", "r5", body, nil); got != nil || len(eng.calls()) != 2 {
		t.Fatalf("a pool needing no ids: %v, calls %v", got, eng.calls())
	}
	if got := tk.TokenIDs(ctx, oai.Embeddings, "public", "r6", body, nil); got != nil {
		t.Fatal("embeddings rendered")
	}
	// Completions render on their own endpoint; /tokenize when configured.
	if got := tk.TokenIDs(ctx, oai.Completions, "public", "r7", []byte(`{"model":"public","prompt":"`+strings.Repeat("x", 200)+`"}`), nil); len(got) == 0 {
		t.Fatal("completions not rendered")
	}
	if c := eng.calls(); c[len(c)-1] != "POST /v1/completions/render" {
		t.Fatalf("completions went to %s", c[len(c)-1])
	}
	tz, _ := newTokens(t, eng.addr(), config.TokenizerTokenize, time.Second, nil)
	if got := tz.TokenIDs(ctx, oai.Chat, "public", "r8", body, nil); len(got) == 0 {
		t.Fatal("tokenize gave nothing")
	}
	if c := eng.calls(); c[len(c)-1] != "POST /tokenize" {
		t.Fatalf("tokenize went to %s", c[len(c)-1])
	}
}

// TestEngineTokensFallBack: a render that is late (past tokenizer_timeout on the gateway's
// clock), fails, or answers something else than token ids (a hostile engine: too large,
// negative ids) gives no ids and is counted; nothing is cached.
func TestEngineTokensFallBack(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	defer close(release)
	cases := map[string]func(w http.ResponseWriter, r *http.Request, body []byte){
		"slow": func(w http.ResponseWriter, r *http.Request, _ []byte) {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		},
		"500":      func(w http.ResponseWriter, _ *http.Request, _ []byte) { w.WriteHeader(500) },
		"negative": func(w http.ResponseWriter, _ *http.Request, _ []byte) { fmt.Fprint(w, `{"token_ids":[1,-2]}`) },
		"huge": func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			fmt.Fprint(w, `{"token_ids":[`+strings.Repeat("1,", 2<<20)+`1]}`)
		},
		"not json": func(w http.ResponseWriter, _ *http.Request, _ []byte) { fmt.Fprint(w, `<html>`) },
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			eng := newRenderEngine(t, h)
			fc := clock.NewFake(time.Unix(0, 0))
			tk, reg := newTokens(t, eng.addr(), config.TokenizerRender, 50*time.Millisecond, fc)
			got := make(chan []uint32, 1)
			go func() { got <- tk.TokenIDs(context.Background(), oai.Chat, "public", "r", chatBody("q"), nil) }()
			if name == "slow" {
				select {
				case <-arrived:
				case <-time.After(10 * time.Second):
					t.Fatal("the render never reached the engine")
				}
				fc.Advance(49 * time.Millisecond)
				select {
				case ids := <-got:
					t.Fatalf("answered %v before the budget", ids)
				default:
				}
				fc.Advance(time.Millisecond)
			}
			select {
			case ids := <-got:
				if ids != nil {
					t.Fatalf("ids %v", ids[:min(len(ids), 4)])
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no answer")
			}
			if outcome(reg, "fallback") != 1 || tk.CacheStats().Entries != 0 {
				t.Fatalf("fallback %v, entries %d", outcome(reg, "fallback"), tk.CacheStats().Entries)
			}
		})
	}
}
