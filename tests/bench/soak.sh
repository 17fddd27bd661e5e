#!/usr/bin/env bash
# The soak of SPEC R19 over separate processes: tlgw and its tlengines (two unified engines per
# model for smol and big, two prefill and two decode engines) pinned to core 1, wrk (64
# connections, the soak mix of soakLua) pinned to core 0, 1,000,000 requests of JSON, SSE, chat,
# a cascade route, a disaggregated route and sessions with admission on, while a worker joins or
# leaves every 10 s and one engine is SIGKILLed and restarted every 30 s. Prints the gateway's
# heap in use, heap objects, goroutines and RSS before any request, after 100,000 and after
# 1,000,000, each read in a 150 s idle window (see soak_bench_test.go), and whether the target
# holds: heap in use after 1M within 10% and 8 MiB of after 100k, goroutines back to their idle
# count. Takes about 20 minutes on the project's 2-core machine.
# Needs wrk and taskset (Debian: apt-get install wrk util-linux) and two cores.
# Usage: tests/bench/soak.sh  (TLGW_SOAK_REQUESTS=1000000 TLGW_SOAK_KILL_EVERY=30s
# TLGW_SOAK_JOIN_EVERY=10s TLGW_SOAK_IDLE=150s by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -run '^$' -bench 'BenchmarkSoak$' -benchtime 1x -timeout 3h ./tests/bench/ |
grep -E '^(soak:|ok|FAIL|PASS|---|    )'
