// Command tlengine is the engine simulator (SPEC R12). It only wires flags to sim/engine.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/sim/engine"
	"github.com/tlgw/tlgw/sim/faults"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tlengine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg engine.Config
	var role, gateways, fault, logLevel, endpoints, loraList string
	var loraSwapMS int
	var kvEvents, kvFormat, kvReplay string
	fs.StringVar(&cfg.ID, "id", "", "worker id (required)")
	fs.StringVar(&cfg.Model, "model", "", "the model id this engine serves (required)")
	fs.StringVar(&role, "role", "unified", "unified, prefill or decode")
	fs.StringVar(&cfg.HTTPListen, "http-listen", "127.0.0.1:0", "OpenAI HTTP address (port 0: any)")
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", "127.0.0.1:0", "EngineControl and KvEvents gRPC address (port 0: any)")
	fs.StringVar(&cfg.KVListen, "kv-listen", "127.0.0.1:0", "KV transfer gRPC address (port 0: any)")
	fs.StringVar(&gateways, "gateway", "", "gateway registries to heartbeat, comma-separated (empty: none): host:port, or dns:///name:port for every A/AAAA record of name, re-resolved every 30 s (a Kubernetes headless service)")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 1024, "KV blocks in the pool")
	fs.IntVar(&cfg.BlockSize, "block-size", 16, "tokens per KV block, 1 to 1048576; sent in heartbeats as block_size (KV capacity = kv-blocks × block-size tokens)")
	fs.IntVar(&cfg.MaxRunning, "max-running", 256, "requests running at once; more wait in the queue")
	fs.DurationVar(&cfg.PrefillPerToken, "prefill-per-token", 0, "prefill cost per uncached prompt token")
	fs.DurationVar(&cfg.DecodePerToken, "decode-per-token", 0, "decode cost per generated token")
	fs.DurationVar(&cfg.KVLease, "kv-lease", 60*time.Second, "how long pushed KV is held for a request that has not used it (decode role)")
	fs.StringVar(&cfg.RegistryAuth.Token, "token", "", "registry token, sent as authorization: Bearer metadata (empty: $TLENGINE_TOKEN)")
	fs.StringVar(&cfg.RegistryAuth.TLSCA, "tls-ca", "", "PEM CA of the registry's certificate: heartbeat over TLS (empty: plaintext)")
	fs.StringVar(&cfg.RegistryAuth.TLSCert, "tls-cert", "", "PEM client certificate for a registry with client_ca (needs --tls-ca)")
	fs.StringVar(&cfg.RegistryAuth.TLSKey, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&fault, "fault", "none", faults.Usage)
	fs.StringVar(&endpoints, "endpoints", "", "serving endpoints to serve, comma-separated (empty: all): "+strings.Join(engine.AllEndpoints, ","))
	fs.StringVar(&loraList, "lora", "", "LoRA adapters served besides the base model, comma-separated, each name or name=path")
	fs.IntVar(&cfg.MaxLoRAs, "max-loras", 4, "GPU slots for LoRA adapters: adapters whose requests run at once")
	fs.IntVar(&loraSwapMS, "lora-swap-ms", 20, "milliseconds to load an adapter into a slot, added to that request's time to first token (0: none)")
	fs.BoolVar(&cfg.AllowRuntimeLoRA, "allow-runtime-lora", false, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter")
	fs.StringVar(&kvEvents, "kv-events", "", "publish vLLM-format KV-cache events over ZMQ (R22): zmq://HOST:PORT or tcp://HOST:PORT (empty: off); binding, * is every interface and port 0 any free port; POST "+engine.GapPath+" then withholds the next batch from live subscribers (a gap, for tests)")
	fs.BoolVar(&cfg.KVEvents.Bind, "kv-events-bind", true, "the KV event PUB binds --kv-events (advertised in heartbeats as kv_events_endpoint); false: it connects to a consumer there, redialling every 500 ms while it is absent")
	fs.StringVar(&kvFormat, "kv-events-format", "array", "KV event encoding: array (vLLM's array_like) or map (newer vLLM)")
	fs.StringVar(&kvReplay, "kv-replay", "", "HOST:PORT of a ZMQ ROUTER that replays the last 1024 KV event batches from a requested seq (empty: none)")
	fs.BoolVar(&cfg.KVEvents.ReplayTopic, "kv-replay-topic", true, "replay answers carry the topic frame [topic, seq, payload]; false: vLLM's [seq, payload]")
	fs.Uint64Var(&cfg.KVEvents.HashSeed, "kv-hash-seed", 0, "seed of the KV blocks' hashes in KV events (0: derived from --id, so a restarted engine names blocks as before)")
	fs.StringVar(&cfg.PD, "pd", "tl", "disaggregation protocol besides EngineControl: tl, vllm (kv_transfer_params) or sglang (bootstrap rooms)")
	fs.IntVar(&cfg.BootstrapPort, "bootstrap-port", 8998, "the KV side channel's port under --pd vllm or sglang on a prefill or unified engine (sglang's bootstrap port; 0: any)")
	fs.DurationVar(&cfg.PDTimeout, "pd-timeout", 30*time.Second, "how long a decode waits for its KV under --pd vllm or sglang (a bootstrap room's prefill, the transfer)")
	fs.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", "host:port of an OTLP/gRPC collector (plaintext): export a "+engine.SpanName+" span per served HTTP request, the child of its traceparent (empty: off)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	f, err := faults.Parse(fault)
	if err != nil {
		fmt.Fprintln(stderr, "tlengine: --fault:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		fmt.Fprintln(stderr, "tlengine: --log-level:", err)
		return 2
	}
	if cfg.RegistryAuth.Token == "" {
		cfg.RegistryAuth.Token = os.Getenv("TLENGINE_TOKEN")
	}
	if err := cfg.RegistryAuth.Check(); err != nil {
		fmt.Fprintln(stderr, "tlengine:", err)
		return 2
	}
	if cfg.Gateways, err = engine.ParseGatewayList(gateways); err != nil {
		fmt.Fprintln(stderr, "tlengine:", err)
		return 2
	}
	if cfg.Endpoints, err = engine.ParseEndpointList(endpoints); err != nil {
		fmt.Fprintln(stderr, "tlengine:", err)
		return 2
	}
	if cfg.LoRAs, err = engine.ParseLoRAList(loraList); err != nil {
		fmt.Fprintln(stderr, "tlengine: --lora:", err)
		return 2
	}
	if loraSwapMS < 0 {
		fmt.Fprintln(stderr, "tlengine: --lora-swap-ms must not be negative")
		return 2
	}
	cfg.LoRASwap = time.Duration(loraSwapMS) * time.Millisecond
	if loraSwapMS == 0 {
		cfg.LoRASwap = -1 // none
	}
	if err := parseKVEvents(&cfg.KVEvents, kvEvents, kvFormat, kvReplay); err != nil {
		fmt.Fprintln(stderr, "tlengine:", err)
		return 2
	}
	cfg.Fault, cfg.Role = f, engine.Role(role)
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// Signals are taken before the engine starts: a SIGTERM right after the address line is
	// printed must close the engine, not kill the process.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	e, err := engine.Start(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "tlengine:", err)
		return 1
	}
	// Machine-readable lines with the real addresses (port 0 resolved); the KV events line, when
	// publishing, comes first so that a reader of the listening line has both.
	if events, replay := e.KVEventsAddrs(); events != "" {
		mode := "bind"
		if !cfg.KVEvents.Bind {
			mode = "connect"
		}
		if replay == "" {
			replay = "-"
		}
		fmt.Fprintf(stdout, "tlengine kv-events mode=%s events=%s replay=%s\n", mode, events, replay)
	}
	fmt.Fprintf(stdout, "tlengine listening http=%s grpc=%s kv=%s\n", e.HTTPAddr, e.GRPCAddr, e.KVAddr)
	cfg.Logger.Info("tlengine serving", "id", cfg.ID, "model", cfg.Model, "role", role, "fault", f.String(),
		"gateways", cfg.Gateways, "pd", cfg.PD, "bootstrap", e.BootstrapAddr)
	<-ctx.Done()
	e.Close()
	return 0
}

// parseKVEvents reads --kv-events (zmq:// or tcp://HOST:PORT), --kv-events-format and
// --kv-replay (HOST:PORT, tcp:// allowed) into k; the addresses are checked by the engine.
func parseKVEvents(k *engine.KVEventsConfig, events, format, replay string) error {
	switch format {
	case "array":
		k.Format = vllmkv.Array
	case "map":
		k.Format = vllmkv.Map
	default:
		return fmt.Errorf("--kv-events-format %q: want array or map", format)
	}
	if events != "" {
		addr, ok := strings.CutPrefix(events, "zmq://")
		if !ok {
			addr, ok = strings.CutPrefix(events, "tcp://")
		}
		if !ok || addr == "" {
			return fmt.Errorf("--kv-events %q: want zmq://HOST:PORT or tcp://HOST:PORT", events)
		}
		k.Addr = addr
	}
	if replay != "" {
		if k.Addr == "" {
			return fmt.Errorf("--kv-replay needs --kv-events")
		}
		k.Replay = strings.TrimPrefix(replay, "tcp://")
	}
	return nil
}
