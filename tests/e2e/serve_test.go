package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/proctest"
)

// standIn is an engine stand-in: OpenAI JSON and SSE answers over a real socket.
func standIn(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, tok := range []string{"Hello", " there", "!"} {
				fmt.Fprintf(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":%q}]}\n\n", tok)
				w.(http.Flusher).Flush()
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"text_completion","model":"from-engine","echo":%q,"choices":[{"index":0,"text":"Hello there!","finish_reason":"stop"}]}`, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func heartbeat(t *testing.T, grpcAddr string, st *controlv1.WorkerStatus) *controlv1.HeartbeatAck {
	t.Helper()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := controlv1.NewWorkerRegistryClient(conn).Heartbeat(ctx, st)
	if err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	return ack
}

func post(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestServeProcessEndToEnd: `tlgw serve --config` as a process; an engine registers over gRPC;
// JSON and SSE complete through it over real sockets; SIGTERM stops it cleanly.
func TestServeProcessEndToEnd(t *testing.T) {
	engine := standIn(t)
	p := startTLGW(t, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "2s"

[[gateway.routes]]
model = "smol"
aliases = ["small"]
backends = [{ model = "smol-v3", weight = 1 }]

[[auth.keys]]
key = "sk-e2e"
scopes = ["inference", "admin", "debug"]
`)
	ack := heartbeat(t, p.GRPCAddr, &controlv1.WorkerStatus{
		WorkerId: "engine-1", Model: "smol-v3", Role: controlv1.Role_ROLE_UNIFIED,
		HttpAddress: strings.TrimPrefix(engine.URL, "http://"), KvTotalBlocks: 64, KvFreeBlocks: 64,
	})
	if ack.GetEpoch() != 1 || ack.GetHeartbeatIntervalMs() != 2000 {
		t.Fatalf("ack %v", ack)
	}
	base := "http://" + p.HTTPAddr
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready\n%s", p.Logs())
		}
		tick := time.NewTimer(10 * time.Millisecond)
		<-tick.C
	}

	resp, body := post(t, base+"/v1/completions", "sk-e2e", `{"model":"small","prompt":"Say hello","max_tokens":8}`)
	if resp.StatusCode != 200 || !strings.Contains(body, "Hello there!") || resp.Header.Get("X-TL-Route") != "engine-1" {
		t.Fatalf("JSON: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if !strings.Contains(body, `\"model\":\"smol-v3\"`) {
		t.Fatalf("the engine did not receive the served model id: %s", body)
	}

	req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(`{"model":"small","prompt":"Say hello","stream":true}`))
	req.Header.Set("Authorization", "Bearer sk-e2e")
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	var text strings.Builder
	sawDone := false
	sc := bufio.NewScanner(sresp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			sawDone = true
			continue
		}
		if rest, ok := strings.CutPrefix(line, "data: "); ok {
			i := strings.Index(rest, `"text":"`)
			j := strings.LastIndex(rest, `"}]}`)
			text.WriteString(rest[i+len(`"text":"`) : j])
		}
	}
	if sresp.Header.Get("Content-Type") != "text/event-stream" || text.String() != "Hello there!" || !sawDone {
		t.Fatalf("SSE: %q done=%v", text.String(), sawDone)
	}

	// The actors' own metrics are exported.
	mresp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, want := range []string{
		`tlgw_actor_mailbox_length{actor_kind="router"}`,
		`tlgw_actor_message_seconds_bucket{actor_kind="router",message="Pick"`,
		`tlgw_actor_message_seconds_bucket{actor_kind="registry",message="Heartbeat"`,
		`tlgw_requests_total{code="200",endpoint="completions",model="smol-v3",route="smol"} 2`,
		`tlgw_routing_decisions_total{policy="least_outstanding",reason="least_load"} 2`,
		`tlgw_workers{state="routable"} 1`,
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Graceful shutdown on SIGTERM: exit code 0.
	stopGracefully(t, p)
}

