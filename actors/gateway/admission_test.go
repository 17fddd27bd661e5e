package gateway_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/gwtest"
)

func admissionConfig(policy admission.Policy, threshold int64) *router.AdmissionConfig {
	return &router.AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10, MaxWait: 5 * time.Second}},
			DefaultClass: "default", Policy: policy, Recheck: time.Second,
		},
		BusyThreshold: threshold, PolicyName: "test",
	}
}

// admitPick sends an admitted first pick from a new requester (a probe standing in for the
// request actor) and returns it.
func admitPick(h *gwtest.Harness, key uint64, id, model, session string) *gwtest.Probe {
	p := h.NewProbe()
	p.Ask(h.GW.Router, &router.Pick{Model: model, RequestID: id, Key: key, Requester: p.PID, Tag: 1,
		Admit: &router.AdmitInfo{SessionID: session}})
	return p
}

// finish ends a probe's admitted request as a request actor's end does: it tells the router
// (router.Finished) and stops.
func finish(h *gwtest.Harness, p *gwtest.Probe, key uint64) {
	h.GW.System.Root.Send(h.GW.Router, &router.Finished{Key: key})
	p.Stop()
}

// TestSessionSerialThroughRouter: the router queues a session's second turn until the first
// has ended (its request actor said so); another session is not delayed.
func TestSessionSerialThroughRouter(t *testing.T) {
	h := gwtest.New(t, gwtest.WithAdmission(admissionConfig(sessionserial.New(), 0)))
	h.Beat(gwtest.Worker("w1", "smol", 0))
	t1, t2 := admitPick(h, 1, "t1", "smol", "alice"), admitPick(h, 2, "t2", "smol", "alice")
	if m, ok := t1.Next().(*router.Picked); !ok || m.Err != nil || !m.Admitted {
		t.Fatalf("first turn: %#v", m)
	}
	if _, ok := t2.Next().(*router.Queued); !ok {
		t.Fatal("second turn of the session was not queued")
	}
	b1 := admitPick(h, 3, "b1", "smol", "bob")
	if m, ok := b1.Next().(*router.Picked); !ok || m.Err != nil {
		t.Fatalf("another session was delayed: %#v", m)
	}
	finish(h, t1, 1) // the first turn's request actor ends
	if m, ok := t2.Next().(*router.Picked); !ok || m.Err != nil || !m.Admitted {
		t.Fatalf("second turn after the first finished: %#v", m)
	}
}

// TestQueueTimeoutAndCancelThroughRouter: a full worker queues; past max_wait the request is
// answered queue_timeout (on the fake clock); a cancelled one leaves at once.
func TestQueueTimeoutAndCancelThroughRouter(t *testing.T) {
	h := gwtest.New(t, gwtest.WithAdmission(admissionConfig(nil, 1)))
	h.Beat(gwtest.Worker("w1", "smol", 1)) // queue depth 1: full at threshold 1
	p, b := admitPick(h, 1, "a", "smol", ""), admitPick(h, 2, "b", "smol", "")
	for _, x := range []*gwtest.Probe{p, b} {
		if _, ok := x.Next().(*router.Queued); !ok {
			t.Fatal("not queued")
		}
	}
	finish(h, b, 2) // its client left: the request actor ends
	h.Eventually("b left the queue", func() bool {
		v, err := h.GW.Queue()
		return err == nil && v.Snapshot.Classes[0].Queued == 1
	})
	h.Clock.Advance(5*time.Second - time.Nanosecond)
	select {
	case m := <-p.C:
		t.Fatalf("answered before max_wait: %#v", m)
	default:
	}
	h.Clock.Advance(time.Nanosecond)
	m, ok := p.Next().(*router.Picked)
	if !ok || !errors.Is(m.Err, errs.ErrQueueTimeout) {
		t.Fatalf("at max_wait: %#v", m)
	}
}
