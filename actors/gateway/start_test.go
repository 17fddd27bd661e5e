package gateway_test

import (
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/gateway"
)

// TestStartNeedsAPositiveHeartbeat: a heartbeat interval or miss limit of zero or less is
// refused before anything starts; the smallest positive ones start.
func TestStartNeedsAPositiveHeartbeat(t *testing.T) {
	for _, c := range []struct {
		interval time.Duration
		miss     int
		ok       bool
	}{
		{0, 3, false}, {-time.Second, 3, false}, {2 * time.Second, 0, false}, {2 * time.Second, -1, false},
		{time.Nanosecond, 1, true},
	} {
		g, err := gateway.Start(gateway.Config{Policy: "least_outstanding", LoadFactor: 1.25, HeartbeatInterval: c.interval, MissLimit: c.miss})
		if (err == nil) != c.ok {
			t.Errorf("interval %v, miss limit %d: %v, want ok=%v", c.interval, c.miss, err, c.ok)
		}
		if g != nil {
			g.Stop()
		}
	}
}
