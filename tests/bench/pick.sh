#!/usr/bin/env bash
# Prints the pick figures: the router's own work per pick (policy choice + reservation), the
# same for prefix_aware scoring a new prompt against a full prefix index (and precise_prefix
# against a full exact index), and a pick round trip
# through the router actor, for each policy at 4, 64 and 1,000 workers.
# Targets (DEVELOPERS.md): own work ≤ 1 µs p50 at 1,000 workers with 0 allocs; round trip
# ≤ 10 µs p50. The scored prefix_aware pick aims at ≤ 10 µs p50 at 1,000 workers, 0 allocs.
# Usage: tests/bench/pick.sh [benchtime, default 1s]
set -euo pipefail
cd "$(dirname "$0")/../.."
bt="${1:-1s}"
go test -run '^$' -bench 'BenchmarkPolicyPick|BenchmarkPrefixAwarePick|BenchmarkPrecisePrefixPick|BenchmarkPredictedLatencyPick|BenchmarkRouterPickRoundTrip' -benchtime "$bt" -benchmem ./tests/bench/ |
awk '
/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name)
  p50=""; p99=""; allocs=""
  for (i=2; i<=NF; i++) {
    if ($(i)=="p50-ns/pick") p50=$(i-1)
    if ($(i)=="p99-ns/pick") p99=$(i-1)
    if ($(i)=="allocs/op") allocs=$(i-1)
  }
  printf "%-62s p50 %9.0f ns  p99 %9.0f ns  allocs/pick %s\n", name, p50, p99, allocs
  next
}
/^(ok|FAIL|PASS)/ { print }
'
