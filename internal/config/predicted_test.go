package config

import (
	"slices"
	"testing"

	"github.com/tlgw/tlgw/actors/router/policy"
)

// TestPredictedLatencyPolicy: route_policy = "predicted_latency" (R18.2) is accepted without
// [admission], and names the router's registered policy.
func TestPredictedLatencyPolicy(t *testing.T) {
	cfg, err := Parse([]byte("[gateway]\nroute_policy = \"predicted_latency\"\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.RoutePolicy != PolicyPredictedLatency {
		t.Fatalf("RoutePolicy = %q", cfg.Gateway.RoutePolicy)
	}
	if !slices.Contains(policy.Names(), PolicyPredictedLatency) {
		t.Fatalf("%s is not a registered policy (%v)", PolicyPredictedLatency, policy.Names())
	}
}
