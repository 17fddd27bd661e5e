package config

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/internal/rollout"
)

// TestRolloutConfig (R25): a route's rollout from TOML with its defaults filled in, the implied
// backends, and 0 kept as a max_error_rate.
func TestRolloutConfig(t *testing.T) {
	cfg, err := Parse([]byte(`
[[gateway.routes]]
model = "smol"
rollout = { canary = "smol-v4", baseline = "smol-v3", steps = [10, 100], step_interval = "30s", max_error_rate = 0 }

[[gateway.routes]]
model = "big"
backends = [{ model = "big-v2" }, { model = "big-v1" }]
rollout = { canary = "big-v2", baseline = "big-v1" }
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Gateway.Routes
	if got := r[0].Rollout.Spec(); !cmp.Equal(got, rollout.Spec{Canary: "smol-v4", Baseline: "smol-v3", Steps: []float64{10, 100},
		Interval: 30 * time.Second, MinRequests: 200, MaxErrorRatio: 1.5, MaxTTFTP99Ratio: 1.25, MaxErrorRate: 0}) {
		t.Fatalf("spec %+v", got)
	}
	if !cmp.Equal(r[0].Backends, []Backend{{"smol-v3", 1}, {"smol-v4", 0}}) {
		t.Fatalf("implied backends %+v", r[0].Backends)
	}
	if got := r[1].Rollout.Spec(); got.Interval != rollout.DefaultInterval || !cmp.Equal(got.Steps, rollout.DefaultSteps) ||
		got.MaxErrorRate != rollout.DefaultMaxErrorRate {
		t.Fatalf("defaults %+v", got)
	}
	// The admin API's JSON form shows the defaults and reads back the same.
	b, err := json.Marshal(r[1])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"step_interval":"5m0s"`) || !strings.Contains(string(b), `"max_error_rate":0.05`) {
		t.Fatalf("JSON %s", b)
	}
	var back Route
	if err := json.Unmarshal(b, &back); err != nil || !cmp.Equal(back, r[1]) {
		t.Fatalf("round trip %v: %s", err, cmp.Diff(r[1], back))
	}
}

func TestRolloutProblems(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`[{"model":"m","rollout":{"canary":"b","baseline":"a","steps":[10,50]}}]`, "routes[0].rollout.steps: the last step must be 100"},
		{`[{"model":"m","rollout":{"canary":"b","baseline":"a","steps":[50,10,100]}}]`, "routes[0].rollout.steps: 10 must be above the step before (50) and at most 100"},
		{`[{"model":"m","rollout":{"canary":"a","baseline":"a"}}]`, "routes[0].rollout.canary: must differ from baseline"},
		{`[{"model":"m","rollout":{"canary":"b","baseline":"a","step_interval":"1ms"}}]`, "routes[0].rollout.step_interval: 1ms is not between 1s and 24h0m0s"},
		{`[{"model":"m","rollout":{"canary":"b","baseline":"a","max_error_rate":2}}]`, "routes[0].rollout.max_error_rate: a share between 0 and 1"},
		{`[{"model":"m","backends":[{"model":"a"},{"model":"c"}],"rollout":{"canary":"b","baseline":"a"}}]`,
			"routes[0].rollout.baseline: the route's backends must be the baseline and the canary (or be left out)"},
		{`[{"model":"m","cascade":[{"model":"a"}],"rollout":{"canary":"b","baseline":"a"}}]`,
			"routes[0].rollout: a cascade route has no rollout: give backends (or none) instead"},
	} {
		var routes []Route
		if err := json.Unmarshal([]byte(c.json), &routes); err != nil {
			t.Fatal(err)
		}
		if err := ValidateRoutes(routes); err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.json, err, c.want)
		}
	}
	many := func(n int) []Route {
		var rs []Route
		for i := range n {
			rs = append(rs, Route{Model: fmt.Sprintf("m%d", i), Rollout: &Rollout{Canary: fmt.Sprintf("b%d", i), Baseline: fmt.Sprintf("a%d", i)}})
		}
		return rs
	}
	if err := ValidateRoutes(many(MaxRollouts)); err != nil {
		t.Errorf("MaxRollouts rollouts: %v", err)
	}
	if err := ValidateRoutes(many(MaxRollouts + 1)); err == nil || err.Error() != fmt.Sprintf("routes: %d routes carry a rollout, more than %d", MaxRollouts+1, MaxRollouts) {
		t.Errorf("one rollout too many: %v", err)
	}
	if _, err := Parse([]byte("[[gateway.routes]]\nmodel = \"m\"\nrollout = { canary = \"b\", baseline = \"a\", speed = 2 }\n"), env(nil)); err == nil {
		t.Error("an unknown rollout key was accepted")
	}
}
