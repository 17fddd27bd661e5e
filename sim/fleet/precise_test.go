package fleet

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPreciseBeatsApproximate is the scenario of docs/simulate.md: on shared-prefix with
// engines of 768 blocks (3/8 of the default KV), the engines' caches hold less than the
// approximate index remembers even bounded by their capacity (running requests' KV is not
// cache, and evictions follow the engines' own order), and restarts empty them without the
// approximate index knowing; precise_prefix, fed by what the engines report, finds more of the
// prompts in cache than prefix_aware. Warm-ups are off: their prompts would count in the hit
// rates compared. PRECISE_SCENARIO_WORKERS and …_REQUESTS (env) scale it up for the
// documentation's table.
func TestPreciseBeatsApproximate(t *testing.T) {
	workers, requests := envInt("PRECISE_SCENARIO_WORKERS", 8), envInt("PRECISE_SCENARIO_REQUESTS", 1000)
	e := DefaultEngine
	e.KVBlocks = 768
	for _, restart := range []time.Duration{0, time.Second} {
		rep, err := Run(Options{Trace: TraceSharedPrefix, Workers: workers, Requests: requests, Load: 0.9, Seed: 1,
			Engine: e, Policies: []string{"least_outstanding", "prefix_aware", "precise_prefix"}, RestartEvery: restart,
			WarmupMinBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		approx, precise := rep.Results[1], rep.Results[2]
		t.Logf("restart every %v:\n%s", restart, markdownOf(t, rep))
		if precise.Completed != precise.Requests {
			t.Fatalf("precise_prefix completed %d of %d", precise.Completed, precise.Requests)
		}
		if precise.HitRate <= approx.HitRate {
			t.Errorf("restart every %v: precise_prefix hit rate %.4f not above prefix_aware's %.4f",
				restart, precise.HitRate, approx.HitRate)
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func markdownOf(t *testing.T, rep *Report) string {
	t.Helper()
	var b strings.Builder
	if err := rep.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
