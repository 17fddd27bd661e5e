#!/usr/bin/env bash
# Issue 13: agent programs (a reasoning turn, then an acting pause) against a fleet whose KV is
# oversubscribed, simulated on a fake clock through the real admission queue under each policy
# (default, session_serial, thunderagent; "+affinity" = the host's picker first tries the
# program's previous worker). Prints the prefix-cache hit rate, the recomputed prompt tokens,
# the total completion time, the mean program duration, the mean turn latency and queue wait
# (simulated seconds), the share of turns run on their previous turn's worker, thunderagent's
# pauses and the dispatches whose thunderagent target was full.
# The model is described at the top of programs_test.go. Deterministic (seeded).
# Usage: tests/bench/programs.sh [all]   (all: also the variants reported in README.md)
#        tests/bench/programs.sh loadreport   (issue 34: the router's time per LoadReport with
#        500 paused and 2,000 tracked programs, BenchmarkProgramsLoadReport, four runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = loadreport ]; then
  exec go test -count=4 -run '^$' -bench 'BenchmarkProgramsLoadReport' -benchtime 1000x ./tests/bench/
fi
if [ "${1:-}" = all ]; then export APBENCH_VARIANTS=1; fi
go test -count=1 -run 'TestAgentProgramsSim' ./tests/bench/
go test -count=1 -run '^$' -bench 'BenchmarkAgentPrograms$' -benchtime 1x ./tests/bench/ |
awk '
BEGIN {
  printf "%-48s %7s %14s %13s %10s %11s %10s %11s %8s %9s\n", "setting/policy", "hit %", "recomputed tok", "completion s", "program s", "turn lat s", "q wait s", "same wkr %", "pauses", "tgt full"
}
/^BenchmarkAgentPrograms\// {
  name=$1; sub(/^BenchmarkAgentPrograms\//, "", name); sub(/-[0-9]+$/, "", name)
  delete v
  for (i=5; i<NF; i+=2) v[$(i+1)]=$(i)
  printf "%-48s %7.1f %14d %13.1f %10.1f %11.2f %10.2f %11.1f %8d %9d\n", name, v["hit_%"], v["recomputed_tok"], v["completion_s"], v["program_s"], v["turn_latency_s"], v["queue_wait_s"], v["same_worker_%"], v["pauses"], v["target_full"]
  next
}
/^(ok|FAIL|PASS|---)/ { print }
'
