#!/usr/bin/env bash
# Routed non-streamed requests and the SSE relay through tlgw against a bare
# httputil.ReverseProxy over the same two tlengine processes, one load generator, one run.
# Targets (DEVELOPERS.md): JSON ≥ 0.9× the bare proxy's req/s; SSE ≥ 0.9× its events/s; zero
# truncated streams; added p50 at one connection ≤ 200 µs.
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -run '^$' -bench 'BenchmarkProxyVsBare' -benchtime 1x ./tests/bench/ |
awk '/^BenchmarkProxyVsBare/ { for (i=3; i<NF; i+=2) printf "%-26s %12.3f\n", $(i+1), $(i); next } /^(ok|FAIL|PASS|---)/ { print }'
