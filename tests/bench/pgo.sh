#!/usr/bin/env bash
# Regenerates cmd/tlgw/default.pgo, the CPU profile that `go build` uses for profile-guided
# optimization of the gateway (Go's -pgo=auto: every build of ./cmd/tlgw picks it up). The
# profile is the gateway process's own, recorded over a whole proxy.sh run on the pinned set-up
# (routed JSON and SSE at 64 connections, JSON at one connection, every feature of the request
# path on), so it weighs the code as a loaded deployment runs it.
# Usage: tests/bench/pgo.sh   (TLGW_BENCH_ROUNDS=8 by default here); then commit the profile.
set -euo pipefail
cd "$(dirname "$0")/../.."
prof=$(mktemp -u /tmp/tlgw-cpu-XXXXXX.pprof)
TLGW_BENCH_ROUNDS=${TLGW_BENCH_ROUNDS:-8} TLGW_BENCH_CPU_PROFILE=$prof tests/bench/proxy.sh
[ -s "$prof" ] || { echo "pgo.sh: the gateway wrote no profile at $prof" >&2; exit 1; }
go tool pprof -proto "$prof" > cmd/tlgw/default.pgo 2>/dev/null
rm -f "$prof"
echo "wrote cmd/tlgw/default.pgo ($(stat -c %s cmd/tlgw/default.pgo) bytes)"
