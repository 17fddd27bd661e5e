// Package demo runs `tlgw demo`: the gateway plus simulated engines on loopback, on an embedded
// default configuration, ready for curl and the OpenAI SDKs.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/sim/engine"
)

// Options configure the demo.
type Options struct {
	HTTPListen string // default 127.0.0.1:8080
	Logger     *slog.Logger
}

// Demo is a running demo.
type Demo struct {
	App     *app.App
	Engines []*engine.Engine
}

// engines is the demo fleet: smol (2 unified), big (1), and smol's disaggregated pair.
var engines = []engine.Config{
	{ID: "smol-1", Model: "smol", Role: engine.RoleUnified, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 15 * time.Millisecond},
	{ID: "smol-2", Model: "smol", Role: engine.RoleUnified, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 15 * time.Millisecond},
	{ID: "big-1", Model: "big", Role: engine.RoleUnified, PrefillPerToken: 300 * time.Microsecond, DecodePerToken: 40 * time.Millisecond},
	{ID: "smol-prefill-1", Model: "smol", Role: engine.RolePrefill, PrefillPerToken: 100 * time.Microsecond},
	{ID: "smol-decode-1", Model: "smol", Role: engine.RoleDecode, DecodePerToken: 15 * time.Millisecond},
}

// Config is the demo's gateway configuration: no API keys, four routes, and a registry that
// takes heartbeats only with registryToken (R13.1).
func Config(httpListen, registryToken string) *config.Config {
	cfg := config.Default()
	cfg.Gateway.HTTPListen = httpListen
	cfg.Gateway.RegistryListen = "127.0.0.1:0"
	cfg.Registry.Tokens = []config.RegistryToken{{Token: registryToken}}
	cfg.Gateway.Routes = config.NormalizeRoutes([]config.Route{
		{Model: "smol"},
		{Model: "big"},
		{Model: "auto", Cascade: []config.CascadeStep{{Model: "smol", AcceptIf: "mean_logprob > -1.0"}, {Model: "big"}}},
		{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	})
	return cfg
}

// Start brings the gateway up, then the engines, and waits until every engine is registered.
func Start(ctx context.Context, o Options) (*Demo, error) {
	if o.HTTPListen == "" {
		o.HTTPListen = "127.0.0.1:8080"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	token, err := newToken()
	if err != nil {
		return nil, err
	}
	cfg := Config(o.HTTPListen, token)
	if err := config.ValidateRoutes(cfg.Gateway.Routes); err != nil {
		return nil, fmt.Errorf("demo routes: %w", err)
	}
	a, err := app.Start(cfg, app.Options{Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	d := &Demo{App: a}
	for _, ec := range engines {
		ec.Gateways = []string{a.GRPCAddr}
		ec.RegistryAuth = engine.RegistryAuth{Token: token}
		ec.Logger = o.Logger
		e, err := engine.Start(ec)
		if err != nil {
			d.Stop(context.Background())
			return nil, err
		}
		d.Engines = append(d.Engines, e)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		list, err := a.Gateway.Workers()
		if err == nil && len(list.Workers) == len(engines) {
			return d, nil
		}
		select {
		case <-ctx.Done():
			d.Stop(context.Background())
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// newToken is a random registry token: 256 bits, hex.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("demo registry token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Stop stops the engines, then the gateway.
func (d *Demo) Stop(ctx context.Context) {
	for _, e := range d.Engines {
		e.Close()
	}
	_ = d.App.Shutdown(ctx)
}

// Banner is what `tlgw demo` prints once ready: the routes and examples to paste.
func Banner(httpAddr string) string {
	base := "http://" + httpAddr
	return fmt.Sprintf(`tlgw demo is ready on %[1]s (no API key needed)

live operator page: %[1]s/ui (workers, routes, queue, replicas; open it in a browser)

models: smol (2 workers), big (1), auto (cascade: smol, escalated to big unless mean_logprob > -1.0),
        smol-pd (disaggregated smol: prefill + decode workers)

  curl -s %[1]s/v1/models
  curl -s %[1]s/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"smol","prompt":"Once upon a time","max_tokens":16,"seed":7}'
  curl -sN %[1]s/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"smol","stream":true,"messages":[{"role":"user","content":"Tell me a story"}]}'
  curl -s %[1]s/admin/v1/workers

OpenAI SDK (Python):
  from openai import OpenAI
  client = OpenAI(base_url="%[1]s/v1", api_key="unused")
  print(client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content)

OpenAI SDK (Go, github.com/openai/openai-go/v3):
  client := openai.NewClient(option.WithBaseURL("%[1]s/v1"), option.WithAPIKey("unused"))

Ctrl-C stops everything.
`, base)
}
