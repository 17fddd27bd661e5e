package gateway_test

import (
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// TestUndrainRoutesAtOnce (R19): an engine echoes the gateway's drain (it reports draining
// once an ack asked it to, until an ack no longer does). After an undrain that echo is no
// reason to stop routing: the worker is routable at once, and stays so over the heartbeats
// that may still carry the drain's ack, while an engine that reported draining before the drain
// (shutting down by itself) stays out. Undrained through the admin API and from the cluster
// store alike.
func TestUndrainRoutesAtOnce(t *testing.T) {
	for _, via := range []string{"admin", "cluster store"} {
		t.Run(via, func(t *testing.T) {
			h := gwtest.New(t)
			// Every heartbeat a little later than the last, so Beat waits for this one's view.
			beat := func(w router.WorkerInfo) *registry.Ack {
				t.Helper()
				h.Clock.Advance(100 * time.Millisecond)
				return h.Beat(w)
			}
			drain := func(drained bool) {
				t.Helper()
				if via == "admin" {
					if _, err := h.GW.Drain("smol", drained); err != nil {
						t.Fatal(err)
					}
					return
				}
				var models []string
				if drained {
					models = []string{"smol"}
				}
				h.GW.SyncDrains(models)
			}
			echo, own := gwtest.Worker("echo", "smol", 0), gwtest.Worker("own", "smol", 0)
			beat(echo)
			own.Draining = true // shutting down before any drain
			beat(own)
			drain(true)
			for _, id := range []string{"echo", "own"} {
				h.Eventually(id+" drained", func() bool { v, ok := h.View(id); return ok && v.Info.AdminDrained && !v.Routable })
			}
			// The engine's next heartbeat is sent before it gets the drain's ack, the one after
			// reports draining: the echo.
			if ack := beat(echo); !ack.Drain {
				t.Fatal("the ack does not ask for the drain")
			}
			echo.Draining = true
			beat(echo)
			beat(own)
			drain(false)
			h.Eventually("echo undrained", func() bool { v, ok := h.View("echo"); return ok && !v.Info.AdminDrained })
			if v, _ := h.View("echo"); !v.Routable || !v.Info.Draining {
				t.Fatalf("right after the undrain: %+v, want routable (its draining is the drain's echo)", v)
			}
			if got := h.MustPick("smol"); got != "echo" {
				t.Fatalf("picked %s", got)
			}
			// Its next two heartbeats may still carry a drain's ack (the one on its way, and in
			// a cluster another replica's): still the echo.
			for i := range 2 {
				if ack := beat(echo); ack.Drain {
					t.Fatal("an ack after the undrain asks for a drain")
				}
				if v, _ := h.View("echo"); !v.Routable {
					t.Fatalf("heartbeat %d after the undrain reporting draining: not routable", i+1)
				}
			}
			// Draining after that is its own.
			beat(echo)
			if v, _ := h.View("echo"); v.Routable {
				t.Fatal("an engine still reporting draining three heartbeats after the undrain is routable")
			}
			if v, _ := h.View("own"); v.Routable {
				t.Fatal("the engine that was draining before the drain is routable after the undrain")
			}
			// An engine that stops draining and starts again by itself is draining.
			echo.Draining = false
			beat(echo)
			if v, _ := h.View("echo"); !v.Routable {
				t.Fatal("not draining: not routable")
			}
			echo.Draining = true
			beat(echo)
			if v, _ := h.View("echo"); v.Routable {
				t.Fatal("draining by itself: routable")
			}
		})
	}
}
