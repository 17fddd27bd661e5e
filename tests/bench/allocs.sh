#!/usr/bin/env bash
# Allocations per routed request in one process (BenchmarkRoutedRequest: every feature of the
# proxy benchmark's configuration on, an engine that answers at once): all of them, and the
# gateway's own — those whose stack passes through neither net/http (the server's request
# parsing, the client's round trip) nor the benchmark's stand-ins (the canned engine, httptest).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=20000
for kind in json sse; do
  go test -run '^$' -bench "BenchmarkRoutedRequest/$kind\$" -benchtime ${n}x -cpu 1 -benchmem \
    -memprofile "$tmp/$kind.prof" -memprofilerate 1 -o "$tmp/bench.test" ./tests/bench/ >"$tmp/$kind.out"
  total=$(awk '/allocs\/op/ { for (i=1; i<=NF; i++) if ($(i)=="allocs/op") print $(i-1) }' "$tmp/$kind.out")
  own=$(go tool pprof -sample_index=alloc_objects -nodefraction=0 \
    -ignore='net/http\.|net/textproto|net/url|bufio\.|cannedEngine|eventReader|httptest|gwtest|Heartbeat' \
    -top -nodecount 100000 "$tmp/bench.test" "$tmp/$kind.prof" 2>/dev/null |
    awk -v n=$n '/accounting for/ { printf "%.1f", $5/n }')
  printf "%-5s allocs/request: all %s, the gateway's own %s\n" "$kind" "$total" "$own"
done
