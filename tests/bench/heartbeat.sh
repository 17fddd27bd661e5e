#!/usr/bin/env bash
# Heartbeat ingest at 10,000 registered workers: the gateway pinned to core 1, the senders (this
# benchmark's process) to core 0. Prints the gateway's CPU per heartbeat, the share of one core
# that 10,000 workers at T = 2 s would take (from a burst), and the share measured while pacing
# exactly 5,000 heartbeats a second for 10 s. Target (DEVELOPERS.md): ≤ 25% of one core.
# Also the actors' own allocations per heartbeat (no gRPC). Needs taskset (util-linux).
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -c -o /tmp/tlgw-bench.test ./tests/bench/
cd tests/bench
taskset -c 0 /tmp/tlgw-bench.test -test.run '^$' -test.bench 'BenchmarkHeartbeatIngest|BenchmarkHeartbeatPath' -test.benchtime 50000x -test.benchmem |
awk '/^Benchmark/ { printf "%s\n", $1; for (i=3; i<NF; i+=2) printf "  %-28s %12.2f\n", $(i+1), $(i); next } /^(ok|FAIL|PASS|---)/ { print }'
