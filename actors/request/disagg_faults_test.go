package request_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/sim/engine"
)

// TestDecodeFailsAfterThePush (R8, R6): P has pushed the prompt's KV to D, but D fails before
// its first byte — its HTTP surface refuses, or answers 503. The request fails over (here to
// nobody: 503 no_capacity) and the handle is released on D, at D's KV address (not its HTTP
// one): D holds nothing long before its lease, which never runs out here (D's clock stands
// still).
func TestDecodeFailsAfterThePush(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := lis.Addr().String()
	lis.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "full", http.StatusServiceUnavailable)
	}))
	t.Cleanup(busy.Close)
	// D's KV surface is the real engine's in both cases; its HTTP surface is not.
	for _, c := range []struct {
		name string
		http string
	}{
		{"D refuses", refused},
		{"D answers 503", strings.TrimPrefix(busy.URL, "http://")},
	} {
		t.Run(c.name, func(t *testing.T) {
			clients := grpcapi.NewEngines(grpcapi.EnginesOptions{})
			t.Cleanup(clients.Close)
			r := newRig(t, rigOpt{engines: clients, routes: []config.Route{
				{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
			}})
			pe := startEngine(t, engine.Config{ID: "p", Model: "smol", Role: engine.RolePrefill})
			de := startEngine(t, engine.Config{ID: "d", Model: "smol", Role: engine.RoleDecode,
				Clock: clock.NewFake(time.Unix(0, 0))})
			r.beatRole("p", "smol", router.RolePrefill, pe.HTTPAddr, pe.GRPCAddr, pe.KVAddr)
			r.beatRole("d", "smol", router.RoleDecode, c.http, de.GRPCAddr, de.KVAddr)
			resp, body := r.post(t, "/v1/completions", "", `{"model":"smol-pd","prompt":"a prompt whose KV reaches D","max_tokens":4}`)
			if resp.StatusCode != 503 || !strings.Contains(body, "no_capacity") {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			r.engines.mu.Lock()
			handles, releases, at := slices.Clone(r.engines.handles), slices.Clone(r.engines.releases), slices.Clone(r.engines.kvAt)
			r.engines.mu.Unlock()
			// The Release goes to D's KV address as D's registration advertised it (R20).
			dView, _ := r.View("d")
			dReg := dView.Info.Reg
			if len(handles) != 1 || !slices.Equal(releases, handles) ||
				!slices.Equal(at, []request.Endpoint{{WorkerID: "d", Reg: dReg, Addr: de.KVAddr}}) {
				t.Fatalf("handles %v, releases %v at %v (D's KV address %s, registration %d)", handles, releases, at, de.KVAddr, dReg)
			}
			r.Eventually("D holds no KV handle", func() bool {
				st := de.Status()
				return st.KVHandlesHeld == 0 && st.KVFreeBlocks == st.KVTotalBlocks
			})
			r.InFlight("p", 0)
			r.InFlight("d", 0)
		})
	}
}

// TestPrefillBlamesADeadDecodeTarget (R8, R14.2, R19): a Prefill that fails because P could not
// push the KV to D (D's KV address refuses: D died) is D's failure, not P's. D takes the failure
// load and the failover tries another decode worker (D2, through the same P), so the client
// gets its answer; P, which did its part, is not charged. Charging P made every prefill worker
// an outlier when one decode worker restarted, and the disaggregated route answered 503 until
// their ejections ended.
func TestPrefillBlamesADeadDecodeTarget(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadKV := lis.Addr().String()
	lis.Close()
	clients := grpcapi.NewEngines(grpcapi.EnginesOptions{})
	t.Cleanup(clients.Close)
	r := newRig(t, rigOpt{engines: clients, routes: []config.Route{
		{Model: "smol-pd", Backends: []config.Backend{{Model: "smol", Weight: 1}}, Targets: []string{config.TargetDisaggregated}},
	}})
	pe := startEngine(t, engine.Config{ID: "p", Model: "smol", Role: engine.RolePrefill})
	d2 := startEngine(t, engine.Config{ID: "d2", Model: "smol", Role: engine.RoleDecode})
	r.beatRole("p", "smol", router.RolePrefill, pe.HTTPAddr, pe.GRPCAddr, pe.KVAddr)
	// "d1" sorts first: least_outstanding's tie goes to it, so the first attempt pushes to its
	// dead KV address.
	r.beatRole("d1", "smol", router.RoleDecode, d2.HTTPAddr, d2.GRPCAddr, deadKV)
	r.beatRole("d2", "smol", router.RoleDecode, d2.HTTPAddr, d2.GRPCAddr, d2.KVAddr)
	resp, body := r.post(t, "/v1/completions", "", `{"model":"smol-pd","prompt":"a prompt for a dead decode target","max_tokens":4}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	r.InFlight("p", 0)
	r.InFlight("d1", 0)
	r.InFlight("d2", 0)
	d1, _ := r.View("d1")
	p, _ := r.View("p")
	if d1.FailLoad == 0 || p.FailLoad != 0 {
		t.Fatalf("failure load: d1 %d, p %d; want d1's failure and none on p", d1.FailLoad, p.FailLoad)
	}
}
