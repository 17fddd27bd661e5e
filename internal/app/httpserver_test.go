package app_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
)

// TestOpenHTTPOffLoopbackRefused (R13.3): a configuration built in code that would serve the
// HTTP API without keys outside loopback does not start, and the error names the key; nothing
// is bound (the address is never listened on).
func TestOpenHTTPOffLoopbackRefused(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "0.0.0.0:0", "127.0.0.1:0"
	_, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "gateway.allow_unauthenticated") {
		t.Fatalf("Start = %v, want an error naming gateway.allow_unauthenticated", err)
	}
}
