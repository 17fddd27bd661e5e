#!/usr/bin/env bash
# A/B of two gateway builds (git revisions) on the pinned set-up: each serves with its own two
# tlengine processes on core 1, and wrk alternates between them in 2 s slices; prints the median
# ratio A ÷ B (SSE events/s, or JSON req/s) and each build's CPU per request. Use it to tell
# whether a change moved throughput by a few percent: two separate proxy.sh runs cannot on this
# VM. Needs wrk and taskset.
# Usage: tests/bench/ab.sh REV_A [REV_B (default HEAD)] [sse|json]   (TLGW_AB_ROUNDS=20 by default;
# TLGW_AB_CONFIG_A or _B: a TOML file that side serves with instead of the proxy benchmark's;
# TLGW_AB_CONNS: wrk's connections, 64 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 REV_A [REV_B] [sse|json]" >&2; exit 2; }
rev_a=$1 rev_b=${2:-HEAD} kind=${3:-sse}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for side in a b; do
  rev=$rev_a; [ $side = b ] && rev=$rev_b
  mkdir "$tmp/$side"
  git archive "$rev" | tar -x -C "$tmp/$side"
done
TLGW_AB_A=$tmp/a TLGW_AB_B=$tmp/b TLGW_AB_KIND=$kind \
  go test -run '^$' -bench 'BenchmarkGatewayAB' -benchtime 1x -timeout 30m ./tests/bench/ |
awk -v a="$rev_a" -v b="$rev_b" -v k="$kind" '/^BenchmarkGatewayAB/ { printf "A=%s B=%s (%s)\n", a, b, k; for (i=3; i<NF; i+=2) printf "%-16s %10.3f\n", $(i+1), $(i); next } /^(ok|FAIL|PASS|---|    )/ { print }'
