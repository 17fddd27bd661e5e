// Command tlgw is the gateway: `tlgw serve --config FILE` runs it, `tlgw version` prints the
// version. It only wires: configuration, logging, signals.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/demo"
)

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("http-listen", "127.0.0.1:8080", "the gateway's HTTP address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := demo.Start(ctx, demo.Options{HTTPListen: *listen, Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "tlgw demo: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "tlgw listening http=%s registry=%s\n\n", d.App.HTTPAddr, d.App.GRPCAddr)
	fmt.Fprint(stdout, demo.Banner(d.App.HTTPAddr))
	select {
	case <-ctx.Done():
	case err := <-d.App.Err():
		log.Error("listener failed", "err", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.Stop(sctx)
	return 0
}

// version is set at build time with -ldflags "-X main.version=…"; otherwise the module
// version recorded in the binary, or "devel".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  tlgw demo [--http-listen ADDR]   the gateway plus simulated engines on loopback (default 127.0.0.1:8080)
  tlgw cascade sweep --fixture F [--small-cost S] [--accept-if 'mean_logprob > tau']
                                   print a cascade's cost and quality curve as JSON
  tlgw serve --config FILE [--log-level L] [--cpu-profile FILE]
                                   run the gateway (--cpu-profile: a pprof CPU profile of the run)
  tlgw simulate --trace T --workers N --requests M --load F --policies a,b --seed S
                [--heterogeneous] [--slo-ttft-ms X] --format json|markdown [--plot FILE.png]
                                   compare route policies over simulated engines (R18.1)
  tlgw version                     print the version
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stdout, stderr)
	case "demo":
		return runDemo(args[1:], stdout, stderr)
	case "cascade":
		return runCascade(args[1:], stdout, stderr)
	case "simulate":
		return runSimulate(args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "tlgw", versionString())
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "tlgw: unknown command %q\n%s", args[0], usage)
	return 2
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func serve(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "TOML configuration file (required; an empty file serves defaults)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	cpuProfile := fs.String("cpu-profile", "", "write a CPU profile of the whole run to this file (pprof; cmd/tlgw/default.pgo is one)")
	dnsServer := fs.String("dns-server", "", "resolve engine names (engine pools, named engine addresses) through this DNS server, HOST:PORT, instead of the system's resolver")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	resolver, err := dnsResolver(*dnsServer)
	if err != nil {
		fmt.Fprintf(stderr, "tlgw serve: --dns-server: %v\n", err)
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "tlgw serve: --config FILE is required")
		return 2
	}
	if *cpuProfile != "" {
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "tlgw serve: --cpu-profile: %v\n", err)
			return 1
		}
		defer func() {
			if err := stopProfile(); err != nil {
				fmt.Fprintf(stderr, "tlgw serve: --cpu-profile: %v\n", err)
			}
		}()
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "tlgw serve: --log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintf(stderr, "tlgw serve: %s: %v\n", *path, err)
		return 1
	}
	// Signals are taken before the gateway starts: a SIGTERM right after the address line is
	// printed must drain and stop it (and write the profile), not kill the process.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	a, err := app.Start(cfg, app.Options{Logger: log, Resolver: resolver, Stdout: stdout})
	if err != nil {
		fmt.Fprintf(stderr, "tlgw serve: %v\n", err)
		return 1
	}
	// One machine-readable line with the bound addresses (a configured port 0 resolved).
	fmt.Fprintf(stdout, "tlgw listening http=%s registry=%s\n", a.HTTPAddr, a.GRPCAddr)
	log.Info("tlgw serving", "version", versionString(), "http", a.HTTPAddr, "registry", a.GRPCAddr,
		"policy", cfg.Gateway.RoutePolicy, "routes", len(cfg.Gateway.Routes))

	code := 0
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests", "grace", cfg.Gateway.ShutdownGrace)
	case err := <-a.Err():
		log.Error("listener failed", "err", err)
		code = 1
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.ShutdownGrace)
	defer cancel()
	if err := a.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Error("shutdown", "err", err)
	}
	log.Info("stopped")
	return code
}

// startCPUProfile starts a CPU profile into a new file at path; the func it returns stops the
// profile and closes the file. The file must not exist: a profile never overwrites one.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// dnsResolver is a resolver that asks the DNS server at addr only (nil for "": the system's).
func dnsResolver(addr string) (*net.Resolver, error) {
	if addr == "" {
		return nil, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("%q is not HOST:PORT", addr)
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}, nil
}
