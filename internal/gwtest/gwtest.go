// Package gwtest is the test harness for tlgw's actor tree: a gateway on a fake clock,
// heartbeats that wait until the router's view shows them, and condition polling with a
// deadline (never a bare sleep).
package gwtest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
)

// Epoch0 is the fake clock's start: t0 of the seed's worked example.
var Epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Harness is a running actor tree on a fake clock.
type Harness struct {
	T     testing.TB
	Clock *clock.Fake
	GW    *gateway.Gateway
	seq   int
}

// Option adjusts the gateway config before start.
type Option func(*gateway.Config)

// WithPolicy sets route_policy.
func WithPolicy(p string) Option { return func(c *gateway.Config) { c.Policy = p } }

// WithRoutes sets the route table.
func WithRoutes(r ...config.Route) Option { return func(c *gateway.Config) { c.Routes = r } }

// WithRouterMetrics registers the router's series on reg.
func WithRouterMetrics(reg prometheus.Registerer) Option {
	return func(c *gateway.Config) { c.RouterMetrics = router.NewMetrics(reg) }
}

// WithPrefixIndex turns the router's prefix index on.
func WithPrefixIndex(blocks int) Option {
	return func(c *gateway.Config) { c.PrefixIndexBlocks = blocks }
}

// WithAdmission turns the router's admission queue on.
func WithAdmission(a *router.AdmissionConfig) Option {
	return func(c *gateway.Config) { c.Admission = a }
}

// WithActorOptions adds props options per actor kind (crash injection).
func WithActorOptions(f func(kind string) []actor.PropsOption) Option {
	return func(c *gateway.Config) { c.Options = f }
}

// WithRegistryHooks has the registry tell accepted of each heartbeat it accepts and evicted of
// each worker it evicts (gateway.Config.OnAccepted, OnEvict), as the app wires the engine
// connections (grpcapi.Engines.Accept, Forget).
func WithRegistryHooks(accepted, evicted func(router.WorkerInfo)) Option {
	return func(c *gateway.Config) { c.OnAccepted, c.OnEvict = accepted, evicted }
}

// New starts a tree with T = 2 s, k = 3, least_outstanding, c = 1.25, unless options say
// otherwise; it is stopped when the test ends.
func New(t testing.TB, opts ...Option) *Harness {
	t.Helper()
	fc := clock.NewFake(Epoch0)
	cfg := gateway.Config{
		Clock: fc, Policy: "least_outstanding", LoadFactor: 1.25,
		HeartbeatInterval: 2 * time.Second, MissLimit: 3, AskTimeout: 5 * time.Second,
	}
	for _, o := range opts {
		o(&cfg)
	}
	gw, err := gateway.Start(cfg)
	if err != nil {
		t.Fatalf("gateway.Start: %v", err)
	}
	t.Cleanup(gw.Stop)
	return &Harness{T: t, Clock: fc, GW: gw}
}

// Worker is a unified worker status with a loopback HTTP address nobody listens on.
func Worker(id, model string, queue int64) router.WorkerInfo {
	return router.WorkerInfo{ID: id, Model: model, Role: router.RoleUnified,
		HTTPAddress: "127.0.0.1:9", QueueDepth: queue, KVTotalBlocks: 1024, KVFreeBlocks: 1024}
}

// Beat sends a heartbeat and waits until the router's view reflects it.
func (h *Harness) Beat(info router.WorkerInfo) *registry.Ack {
	h.T.Helper()
	ack, err := h.GW.Heartbeat(info)
	if err != nil {
		h.T.Fatalf("heartbeat %s: %v", info.ID, err)
	}
	now := h.Clock.Now()
	h.Eventually(fmt.Sprintf("router sees %s's heartbeat", info.ID), func() bool {
		v, ok := h.View(info.ID)
		return ok && v.Info.LastHeartbeat.Equal(now) && v.Info.QueueDepth == info.QueueDepth &&
			v.Info.Draining == info.Draining && v.Info.Model == info.Model &&
			v.Info.HTTPAddress == info.HTTPAddress
	})
	return ack
}

