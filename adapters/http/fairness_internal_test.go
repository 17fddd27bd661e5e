package httpapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// fairStack is the HTTP surface with real request actors over one stand-in engine whose answer
// each request's prompt chooses: "hold …" waits until the test lets it go (or the gateway
// cancels it), "stay …" until the gateway cancels it, "fail …" answers 503, anything else
// answers 200 with usage.total_tokens 5.
type fairStack struct {
	api     *Server
	srv     *httptest.Server
	arrived chan string   // the prompt of each request that reached the engine
	release chan struct{} // closed: every held request answers
	calls   atomic.Int64
}

func newFairStack(t *testing.T, keys []config.Key, maxInFlight int) *fairStack {
	t.Helper()
	fs := &fairStack{arrived: make(chan string, 1024), release: make(chan struct{})}
	h := gwtest.New(t)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fs.calls.Add(1)
		prompt := string(body)
		if i := strings.Index(prompt, `"prompt":"`); i >= 0 {
			prompt = prompt[i+len(`"prompt":"`):]
			prompt = prompt[:strings.IndexByte(prompt, '"')]
		}
		fs.arrived <- prompt
		switch {
		case strings.HasPrefix(prompt, "hold"):
			select {
			case <-fs.release:
			case <-r.Context().Done():
				return
			}
		case strings.HasPrefix(prompt, "stay"):
			<-r.Context().Done()
			return
		case strings.HasPrefix(prompt, "fail"):
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"total_tokens":5}}`)
	}))
	t.Cleanup(engine.Close)
	wk := gwtest.Worker("w1", "smol", 0)
	wk.HTTPAddress = strings.TrimPrefix(engine.URL, "http://")
	h.Beat(wk)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	deps := &request.Deps{Router: h.GW.Router, Transport: NewTransport(), MaxAttempts: 1,
		Metrics: request.NewMetrics(nil), Logger: log, Errors: ErrorWriter{}}
	start := time.Unix(3_000_000, 0)
	fs.api = New(Options{Core: h.GW, Keys: keys, Logger: log, Now: func() time.Time { return start },
		MaxInFlight: maxInFlight, MaxBodyBytes: 4096,
		Serve: func(x *request.Exchange) { request.Spawn(h.GW.System, deps, x) }})
	fs.srv = httptest.NewServer(fs.api)
	t.Cleanup(fs.srv.Close)
	t.Cleanup(fs.letGo)
	return fs
}

func (fs *fairStack) letGo() {
	select {
	case <-fs.release:
	default:
		close(fs.release)
	}
}

// post sends a completions request with key and extra headers and returns the status, the
// answer's headers and body.
func (fs *fairStack) post(ctx context.Context, key, body string, hdr ...string) (int, http.Header, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fs.srv.URL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := fs.srv.Client().Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), nil
}

func completion(prompt string, maxTokens int) string {
	return fmt.Sprintf(`{"model":"smol","prompt":%q,"max_tokens":%d}`, prompt, maxTokens)
}

// holdsNothing waits (up to 5 s) until key index k holds no reservation and no request, and
// the gateway nothing in flight: every path gives back what it took.
func (fs *fairStack) holdsNothing(t interface{ Fatalf(string, ...any) }, k int) {
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		r, n := fs.api.limiter.Held(k)
		if r == 0 && n == 0 && fs.api.inFlight.Load() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %d holds %d tokens and %d requests, the gateway %d in flight, after every request ended", k, r, n, fs.api.inFlight.Load())
		}
		<-tick.C
	}
}

// TestKeyMaxInFlight (R20): a key with max_in_flight = 2 has two requests served at once; a
// third is 429 rate_limited with Retry-After: 1 before it takes one of the gateway's slots or
// reaches an engine, while another key is served as usual. Once the two end, the key is served
// again and holds nothing.
func TestKeyMaxInFlight(t *testing.T) {
	fs := newFairStack(t, []config.Key{
		{Key: "sk-capped", Scopes: []string{"inference"}, MaxInFlight: 2},
		{Key: "sk-other", Scopes: []string{"inference"}},
	}, 64)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if code, _, body, err := fs.post(context.Background(), "sk-capped", completion(fmt.Sprint("hold ", i), 4)); code != 200 {
				t.Errorf("held request %d: %d %s %v", i, code, body, err)
			}
		})
	}
	for range 2 {
		<-fs.arrived
	}
	code, h, body, err := fs.post(context.Background(), "sk-capped", completion("third", 4))
	if err != nil || code != 429 || h.Get("Retry-After") != "1" || !strings.Contains(body, "rate_limited") ||
		!strings.Contains(body, "limit of 2 requests in flight") {
		t.Fatalf("third: %d Retry-After %q %s %v", code, h.Get("Retry-After"), body, err)
	}
	if n := fs.api.inFlight.Load(); n != 2 {
		t.Fatalf("the gateway counts %d requests in flight, want the 2 held (the refused one took no slot)", n)
	}
	if code, _, body, _ := fs.post(context.Background(), "sk-other", completion("other", 4)); code != 200 {
		t.Fatalf("another key: %d %s", code, body)
	}
	<-fs.arrived
	if fs.calls.Load() != 3 {
		t.Fatalf("the engine saw %d requests, want 3 (the refused one never reached it)", fs.calls.Load())
	}
	fs.letGo()
	wg.Wait()
	fs.holdsNothing(t, 0)
	if code, _, body, _ := fs.post(context.Background(), "sk-capped", completion("again", 4)); code != 200 {
		t.Fatalf("after the held ones ended: %d %s", code, body)
	}
	fs.holdsNothing(t, 0)
}

// TestTPMReservedAtAdmission (R20): a request holds its prompt and max_tokens of its key's tpm
// while it is served, so a second request that does not fit next to it is 429 rate_limited
// before it reaches an engine (Retry-After 1: the tokens are held by a request, not the
// window), one that fits is served, and when the first ends its real usage replaces its
// reservation.
func TestTPMReservedAtAdmission(t *testing.T) {
	fs := newFairStack(t, []config.Key{{Key: "sk-t", Scopes: []string{"inference"}, TPM: 100}}, 64)
	done := make(chan int)
	go func() {
		code, h, _, _ := fs.post(context.Background(), "sk-t", completion("hold", 80)) // 1 + 80
		if h.Get("X-Ratelimit-Remaining-Tokens") != "19" {
			t.Errorf("the held request's remaining tokens %q, want 19", h.Get("X-Ratelimit-Remaining-Tokens"))
		}
		done <- code
	}()
	<-fs.arrived
	code, h, body, _ := fs.post(context.Background(), "sk-t", completion("big", 30)) // 2 + 30 > 19
	if code != 429 || h.Get("Retry-After") != "1" || !strings.Contains(body, "rate_limited") ||
		h.Get("X-Ratelimit-Remaining-Tokens") != "19" {
		t.Fatalf("over the reservation: %d Retry-After %q remaining %q %s", code, h.Get("Retry-After"), h.Get("X-Ratelimit-Remaining-Tokens"), body)
	}
	// A batch hides nothing behind its first prompt: 3 prompts × (1 + max_tokens 4) > 19.
	code, _, body, _ = fs.post(context.Background(), "sk-t", `{"model":"smol","prompt":["a","b","`+strings.Repeat("c", 40)+`"],"max_tokens":4}`)
	if code != 429 {
		t.Fatalf("a batch costing 12 prompt tokens + 12: %d %s", code, body)
	}
	code, h, body, _ = fs.post(context.Background(), "sk-t", completion("small", 10)) // 2 + 10 ≤ 19
	if code != 200 || h.Get("X-Ratelimit-Remaining-Tokens") != "7" {
		t.Fatalf("a request that fits: %d remaining %q %s", code, h.Get("X-Ratelimit-Remaining-Tokens"), body)
	}
	<-fs.arrived
	if fs.calls.Load() != 2 {
		t.Fatalf("the engine saw %d requests, want 2", fs.calls.Load())
	}
	fs.letGo()
	if code := <-done; code != 200 {
		t.Fatalf("the held request: %d", code)
	}
	fs.holdsNothing(t, 0)
	// 5 + 5 used, nothing reserved: the next request of 2 + 10 leaves 100 − 10 − 12.
	if code, h, _, _ := fs.post(context.Background(), "sk-t", completion("after", 10)); code != 200 || h.Get("X-Ratelimit-Remaining-Tokens") != "78" {
		t.Fatalf("after both ended: %d remaining %q, want 78", code, h.Get("X-Ratelimit-Remaining-Tokens"))
	}
}

// TestKeyHoldsNothingAfterEveryPath (R20): whatever way a request of a limited key ends —
// served, refused by its body, its headers or its size, failed by the engine, abandoned by its
// client while the engine works, refused for lack of tokens, or refused at its key's
// max_in_flight — and however many run at once, the key's reservation and in-flight count and
// the gateway's in-flight count return to 0. Random batches of concurrent requests, each
// batch checked once it has ended.
func TestKeyHoldsNothingAfterEveryPath(t *testing.T) {
	fs := newFairStack(t, []config.Key{
		{Key: "sk-a", Scopes: []string{"inference"}, TPM: 1 << 40, RPM: 1 << 40, MaxInFlight: 4},
		{Key: "sk-poor", Scopes: []string{"inference"}, TPM: 10},
	}, 64)
	// sk-poor: 5 of its 10 tokens used, so any request of 6 or more is refused by its
	// reservation.
	if code, _, body, _ := fs.post(context.Background(), "sk-poor", completion("x", 0)); code != 200 {
		t.Fatalf("sk-poor's first: %d %s", code, body)
	}
	<-fs.arrived
	type path struct {
		name string
		key  string
		body string
		hdr  []string
		hold bool // the client leaves once the engine has the request ("stay")
	}
	paths := []path{
		{name: "served", key: "sk-a", body: completion("ok", 4)},
		{name: "served stream", key: "sk-a", body: `{"model":"smol","prompt":"ok","stream":true,"max_tokens":4}`},
		{name: "invalid JSON", key: "sk-a", body: `{"model":`},
		{name: "bad SLO header", key: "sk-a", body: completion("ok", 4), hdr: []string{"X-TL-SLO-TTFT-Ms", "-1"}},
		{name: "body too large", key: "sk-a", body: completion(strings.Repeat("z", 5000), 4)},
		{name: "unknown model", key: "sk-a", body: `{"model":"nobody","prompt":"ok"}`},
		{name: "engine fails", key: "sk-a", body: completion("fail", 4)},
		{name: "client leaves", key: "sk-a", body: completion("stay", 4), hold: true},
		{name: "no tokens left", key: "sk-poor", body: completion("ok", 50)},
	}
	rapid.Check(t, func(rt *rapid.T) {
		batch := rapid.SliceOfN(rapid.SampledFrom(paths), 1, 8).Draw(rt, "batch")
		// Each request has its own client context; a "stay" one is cancelled when its prompt
		// reaches the engine (one refused before ends by itself).
		cancels := make([]context.CancelFunc, len(batch))
		var wg sync.WaitGroup
		for i, p := range batch {
			ctx, cancel := context.WithCancel(context.Background())
			cancels[i] = cancel
			body := p.body
			if p.hold {
				body = completion(fmt.Sprint("stay-", i), 4)
			}
			wg.Go(func() {
				defer cancel()
				_, _, _, _ = fs.post(ctx, p.key, body, p.hdr...)
			})
		}
		stop, drained := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(drained)
			for {
				select {
				case prompt := <-fs.arrived:
					var i int
					if _, err := fmt.Sscanf(prompt, "stay-%d", &i); err == nil && i < len(cancels) {
						cancels[i]()
					}
				case <-stop:
					return
				}
			}
		}()
		wg.Wait()
		close(stop)
		<-drained
		for k := range 2 {
			fs.holdsNothing(rt, k)
		}
	})
}
