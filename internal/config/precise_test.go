package config

import (
	"slices"
	"testing"

	"github.com/tlgw/tlgw/actors/router/policy"
)

// TestPrecisePrefixPolicy: route_policy = "precise_prefix" (R18.2) is accepted without the
// approximate prefix index or [admission], and names the router's registered policy.
func TestPrecisePrefixPolicy(t *testing.T) {
	cfg, err := Parse([]byte("[gateway]\nroute_policy = \"precise_prefix\"\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.RoutePolicy != PolicyPrecisePrefix {
		t.Fatalf("RoutePolicy = %q", cfg.Gateway.RoutePolicy)
	}
	if !slices.Contains(policy.Names(), PolicyPrecisePrefix) {
		t.Fatalf("%s is not a registered policy (%v)", PolicyPrecisePrefix, policy.Names())
	}
}