// View returns the router's row for worker id.
func (h *Harness) View(id string) (router.WorkerView, bool) {
	h.T.Helper()
	list, err := h.GW.Workers()
	if err != nil {
		h.T.Fatalf("workers: %v", err)
	}
	for _, v := range list.Workers {
		if v.Info.ID == id {
			return v, true
		}
	}
	return router.WorkerView{}, false
}

// IDs lists the registered workers' ids in order.
func (h *Harness) IDs() []string {
	h.T.Helper()
	list, err := h.GW.Workers()
	if err != nil {
		h.T.Fatalf("workers: %v", err)
	}
	ids := make([]string, 0, len(list.Workers))
	for _, v := range list.Workers {
		ids = append(ids, v.Info.ID)
	}
	return ids
}

// WaitIDs waits until the registered workers are exactly want.
func (h *Harness) WaitIDs(want ...string) {
	h.T.Helper()
	h.Eventually(fmt.Sprintf("workers %v", want), func() bool { return slices.Equal(h.IDs(), want) })
}

// Pick asks the router; on success the caller holds the pick's tickets (h.GW.Release).
func (h *Harness) Pick(p router.Pick) (*router.Picked, error) {
	return h.GW.Pick(&p)
}

// MustPick is Pick that fails the test on error and returns the worker id.
func (h *Harness) MustPick(model string) string {
	h.T.Helper()
	h.seq++
	res, err := h.Pick(router.Pick{Model: model, RequestID: fmt.Sprintf("r-%d", h.seq)})
	if err != nil {
		h.T.Fatalf("pick %s: %v", model, err)
	}
	return res.WorkerID
}

// InFlight waits until the router shows n in flight on worker id.
func (h *Harness) InFlight(id string, n int64) {
	h.T.Helper()
	h.Eventually(fmt.Sprintf("%s in flight = %d", id, n), func() bool {
		v, ok := h.View(id)
		return ok && v.InFlight == n
	})
}

// Eventually polls cond every millisecond until it holds, failing the test after 5 s.
func (h *Harness) Eventually(what string, cond func() bool) {
	h.T.Helper()
	Eventually(h.T, what, cond)
}

// Eventually polls cond every millisecond until it holds, failing t after 5 s.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		<-tick.C
	}
}

// Idle waits until g's router counts no request in flight on any worker: a request's release
// travels from its request actor through its worker actor after the client has its answer.
func Idle(t testing.TB, g *gateway.Gateway) {
	t.Helper()
	Eventually(t, "no request counted in flight", func() bool {
		l, err := g.Workers()
		if err != nil {
			return false
		}
		for _, w := range l.Workers {
			if w.InFlight != 0 {
				return false
			}
		}
		return true
	})
}

// Probe is an actor that hands every message it receives to a channel: a stand-in requester
// for messages that arrive later than a request/reply (an admission queue's Picked).
type Probe struct {
	PID *actor.PID
	C   chan any
	h   *Harness
}

// NewProbe spawns a probe.
func (h *Harness) NewProbe() *Probe {
	p := &Probe{C: make(chan any, 64), h: h}
	p.PID = h.GW.System.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch c.Message().(type) {
		case *actor.Started, *actor.Stopping, *actor.Stopped:
			return
		}
		p.C <- c.Message()
	}))
	h.T.Cleanup(func() { _ = h.GW.System.Root.StopFuture(p.PID).Wait() })
	return p
}

// Stop stops the probe (a requester ending) and waits until it has.
func (p *Probe) Stop() {
	p.h.T.Helper()
	if err := p.h.GW.System.Root.StopFuture(p.PID).Wait(); err != nil {
		p.h.T.Fatalf("stopping a probe: %v", err)
	}
}

// Ask sends msg to pid with the probe as the sender.
func (p *Probe) Ask(pid *actor.PID, msg any) {
	p.h.GW.System.Root.RequestWithCustomSender(pid, msg, p.PID)
}

// Next waits up to 5 s for the probe's next message.
func (p *Probe) Next() any {
	p.h.T.Helper()
	select {
	case m := <-p.C:
		return m
	case <-time.After(5 * time.Second):
		p.h.T.Fatal("the probe received nothing")
		return nil
	}
}
