#!/usr/bin/env bash
# Routed non-streamed requests and the SSE relay through tlgw (every feature of the path on)
# against a bare, body-buffering httputil.ReverseProxy over the same two tlengine processes,
# measured in one run on the pinned set-up: the proxy under test and both engines as separate
# processes on core 1, wrk (64 connections) on core 0. Prints the ratios beside the gateway
# process's CPU and allocations per request.
# Targets (DEVELOPERS.md): JSON ≥ 0.9× the bare proxy's req/s; SSE ≥ 0.95× its events/s; zero
# truncated streams; added p50 at one connection ≤ 100 µs.
# Needs wrk and taskset (Debian: apt-get install wrk util-linux) and two cores.
# Usage: tests/bench/proxy.sh  (TLGW_BENCH_PHASE=2s TLGW_BENCH_ROUNDS=20 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -run '^$' -bench 'BenchmarkProxyVsBare' -benchtime 1x -timeout 30m ./tests/bench/ |
awk '/^BenchmarkProxyVsBare/ { for (i=3; i<NF; i+=2) printf "%-26s %12.3f\n", $(i+1), $(i); next } /^(ok|FAIL|PASS|---|    )/ { print }'
