package app_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgw/tlgw/actors/router"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// heldKV is a KvEvents server whose cache holds ids: every stream gets CLEARED, the snapshot,
// then nothing until the client leaves.
type heldKV struct {
	kvv1.UnimplementedKvEventsServer
	ids  []uint64
	subs atomic.Int32
}

func (h *heldKV) Subscribe(_ *kvv1.SubscribeRequest, st grpc.ServerStreamingServer[kvv1.KvEvent]) error {
	h.subs.Add(1)
	if err := st.Send(&kvv1.KvEvent{Seq: 41, Kind: kvv1.KvEvent_CLEARED}); err != nil {
		return err
	}
	if err := st.Send(&kvv1.KvEvent{Seq: 42, Kind: kvv1.KvEvent_STORED, BlockIds: h.ids}); err != nil {
		return err
	}
	<-st.Context().Done()
	return nil
}

// TestPrecisePrefixSubscribes: with route_policy = "precise_prefix" the gateway subscribes to
// the KvEvents of a worker whose heartbeat sets kv_events, and routes a prompt to the worker
// whose engine reports holding it (w2, though w1 would win a tie); shutdown ends the
// subscription (goleak in TestMain). The same under predicted_latency, whose pool reads the
// exact index when every member reports: there w1's engine reports too, holding nothing.
func TestPrecisePrefixSubscribes(t *testing.T) {
	for _, policy := range []string{config.PolicyPrecisePrefix, config.PolicyPredictedLatency} {
		t.Run(policy, func(t *testing.T) { testSubscribes(t, policy) })
	}
}

// kvServer serves kv on a loopback gRPC server until the test ends.
func kvServer(t *testing.T, kv *heldKV) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	kvv1.RegisterKvEventsServer(gs, kv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

func testSubscribes(t *testing.T, policy string) {
	prompt := strings.Repeat("a prompt that w2's engine holds in its prefix cache. ", 20)
	kv, empty := &heldKV{ids: prefixindex.Hashes(nil, []byte(prompt))}, &heldKV{}
	kvAddr := kvServer(t, kv)
	emptyAddr := ""
	if policy == config.PolicyPredictedLatency {
		emptyAddr = kvServer(t, empty)
	}

	var served [2]atomic.Int32
	var engines [2]*httptest.Server
	for i := range engines {
		engines[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			served[i].Add(1)
			if strings.Contains(string(body), `"stream":true`) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"ok\"}]}\n\ndata: [DONE]\n\n")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
		}))
		defer engines[i].Close()
	}

	a := startGateway(t, policy)
	conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := controlv1.NewWorkerRegistryClient(conn)
	for i, id := range []string{"w1", "w2"} {
		st := &controlv1.WorkerStatus{WorkerId: id, Model: "smol", Role: controlv1.Role_ROLE_UNIFIED,
			HttpAddress: strings.TrimPrefix(engines[i].URL, "http://")}
		if id == "w2" {
			st.GrpcAddress, st.KvEvents = kvAddr, true
		} else if emptyAddr != "" {
			st.GrpcAddress, st.KvEvents = emptyAddr, true
		}
		if _, err := reg.Heartbeat(context.Background(), st); err != nil {
			t.Fatal(err)
		}
	}
	gwtest.Eventually(t, "both routable and subscribed", func() bool {
		n, _ := a.Gateway.Routable()
		return n == 2 && kv.subs.Load() > 0 && (emptyAddr == "" || empty.subs.Load() > 0)
	})
	// Each request is sent once the router counts nothing in flight: on a busy machine the
	// previous one's release can still be on its way and leave w2 at the bounded-load cap.
	stream := ""
	send := func() {
		gwtest.Idle(t, a.Gateway)
		req, err := http.NewRequest(http.MethodPost, "http://"+a.HTTPAddr+"/v1/completions",
			strings.NewReader(`{"model":"smol",`+stream+`"prompt":"`+prompt+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if policy == config.PolicyPredictedLatency {
			// An objective both engines are predicted to meet: the pick is then by cached
			// prefix (R18.4), not by the TTFTs these instant engines happen to show, which are
			// noise on a busy machine.
			req.Header.Set("X-TL-SLO-TTFT-Ms", "60000")
		}
		doOK(t, req)
	}
	// The snapshot travels a stream and an actor message after the subscription: once a repeat
	// lands on w2 the router has it (bounded: at most a few requests).
	gwtest.Eventually(t, "the snapshot reaches the router", func() bool {
		send()
		return served[1].Load() > 0
	})
	served[0].Store(0)
	served[1].Store(0)
	for range 3 {
		send()
	}
	if served[0].Load() != 0 || served[1].Load() != 3 {
		t.Fatalf("w1 served %d, w2 %d: want every repeat on w2, which holds the prompt", served[0].Load(), served[1].Load())
	}
	if policy != config.PolicyPredictedLatency {
		return
	}
	// The request actors report each streamed attempt's TTFT: w2's model learns from streamed
	// repeats, and the admin listing shows it.
	stream = `"stream":true,`
	for range 3 {
		send()
	}
	if served[1].Load() != 6 {
		t.Fatalf("w2 served %d of 6 repeats", served[1].Load())
	}
	gwtest.Eventually(t, "w2's TTFT model listed with the repeats", func() bool {
		var out struct {
			Workers []struct {
				ID    string `json:"id"`
				Model *struct {
					Observations uint64   `json:"observations"`
					BiasMs       *float64 `json:"bias_ms"`
				} `json:"ttft_model"`
			} `json:"workers"`
		}
		gwtest.GetJSON(t, "http://"+a.HTTPAddr+"/admin/v1/workers", &out)
		for _, w := range out.Workers {
			if w.ID == "w2" && w.Model != nil && w.Model.Observations >= 3 && w.Model.BiasMs != nil {
				return true
			}
		}
		return false
	})
}

// TestPrefixAwareGetsTheHashes: with route_policy = "prefix_aware" the request actors send
// each prompt's chunk hashes with their picks, so a repeat of a prompt is picked for its prefix
// (tlgw_routing_decisions_total{reason="prefix"}), not as the first sight of a stranger.
func TestPrefixAwareGetsTheHashes(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer engine.Close()
	a := startGateway(t, "prefix_aware")
	if _, err := a.Gateway.Heartbeat(router.WorkerInfo{ID: "w1", Model: "smol", HTTPAddress: strings.TrimPrefix(engine.URL, "http://")}); err != nil {
		t.Fatal(err)
	}
	gwtest.Eventually(t, "w1 routable", func() bool { n, _ := a.Gateway.Routable(); return n == 1 })
	prompt := strings.Repeat("a prompt long enough for several chunks of the prefix index. ", 8)
	for range 2 {
		gwtest.Idle(t, a.Gateway)
		req, err := http.NewRequest("POST", "http://"+a.HTTPAddr+"/v1/completions",
			strings.NewReader(`{"model":"smol","prompt":"`+prompt+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		doOK(t, req)
	}
	resp, err := http.Get("http://" + a.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	const want = `tlgw_routing_decisions_total{policy="prefix_aware",reason="prefix"} 1`
	if !strings.Contains(string(b), want+"\n") {
		t.Fatalf("no %q in the metrics:\n%s", want, grepLines(string(b), "tlgw_routing_decisions_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// startGateway starts a gateway on loopback with route_policy = policy, shut down with the
// test.
func startGateway(t *testing.T, policy string) *app.App {
	t.Helper()
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.RoutePolicy = policy
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
	})
	return a
}

// doOK sends req and requires a 200, reading the answer to its end.
func doOK(t *testing.T, req *http.Request) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}
