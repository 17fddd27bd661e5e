package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
)

// TestRegistryTokensEndToEnd (R13.1): tlengine processes register with --token or
// TLENGINE_TOKEN; a heartbeat without a token is Unauthenticated, one outside the token's
// model grant PermissionDenied, and one for a live engine's id from another token
// PermissionDenied.
func TestRegistryTokensEndToEnd(t *testing.T) {
	t.Setenv("TLENGINE_TOKEN", "token-b")
	f := startFleet(t, fastHeartbeats+`
[registry]
tokens = [
  { token = "token-a", models = ["smol*"], id_prefix = "a-" },
  { token = "token-b", id_prefix = "b-" },
]
`, []string{"a-1", "--model", "smol", "--token", "token-a"}, []string{"b-1", "--model", "big"})

	conn, err := grpc.NewClient(f.gw.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := controlv1.NewWorkerRegistryClient(conn)
	beat := func(token, id, model string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		_, err := c.Heartbeat(ctx, &controlv1.WorkerStatus{WorkerId: id, Model: model, HttpAddress: "127.0.0.1:9"})
		return err
	}
	for _, tc := range []struct {
		token, id, model string
		want             codes.Code
	}{
		{"", "a-2", "smol", codes.Unauthenticated},
		{"token-x", "a-2", "smol", codes.Unauthenticated},
		{"token-a", "a-2", "big", codes.PermissionDenied},
		{"token-a", "b-2", "smol", codes.PermissionDenied},
		{"token-b", "a-1", "smol", codes.PermissionDenied}, // id_prefix
	} {
		if err := beat(tc.token, tc.id, tc.model); status.Code(err) != tc.want {
			t.Errorf("%+v: %v, want %v", tc, err, tc.want)
		}
	}
	if ids := f.ids(t); strings.Join(ids, ",") != "a-1,b-1" {
		t.Fatalf("workers %v", ids)
	}
}

// TestServeRefusesOpenRegistryOffLoopback (R13.1): registry_listen on 0.0.0.0 with neither
// tokens nor client_ca exits non-zero naming the key; a link-local metrics_url too.
func TestServeRefusesOpenRegistryOffLoopback(t *testing.T) {
	for name, tc := range map[string]struct{ toml, key string }{
		"open registry": {"[gateway]\nhttp_listen = \"127.0.0.1:0\"\nregistry_listen = \"0.0.0.0:0\"\n", "registry.allow_insecure"},
		"metadata metrics_url": {"[gateway]\nhttp_listen = \"127.0.0.1:0\"\nregistry_listen = \"127.0.0.1:0\"\n" +
			"[[gateway.static_workers]]\nid = \"v\"\nmodel = \"m\"\nhttp_address = \"10.0.0.5:8000\"\nmetrics = \"vllm\"\n" +
			"metrics_url = \"http://169.254.169.254/latest/meta-data\"\n", "gateway.static_workers[0].metrics_url"},
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
}
