package router

import (
	"fmt"
	"testing"

	"github.com/tlgw/tlgw/internal/config"
)

// TestRouteSplitMatchesTheDraw: a backend is the first whose cumulative weight exceeds
// u·total, u = CanaryDraw(request id) (R5); a weight of 0 is never drawn; the shares come out
// as the weights say, whatever they sum to; and a route without backends serves its own id.
func TestRouteSplitMatchesTheDraw(t *testing.T) {
	routes := compileRoutes([]config.Route{
		{Model: "smol", Aliases: []string{"small"}, Backends: []config.Backend{{Model: "v3", Weight: 0.9}, {Model: "v4", Weight: 0.1}}},
		{Model: "edge", Backends: []config.Backend{{Model: "zero-first", Weight: 0}, {Model: "one", Weight: 1}, {Model: "zero-last", Weight: 0}}},
		{Model: "plain"},
		{Model: "heavy", Backends: []config.Backend{{Model: "three", Weight: 3}, {Model: "one", Weight: 1}}}, // weights not summing to 1
	})
	if routes["small"] != routes["smol"] {
		t.Fatal("the alias does not resolve to its route")
	}
	const n = 20000
	v4 := 0
	for i := range n {
		id := fmt.Sprintf("req-%d", i)
		want := "v3"
		if CanaryDraw(id)*1.0 >= 0.9 {
			want = "v4"
		}
		got := routes["smol"].servedModel(id)
		if got != want {
			t.Fatalf("%s (u = %v): served %s, want %s", id, CanaryDraw(id), got, want)
		}
		if got == "v4" {
			v4++
		}
		wantHeavy := "three"
		if CanaryDraw(id)*4 >= 3 {
			wantHeavy = "one"
		}
		if got := routes["heavy"].servedModel(id); got != wantHeavy {
			t.Fatalf("%s (u = %v): served %s from weights 3:1, want %s", id, CanaryDraw(id), got, wantHeavy)
		}
		if got := routes["edge"].servedModel(id); got != "one" {
			t.Fatalf("%s: served %s from a split whose only weight is on one", id, got)
		}
		if got, step, steps, accept := routes["plain"].target(id, 0); got != "plain" || step != 0 || steps != 1 || accept != nil {
			t.Fatalf("plain route: %s %d/%d %v", got, step, steps, accept)
		}
	}
	// 10% ± 1 point over 20,000 ids (the binomial's σ is 0.2 points).
	if share := float64(v4) / n; share < 0.09 || share > 0.11 {
		t.Fatalf("v4 served %.4f of requests, want 0.10", share)
	}
}

// TestRouteCascadeSteps: each step but the last carries its accept rule; a step asked out of
// range is the last one (R5, cascades).
func TestRouteCascadeSteps(t *testing.T) {
	r := compileRoutes([]config.Route{{Model: "auto", Cascade: []config.CascadeStep{
		{Model: "smol", AcceptIf: "mean_logprob > -1.0"},
		{Model: "mid", AcceptIf: "mean_logprob > -0.5"},
		{Model: "big"},
	}}})["auto"]
	for _, tc := range []struct {
		asked, step int
		model       string
		accept      bool
	}{{0, 0, "smol", true}, {1, 1, "mid", true}, {2, 2, "big", false}, {3, 2, "big", false}, {-1, 2, "big", false}} {
		got, step, steps, accept := r.target("id", tc.asked)
		if got != tc.model || step != tc.step || steps != 3 || (accept != nil) != tc.accept {
			t.Errorf("step %d asked: %s %d/%d accept %v, want %s %d/3 accept %v", tc.asked, got, step, steps, accept != nil, tc.model, tc.step, tc.accept)
		}
	}
}

// TestOutcomeNamesAndFailures: each outcome's name is its ejection reason label; the failures
// are refused, reset, timeout, 5xx and interrupted; a value past the last names "unknown" and
// is no failure (a Release from a newer build cannot eject anyone by accident).
func TestOutcomeNamesAndFailures(t *testing.T) {
	want := []struct {
		name   string
		failed bool
	}{{"none", false}, {"success", false}, {"refused", true}, {"reset", true}, {"timeout", true}, {"5xx", true}, {"interrupted", true}}
	for o := range Outcome(len(want) + 3) {
		name, failed := "unknown", false
		if int(o) < len(want) {
			name, failed = want[o].name, want[o].failed
		}
		if o.String() != name || o.Failed() != failed {
			t.Errorf("Outcome(%d): %q failed %v, want %q failed %v", o, o.String(), o.Failed(), name, failed)
		}
	}
}

// TestKVCapacityTokens: blocks × block size, 0 when either is unknown (0 or below).
func TestKVCapacityTokens(t *testing.T) {
	for _, tc := range []struct{ blocks, size, want int64 }{{64, 16, 1024}, {1, 1, 1}, {0, 16, 0}, {64, 0, 0}, {-1, 16, 0}, {64, -16, 0}} {
		if got := (WorkerInfo{KVTotalBlocks: tc.blocks, BlockSize: tc.size}).KVCapacityTokens(); got != tc.want {
			t.Errorf("%d blocks of %d: %d tokens, want %d", tc.blocks, tc.size, got, tc.want)
		}
	}
}
