package demo

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
)

// TestDemoRegistryToken (R13.1): the demo's engines register with the generated token, and a
// heartbeat without it is Unauthenticated.
func TestDemoRegistryToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := Start(ctx, Options{HTTPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(context.Background())
	conn, err := grpc.NewClient(d.App.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = controlv1.NewWorkerRegistryClient(conn).Heartbeat(ctx, &controlv1.WorkerStatus{
		WorkerId: "intruder", Model: "smol", HttpAddress: "127.0.0.1:9",
	})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("tokenless heartbeat to the demo: %v, want Unauthenticated", err)
	}
	if t1, t2 := mustToken(t), mustToken(t); t1 == t2 || len(t1) != 64 {
		t.Fatalf("tokens %q %q", t1, t2)
	}
	// The live page the banner names is served, without a key (the demo has none).
	resp, err := http.Get("http://" + d.App.HTTPAddr + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/ui on the demo: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

func mustToken(t *testing.T) string {
	t.Helper()
	s, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The banner names the live operator page (R24); TestDemoRegistryToken fetches it.
func TestBannerNamesTheLivePage(t *testing.T) {
	b := Banner("127.0.0.1:8080")
	if !strings.Contains(b, "live operator page: http://127.0.0.1:8080/ui") {
		t.Fatalf("banner without the /ui address:\n%s", b)
	}
}
