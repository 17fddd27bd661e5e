package config

import (
	"slices"
	"testing"

	"github.com/tlgw/tlgw/actors/router/policy"
)

// TestRoundRobinPolicy: route_policy = "round_robin" (R18.2) is accepted, and every policy the
// configuration accepts is one the router can build.
func TestRoundRobinPolicy(t *testing.T) {
	cfg, err := Parse([]byte("[gateway]\nroute_policy = \"round_robin\"\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.RoutePolicy != PolicyRoundRobin {
		t.Fatalf("RoutePolicy = %q, want %q", cfg.Gateway.RoutePolicy, PolicyRoundRobin)
	}
	for _, name := range []string{PolicyLeastOutstanding, PolicyWeighted, PolicyAffinity, PolicyPrefixAware, PolicyRoundRobin} {
		if _, err := Parse([]byte("[gateway]\nroute_policy = \""+name+"\"\n"), env(nil)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if !slices.Contains(policy.Names(), name) {
			t.Errorf("%s is not a registered policy (%v)", name, policy.Names())
		}
	}
}
