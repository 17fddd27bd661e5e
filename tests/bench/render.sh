#!/usr/bin/env bash
# What gateway.tokenizer = "engine" adds to time to first token (R22): a precise_prefix gateway
# that renders requests on its engines against one that does not, over the same two tlengine
# processes publishing vLLM-format KV events, on the pinned set-up (gateways and engines on core
# 1, wrk on core 0), at one and at 64 connections, every prompt new (a render per request) and
# one prompt repeated (the gateway's cache). Figures are medians over rounds of engine − estimate.
# Needs wrk and taskset. Usage: tests/bench/render.sh  (TLGW_BENCH_PHASE=2s TLGW_BENCH_ROUNDS=8)
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -run '^$' -bench 'BenchmarkRenderTTFT' -benchtime 1x -timeout 30m ./tests/bench/ |
awk '/^BenchmarkRenderTTFT/ { for (i=3; i<NF; i+=2) printf "%-36s %12.1f\n", $(i+1), $(i); next } /^(ok|FAIL|PASS|---|    )/ { print }'
