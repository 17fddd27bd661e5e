package router

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
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
	key := CanaryKey{1, 2, 3}
	d := newCanaryDraw(key)
	for i := range n {
		id := fmt.Sprintf("req-%d", i)
		want := "v3"
		if CanaryDraw(key, id)*1.0 >= 0.9 {
			want = "v4"
		}
		got := routes["smol"].servedModel(d, id)
		if got != want {
			t.Fatalf("%s (u = %v): served %s, want %s", id, CanaryDraw(key, id), got, want)
		}
		if got == "v4" {
			v4++
		}
		wantHeavy := "three"
		if CanaryDraw(key, id)*4 >= 3 {
			wantHeavy = "one"
		}
		if got := routes["heavy"].servedModel(d, id); got != wantHeavy {
			t.Fatalf("%s (u = %v): served %s from weights 3:1, want %s", id, CanaryDraw(key, id), got, wantHeavy)
		}
		if got := routes["edge"].servedModel(d, id); got != "one" {
			t.Fatalf("%s: served %s from a split whose only weight is on one", id, got)
		}
		if got, step, steps, accept := routes["plain"].target(d, id, 0); got != "plain" || step != 0 || steps != 1 || accept != nil {
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
		got, step, steps, accept := r.target(nil, "id", tc.asked)
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

// TestCanaryDrawIsKeyed (R20, issue 35: a client choosing X-Request-ID chose its backend): the
// draw of an id is the top 53 bits of HMAC-SHA256(key, id) over 2^53; one key gives one id one
// u (a request id sent twice lands on one backend), two keys give the same ids unrelated
// draws (about half of 1,000 ids fall on the other side of 0.5), and the MAC reused across
// draws gives what a fresh one does.
func TestCanaryDrawIsKeyed(t *testing.T) {
	k1, k2 := CanaryKey{1}, CanaryKey{2}
	mac := hmac.New(sha256.New, k1[:])
	mac.Write([]byte("req-1"))
	if want := float64(binary.BigEndian.Uint64(mac.Sum(nil))>>11) / (1 << 53); CanaryDraw(k1, "req-1") != want {
		t.Fatalf("CanaryDraw = %v, want %v", CanaryDraw(k1, "req-1"), want)
	}
	d1, d2 := newCanaryDraw(k1), newCanaryDraw(k2)
	flipped := 0
	for i := range 1000 {
		id := fmt.Sprintf("req-%d", i)
		u := d1.draw(id)
		if u < 0 || u >= 1 || u != CanaryDraw(k1, id) || u != d1.draw(id) {
			t.Fatalf("%s: u = %v, fresh %v", id, u, CanaryDraw(k1, id))
		}
		if (u < 0.5) != (d2.draw(id) < 0.5) {
			flipped++
		}
	}
	if flipped < 400 || flipped > 600 {
		t.Fatalf("%d of 1,000 ids changed sides of 0.5 with another key, want about 500", flipped)
	}
	if a, b := NewCanaryKey(), NewCanaryKey(); a == b || a == (CanaryKey{}) {
		t.Fatal("NewCanaryKey drew the same key twice, or zeros")
	}
	if canaryKey(&k2) != k2 || canaryKey(nil) == (CanaryKey{}) {
		t.Fatal("canaryKey: a given key is not kept, or nil gives zeros")
	}
}

// BenchmarkCanaryDraw: one keyed draw of a typical request id (the router's reused MAC).
func BenchmarkCanaryDraw(b *testing.B) {
	d := newCanaryDraw(NewCanaryKey())
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		d.draw("req-0123456789abcdef0123456789")
	}
}