// TestServeRejectsBadConfig: a bad key or value stops start-up with a message naming the key.
func TestServeRejectsBadConfig(t *testing.T) {
	for name, tc := range map[string]struct{ toml, key string }{
		"unknown key":  {"[gateway]\nhttp_lisen = \"127.0.0.1:0\"\n", "gateway.http_lisen"},
		"bad duration": {"[gateway]\nheartbeat_interval = \"soon\"\n", "gateway.heartbeat_interval"},
		"bad policy":   {"[gateway]\nroute_policy = \"random\"\n", "gateway.route_policy"},
		"bad toml":     {"[gateway\n", "tlgw.toml"},
	} {
		cfg := filepath.Join(t.TempDir(), "tlgw.toml")
		if err := os.WriteFile(cfg, []byte(tc.toml), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out := runTLGW(t, "serve", "--config", cfg)
		if code == 0 || !strings.Contains(out, tc.key) {
			t.Errorf("%s: exit %d, output does not name %q:\n%s", name, code, tc.key, out)
		}
	}
	if code, out := runTLGW(t, "version"); code != 0 || !strings.HasPrefix(out, "tlgw ") {
		t.Fatalf("version: %d %q", code, out)
	}
}

// stopGracefully sends p SIGTERM and fails unless it exits with code 0 within 10 s.
func stopGracefully(t *testing.T, p *proctest.Proc) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
		if err := p.Err(); err != nil {
			t.Fatalf("exit: %v\n%s", err, p.Logs())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("tlgw did not stop on SIGTERM\n%s", p.Logs())
	}
}

// TestSIGTERMRightAfterStart: a SIGTERM sent the moment the listening line appears stops tlgw
// and tlengine gracefully (exit 0), every time — the signal handler is in place before the
// line is printed. Twenty starts each.
func TestSIGTERMRightAfterStart(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tlgw.toml")
	if err := os.WriteFile(cfg, []byte("[gateway]\nhttp_listen = \"127.0.0.1:0\"\nregistry_listen = \"127.0.0.1:0\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		stopGracefully(t, proctest.Start(t, tlgwBin, []string{"serve", "--config", cfg}))
		stopGracefully(t, proctest.StartEngine(t, tlengineBin, "--id", fmt.Sprint("e", i), "--model", "smol",
			"--http-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--kv-listen", "127.0.0.1:0"))
	}
}

// TestServeWritesACPUProfile: `tlgw serve --cpu-profile FILE` records the whole run and writes
// the profile (gzip-compressed pprof, what cmd/tlgw/default.pgo is) when SIGTERM stops it.
func TestServeWritesACPUProfile(t *testing.T) {
	dir := t.TempDir()
	cfg, prof := filepath.Join(dir, "tlgw.toml"), filepath.Join(dir, "cpu.pprof")
	if err := os.WriteFile(cfg, []byte("[gateway]\nhttp_listen = \"127.0.0.1:0\"\nregistry_listen = \"127.0.0.1:0\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := proctest.Start(t, tlgwBin, []string{"serve", "--config", cfg, "--cpu-profile", prof})
	if resp, err := http.Get("http://" + p.HTTPAddr + "/healthz"); err == nil {
		resp.Body.Close()
	}
	stopGracefully(t, p)
	f, err := os.Open(prof)
	if err != nil {
		t.Fatalf("no profile: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the profile is not gzip: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	// The profile's string table names its sample types: samples/count and cpu/nanoseconds.
	for _, want := range []string{"samples", "cpu", "nanoseconds"} {
		if !bytes.Contains(raw, []byte(want)) {
			t.Errorf("the profile (%d bytes) lacks %q", len(raw), want)
		}
	}

	// A file that exists is never overwritten: serve refuses to start.
	before, _ := os.ReadFile(prof)
	code, out := runTLGW(t, "serve", "--config", cfg, "--cpu-profile", prof)
	if code != 1 || !strings.Contains(out, "--cpu-profile") {
		t.Fatalf("existing profile file: exit %d, %q", code, out)
	}
	if after, _ := os.ReadFile(prof); !bytes.Equal(before, after) {
		t.Fatal("serve changed an existing profile file")
	}
}
