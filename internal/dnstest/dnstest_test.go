package dnstest

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestResolves: the resolver answers what the table says — A and AAAA records, a name set
// anew (a rebinding), and NXDOMAIN for a name it does not hold.
func TestResolves(t *testing.T) {
	s := Start(t)
	r := s.Resolver()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.Set("engine.test", netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5"))
	got, err := r.LookupNetIP(ctx, "ip", "Engine.Test.")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, netip.Addr.Compare)
	if want := []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")}; !slices.Equal(got, want) {
		t.Fatalf("engine.test: %v, want %v", got, want)
	}
	s.Set("engine.test", netip.MustParseAddr("169.254.169.254"))
	if got, err := r.LookupNetIP(ctx, "ip4", "engine.test"); err != nil || !slices.Equal(got, []netip.Addr{netip.MustParseAddr("169.254.169.254")}) {
		t.Fatalf("after rebinding: %v %v", got, err)
	}
	if got, err := r.LookupNetIP(ctx, "ip", "unknown.test"); err == nil {
		t.Fatalf("unknown.test resolved to %v", got)
	}
}
